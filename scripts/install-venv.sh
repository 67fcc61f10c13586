#!/usr/bin/env bash
# Makes the project's one Python virtual environment, .venv/ at the repository root
# (git-ignored), with PyPI's torch at the version the project's GPU machines carry (2.11.0,
# a CUDA 13.0 build), so zinf can be built against that torch's LibTorch
# (torch.utils.cmake_prefix_path; README, "Building against torch 2.x") and its binaries run
# there. Packages that other parts of the project need go into `packages` below, pinned.
#
# Idempotent: when every pin is already installed it says so and downloads nothing.
# The venv is made with the first `python3` on PATH (Debian's /usr/bin/python3 has no pip);
# PYTHON=/path/to/python3 picks another one. Needs about 5 GB of disk (torch pulls the CUDA
# 13 runtime libraries, cuDNN and NCCL from PyPI).
set -euo pipefail

# One pin a line, `name==version` (extras allowed: `name[extra]==version`).
packages=(
  torch==2.11.0  # = the GPU machines' Python torch 2.11.0+cu130; PyPI's default wheel is cu130
)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"
python=${PYTHON:-python3}
die() { echo "install-venv: $*" >&2; exit 1; }

for pin in "${packages[@]}"; do
  [[ $pin =~ ^[A-Za-z0-9._-]+(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9.+!-]+$ ]] ||
    die "'$pin' is not pinned as name==version"
done

# A venv whose interpreter no longer runs (its base Python was removed) is made anew.
if [[ -x $venv/bin/python ]] && ! "$venv/bin/python" -c '' 2>/dev/null; then
  echo "install-venv: $venv/bin/python does not run; making the venv anew"
  rm -rf "$venv"
fi
if [[ ! -x $venv/bin/python ]]; then
  command -v "$python" >/dev/null || die "no '$python' on PATH (set PYTHON=/path/to/python3)"
  "$python" -c 'import ensurepip, venv' 2>/dev/null ||
    die "$(command -v "$python") has no venv/ensurepip (Debian's python3 lacks them); " \
        "set PYTHON to a Python with pip"
  echo "install-venv: making $venv with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$python" -m venv "$venv"
fi
vpython="$venv/bin/python"

# The pins not yet installed at their version.
mapfile -t missing < <("$vpython" - "${packages[@]}" <<'EOF'
import importlib.metadata as md
import re
import sys

for pin in sys.argv[1:]:
    name, version = pin.split("==")
    name = re.sub(r"\[.*\]", "", name)
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have != version:
        print(pin)
EOF
)

if ((${#missing[@]} == 0)); then
  echo "install-venv: already installed: ${packages[*]} (nothing to do)"
else
  echo "install-venv: installing ${missing[*]}"
  "$vpython" -m pip install --disable-pip-version-check "${missing[@]}"
fi

echo "install-venv: $venv ($(du -sh "$venv" | cut -f1)) has:"
"$vpython" - "${packages[@]}" <<'EOF'
import importlib.metadata as md
import re
import sys

for pin in sys.argv[1:]:
    name = re.sub(r"\[.*\]", "", pin.split("==")[0])
    print(f"  {name} {md.version(name)}")
EOF
"$vpython" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path)'
