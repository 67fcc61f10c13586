#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cc) with clang, ASan and UBSan in build-fuzz and
# runs each for SECONDS seconds (default 30), starting from the checked-in seed corpus
# fuzz/corpus/<format>/ (format = target name without _fuzz) and the dictionary
# fuzz/<format>.dict when present. New corpus entries go to build-fuzz/corpus/<format>/,
# crash reproducers to build-fuzz/artifacts/. Exits non-zero when a target finds a crash.
# Environment: ZINF_FUZZ_BUILD_DIR (default build-fuzz), ZINF_JOBS (build parallelism).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
dir=${ZINF_FUZZ_BUILD_DIR:-build-fuzz}

cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DZINF_FUZZ=ON -DZINF_WITH_TORCH=OFF -DZINF_BUILD_TESTS=OFF -DZINF_BUILD_BENCH=OFF \
  -DZINF_SANITIZE=address,undefined >/dev/null

targets=()
for source in fuzz/*_fuzz.cc; do
  targets+=("$(basename "$source" .cc)")
done
cmake --build "$dir" -j "${ZINF_JOBS:-$(nproc)}" --target "${targets[@]}"

mkdir -p "$dir/artifacts"
for target in "${targets[@]}"; do
  format=${target%_fuzz}
  corpus="$dir/corpus/$format"
  mkdir -p "$corpus"
  args=(-max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$dir/artifacts/$target-"
        -timeout=10 -rss_limit_mb=2048)
  [[ -f fuzz/$format.dict ]] && args+=(-dict="fuzz/$format.dict")
  seeds=()
  [[ -d fuzz/corpus/$format ]] && seeds=("fuzz/corpus/$format")
  log="$dir/$target.log"
  echo "== $target: ${seconds} s =="
  if ! "$dir/fuzz/$target" "${args[@]}" "$corpus" "${seeds[@]}" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "$target failed; reproducers in $dir/artifacts/" >&2
    exit 1
  fi
  # The last status line (coverage, features, corpus) and the speed.
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
done
