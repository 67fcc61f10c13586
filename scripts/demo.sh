#!/usr/bin/env bash
# The main job until `zinf train` exists: builds zinf and measures write then read
# throughput of a temporary file next to the build (removed afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
dir=$(mktemp -d "${ZINF_DEMO_DIR:-$PWD/build}/zinf-io-demo.XXXXXX")
trap 'rm -rf "$dir"' EXIT
build/tools/zinf io "$dir" --size "${ZINF_DEMO_SIZE:-1G}" --write --loops 3
build/tools/zinf io "$dir" --size "${ZINF_DEMO_SIZE:-1G}" --read --loops 3 --validate
