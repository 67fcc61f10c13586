#!/usr/bin/env bash
# Configures and builds zinf in ./build (Release). Extra arguments go to CMake's configure
# step, e.g. scripts/build.sh -DZINF_WERROR=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ZINF_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "${ZINF_JOBS:-$(nproc)}"
