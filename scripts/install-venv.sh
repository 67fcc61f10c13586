#!/usr/bin/env bash
# Makes the project's one Python virtual environment, .venv/ at the repository root
# (git-ignored), with PyPI's torch at the version the project's GPU machines carry (2.11.0,
# a CUDA 13.0 build), so zinf can be built against that torch's LibTorch
# (torch.utils.cmake_prefix_path; README, "Building against torch 2.x") and its binaries run
# there; and with the peer zinf is measured against (README, Measured figures, "Against DeepSpeed 0.19"):
# DeepSpeed 0.19, transformers, safetensors and huggingface_hub. Packages that other parts of
# the project need go into the lists below, pinned.
#
# DeepSpeed ships as a source distribution whose setup.py imports torch, so it is installed
# in a second pip run, after torch, without build isolation (an isolated build would not see
# torch and records no torch version). Its ops are not compiled at install time
# (DS_BUILD_OPS=0); instead, once everything is installed, the script JIT-builds the two ops
# the benchmarks use, `cpu_adam` and `async_io` (which loads `pin_memory`), for DeepSpeed's
# CPU accelerator (DS_ACCELERATOR=cpu), into torch's extension cache (TORCH_EXTENSIONS_DIR,
# default ~/.cache/torch_extensions), and prints ds_report's verdicts.
#
# The JIT builds need these Debian packages (the script checks for them and says what is
# missing; it installs nothing with apt):
#   g++          (build-essential)  the compiler torch.utils.cpp_extension calls
#   ninja-build                     torch's JIT builds run ninja (the pip `ninja` that
#                                   DeepSpeed pulls in also provides one)
#   libaio-dev                      async_io includes <libaio.h> and links -laio
#   python3-dev  or any Python.h of the venv's interpreter
# MAX_JOBS=N limits the JIT builds' parallel compiles (torch's default: as many as cores;
# async_io's took 11.5 min at a load average of 5 here).
#
# Idempotent: when every pin is already installed it says so and downloads nothing, and the
# JIT builds find their cached objects (ninja: no work to do).
# `--torch-only`: torch alone, for building zinf against it (README, "Building against torch
# 2.x"): no peer packages, no JIT builds, no Debian packages checked.
# `--no-jit`: every package, but no JIT builds and no Debian packages checked: enough for the
# tests of label "deepspeed" that load zinf's files with transformers (CI's torch 2.x stage),
# not for bench/deepspeed.
#
# The venv is made with the first `python3` on PATH (Debian's /usr/bin/python3 has no pip);
# PYTHON=/path/to/python3 picks another one. Needs about 5 GB of disk (torch pulls the CUDA
# 13 runtime libraries, cuDNN and NCCL from PyPI).
set -euo pipefail

# One pin a line, `name==version` (extras allowed: `name[extra]==version`).
# First pip run: torch, and what the second run needs to build DeepSpeed without isolation.
packages=(
  torch==2.11.0  # = the GPU machines' Python torch 2.11.0+cu130; PyPI's default wheel is cu130
  wheel==0.48.0  # setuptools' bdist_wheel, for the non-isolated DeepSpeed build
)
# Second pip run, after torch, --no-build-isolation.
peer_packages=(
  deepspeed==0.19.8        # the newest 0.19 release; requires torch>=2.0
  transformers==5.24.0     # requires torch>=2.6, huggingface-hub>=1.31,<3, safetensors>=0.8
  safetensors==0.8.0
  huggingface_hub==2.4.0
)

torch_only=0
no_jit=0
for arg in "$@"; do
  case $arg in
    --torch-only) torch_only=1 ;;
    --no-jit) no_jit=1 ;;
    *) echo "install-venv: unknown argument '$arg' (usage: scripts/install-venv.sh [--torch-only | --no-jit])" >&2
       exit 2 ;;
  esac
done
((torch_only)) && no_jit=1
if ((torch_only)); then
  packages=("${packages[0]}")  # the torch pin
  peer_packages=()
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"
python=${PYTHON:-python3}
die() { echo "install-venv: $*" >&2; exit 1; }

