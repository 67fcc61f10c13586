#!/usr/bin/env bash
# Installs everything zinf needs to build, test and benchmark, from Debian 12 packages.
# Idempotent; run as root (or through sudo). The CUDA toolkit is optional and not installed
# here: when /usr/local/cuda exists, the CUDA pieces are built too.
#
# When another apt or dpkg process holds its lock (an unattended upgrade on a fresh machine),
# this waits for it, saying so, for up to ZINF_APT_LOCK_TIMEOUT seconds (default 600), then
# fails. `apt-get install` waits by itself (DPkg::Lock::Timeout); `apt-get update` does not
# (apt 2.6 ignores that option for the lists lock), so it is retried here.
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
  python3-torch
  fortunes fortunes-min
  gnuplot-nox libgnuplot-iostream-dev
  libzip-dev libdeflate-dev clang
  iproute2  # ip netns, tc: tests/comm/netns_fault_test.cc
)
lock_timeout=${ZINF_APT_LOCK_TIMEOUT:-600}
retry_seconds=${ZINF_APT_LOCK_RETRY:-5}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  SUDO=(sudo)
else
  SUDO=()
fi

# apt-get update, retried while another process holds the lists lock, until lock_timeout.
update_package_lists() {
  local deadline=$((SECONDS + lock_timeout)) said=0 rc log
  log=$(mktemp)
  trap 'rm -f "$log"' RETURN
  while :; do
    rc=0
    "${SUDO[@]}" apt-get update -qq 2>"$log" || rc=$?
    if ((rc == 0)); then
      cat "$log" >&2
      return 0
    fi
    if ! grep -q "Could not get lock" "$log"; then
      cat "$log" >&2
      echo "install-deps: apt-get update failed (exit $rc)" >&2
      return "$rc"
    fi
    if ((SECONDS >= deadline)); then
      cat "$log" >&2
      echo "install-deps: gave up after waiting ${lock_timeout} s for the apt lock" \
        "(ZINF_APT_LOCK_TIMEOUT sets the limit)" >&2
      return "$rc"
    fi
    if ((said == 0)); then
      echo "install-deps: another apt/dpkg process holds the package lists lock:" \
        "$(grep -m1 "Could not get lock" "$log")"
      echo "install-deps: waiting for it (up to ${lock_timeout} s)"
      said=1
    fi
    sleep "$retry_seconds"
  done
}

echo "install-deps: installing ${missing[*]}"
update_package_lists
echo "install-deps: apt-get install (waits up to ${lock_timeout} s if another apt/dpkg holds the lock)"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=${lock_timeout}" \
  install -y -q "${missing[@]}"
