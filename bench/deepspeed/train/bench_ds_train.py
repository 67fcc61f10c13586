#!/usr/bin/env python3
"""`zinf train` against DeepSpeed 0.19 training the same Hugging Face Llama folder, with the
same ds_config.json, on the same samples in the same order, fp32, on the CPU.

Run with the project's venv (scripts/install-venv.sh), from the repository root:

    .venv/bin/python bench/deepspeed/train/bench_ds_train.py --zinf build-torch2/tools/zinf

(build-torch2: zinf built against .venv's torch, so both sides compute with the same
kernels). What it does, in a fresh temporary folder (--dir, default /var/tmp) per shape:

  1. transformers writes a randomly initialised LlamaForCausalLM (seeded, fp32) with
     save_pretrained: zinf's `small` shape (hidden 256, 4 layers, 8 heads, intermediate
     688, vocab 256; engine/model/llama.cc) and, with --shapes small,125m, its `125m` shape
     (hidden 768, 12 layers, 12 heads, intermediate 2048) with a vocab of --vocab-125m;
  2. one token file tokens.u16 (the fortunes corpus zinf trains on by default, each byte a
     token id, as flat little-endian uint16: what `zinf train --data *.u16` reads) and one
     ds_config.json per (mode, ranks): fp32, AdamW (explicit lr, betas, eps, weight decay),
     gradient_clipping, ZeRO stage 3, the same global batch for 1 and 2 ranks (the micro
     batch halves on 2), and per mode
        none  no offload
        cpu   offload_optimizer cpu
        nvme  offload_param and offload_optimizer nvme, nvme_path a fresh folder per run;
  3. for each round, each mode and each rank count, DeepSpeed (ds_train_worker.py, which
     takes zinf's samples in zinf's order) and `zinf train --init-from` (the order of the
     two alternating per round), 1 rank as a plain process with RANK/WORLD_SIZE/MASTER_*
     set, 2 ranks under .venv/bin/torchrun (gloo on loopback for both); OMP_NUM_THREADS is
     cores / ranks for both;
  4. each rank runs under GNU time (/usr/bin/time -f): the table's peak RSS is the sum of
     the ranks' ru_maxrss (where time is missing: VmHWM polled from /proc and summed over the
     tree, torchrun's agent apart, which misses a peak in the last poll period and adds
     the peaks of processes a rank starts and ends, e.g. a JIT load's compiler; not
     getrusage of the child, whose ru_maxrss counts the RSS of this driver, which forked it,
     before its exec). While a
     run lasts it polls /proc of every process in the launched tree every --poll seconds for
     read_bytes / write_bytes of /proc/PID/io read_bytes / write_bytes of /proc/PID/io (what reached or came from the
     block layer). Rank 0's per-step line is time-stamped as it arrives; the counters are
     read at the line of step 1 and at the line of the last step, so s/step, tokens/s and
     bytes/step are over steps 2..N (step 1 is warm-up and is excluded). The loss of every
     step comes from zinf's csv_monitor file (full precision) and from the worker's lines.

The table per shape gives, per (mode, ranks), the median over rounds of each figure for both
runtimes, zinf / DeepSpeed, and the largest relative difference of the step losses
(|l_zinf - l_ds| / l_ds over all steps; the target is 1e-3 over 20 steps in fp32).

    --consolidate  (part 4) after the training matrix, runs DeepSpeed's zero_to_fp32.py and
                   `zinf zero-to-fp32` on the checkpoint each side saved in its 2-rank
                   `--save-mode` run: time, peak RSS and whether the outputs are equal.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
VENV = os.path.join(ROOT, ".venv", "bin")
WORKER = os.path.join(HERE, "ds_train_worker.py")

# zinf's named shapes (engine/model/llama.cc named_llama): hidden, layers, heads, intermediate.
SHAPES = {
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 688},
    "125m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 2048},
}
MODES = ("none", "cpu", "nvme")
STEP_ZINF = re.compile(r"^step (\d+) \| loss ")
STEP_DS = re.compile(r"^ds-step (\d+) loss (\S+) ")
# Each rank runs under GNU time, which prints its peak RSS (ru_maxrss: the largest of the rank
# and the processes it waited for, never their sum) when it exits.
TIME = "/usr/bin/time"
MAXRSS = re.compile(r"zinf-bench-maxrss-kib (\d+)")
FORTUNES = "/usr/share/games/fortunes"
WAIT_POLICY = [""]  # --omp-wait-policy, for both runtimes' processes


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---- inputs ------------------------------------------------------------------------------------


def write_model(folder, shape, vocab, seq_len, seed):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=vocab,
        num_key_value_heads=dims["num_attention_heads"],
        max_position_embeddings=max(seq_len, 2048),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        **dims,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def write_tokens(path, min_tokens):
    """The fortunes text (sorted files, less .dat and .u8, as zinf's default corpus), each
    byte a uint16 token id, repeated until it holds min_tokens."""
    import numpy as np

    text = bytearray()
    if os.path.isdir(FORTUNES):
        for name in sorted(os.listdir(FORTUNES)):
            p = os.path.join(FORTUNES, name)
            if os.path.isfile(p) and not name.endswith((".dat", ".u8")):
                with open(p, "rb") as f:
                    text += f.read()
    if not text:  # no fortunes package: a seeded random byte stream still trains and compares
        text = bytearray(np.random.default_rng(21).integers(32, 127, size=1 << 20, dtype=np.uint8).tobytes())
    ids = np.frombuffer(bytes(text), dtype=np.uint8).astype("<u2")
    while len(ids) < min_tokens:
        ids = np.concatenate([ids, ids])
    ids.tofile(path)
    return len(ids)


def ds_config(mode, ranks, args, nvme_path, largest_param, csv_dir):
    micro = args.global_batch // (ranks * args.grad_accum)
    zero = {
        "stage": 3,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "reduce_bucket_size": 5e6,
        "stage3_prefetch_bucket_size": 5e6,
        "stage3_param_persistence_threshold": 1e4,
        "sub_group_size": 1e9,
    }
    if mode == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif mode == "nvme":
        # DeepSpeed's param swap buffers must each hold the largest parameter (its default,
        # 1e8 elements x 5 buffers, would pin 2 GB).
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_path, "buffer_count": 5,
                                 "buffer_size": int(largest_param), "max_in_cpu": 0}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_path, "buffer_count": 4}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.global_batch,
        "steps_per_print": 1,
        "gradient_clipping": args.clip,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "zero_optimization": zero,
        "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
                "single_submit": False, "overlap_events": True},
        "csv_monitor": {"enabled": True, "output_path": csv_dir, "job_name": "run"},
    }


# ---- one measured run ---------------------------------------------------------------------------


def tree(root):
    """root and its descendants (via /proc/PID/task/*/children)."""
    pids, pending = [], [root]
    while pending:
        pid = pending.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pending.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def read_proc(pid):
    """(VmHWM bytes, read_bytes, write_bytes, cmdline) or None when gone."""
    try:
        hwm = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        io = {}
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, v = line.split(":")
                io[k] = int(v)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        return hwm, io["read_bytes"], io["write_bytes"], cmd
    except (OSError, KeyError, ValueError):
        return None


class Watch:
    """Polls a process tree: per pid the largest VmHWM and the latest io counters."""

    def __init__(self, root, launcher_pid, period):
        self.root, self.launcher_pid, self.period = root, launcher_pid, period
        self.hwm, self.io, self.cmd = {}, {}, {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self):
        with self.lock:
            for pid in tree(self.root):
                r = read_proc(pid)
                if r is None:
                    continue
                self.hwm[pid] = max(self.hwm.get(pid, 0), r[0])
                self.io[pid] = (r[1], r[2])
                if r[3]:  # a zombie's cmdline is empty
                    self.cmd[pid] = r[3]
            return sum(v[0] for v in self.io.values()), sum(v[1] for v in self.io.values())

    def _run(self):
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.period)

    def stop(self):
        self.done.set()
        self.thread.join()

    def largest(self):
        """'NNN MiB: cmdline' of the process with the largest peak (not the launcher)."""
        procs = [(v, self.cmd.get(pid, "?")) for pid, v in self.hwm.items() if pid != self.launcher_pid]
        if not procs:
            return "-"
        v, cmd = max(procs)
        return f"{v / 2**20:.0f} MiB of {len(procs)} process(es): {cmd[:100]}"

    def peak_rss(self):
        """(sum of the ranks' peaks, the launcher's peak or 0)."""
        ranks = sum(v for pid, v in self.hwm.items() if pid != self.launcher_pid)
        return ranks, self.hwm.get(self.launcher_pid, 0)


def run_measured(cmd, env, step_re, steps, ranks, log_path, poll, timeout):
    """Runs cmd; returns a dict of the measurements, or {"error": text}."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        launcher = proc.pid if "torchrun" in os.path.basename(cmd[0]) else None
        watch = Watch(proc.pid, launcher, poll)
        marks = {}  # step -> (time, read, written)
        lines = []

        def killer():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

        timer = threading.Timer(timeout, killer)
        timer.start()
        for line in proc.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
            m = step_re.match(line)
            if m and int(m.group(1)) in (1, steps):
                read, written = watch.sample()
                marks[int(m.group(1))] = (time.perf_counter(), read, written)
        rc = proc.wait()
        timer.cancel()
        watch.stop()
    wall = time.perf_counter() - start
    if rc != 0 or 1 not in marks or steps not in marks:
        tail = "\n".join(lines[-25:])
        return {"error": f"exit code {rc}{' (killed after %d s)' % timeout if rc == -9 else ''}; last lines:\n{tail}",
                "lines": lines}
    (t1, r1, w1), (tn, rn, wn) = marks[1], marks[steps]
    ranks_rss, launcher_rss = watch.peak_rss()
    polled_rss = ranks_rss
    timed = [int(m.group(1)) * 1024 for m in map(MAXRSS.search, lines) if m]
    if len(timed) == ranks:  # exact, where GNU time is there; else the polled sum
        ranks_rss = sum(timed)
    return {
        "s_per_step": (tn - t1) / (steps - 1),
        "read_per_step": (rn - r1) / (steps - 1),
        "write_per_step": (wn - w1) / (steps - 1),
        "peak_rss": ranks_rss,
        "launcher_rss": launcher_rss,
        "polled_rss": polled_rss,
        "largest": watch.largest(),
        "wall": wall,
        "lines": lines,
    }


def base_env(ranks, port):
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
    env["PYTHONUNBUFFERED"] = "1"
    if WAIT_POLICY[0]:
        env["OMP_WAIT_POLICY"] = WAIT_POLICY[0]
    if ranks == 1:
        env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    return env


def launch(ranks, port, program):
    if ranks == 1:
        return program
    return [os.path.join(VENV, "torchrun"), "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1",
            "--master_port", str(port), "--monitor_interval", "0.2", "--no_python"] + program


def run_one(runtime, mode, ranks, shape_dir, args, tokens_path, largest, save):
    """One run in a fresh folder; returns the measurement dict with 'losses' and 'cmd'."""
    run_dir = tempfile.mkdtemp(prefix=f"{runtime}-{mode}-{ranks}r-", dir=shape_dir)
    nvme = os.path.join(run_dir, "swap")
    os.makedirs(nvme)
    csv_dir = os.path.join(run_dir, "csv")
    cfg = ds_config(mode, ranks, args, nvme, largest, csv_dir)
    cfg_path = os.path.join(run_dir, "ds_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    model = os.path.join(shape_dir, "model")
    port = 29500 + (os.getpid() + hash((runtime, mode, ranks))) % 2000
    ckpt = os.path.join(run_dir, "ckpt") if save else ""
    if runtime == "zinf":
        program = [args.zinf, "train", "--init-from", model, "--config", cfg_path, "--data", tokens_path,
                   "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--seed", str(args.seed),
                   "--plot", ""]
        if ckpt:
            program += ["--save", ckpt]
        step_re = STEP_ZINF
    else:
        program = [os.path.join(VENV, "python"), WORKER, "--model", model, "--config", cfg_path, "--data",
                   tokens_path, "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--seed",
                   str(args.seed)]
        if ckpt:
            program += ["--save", ckpt]
        step_re = STEP_DS
    if os.access(TIME, os.X_OK):
        program = [TIME, "-f", "zinf-bench-maxrss-kib %M"] + program
    cmd = launch(ranks, port, program)
    r = run_measured(cmd, base_env(ranks, port), step_re, args.steps, ranks, os.path.join(run_dir, "log.txt"),
                     args.poll, args.timeout)
    r["cmd"] = cmd
    r["dir"] = run_dir
    r["config"] = cfg_path
    if "error" not in r:
        if runtime == "zinf":
            csv = os.path.join(csv_dir, "run", "Train_Samples_train_loss.csv")
            with open(csv) as f:
                rows = [line.strip().split(",") for line in f.readlines()[1:] if line.strip()]
            r["losses"] = [float(v) for _, v in rows]
        else:
            r["losses"] = [float(m.group(2)) for m in map(STEP_DS.match, r["lines"]) if m]
        if len(r["losses"]) != args.steps:
            r["error"] = f"{len(r['losses'])} step losses, not {args.steps}"
    shutil.rmtree(nvme, ignore_errors=True)  # the swap files; the rest goes with the shape folder
    return r


# ---- the table -------------------------------------------------------------------------------


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def per_step(b):
    return f"{b / 2**20:.2f} MiB" if b >= 2**16 else f"{b / 1024:.1f} KiB"


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def median_of(runs, key):
    return statistics.median(r[key] for r in runs)


def print_table(shape, results, args, tokens_per_step):
    print(f"\n### {shape}: {args.steps} steps, {tokens_per_step} tokens/step "
          f"(global batch {args.global_batch} x seq_len {args.seq_len}; grad_accum {args.grad_accum}), "
          f"{args.rounds} round(s), medians; step 1 excluded from s/step, tokens/s and bytes/step\n")
    print("| mode | ranks | DS s/step | zinf s/step | DS tokens/s | zinf tokens/s | zinf / DS tokens/s "
          "| DS peak RSS | zinf peak RSS | zinf / DS RSS | DS read/step | zinf read/step "
          "| DS written/step | zinf written/step | max rel. loss diff (step) |")
    print("| --- " * 15 + "|")
    for (mode, ranks), by in results.items():
        ds, zf = by.get("deepspeed", []), by.get("zinf", [])
        ok_ds = [r for r in ds if "error" not in r]
        ok_zf = [r for r in zf if "error" not in r]

        def cell(runs, key, fmt):
            return fmt(median_of(runs, key)) if runs else "failed"

        tps = lambda runs: tokens_per_step / median_of(runs, "s_per_step") if runs else 0.0  # noqa: E731
        diff = "-"
        if ok_ds and ok_zf:
            a, b = ok_zf[0]["losses"], ok_ds[0]["losses"]
            rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
            worst = max(range(len(rel)), key=rel.__getitem__)
            diff = f"{rel[worst]:.2e} ({worst + 1})"
        print(f"| {mode} | {ranks} | {cell(ok_ds, 's_per_step', '{:.3f}'.format)} "
              f"| {cell(ok_zf, 's_per_step', '{:.3f}'.format)} "
              f"| {tps(ok_ds):.0f} | {tps(ok_zf):.0f} | {ratio(tps(ok_zf), tps(ok_ds))} "
              f"| {cell(ok_ds, 'peak_rss', mib)} | {cell(ok_zf, 'peak_rss', mib)} "
              f"| {ratio(median_of(ok_zf, 'peak_rss'), median_of(ok_ds, 'peak_rss')) if ok_ds and ok_zf else '-'} "
              f"| {cell(ok_ds, 'read_per_step', per_step)} | {cell(ok_zf, 'read_per_step', per_step)} "
              f"| {cell(ok_ds, 'write_per_step', per_step)} | {cell(ok_zf, 'write_per_step', per_step)} "
              f"| {diff} |")
    print("\nstep losses (round 1), DeepSpeed / zinf:")
    for (mode, ranks), by in results.items():
        for runtime in ("deepspeed", "zinf"):
            runs = by.get(runtime, [])
            if runs and "error" not in runs[0]:
                print(f"  {mode} {ranks}r {runtime:9s} " + " ".join(f"{x:.6f}" for x in runs[0]["losses"]))
    for (mode, ranks), by in results.items():
        for runtime, runs in by.items():
            for r in runs:
                if "error" in r:
                    print(f"\nFAILED: {runtime} {mode} {ranks} rank(s): {' '.join(r['cmd'])}\n{r['error']}")


# ---- main -----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zinf", default=os.path.join(ROOT, "build-torch2", "tools", "zinf"))
    ap.add_argument("--shapes", default="small", help="comma-separated, of " + ", ".join(SHAPES))
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--modes-125m", default="none,nvme", help="the modes the 125m shape runs")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--ranks-125m", default="1,2", help="the rank counts the 125m shape runs")
    ap.add_argument("--omp-wait-policy", default="", help="OMP_WAIT_POLICY for both sides (default: unset)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--steps-125m", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=8, help="samples per step over all ranks")
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient_clipping")
    ap.add_argument("--seed", type=int, default=1234, help="the weights' and the data order's seed")
    ap.add_argument("--vocab-125m", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between /proc samples")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds before a run is killed")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary folders go (swap files too)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    ap.add_argument("--consolidate", action="store_true", help="part 4: zero_to_fp32 on both sides' checkpoints")
    ap.add_argument("--consolidate-rounds", type=int, default=3)
    args = ap.parse_args()
    WAIT_POLICY[0] = args.omp_wait_policy
    if not os.access(args.zinf, os.X_OK):
        sys.exit(f"bench_ds_train: no zinf at {args.zinf} (cmake --build build-torch2 --target zinf)")

    print(f"bench_ds_train: load average {load_average()} at the start; {os.cpu_count()} cores; zinf {args.zinf}; "
          f"OMP_NUM_THREADS cores / ranks; OMP_WAIT_POLICY {args.omp_wait_policy or 'unset (libgomp default: spin, then sleep)'}")
    print(" ".join([os.path.basename(sys.executable)] + sys.argv))
    top = tempfile.mkdtemp(prefix="bench-ds-train-", dir=args.dir)
    consolidation = []
    try:
        for shape in args.shapes.split(","):
            small = shape == "small"
            run_args = argparse.Namespace(**vars(args))
            if not small:
                run_args.steps = args.steps_125m
            modes = (args.modes if small else args.modes_125m).split(",")
            shape_dir = os.path.join(top, shape)
            os.makedirs(shape_dir)
            vocab = 256 if small else args.vocab_125m
            params = write_model(os.path.join(shape_dir, "model"), shape, vocab, args.seq_len, args.seed)
            tokens_path = os.path.join(shape_dir, "tokens.u16")
            n_tokens = write_tokens(tokens_path, run_args.steps * args.global_batch * (args.seq_len + 1) * 2)
            largest = vocab * SHAPES[shape]["hidden_size"]
            print(f"\n{shape}: {params / 1e6:.2f} M parameters (vocab {vocab}), {shape_dir}/model; "
                  f"{n_tokens} tokens in {tokens_path}")
            results = {}
            for rnd in range(args.rounds):
                for i, (mode, ranks) in enumerate((m, int(r)) for m in modes for r in (args.ranks if small else args.ranks_125m).split(",")):
                    order = ("deepspeed", "zinf") if (rnd + i) % 2 == 0 else ("zinf", "deepspeed")
                    for runtime in order:
                        save = args.consolidate and rnd == 0 and small and mode == "none" and ranks == 2
                        r = run_one(runtime, mode, ranks, shape_dir, run_args, tokens_path, largest, save)
                        status = r.get("error", "").splitlines()[0] if "error" in r else (
                            f"{r['s_per_step']:.3f} s/step, peak RSS {mib(r['peak_rss'])} (polled {mib(r['polled_rss'])}), "
                            f"last loss {r['losses'][-1]:.6f}; largest {r['largest']}")
                        print(f"  round {rnd + 1} {runtime:9s} {mode:4s} {ranks}r: {status}", flush=True)
                        if rnd == 0:
                            print(f"    {' '.join(r['cmd'])}", flush=True)
                        results.setdefault((mode, ranks), {}).setdefault(runtime, []).append(r)
                        if save and "error" not in r:
                            consolidation.append((runtime, os.path.join(r["dir"], "ckpt")))
            tokens_per_step = args.global_batch * args.seq_len
            print_table(shape, results, run_args, tokens_per_step)
            if consolidation and args.consolidate:
                from consolidate import compare_consolidation  # noqa: PLC0415 (part 4, optional)

                compare_consolidation(consolidation, args, shape_dir)
                consolidation = []
        print(f"\nbench_ds_train: load average {load_average()} at the end")
    finally:
        if args.keep:
            print(f"kept {top}")
        else:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
