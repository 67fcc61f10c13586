#!/usr/bin/env bash
# The main job: builds zinf, then runs `zinf train` bare — the reference model trained with
# its parameters and optimizer states on NVMe (a temporary swap folder under $TMPDIR or
# /var/tmp, removed at the end) and a CPU "accelerator" budget of 1/4 of its model states,
# on the fortunes corpus, until its loss is below the corpus's unigram entropy. The loss
# curve goes to <build>/zinf-train-loss.png. Extra arguments go to `zinf train`
# (e.g. --steps 20).
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
echo "demo: zinf train (bare: stage 3, params and optimizer on NVMe; a few minutes)"
exec "$build_dir"/tools/zinf train --plot "$build_dir/zinf-train-loss.png" "$@"
