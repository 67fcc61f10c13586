#!/usr/bin/env bash
# Builds zinf (Release) and runs the whole test suite with CTest. Extra arguments go to
# CTest, e.g. scripts/test.sh -R Aio.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh ${ZINF_CMAKE_ARGS:-}
ctest --test-dir "${ZINF_BUILD_DIR:-build}" --output-on-failure --no-tests=error -j "${ZINF_JOBS:-$(nproc)}" "$@"
