#!/usr/bin/env bash
# The prepared GPU check (issue 19): one command for a machine with an NVIDIA GPU and no
# internet (the project's GPU machines: x86-64 Ubuntu, CUDA 13, Python torch 2.11.0+cu130 as
# `python3`, no Debian dev packages). Two halves:
#
#   scripts/gpu-check.sh pack   here, on Debian: fills gpu-bundle/ (git-ignored, 15 MB here)
#                               from a build of zinf against PyPI's torch 2.11 (README,
#                               "Building against torch 2.x"; ZINF_GPU_BUILD names the build
#                               folder, default build-torch2): zinf, the CUDA, NCCL and engine
#                               test binaries, the Debian libraries they need that are not
#                               LibTorch's or the system's, and a text corpus.
#   scripts/gpu-check.sh [run]  there (the device tool carries gpu-bundle/): LibTorch, cuDNN and
#                               NCCL come from that machine's torch; runs, each under a time
#                               limit, in under 10 minutes in all:
#     1. `zinf --version`: CUDA compute must be built in and usable;
#     2. the CUDA accelerator's tests, the NCCL communicator's (1 rank), and the engine's fp32
#        parity suite on the GPU (ZINF_TEST_ACCELERATOR=cuda: every ZeRO stage, CPU and NVMe
#        offload, against plain LibTorch);
#     3. `zinf train`, stage 3, model `small` under a memory budget a third of its model
#        states: the same 20 steps on "cpu" and "cuda" with params and optimizer on NVMe
#        (losses compared step by step, 1e-4 relative), on "cuda" with the layers' saved
#        inputs on NVMe too (zinf.activation_offload; losses compared with the run without),
#        then on "cuda" with CPU offload and with none. Prints each run's tokens/s, planned and measured device peak, the device
#        runtime's allocations per step after the first, and the time blocked per tier.
#   It ends with one line per check, PASS or FAIL, and exits 1 if any failed.
#   scripts/gpu-check.sh config ACCELERATOR OFFLOAD NVME_DIR CSV_DIR [ACTIVATIONS] prints a run's
#   config.
#
# ZINF_GPU_MODEL (small: 3.3 M parameters, 50 MiB of model states), ZINF_GPU_STEPS (20) and
# ZINF_GPU_BUDGET (17MiB: what the NVMe runs need at 1 sample x 64 tokens a micro-batch, so
# the model states are 3x the budget) change the training runs; the CPU-offload and
# no-offload runs get 1GiB.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle="$repo/gpu-bundle"
die() { echo "gpu-check: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------
pack() {
  local build="$repo/${ZINF_GPU_BUILD:-build-torch2}"
  [[ -f $build/CMakeCache.txt ]] || die "no build in $build (README, 'Building against torch 2.x')"
  grep -q '^Torch_DIR:.*site-packages/torch' "$build/CMakeCache.txt" ||
    die "$build is not built against a pip torch (its Torch_DIR is not under site-packages)"
  local binaries=(tools/zinf tests/offload/offload_accelerator_test tests/comm/comm_nccl_test
                  tests/engine/engine_test)
  for b in "${binaries[@]}"; do
    [[ -x $build/$b ]] || die "$build/$b is missing: build it first (cmake --build $build)"
  done
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/data"
  for b in "${binaries[@]}"; do
    strip -o "$bundle/bin/$(basename "$b")" "$build/$b"
  done
  # The libraries ldd resolves outside the pip torch, less the C runtime every machine has
  # (glibc, libstdc++, libgcc_s) and NCCL, which the GPU machine's torch brings.
  local lib
  while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|ld-linux*) ;;
      libstdc++.so.*|libgcc_s.so.*|libnccl.so.*) ;;
      libz.so.*|liblzma.so.*|libbz2.so.*|libzstd.so.*) ;;  # every Ubuntu has these
      *) cp -L "$lib" "$bundle/lib/$(basename "$lib")" ;;
    esac
  done < <(for b in "${binaries[@]}"; do ldd "$build/$b"; done |
             awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v '/site-packages/' | sort -u)
  # The training corpus: Debian's fortunes (the bare run's default), or the project's docs.
  if compgen -G '/usr/share/games/fortunes/*' >/dev/null; then
    find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
      -exec cat {} + >"$bundle/data/corpus.txt"
  else
    cat "$repo"/*.md "$repo"/docs/*.md >"$bundle/data/corpus.txt" 2>/dev/null
  fi
  {
    echo "commit $(git -C "$repo" rev-parse HEAD 2>/dev/null)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "build $build"
    grep -E '^(Torch_DIR|CMAKE_BUILD_TYPE):' "$build/CMakeCache.txt"
    echo "packed $(date -u +%FT%TZ) on $(hostname)"
  } >"$bundle/MANIFEST"
  echo "gpu-check: packed $bundle ($(du -sh "$bundle" | cut -f1)):"
  ls -1 "$bundle/bin" "$bundle/lib" | sed 's/^/  /'
  echo "gpu-check: on the GPU machine: scripts/gpu-check.sh (carry gpu-bundle)"
}

# ---------------------------------------------------------------------------------------------
results=()
record() {  # record NAME STATUS DETAIL
  results+=("$(printf '%-4s  %-34s %s' "$2" "$1" "$3")")
}

# Runs a gtest binary under a time limit; PASS when it printed its own pass line and skipped
# nothing (on a GPU machine a skipped CUDA test means the device was not usable).
gtest() {  # gtest NAME LIMIT_S BINARY ARGS...
  local name=$1 limit=$2
  shift 2
  local log="$work/$name.log" t0=$SECONDS
  echo "---- $name: $* (limit ${limit} s)"
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[ +(OK|FAILED) +\]' "$log" | tail -40
  local ran passed skipped
  ran=$(grep -c '^\[ RUN      \]' "$log")
  passed=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z]' "$log")
  if ((rc == 0 && ran > 0 && passed == ran)) && grep -q '^\[  PASSED  \]' "$log"; then
    record "$name" PASS "$passed/$ran tests, $((SECONDS - t0)) s"
  else
    tail -30 "$log"
    record "$name" FAIL "rc $rc, $passed/$ran tests passed, $skipped skipped, $((SECONDS - t0)) s (log: $log)"
  fi
}

train_config() {  # train_config ACCELERATOR OFFLOAD(nvme|cpu|none) NVME_DIR CSV_DIR [ACTIVATIONS]
  local accel=$1 offload=$2 nvme=$3 csv=$4 activations=${5:-none} param optim
  case $offload in
    # buffer_size: DeepSpeed's default (1e8 elements) would pin 1.6 GB for a 3.3 M model.
    nvme) param="{\"device\": \"nvme\", \"nvme_path\": \"$nvme\", \"max_in_cpu\": 0, \"buffer_count\": 4, \"buffer_size\": 1000000}"
          optim="{\"device\": \"nvme\", \"nvme_path\": \"$nvme\", \"buffer_count\": 4}" ;;
    cpu) param='{"device": "cpu"}'; optim='{"device": "cpu"}' ;;
    none) param='{"device": "none"}'; optim='{"device": "none"}' ;;
  esac
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                           "weight_decay": 0.0}},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "offload_param": $param, "offload_optimizer": $optim,
                        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"},
  "steps_per_print": 1,
  "csv_monitor": {"enabled": true, "output_path": "$csv", "job_name": "run"},
  "zinf": {"accelerator": {"type": "$accel"}, "activation_offload": "$activations"}
}
EOF
}

train() {  # train NAME ACCELERATOR OFFLOAD BUDGET [ACTIVATIONS]
  local name=$1 accel=$2 offload=$3 budget=$4 activations=${5:-none}
  local dir="$work/$name" t0=$SECONDS
  mkdir -p "$dir/nvme" "$dir/csv"
  train_config "$accel" "$offload" "$dir/nvme" "$dir/csv" "$activations" >"$dir/ds_config.json"
  echo "---- train $name: zinf train --config $dir/ds_config.json --model $model --steps $steps --memory-budget $budget"
  timeout 240 "$bundle/bin/zinf" train --config "$dir/ds_config.json" --model "$model" \
    --steps "$steps" --memory-budget "$budget" --data "$bundle/data/corpus.txt" --plot "" \
    --seq-len 64 >"$dir/out.log" 2>&1
  local rc=$?
  sed -n '/^== zinf train/,$p' "$dir/out.log"
  if ((rc == 0)) && [[ -s $dir/csv/run/Train_Samples_train_loss.csv ]]; then
    record "train $name" PASS "$(sed -n 's/^throughput *//p' "$dir/out.log"), $((SECONDS - t0)) s"
  else
    tail -20 "$dir/out.log"
    record "train $name" FAIL "rc $rc, $((SECONDS - t0)) s (log: $dir/out.log)"
  fi
}

