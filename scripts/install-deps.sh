#!/usr/bin/env bash
# Installs everything zinf needs to build, test and benchmark, from Debian 12 packages.
# Idempotent; run as root (or through sudo). The CUDA toolkit is optional and not installed
# here: when /usr/local/cuda exists, the CUDA pieces are built too.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang-format clang-tidy
  liburing-dev libaio-dev libxxhash-dev
  libtbb-dev libxsimd-dev
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev libgloo-dev
  libopenblas0-openmp
  fio python3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
else
  SUDO=
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
