#!/usr/bin/python3
"""Soak run of `zinf train`: two ranks train the tiny model for many steps at ZeRO stage 3 with
params and optimizer states on NVMe and a checkpoint every --save-interval steps, while each
rank's resident memory, open fds, threads, pinned memory and swap files are sampled. After a
warm-up they must stay flat. Driven by scripts/soak.sh (see there for the usage).

What is sampled, every --interval seconds, per rank (from outside the process, /proc):
  rss         VmRSS of /proc/PID/status
  fds         entries of /proc/PID/fd
  threads     the process's own threads (/proc/PID/task, less io_uring's iou-wrk-* workers,
              which the kernel starts and retires on demand; counted apart as io_workers)
  locked      VmLck: zinf's pinned buffers are mlock()ed (aio/pinned_buffer.h), so this is
              the pinned-memory account zinf prints (the "pinned" tier) seen by the kernel
  registered  VmPin: pages pinned by the kernel for io_uring's registered (fixed) buffers
  swap        apparent and allocated bytes of the rank's swap files
              (<nvme>/zinf_swap/rank<r>/*.swp)
  cpu         user + system CPU seconds (/proc/PID/stat), which shows that a rank computes
and the step the run is at, from rank 0's per-step lines (steps_per_print 1).

Verdict: for each metric and rank, the end window (the last quarter of the steps, before the
final step) against the baseline window (the second quarter, starting after the first
checkpoint): their means (medians for the counts, fds and threads), within the tolerance
printed with it. Plus one check per
rank that it trained: exit 0; rank 0 printed a finite loss for every step, a falling loss and
the final summary; every checkpoint holds both ranks' files; the rank kept using CPU time.
Output: one line per check, "soak: N passed, M failed", exit 1 on a failure (2 on a usage
error); the samples in soak.csv, the loss in loss.csv, a plot in soak.png, both ranks' logs,
the config and the report under --out. No PyPI packages: Debian's python3 and gnuplot.
"""

import argparse
import csv
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MiB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ---- metrics and their tolerances ---------------------------------------------------------------
# name, CSV column, unit for the table, the statistic of each window, the allowed growth (end
# minus baseline) as a function of the baseline, and the text that states it. Counts use the
# median: a save holds two more fds for a fraction of a second, which a sample catches now and
# then; a leak moves the median as surely as the mean.
METRICS = [
    ("rss", "rss_bytes", "MiB", "mean", lambda base: max(8 * MiB, 0.05 * base),
     "< max(8 MiB, 5%)"),
    ("fds", "fds", "", "median", lambda base: 0, "equal"),
    ("threads", "threads", "", "median", lambda base: 0, "equal"),
    ("locked", "vmlck_bytes", "MiB", "mean", lambda base: 64 * 1024, "equal (within 64 KiB)"),
    ("registered", "vmpin_bytes", "MiB", "mean", lambda base: 64 * 1024,
     "equal (within 64 KiB)"),
    ("swap", "swap_bytes", "MiB", "mean", lambda base: 0, "equal size"),
]

# threads: the process's own; io_workers: io_uring's io-wq kernel workers (iou-wrk-*), which the
# kernel starts and retires on demand, so they come and go without zinf doing anything.
CSV_FIELDS = ["t_s", "step", "rank", "rss_bytes", "fds", "threads", "vmlck_bytes", "vmpin_bytes",
              "swap_bytes", "swap_alloc_bytes", "cpu_s", "io_workers"]