compare_losses() {  # compare_losses REF_NAME NAME
  local a="$work/$1/csv/run/Train_Samples_train_loss.csv" b="$work/$2/csv/run/Train_Samples_train_loss.csv"
  if [[ ! -s $a || ! -s $b ]]; then
    record "losses $2 vs $1" FAIL "a loss file is missing"
    return
  fi
  echo "---- losses per step: $1 | $2 | relative difference"
  paste -d, <(tail -n +2 "$a") <(tail -n +2 "$b") | awk -F, -v out="$work/verdict" '
    { step++; rel = ($2 == 0) ? 0 : ($4 - $2) / $2; if (rel < 0) rel = -rel
      if (rel > worst) worst = rel
      printf "  step %2d  %.7f  %.7f  %.2e\n", step, $2, $4, rel }
    END { printf "%d %.3e\n", step, worst > out }'
  local verdict
  verdict=$(cat "$work/verdict")
  local n=${verdict% *} worst=${verdict#* }
  if awk -v w="$worst" -v n="$n" -v s="$steps" 'BEGIN { exit !(w <= 1e-4 && n == s) }'; then
    record "losses $2 vs $1" PASS "$n steps, worst relative difference $worst (limit 1e-4)"
  else
    record "losses $2 vs $1" FAIL "$n of $steps steps, worst relative difference $worst (limit 1e-4)"
  fi
}

run() {
  [[ -x $bundle/bin/zinf ]] || die "no $bundle/bin/zinf: run 'scripts/gpu-check.sh pack' on the build machine and carry gpu-bundle"
  local py=${PYTHON:-python3} torch_dir site
  torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))') ||
    die "$py has no torch (PYTHON=/path/to/python3 picks another)"
  site=$(dirname "$torch_dir")
  local path="$bundle/lib:$torch_dir/lib" d
  for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
    [[ -d $d ]] && path+=":$d"
  done
  export LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  work=$(mktemp -d "${TMPDIR:-/tmp}/zinf-gpu-check.XXXXXX")
  model=${ZINF_GPU_MODEL:-small}
  steps=${ZINF_GPU_STEPS:-20}
  budget=${ZINF_GPU_BUDGET:-17MiB}
  echo "== gpu-check $(date -u +%FT%TZ) on $(hostname); work folder $work"
  sed 's/^/  bundle: /' "$bundle/MANIFEST"
  nvidia-smi -L 2>&1 | sed 's/^/  /'
  "$py" -c 'import torch; print("  python torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
  nproc | sed 's/^/  cores: /'

  echo "---- zinf --version"
  if "$bundle/bin/zinf" --version | tee "$work/version.txt" && grep -q '^cuda compute: yes' "$work/version.txt"; then
    record "zinf --version" PASS "$(grep '^cuda compute' "$work/version.txt")"
  else
    record "zinf --version" FAIL "$(grep '^cuda' "$work/version.txt" | tr '\n' ' ')"
  fi
  gtest cuda-accelerator 120 "$bundle/bin/offload_accelerator_test" --gtest_filter='CudaAccelerator.*'
  gtest nccl-one-rank 120 "$bundle/bin/comm_nccl_test" --gtest_filter='NcclFactory.*:NcclCommunicator.OneRank*'
  ZINF_TEST_ACCELERATOR=cuda gtest engine-parity-cuda 180 "$bundle/bin/engine_test" \
    --gtest_filter='EngineParity.*'

  train cpu-nvme cpu nvme "$budget"
  train cuda-nvme cuda nvme "$budget"
  compare_losses cpu-nvme cuda-nvme
  # The layers' saved inputs to NVMe and back (zinf.activation_offload): the same losses.
  train cuda-nvme-activations cuda nvme "$budget" nvme
  compare_losses cuda-nvme cuda-nvme-activations
  train cuda-cpu-offload cuda cpu 1GiB
  train cuda-no-offload cuda none 1GiB

  echo
  echo "== gpu-check summary (model $model, $steps steps, memory budget $budget; logs in $work)"
  printf '%s\n' "${results[@]}"
  local n
  n=$(printf '%s\n' "${results[@]}" | grep -c '^FAIL')
  echo "== $((${#results[@]} - n)) of ${#results[@]} checks passed"
  ((n == 0))
}

case ${1:-run} in
  pack) pack ;;
  run) run ;;
  # The DeepSpeed config a training run of the check uses: config cpu|cuda nvme|cpu|none
  # NVME_DIR CSV_DIR.
  config) shift; train_config "$@" ;;
  *) die "usage: scripts/gpu-check.sh [pack|run|config ...]" ;;
esac
