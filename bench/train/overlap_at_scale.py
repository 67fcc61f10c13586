#!/usr/bin/env python3
"""bench/train/overlap_at_scale.py: zinf.overlap_optimizer off, then on, one right after the
other, on a model whose states are at least twice the memory the run may use.

The disk's read and write rates are measured first with fio in the swap folder (1 MiB
blocks, O_DIRECT, queue depth 32), so that each run's I/O bound (the bytes it moves per step
at those rates) is printed beside its s/step. Each run is `zinf train` with the given config,
in a memory cgroup limited to --memory-limit (default: half the model states, so the states
are 2x the memory the run has; "none" runs without a cgroup). The variant configs set
zinf.overlap_optimizer false and true; everything else is the config's.

  bench/train/overlap_at_scale.py [--zinf build/tools/zinf]
      [--config bench/train/ds_config_1b_overlap.json] [--model 1b] [--steps 3]
      [--swap build/bigswap] [--memory-limit auto|BYTES|none] [--fio-size 4G]

Prints each run's output as it goes, then a table: s/step (the mean of the steps after the
first, as zinf train reports it), NVMe bytes read and written per step by each tier, the I/O
bound at fio's rates, the peak memory of the cgroup, and the overlapped / serial ratios.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text):
    m = re.fullmatch(r"([0-9.]+) (B|KiB|MiB|GiB|TiB)", text.strip())
    if not m:
        raise ValueError(f"not a byte count: {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def gib(n):
    return f"{n / (1 << 30):.2f} GiB"


def fio_rate(folder, rw, size):
    """fio's bandwidth in bytes/s for sequential `rw` (read or write) in `folder`."""
    path = os.path.join(folder, "overlap_at_scale.fio")
    cmd = ["fio", "--name=" + rw, "--filename=" + path, "--size=" + size, "--bs=1M",
           "--direct=1", "--ioengine=io_uring", "--iodepth=32", "--rw=" + rw,
           "--output-format=json"]
    ok = False
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        ok = True
    finally:
        if (rw == "read" or not ok) and os.path.exists(path):
            os.unlink(path)
    job = json.loads(out)["jobs"][0]
    return float(job["read" if rw == "read" else "write"]["bw_bytes"])


