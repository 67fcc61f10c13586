"""The DeepSpeed side of bench_ds_adam.py (run with .venv/bin/python).

Reads fp32 params and grads from raw files, runs DeepSpeedCPUAdam (the JIT-built cpu_adam
op) over them for --warmup untimed and --steps timed steps with the same grads every step,
and prints one JSON line with each timed step's milliseconds. With --copy bf16|fp16 each
step also copies the updated fp32 params into a 16-bit tensor with torch's copy_, which is
how DeepSpeed 0.19's ZeRO stage 3 refreshes its 16-bit partition after a CPU step
(`fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)`):
DeepSpeedCPUAdam 0.19 has no fused copy-out (its op binds adam_update, adam_rollback,
create_adam and destroy_adam only).

Threads: the driver sets OMP_NUM_THREADS (cpu_adam's OpenMP loop) and this script
torch.set_num_threads (torch's copy_) to --threads.
"""
import argparse
import json
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from deepspeed.ops.adam import DeepSpeedCPUAdam  # noqa: E402


def read_fp32(path):
    numel = os.path.getsize(path) // 4
    t = torch.empty(numel, dtype=torch.float32)
    with open(path, "rb") as f:
        if f.readinto(t.numpy()) != numel * 4:
            raise SystemExit(f"ds_adam_worker: short read of {path}")
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", required=True)
    ap.add_argument("--grads", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adamw", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--copy", choices=["none", "bf16", "fp16"], default="none")
    ap.add_argument("--out-params")
    ap.add_argument("--out-copy")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    param = torch.nn.Parameter(read_fp32(args.params), requires_grad=False)
    param.grad = read_fp32(args.grads)
    if param.grad.numel() != param.numel():
        raise SystemExit("ds_adam_worker: --params and --grads differ in size")
    opt = DeepSpeedCPUAdam([param], lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                           weight_decay=args.weight_decay, adamw_mode=bool(args.adamw))
    copy = None
    if args.copy != "none":
        copy = torch.zeros(param.numel(), dtype=torch.bfloat16 if args.copy == "bf16" else torch.float16)

    step_ms = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.step()
        if copy is not None:
            copy.copy_(param.data)
        ms = (time.perf_counter() - start) * 1e3
        if i >= args.warmup:
            step_ms.append(round(ms, 4))

    if args.out_params:
        param.data.numpy().tofile(args.out_params)
    if args.out_copy and copy is not None:
        copy.view(torch.int16).numpy().tofile(args.out_copy)
    print(json.dumps({"numel": param.numel(), "threads": args.threads,
                      "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                      "os_threads": len(os.listdir("/proc/self/task")),
                      "torch": torch.__version__, "step_ms": step_ms}))


if __name__ == "__main__":
    main()
