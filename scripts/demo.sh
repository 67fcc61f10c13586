#!/usr/bin/env bash
# The main job until `zinf train` exists: builds zinf and measures write then read
# throughput of a temporary file next to the build (removed afterwards).
#
# The build prints one line per stage and a progress line at every tenth of the build
# steps (ninja's [done/total] counter); its full output goes to <build>/demo-build.log and
# is printed when the build fails. ZINF_BUILD_DIR (default build) and ZINF_JOBS are passed to
# scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ZINF_BUILD_DIR:-build}
mkdir -p "$build_dir"
log=$build_dir/demo-build.log
echo "demo: configuring and building zinf (Release, ${ZINF_JOBS:-$(nproc)} jobs; full log in $log)"
start=$SECONDS
rc=0
scripts/build.sh 2>&1 | tee "$log" | {
  stage=configure
  shown=-1
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      if [[ $stage == configure ]]; then
        stage=build
        echo "demo: configured in $((SECONDS - start)) s; compiling ${BASH_REMATCH[2]} steps"
      fi
      done_steps=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
      tenth=$((done_steps * 10 / total))
      if ((tenth > shown)); then
        shown=$tenth
        echo "demo: build [$done_steps/$total] $((SECONDS - start)) s"
      fi
    elif [[ $line == "ninja: no work to do." ]]; then
      echo "demo: build up to date"
    fi
  done
} || rc=$?
if ((rc != 0)); then
  echo "demo: build failed (exit $rc); its output:" >&2
  cat "$log" >&2
  exit "$rc"
fi
echo "demo: built in $((SECONDS - start)) s"
dir=$(mktemp -d "${ZINF_DEMO_DIR:-$build_dir}/zinf-io-demo.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$build_dir"/tools/zinf io "$dir" --size "${ZINF_DEMO_SIZE:-1G}" --write --loops 3
"$build_dir"/tools/zinf io "$dir" --size "${ZINF_DEMO_SIZE:-1G}" --read --loops 3 --validate
