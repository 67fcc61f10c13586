#!/usr/bin/env bash
# Builds zinf (Release) and runs the whole test suite with CTest. Extra arguments go to
# CTest, e.g. scripts/test.sh -R Aio. Without them the scripts' own tests run too
# (scripts/test-*.sh: hermetic, fake apt-get and build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh ${ZINF_CMAKE_ARGS:-}
ctest --test-dir "${ZINF_BUILD_DIR:-build}" --output-on-failure --no-tests=error -j "${ZINF_JOBS:-$(nproc)}" "$@"
if (($# == 0)); then
  for t in scripts/test-*.sh; do
    "$t"
  done
fi