for pin in "${packages[@]}" "${peer_packages[@]}"; do
  [[ $pin =~ ^[A-Za-z0-9._-]+(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9.+!-]+$ ]] ||
    die "'$pin' is not pinned as name==version"
done

# The tools the JIT builds need, checked before anything is downloaded.
missing_debs=()
if ((!no_jit)); then
  command -v g++ >/dev/null || missing_debs+=(g++)
  command -v ninja >/dev/null || missing_debs+=(ninja-build)
  if ! printf '#include <libaio.h>\nint main(){io_context_t c=0;return io_setup(1,&c);}\n' |
      g++ -x c++ - -o /dev/null -laio 2>/dev/null; then
    missing_debs+=(libaio-dev)
  fi
  if ((${#missing_debs[@]})); then
    die "the DeepSpeed JIT builds need Debian packages that are missing: ${missing_debs[*]}" \
        "(install them with: apt-get install -y ${missing_debs[*]})"
  fi
fi

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
include=$("$vpython" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
((no_jit)) || [[ -f $include/Python.h ]] ||
  die "no Python.h in $include: the JIT builds need the interpreter's headers (python3-dev)"

# Prints the pins among "$@" not installed at their version.
missing_pins() {
  "$vpython" - "$@" <<'EOF'
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
}

export DS_ACCELERATOR=cpu  # DeepSpeed's CPU accelerator, here and for the JIT builds below
export DS_BUILD_OPS=0      # ops are JIT-built, not compiled into the install

install_start=$SECONDS
mapfile -t missing < <(missing_pins "${packages[@]}")
mapfile -t missing_peer < <(missing_pins "${peer_packages[@]}")
if ((${#missing[@]} + ${#missing_peer[@]} == 0)); then
  echo "install-venv: already installed: ${packages[*]} ${peer_packages[*]} (nothing to do)"
else
  if ((${#missing[@]})); then
    echo "install-venv: installing ${missing[*]}"
    "$vpython" -m pip install --disable-pip-version-check "${missing[@]}"
  fi
  if ((${#missing_peer[@]})); then
    echo "install-venv: installing ${missing_peer[*]} (no build isolation: setup.py imports torch)"
    # The whole list again, so that pip resolves the peer packages together.
    "$vpython" -m pip install --disable-pip-version-check --no-build-isolation \
      "${peer_packages[@]}"
  fi
  echo "install-venv: pip took $((SECONDS - install_start)) s"
fi

echo "install-venv: $venv ($(du -sh "$venv" | cut -f1)) has:"
"$vpython" - "${packages[@]}" "${peer_packages[@]}" <<'EOF'
import importlib.metadata as md
import re
import sys

for pin in sys.argv[1:]:
    name = re.sub(r"\[.*\]", "", pin.split("==")[0])
    print(f"  {name} {md.version(name)}")
EOF
"$vpython" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path)'

if ((no_jit)); then
  echo "install-venv: no JIT builds (${1:-}): bench/deepspeed needs scripts/install-venv.sh without it"
  exit 0
fi

# JIT-builds (or finds built) DeepSpeed's cpu_adam and async_io for the CPU accelerator.
jit_start=$SECONDS
echo "install-venv: JIT-building DeepSpeed's cpu_adam and async_io (DS_ACCELERATOR=cpu," \
     "cache ${TORCH_EXTENSIONS_DIR:-~/.cache/torch_extensions}; minutes the first time)"
"$vpython" - <<'EOF'
import time

from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder

for builder in (CPUAdamBuilder(), AsyncIOBuilder()):  # async_io loads pin_memory first
    start = time.monotonic()
    module = builder.load()
    print(f"install-venv: {builder.name}: built or found and loaded in "
          f"{time.monotonic() - start:.1f} s: {module.__file__}")
EOF
echo "install-venv: JIT step took $((SECONDS - jit_start)) s"

# ds_report's verdicts: "installed" is [NO] for every op because none is compiled into the
# install (JIT); "compatible" [OKAY] means this machine can JIT-build it. The JIT-built ops
# are listed above it.
"$venv/bin/ds_report" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g' | sed -n '/^JIT compiled ops requires ninja/,$p'