STEP_LINE = re.compile(r"^step (\d+) \| loss (\S+) \|")
SUMMARY_LINE = re.compile(r"^== zinf train: (\d+) steps of (\S+) in ")
SAVED_LINE = re.compile(r"^checkpoint saved: \S*global_step(\d+) ")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="scripts/soak.sh",
        description="Soak run of `zinf train` (2 ranks, stage 3, NVMe offload, periodic "
                    "checkpoints): RSS, fds, threads, pinned memory and swap files must stay "
                    "flat after the warm-up.")
    p.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    p.add_argument("--save-interval", type=int, default=50,
                   help="a checkpoint every N steps (default 50)")
    p.add_argument("--out", default="soak",
                   help="folder for the CSV, PNG, logs and report (default ./soak)")
    p.add_argument("--zinf", default=os.environ.get("ZINF_BINARY", ""),
                   help="the zinf binary (default $ZINF_BINARY, else build/tools/zinf)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sample (default 64)")
    p.add_argument("--grad-accum", type=int, default=16,
                   help="micro-batches per step (default 16: ~0.5 s/step on 2 cores)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between samples (default 1)")
    p.add_argument("--stall-timeout", type=float, default=300,
                   help="stop when no step finishes for this long (default 300 s)")
    p.add_argument("--tmp", default=os.environ.get("TMPDIR") or "/var/tmp",
                   help="parent of the temporary swap and checkpoint folder "
                        "(default $TMPDIR, else /var/tmp)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary folder (swap files are removed by zinf anyway)")
    a = p.parse_args(argv)
    if a.steps < 8:
        p.error("--steps must be at least 8 (the windows are quarters of the run)")
    if a.save_interval < 1:
        p.error("--save-interval must be at least 1")
    if a.interval <= 0:
        p.error("--interval must be more than 0")
    if not a.zinf:
        a.zinf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "tools",
                              "zinf")
    if not (os.path.isfile(a.zinf) and os.access(a.zinf, os.X_OK)):
        p.error(f"zinf binary {a.zinf} not found or not executable (--zinf or $ZINF_BINARY)")
    return a


_port_locks = []


def free_port():
    # Below the ephemeral range, where no socket is given a port implicitly (a port 0 bound and
    # released here could be handed to another program's connection before the store binds
    # it), and reserved against other runs on this machine by an abstract Unix socket named after
    # the port, bound until exit (no file to leave behind).
    low = 32768  # Linux's default, when the range cannot be read
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if low <= 10000:
        sys.exit(f"soak: the ephemeral port range starts at {low}: no port in [10000, {low})")
    start = os.getpid() % (low - 10000)
    for i in range(low - 10000):
        port = 10000 + (start + i) % (low - 10000)
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0zinf-test-port-{port}")
        except OSError:
            lock.close()
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                lock.close()
                continue
        _port_locks.append(lock)
        return port
    sys.exit(f"soak: no free TCP port in [10000, {low})")


def write_config(path, nvme, steps):
    # Stage 3, params (max_in_cpu 0: every slice swapped) and optimizer states on NVMe, small
    # pinned pools (buffer_size 1e5 elements holds tiny's largest parameter), a per-step line.
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": "auto",
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                 "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"warmup_num_steps": min(10, steps - 1),
                                 "total_num_steps": "auto", "cos_min_ratio": 0.1}},
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4,
                              "buffer_size": 1e5, "max_in_cpu": 0},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4},
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
        "steps_per_print": 1,
        "zinf": {"accelerator": {"type": "cpu", "memory_budget": "64MiB"}},
    }
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# ---- sampling -----------------------------------------------------------------------------------
def read_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmLck", "VmPin"):
                out[key] = int(value.split()[0]) * 1024  # kB
    return out


def read_threads(pid):
    """(own threads, io_uring io-wq workers) of a process."""
    own = workers = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended between the listing and the read
        if comm.startswith(("iou-wrk-", "iou-sqp-")):
            workers += 1
        else:
            own += 1
    return own, workers


def read_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def swap_bytes(folder):
    size = alloc = 0
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0, 0
    for name in names:
        if name.endswith(".swp"):
            try:
                st = os.stat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            size += st.st_size
            alloc += st.st_blocks * 512
    return size, alloc