class Cgroup:
    """A memory cgroup (v2 or v1) with a limit; None-like when no limit is asked."""

    def __init__(self, limit):
        self.path = None
        self.v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        if limit is None:
            return
        root = "/sys/fs/cgroup" if self.v2 else "/sys/fs/cgroup/memory"
        if self.v2:  # the memory controller must be enabled for the children of the root
            try:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            except OSError:
                pass  # already enabled, or not ours to change: the limit below will say
        self.path = os.path.join(root, f"zinf-overlap-{os.getpid()}-{time.monotonic_ns()}")
        os.mkdir(self.path)
        try:
            self.write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))
            # No escape to swap space: the limit is the memory the run has.
            swap = "memory.swap.max" if self.v2 else "memory.memsw.limit_in_bytes"
            if os.path.exists(os.path.join(self.path, swap)):
                self.write(swap, "0" if self.v2 else str(limit))
        except OSError:
            self.remove()
            raise

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def read(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    def enter(self):  # in the child, before exec
        if self.path:
            self.write("cgroup.procs", str(os.getpid()))

    def peak(self):
        if not self.path:
            return None
        value = self.read("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(value) if value else None

    def oom_kills(self):
        if not self.path:
            return 0
        if self.v2:
            events = self.read("memory.events") or ""
            m = re.search(r"oom_kill (\d+)", events)
            return int(m.group(1)) if m else 0
        control = self.read("memory.oom_control") or ""
        m = re.search(r"oom_kill (\d+)", control)
        return int(m.group(1)) if m else 0

    def remove(self):
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError as e:
                print(f"overlap_at_scale: could not remove {self.path}: {e}", file=sys.stderr)


def run_zinf(args, config, overlap, limit):
    variant = dict(config)
    variant["zinf"] = dict(config.get("zinf", {}))
    variant["zinf"]["overlap_optimizer"] = overlap
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(variant, f)
        path = f.name
    cmd = [args.zinf, "train", "--config", path, "--model", args.model, "--steps",
           str(args.steps), "--seq-len", "32", "--micro-batch", "1", "--nvme-path", args.swap,
           "--plot", ""]
    print(f"\n$ {' '.join(cmd)}   # zinf.overlap_optimizer {str(overlap).lower()}", flush=True)
    lines = []
    start = time.monotonic()
    group = None
    proc = None
    try:
        group = Cgroup(limit)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=group.enter)
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        rc = proc.wait()
        peak, ooms = group.peak(), group.oom_kills()
    finally:
        if proc is not None and proc.poll() is None:  # interrupted: the run goes too
            proc.kill()
            proc.wait()
        if group is not None:
            group.remove()
        os.unlink(path)
    wall = time.monotonic() - start
    if rc != 0:
        raise SystemExit(f"overlap_at_scale: zinf train exited {rc}"
                         f"{' (killed by the cgroup OOM killer)' if ooms else ''}")
    text = "".join(lines)
    m = re.search(r"\(([0-9.]+) s/step", text)
    io = re.search(r"I/O/step +optimizer nvme read (.+?) written (.+?) \| params nvme read "
                   r"(.+?) written (.+?)(?: \(|\n)", text)
    loss = re.findall(r"loss ([0-9.]+)", text)
    if not m or not io:
        raise SystemExit("overlap_at_scale: no throughput or I/O/step line in zinf train's output")
    r = {"s_step": float(m.group(1)), "wall": wall, "peak": peak,
         "opt_read": parse_bytes(io.group(1)), "opt_written": parse_bytes(io.group(2)),
         "param_read": parse_bytes(io.group(3)), "param_written": parse_bytes(io.group(4)),
         "loss": loss[-1] if loss else "?"}
    ov = re.search(r"overlap +(\d+) sub-group updates behind the backward: (\d+) kept, (\d+) "
                   r"rolled back; ([0-9.]+) s waited", text)
    r["overlap"] = ov.groups() if ov else None
    return r


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zinf", default="build/tools/zinf")
    p.add_argument("--config", default=os.path.join(here, "ds_config_1b_overlap.json"))
    p.add_argument("--model", default="1b")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--swap", default="build/bigswap")
    p.add_argument("--memory-limit", default="auto",
                   help="bytes, 'auto' (half the model states) or 'none'")
    p.add_argument("--fio-size", default="4G")
    args = p.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("overlap_at_scale: fio is not installed (apt-get install fio)")
    with open(args.config) as f:
        config = json.load(f)
    os.makedirs(args.swap, exist_ok=True)

    # The model states from zinf estimate (its first line gives the parameter count).
    est = subprocess.run([args.zinf, "estimate", "--config", args.config, "--model-size",
                          args.model, "--vocab", "256", "--seq-len", "32"], check=True,
                         capture_output=True, text=True).stdout
    params = float(re.search(r"([0-9.]+) B parameters", est).group(1)) * 1e9
    states = params * 16  # fp32 master, grads, Adam m and v
    if args.memory_limit == "none":
        limit = None
    elif args.memory_limit == "auto":
        limit = int(states / 2)
    else:
        limit = int(args.memory_limit)
    print(f"overlap_at_scale: model {args.model}, {params / 1e9:.3f} B parameters, model states "
          f"{gib(states)}; memory limit {gib(limit) if limit else 'none'}"
          f"{f' (states = {states / limit:.2f}x the limit)' if limit else ''}", flush=True)

    write_rate = fio_rate(args.swap, "write", args.fio_size)  # (makes the file read next)
    read_rate = fio_rate(args.swap, "read", args.fio_size)
    print(f"fio in {args.swap} (1 MiB, O_DIRECT, io_uring, depth 32, {args.fio_size}): "
          f"read {read_rate / (1 << 20):.0f} MiB/s, write {write_rate / (1 << 20):.0f} MiB/s",
          flush=True)

    results = {}
    for overlap in (False, True):
        results[overlap] = run_zinf(args, config, overlap, limit)

    print("\n| overlap | s/step | optimizer read/step | written/step | params read/step | "
          "written/step | I/O bound s/step | peak memory | loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for overlap in (False, True):
        r = results[overlap]
        read = r["opt_read"] + r["param_read"]
        written = r["opt_written"] + r["param_written"]
        bound = read / read_rate + written / write_rate
        r["bound"] = bound
        print(f"| {'on' if overlap else 'off'} | {r['s_step']:.2f} | {gib(r['opt_read'])} | "
              f"{gib(r['opt_written'])} | {gib(r['param_read'])} | {gib(r['param_written'])} | "
              f"{bound:.2f} | {gib(r['peak']) if r['peak'] else '-'} | {r['loss']} |")
    on, off = results[True], results[False]
    print(f"\noverlapped / serial: s/step {on['s_step'] / off['s_step']:.3f} (target <= 0.6); "
          f"optimizer bytes read per step {on['opt_read'] / max(off['opt_read'], 1):.3f} "
          f"(target <= 0.8); all NVMe bytes read {(on['opt_read'] + on['param_read']) / max(off['opt_read'] + off['param_read'], 1):.3f}")
    if on["overlap"]:
        s, k, b, w = on["overlap"]
        print(f"overlap: {s} sub-group updates behind the backward, {k} kept, {b} rolled back, "
              f"{w} s waited for them after the backward")


if __name__ == "__main__":
    main()
