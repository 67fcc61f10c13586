#!/usr/bin/env bash
# Fine-tunes a SmolLM-135M-shaped model (scripts/make-model-with-tokenizer.py --shape
# smollm-135m: its shape, random weights, a BPE tokenizer trained on the text) on text tokenized by
# scripts/tokenize-text.py with that tokenizer, at sequence length 2048, ZeRO stage 3 with
# parameters, optimizer states and the layers' saved inputs (zinf.activation_offload; set
# ACTIVATION_OFFLOAD=none, cpu or nvme, default nvme) on NVMe, with held-out evaluation: the run
# issue 22 asks for, on the machine at hand. Needs .venv/ (scripts/install-venv.sh) and build/tools/zinf.
#
#   bench/finetune/smollm_shaped.sh [WORK_DIR] [STEPS] [-- extra zinf train arguments]
# WORK_DIR (default /var/tmp/zinf-smollm) receives the model folder, the token files, the
# swap folder, the csv_monitor files and the loss plot; TEXT defaults to the fortunes files.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/var/tmp/zinf-smollm}
steps=${2:-10}
activation_offload=${ACTIVATION_OFFLOAD:-nvme}
shift $(($# > 2 ? 2 : $#))
[[ ${1:-} == -- ]] && shift
# The fortunes files (no .dat indexes, no .u8 links) that are UTF-8 text.
if [[ -n ${TEXT:-} ]]; then
  read -r -a texts <<<"$TEXT"
else
  mapfile -t texts < <(python3 -c '
import glob, os
for p in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if os.path.isfile(p) and "." not in os.path.basename(p):
        try:
            open(p, encoding="utf-8").read()
            print(p)
        except UnicodeDecodeError:
            pass')
fi
mkdir -p "$work/swap"
if [[ ! -f $work/smollm-135m-shaped/config.json ]]; then
  .venv/bin/python scripts/make-model-with-tokenizer.py "$work/smollm-135m-shaped" "${texts[@]}" \
    --shape smollm-135m
fi
if [[ ! -f $work/train.u16.json ]]; then
  .venv/bin/python scripts/tokenize-text.py --model "$work/smollm-135m-shaped" --out "$work/train.u16" \
    --eval-out "$work/eval.u16" --eval-fraction 0.02 --separator '\n%\n' "${texts[@]}"
fi
cat > "$work/ds_config.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 2, "warmup_type": "linear"}},
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": "$work/swap", "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$work/swap"},
    "sub_group_size": 1e7
  },
  "csv_monitor": {"enabled": true, "output_path": "$work/csv", "job_name": "smollm"},
  "steps_per_print": 1,
  "zinf": {"activation_offload": "$activation_offload"}
}
JSON
exec build/tools/zinf train --config "$work/ds_config.json" --init-from "$work/smollm-135m-shaped" \
  --data "$work/train.u16" --eval-data "$work/eval.u16" --eval-interval 5 --eval-batches 2 \
  --seq-len 2048 --steps "$steps" --plot "$work/loss.png" "$@"
