#!/usr/bin/env python3
"""zinf's CPU Adam/AdamW against DeepSpeedCPUAdam on the same params, grads and settings.

Run with the project's venv (scripts/install-venv.sh), from the repository root:

    .venv/bin/python bench/deepspeed/optimizer/bench_ds_adam.py \\
        --worker BUILD/bench/deepspeed/optimizer/zinf_ds_adam_worker

Writes seeded random fp32 params (uniform in [-1, 1)) and grads (normal, sd 0.01) of
--numel elements (default 64 Mi) to a folder in /dev/shm, then, for each configuration and
each round, runs DeepSpeed's worker (ds_adam_worker.py: DeepSpeedCPUAdam, the JIT-built
cpu_adam op) and zinf's (zinf_ds_adam_worker: optimizer_cpu's AdamOptimizer), each a
child process doing --warmup untimed and --steps timed steps on --threads threads, the
two in an order that alternates per round. A round's figure is the median of its timed
steps; the table gives the median of the rounds, ms per step, and the speedup
DeepSpeed / zinf. Configurations:

    adam        Adam with L2 weight decay (adamw_mode false), fp32
    adamw       AdamW (decoupled weight decay), fp32
    adamw+bf16  AdamW, then the updated params copied to a bf16 tensor
    adamw+fp16  AdamW, then the updated params copied to an fp16 tensor

lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, bias correction on, fp32 states
starting at zero, the same grads every step. zinf writes the 16-bit copy in the optimizer's
own pass (StepArgs::param_copy); DeepSpeedCPUAdam 0.19 has no fused copy, so its side runs
torch's copy_ after the step, as DeepSpeed's ZeRO stage 3 does. Both sides' arrays are on
transparent huge pages (zinf madvises them; torch gets THP_MEM_ALLOC_ENABLE=1).

Memory floor: each round also runs zinf's worker with --kernel floor, a loop with Adam's
memory traffic and no arithmetic (p, g, m, v read; p, m, v and the copy written: 28 B/param,
30 with the copy) on the same threads; no Adam step can be faster than that here, so
"floor / x" says how close each side comes to the memory bandwidth.

Agreement: in the first round both workers write their final params (and 16-bit copies);
the table gives max |p_zinf - p_ds|, the same in units of fp32's machine epsilon (2^-23,
one unit in the last place of a value in [1, 2); the params stay within about [-1, 1]),
and how many params differ at all; for the
copies the number of elements whose 16-bit patterns differ and the largest difference.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

CONFIGS = {
    "adam": {"adamw": 0, "copy": "none"},
    "adamw": {"adamw": 1, "copy": "none"},
    "adamw+bf16": {"adamw": 1, "copy": "bf16"},
    "adamw+fp16": {"adamw": 1, "copy": "fp16"},
}


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_worker(cmd, env):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"bench_ds_adam: failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"bench_ds_adam: no JSON line from {' '.join(cmd)}\n{proc.stdout[-2000:]}")
    return json.loads(lines[-1])


def sixteen_bit_as_float(bits, dtype):
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def compare(workdir, name, copy):
    p_ds = np.fromfile(os.path.join(workdir, f"{name}.ds.params"), dtype=np.float32)
    p_zinf = np.fromfile(os.path.join(workdir, f"{name}.zinf.params"), dtype=np.float32)
    diff = np.abs(p_zinf.astype(np.float64) - p_ds)
    result = {"max_abs": float(diff.max()), "max_scale": float(np.abs(p_ds).max()),
              "differ": int(np.count_nonzero(diff))}
    if copy != "none":
        c_ds = np.fromfile(os.path.join(workdir, f"{name}.ds.copy"), dtype=np.uint16)
        c_zinf = np.fromfile(os.path.join(workdir, f"{name}.zinf.copy"), dtype=np.uint16)
        cdiff = np.abs(sixteen_bit_as_float(c_zinf, copy).astype(np.float64) -
                       sixteen_bit_as_float(c_ds, copy))
        result["copy_differ"] = int(np.count_nonzero(c_ds != c_zinf))
        result["copy_max_abs"] = float(cdiff.max())
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "bench", "deepspeed", "optimizer",
                                                     "zinf_ds_adam_worker"),
                    help="zinf_ds_adam_worker binary (default: build/bench/deepspeed/optimizer/)")
    ap.add_argument("--numel", type=int, default=64 << 20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per run, first")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of " + ", ".join(CONFIGS))
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--dir", default="/dev/shm", help="where the input and output arrays go")
    args = ap.parse_args()

    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"bench_ds_adam: unknown config {c} (known: {', '.join(CONFIGS)})")
    if not os.access(args.worker, os.X_OK):
        sys.exit(f"bench_ds_adam: no zinf worker at {args.worker} (build the target zinf_ds_adam_worker)")

    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(args.threads), THP_MEM_ALLOC_ENABLE="1")
    workdir = tempfile.mkdtemp(prefix="bench_ds_adam.", dir=args.dir)
    try:
        rng = np.random.default_rng(args.seed)
        params = os.path.join(workdir, "params.f32")
        grads = os.path.join(workdir, "grads.f32")
        rng.uniform(-1.0, 1.0, args.numel).astype(np.float32).tofile(params)
        (rng.standard_normal(args.numel, dtype=np.float32) * np.float32(0.01)).tofile(grads)

        common = ["--params", params, "--grads", grads, "--steps", str(args.steps), "--warmup",
                  str(args.warmup), "--threads", str(args.threads), "--lr", "1e-3", "--weight-decay", "0.01"]
        ds_cmd = [sys.executable, os.path.join(HERE, "ds_adam_worker.py")] + common
        zinf_cmd = [args.worker] + common
        print(f"bench_ds_adam: {args.numel} fp32 params ({args.numel * 4 / 2**20:.0f} MiB), {args.threads} threads, "
              f"{args.warmup} + {args.steps} steps per run, {args.rounds} interleaved rounds, load average "
              f"{load_average()}")
        print(f"  env: DS_ACCELERATOR=cpu OMP_NUM_THREADS={args.threads} THP_MEM_ALLOC_ENABLE=1")
        print(f"  DeepSpeed: {' '.join(ds_cmd)} --adamw A --copy C")
        print(f"  zinf:      {' '.join(zinf_cmd)} --adamw A --copy C")

        samples = {}  # (config, side) -> [ms per step, one per round]
        agreement = {}
        info = {}
        for rnd in range(args.rounds):
            for name in configs:
                c = CONFIGS[name]
                extra = ["--adamw", str(c["adamw"]), "--copy", c["copy"]]
                sides = [("ds", ds_cmd), ("zinf", zinf_cmd), ("floor", zinf_cmd + ["--kernel", "floor"])]
                shift = rnd % len(sides)
                for side, cmd in sides[shift:] + sides[:shift]:
                    out = []
                    if rnd == 0 and side != "floor":
                        out = ["--out-params", os.path.join(workdir, f"{name}.{side}.params")]
                        if c["copy"] != "none":
                            out += ["--out-copy", os.path.join(workdir, f"{name}.{side}.copy")]
                    result = run_worker(cmd + extra + out, env)
                    ms = statistics.median(result["step_ms"])
                    samples.setdefault((name, side), []).append(ms)
                    info[side] = result
                    print(f"  round {rnd + 1} {name:11} {side:5} {ms:9.2f} ms/step "
                          f"(steps {min(result['step_ms']):.2f}-{max(result['step_ms']):.2f})", flush=True)
                if rnd == 0:
                    agreement[name] = compare(workdir, name, c["copy"])
                    for f in os.listdir(workdir):
                        if f.startswith(name + "."):
                            os.unlink(os.path.join(workdir, f))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"zinf: simd {info['zinf'].get('simd')}, optimizer {info['zinf'].get('optimizer')}; DeepSpeed: "
          f"torch {info['ds'].get('torch')}, {info['ds'].get('os_threads')} OS threads in the worker")
    print(f"median of {args.rounds} rounds, ms/step ({args.numel} params, {args.threads} threads); "
          f"load average at the end {load_average()}")
    print(f"{'config':11} {'DeepSpeedCPUAdam':>17} {'zinf':>9} {'zinf speedup':>13} {'floor':>7} "
          f"{'floor/ds':>8} {'floor/zinf':>10} {'max|dp|':>10} "
          f"{'/ 2^-23':>7} {'params differ':>14} {'16-bit copy: differ, max|d|':>28}")
    worst = None
    for name in configs:
        ds = statistics.median(samples[(name, "ds")])
        zinf = statistics.median(samples[(name, "zinf")])
        floor = statistics.median(samples[(name, "floor")])
        speedup = ds / zinf
        worst = speedup if worst is None else min(worst, speedup)
        a = agreement[name]
        copy = f"{a['copy_differ']} of {args.numel}, {a['copy_max_abs']:.2e}" if "copy_differ" in a else "-"
        print(f"{name:11} {ds:17.2f} {zinf:9.2f} {speedup:12.2f}x {floor:7.2f} {floor / ds:8.2f} "
              f"{floor / zinf:10.2f} {a['max_abs']:10.2e} {a['max_abs'] / 2**-23:7.1f} {a['differ']:14d} {copy:>28}")
    scale = max(a["max_scale"] for a in agreement.values())
    print(f"lowest speedup {worst:.2f}x (target >= 1.5x); params compared after {args.warmup + args.steps} steps "
          f"(max |p| {scale:.3f})")


if __name__ == "__main__":
    main()