def sample(pid, rank, nvme):
    """One CSV row's metrics for a running rank, or None once it is gone."""
    try:
        status = read_status(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads, io_workers = read_threads(pid)
        cpu = read_cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    if "VmRSS" not in status:  # a zombie: exited, not yet reaped
        return None
    size, alloc = swap_bytes(os.path.join(nvme, "zinf_swap", f"rank{rank}"))
    return {"rank": rank, "rss_bytes": status["VmRSS"], "fds": fds, "threads": threads,
            "io_workers": io_workers, "vmlck_bytes": status.get("VmLck", 0),
            "vmpin_bytes": status.get("VmPin", 0),
            "swap_bytes": size, "swap_alloc_bytes": alloc, "cpu_s": round(cpu, 2)}


class LogFollower:
    """Reads rank 0's log as it grows: the last finished step, the losses, saves, the summary."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = ""
        self.step = 0
        self.losses = {}
        self.saves = []
        self.summary = None

    def poll(self):
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            m = STEP_LINE.match(line)
            if m:
                step = int(m.group(1))
                self.losses[step] = float(m.group(2))
                self.step = max(self.step, step)
                continue
            m = SAVED_LINE.match(line)
            if m:
                self.saves.append(int(m.group(1)))
                continue
            m = SUMMARY_LINE.match(line)
            if m:
                self.summary = (int(m.group(1)), m.group(2))


def fmt_time(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class ProgressLine:
    """A line redrawn in place on a terminal; elsewhere a plain line every 10 s."""

    def __init__(self):
        self.tty = sys.stdout.isatty()
        self.last = 0.0

    def show(self, text, force=False):
        now = time.monotonic()
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()
        elif force or now - self.last >= 10:
            self.last = now
            print(text, flush=True)

    def done(self):
        if self.tty:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()


# ---- the run ------------------------------------------------------------------------------------
def run(args, tmp, out):
    nvme = os.path.join(tmp, "nvme")
    ck = os.path.join(tmp, "ck")
    os.makedirs(nvme)
    config = os.path.join(out, "soak_config.json")
    write_config(config, nvme, args.steps)
    port = free_port()
    cmd = [args.zinf, "train", "--config", config, "--model", "tiny", "--steps", str(args.steps),
           "--seq-len", str(args.seq_len), "--grad-accum", str(args.grad_accum),
           "--save", ck, "--save-interval", str(args.save_interval), "--plot", ""]
    print("soak: " + shlex.join(cmd))
    print(f"soak: 2 ranks (RANK/WORLD_SIZE, MASTER_ADDR=127.0.0.1 MASTER_PORT={port}), "
          f"swap and checkpoints in {tmp}, samples every {args.interval:g} s into "
          f"{os.path.join(out, 'soak.csv')}", flush=True)

    procs, logs = [], []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        log = open(os.path.join(out, f"rank{rank}.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
    follower = LogFollower(os.path.join(out, "rank0.log"))
    rows = []
    progress = ProgressLine()
    start = time.monotonic()
    first_step_at = None
    last_step, last_step_at = 0, start
    failed_at = None
    exits = [None, None]
    stop_reason = None
    try:
        with open(os.path.join(out, "soak.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            while True:
                now = time.monotonic()
                taken = []
                for rank, p in enumerate(procs):
                    if exits[rank] is None:
                        row = sample(p.pid, rank, nvme)
                        if row is not None:
                            taken.append(row)
                        exits[rank] = p.poll()
                # The log is read after the samples: a sample is never attributed to a step
                # before one whose line was printed before it was taken (the last step's line
                # comes before the final save and the teardown, which are not steady state).
                follower.poll()
                for row in taken:
                    row.update(t_s=round(now - start, 2), step=follower.step, rank=row["rank"])
                    writer.writerow(row)
                    rows.append(row)
                f.flush()
                if follower.step != last_step:
                    last_step, last_step_at = follower.step, now
                    if first_step_at is None:
                        first_step_at = (now, follower.step)
                if all(e is not None for e in exits):
                    break
                # One rank failed: give the other 30 s to notice, then stop it.
                if any(e not in (None, 0) for e in exits):
                    failed_at = failed_at or now
                    if now - failed_at > 30:
                        stop_reason = "a rank failed; the other was stopped"
                        break
                if now - last_step_at > args.stall_timeout:
                    stop_reason = f"no step finished for {args.stall_timeout:g} s"
                    break
                # Progress: steps done, ETA from the steps after the first.
                eta = "?"
                if first_step_at and follower.step > first_step_at[1]:
                    rate = (now - first_step_at[0]) / (follower.step - first_step_at[1])
                    eta = fmt_time(rate * (args.steps - follower.step))
                r0 = [r for r in rows[-2:] if r["rank"] == 0]
                extra = ""
                if r0:
                    r = r0[-1]
                    extra = (f"  rank 0: RSS {r['rss_bytes'] / MiB:.1f} MiB, {r['fds']} fds, "
                             f"pinned {r['vmlck_bytes'] / MiB:.2f} MiB, "
                             f"swap {r['swap_bytes'] / MiB:.2f} MiB")
                progress.show(f"soak: step {follower.step}/{args.steps} "
                              f"({100 * follower.step // args.steps}%)  "
                              f"{fmt_time(now - start)} < {eta}{extra}")
                time.sleep(args.interval)
    finally:
        progress.done()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    exits = [p.returncode for p in procs]
    follower.poll()
    follower.partial += "\n"
    follower.poll()
    elapsed = time.monotonic() - start
    print(f"soak: both ranks ended after {fmt_time(elapsed)} (exit {exits[0]}, {exits[1]}); "
          f"{len(rows)} samples", flush=True)
    # Every checkpoint of the run, with both ranks' files, before the folder goes away.
    saved = list(range(args.save_interval, args.steps, args.save_interval)) + [args.steps]
    missing = []
    for step in saved:
        for rank in range(2):
            for kind in ("model_states", "optim_states"):
                name = os.path.join(ck, f"global_step{step}",
                                    f"zero_pp_rank_{rank}_mp_rank_00_{kind}.pt")
                if not os.path.isfile(name) or os.path.getsize(name) == 0:
                    missing.append((rank, name))
    leftover = [os.path.join(d, n) for d, _, ns in os.walk(nvme) for n in ns if n.endswith(".swp")]
    return {"rows": rows, "follower": follower, "exits": exits, "stop_reason": stop_reason,
            "saved": saved, "missing": missing, "leftover_swap": leftover, "elapsed": elapsed}


# ---- the verdict --------------------------------------------------------------------------------
def windows(steps, save_interval):
    """(baseline, end): half-open step ranges (lo, hi] of the second and last quarter. The
    baseline starts after the first checkpoint; the end window stops before the last step
    (whose save and teardown are not steady state)."""
    first_save = save_interval if save_interval < steps else 0
    base_lo = max(steps // 4, first_save + 1 if first_save else 0)
    base_hi = max(steps // 2, base_lo + 1)
    return (base_lo, base_hi), (3 * steps // 4, steps - 1)


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def median(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def value_text(value, unit):
    if unit == "MiB":
        return f"{value / MiB:.2f} MiB"
    return f"{value:.2f}"


def judge(args, result):
    rows = result["rows"]
    (b_lo, b_hi), (e_lo, e_hi) = windows(args.steps, args.save_interval)
    checks = []  # (rank, name, ok, text)
    table = []
    for rank in range(2):
        base = [r for r in rows if r["rank"] == rank and b_lo < r["step"] <= b_hi]
        end = [r for r in rows if r["rank"] == rank and e_lo < r["step"] <= e_hi]
        for name, column, unit, stat, tolerance, tol_text in METRICS:
            if len(base) < 3 or len(end) < 3:
                checks.append((rank, name, False,
                               f"too few samples ({len(base)} in steps {b_lo + 1}-{b_hi}, "
                               f"{len(end)} in {e_lo + 1}-{e_hi}; --interval or more steps)"))
                continue
            of = mean if stat == "mean" else median
            b = of([r[column] for r in base])
            e = of([r[column] for r in end])
            growth = e - b
            allowed = tolerance(b)
            ok = growth <= allowed if name == "rss" else abs(growth) <= allowed
            # Rate: per step between the windows' mean steps, and per checkpoint.
            span = mean([r["step"] for r in end]) - mean([r["step"] for r in base])
            per_step = growth / span if span > 0 else 0.0
            tol_text = f"{stat}s {tol_text}"
            table.append((rank, name, value_text(b, unit), value_text(e, unit),
                          value_text(growth, unit),
                          value_text(per_step * args.save_interval, unit), tol_text,
                          "ok" if ok else "FAIL"))
            checks.append((rank, name, ok,
                           f"{value_text(b, unit)} -> {value_text(e, unit)} "
                           f"({'+' if growth >= 0 else ''}{value_text(growth, unit)}; "
                           f"{value_text(per_step, unit)}/step, "
                           f"{value_text(per_step * args.save_interval, unit)}/save), "
                           f"allowed {tol_text}"))
    # Did both ranks train?
    f = result["follower"]
    for rank in range(2):
        problems = []
        if result["stop_reason"]:
            problems.append(result["stop_reason"])
        if result["exits"][rank] != 0:
            problems.append(f"exit {result['exits'][rank]}")
        left = [n for n in result["leftover_swap"] if f"{os.sep}rank{rank}{os.sep}" in n]
        if left:
            problems.append(f"swap files left: {left[0]}")
        mine = [name for r, name in result["missing"] if r == rank]
        if mine:
            problems.append(f"{len(mine)} checkpoint files missing (first {mine[0]})")
        cpu = [r["cpu_s"] for r in rows if r["rank"] == rank and e_lo < r["step"] <= e_hi]
        cpu_base = [r["cpu_s"] for r in rows if r["rank"] == rank and b_lo < r["step"] <= b_hi]
        if not cpu or not cpu_base or max(cpu) - min(cpu_base) < 0.1:
            problems.append("no CPU time used between the windows")
        if rank == 0:
            absent = [s for s in range(1, args.steps + 1) if s not in f.losses]
            if absent:
                problems.append(f"{len(absent)} steps without a loss line (first {absent[0]})")
            bad = [s for s, v in f.losses.items() if not math.isfinite(v)]
            if bad:
                problems.append(f"loss not finite at step {bad[0]}")
            tenth = max(1, args.steps // 10)
            first = mean([f.losses[s] for s in range(1, tenth + 1) if s in f.losses])
            last = mean([f.losses[s] for s in range(args.steps - tenth + 1, args.steps + 1)
                         if s in f.losses])
            if not last < first:
                problems.append(f"loss did not fall ({first:.4f} -> {last:.4f})")
            if f.summary != (args.steps, "tiny"):
                problems.append("no final summary of the run's steps")
            if sorted(set(f.saves)) != result["saved"]:
                problems.append(f"saves printed for steps {sorted(set(f.saves))}, "
                                f"expected {result['saved']}")
            text = (f"exit 0, {len(f.losses)} loss lines, loss {first:.4f} -> {last:.4f} "
                    f"(first and last tenth), summary, {len(f.saves)} saves")
        else:
            text = (f"exit 0, its files in all {len(result['saved'])} checkpoints, "
                    f"{(max(cpu) if cpu else 0):.0f} CPU s by the end window")
        checks.append((rank, "trained", not problems, "; ".join(problems) if problems else text))
    return checks, table, ((b_lo, b_hi), (e_lo, e_hi))


def write_loss_csv(path, follower):
    with open(path, "w") as f:
        f.write("step,loss\n")
        for step in sorted(follower.losses):
            f.write(f"{step},{follower.losses[step]}\n")


def plot(out, args, wins, rows):
    """soak.png: one panel per metric, both ranks, the windows shaded. Samples before the first
    step (start-up) and after the last (the final save, the teardown) are left out; each y
    axis spans at least about the metric's tolerance, so a flat series looks flat and a growth
    past the tolerance is visible."""
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("soak: warning: gnuplot not found, no plot")
        return None
    (b_lo, b_hi), (e_lo, e_hi) = wins
    png = os.path.join(out, "soak.png")
    # title, y label, CSV column, scale, smallest y span
    panels = [
        ("resident memory (VmRSS)", "MiB", "rss_bytes", MiB, 16),
        ("open file descriptors", "fds", "fds", 1, 6),
        ("threads (the process's own; io_uring workers not counted)", "threads", "threads", 1,
         6),
        ("pinned: mlock()ed buffers (VmLck)", "MiB", "vmlck_bytes", MiB, 1),
        ("pinned: io_uring registered buffers (VmPin)", "MiB", "vmpin_bytes", MiB, 1),
        ("swap files (apparent size, both tiers)", "MiB", "swap_bytes", MiB, 1),
    ]
    lines = [
        "set terminal pngcairo size 1500,1000 font 'sans,10' noenhanced",
        f"set output '{png}'",
        "set key bottom right",
        "set grid",
        f"set multiplot layout 3,2 title 'zinf soak: {args.steps} steps of the tiny model, "
        f"stage 3, params and optimizer states on NVMe, a checkpoint every "
        f"{args.save_interval} steps, 2 ranks; grey: warm-up, blue: baseline window, "
        "red: end window'",
        "set xlabel 'step'",
        f"set xrange [0:{args.steps}]",
    ]
    trained = [r for r in rows if 1 <= r["step"] < args.steps]
    for i, (title, ylabel, column, scale, span) in enumerate(panels):
        for rank in range(2):
            lines.append(f"$r{rank}p{i} << EOD")
            lines += [f"{r['step']} {r[column] / scale:.6f}" for r in trained
                      if r["rank"] == rank]
            lines.append("EOD")
    for i, (title, ylabel, column, scale, span) in enumerate(panels):
        values = [r[column] / scale for r in trained] or [0.0]
        lo, hi = min(values), max(values)
        half = max((hi - lo) / 2 * 1.2, span / 2)
        mid = (lo + hi) / 2
        lines += [  # more room below, for the key
            f"set yrange [{max(0.0, mid - 1.6 * half):.6f}:{mid + half:.6f}]",
            f"set object 1 rect from 0, graph 0 to {b_lo}, graph 1 fc rgb '#eeeeee' "
            "fs solid noborder behind",
            f"set object 2 rect from {b_lo}, graph 0 to {b_hi}, graph 1 fc rgb '#dde8ff' "
            "fs solid noborder behind",
            f"set object 3 rect from {e_lo}, graph 0 to {e_hi}, graph 1 fc rgb '#ffe0e0' "
            "fs solid noborder behind",
            f"set title \"{title}\"",
            f"set ylabel '{ylabel}'",
            f"plot $r0p{i} using 1:2 with lines lw 2 lc rgb '#1f5fbf' title 'rank 0', "
            f"$r1p{i} using 1:2 with lines lw 2 dt 2 lc rgb '#d9480f' title 'rank 1'",
        ]
    lines.append("unset multiplot")
    script = os.path.join(out, "soak.gp")
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run([gnuplot, script], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"soak: warning: gnuplot failed: {r.stderr.strip()[:500]}")
        return None
    return png


def main(argv):
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.makedirs(args.tmp, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="zinf-soak-", dir=args.tmp)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        result = run(args, tmp, out)
    except KeyboardInterrupt:
        print("\nsoak: interrupted; ranks stopped, temporary folder removed", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"soak: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    checks, table, wins = judge(args, result)
    write_loss_csv(os.path.join(out, "loss.csv"), result["follower"])
    png = plot(out, args, wins, result["rows"])
    (b_lo, b_hi), (e_lo, e_hi) = wins
    report = [
        f"soak: {args.steps} steps, a save every {args.save_interval}, 2 ranks; "
        f"{len(result['rows'])} samples in {fmt_time(result['elapsed'])}; baseline window steps "
        f"{b_lo + 1}-{b_hi}, end window steps {e_lo + 1}-{e_hi} (means compared; medians for "
        "the counts)",
        "",
        f"{'rank':<5}{'metric':<12}{'baseline':>14}{'end':>14}{'growth':>14}"
        f"{'per save':>14}  {'allowed':<30}verdict",
    ]
    for rank, name, b, e, g, ps, tol, verdict in table:
        report.append(f"{rank:<5}{name:<12}{b:>14}{e:>14}{g:>14}{ps:>14}  {tol:<30}{verdict}")
    report.append("")
    for rank, name, ok, text in checks:
        report.append(f"{'ok  ' if ok else 'FAIL'} rank {rank} {name}: {text}")
    passed = sum(1 for c in checks if c[2])
    failed = len(checks) - passed
    report.append("")
    report.append(f"soak: CSV {os.path.join(out, 'soak.csv')}"
                  + (f", plot {png}" if png else "") + f", logs {out}/rank*.log")
    report.append(f"soak: {passed} passed, {failed} failed")
    text = "\n".join(report)
    print(text)
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
