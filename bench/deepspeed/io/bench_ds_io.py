#!/usr/bin/env python3
"""zinf's aio engine and `zinf io` against DeepSpeed's `ds_io`: same file size, block size,
queue depth, folder.

Run with the project's venv (scripts/install-venv.sh), from the repository root:

    .venv/bin/python bench/deepspeed/io/bench_ds_io.py [--zinf build/tools/zinf] \
        [--worker build/bench/deepspeed/io/zinf_ds_io_worker]

For each folder (default: a folder under /var/tmp, on the disk, and one under /dev/shm,
a tmpfs), block size (1M, 8M) and direction, each round runs, in an order that rotates per
round:

  ds_io        DeepSpeed's ds_io (its aio handle over libaio, the engine of DeepSpeed's NVMe
               offload; DS_ACCELERATOR=cpu). It reads or writes the whole size from one
               page-locked buffer of that size per loop: handle.pread/pwrite, then wait.
  zinf aio     zinf_ds_io_worker: zinf's AioHandle measured the same way, one pinned buffer
               of the whole size (registered with io_uring, as zinf's pinned pools are), one
               synchronous pread/pwrite of all of it per loop; io_uring and libaio backends.
  zinf io      the CLI, `zinf io` (io_uring): it streams the size through a ring of block
               size x queue depth, one chunk of block size x queue depth / 4 at a time.

All use O_DIRECT, one I/O thread (io_parallel 1), batched submission, overlapped completion
and the given queue depth, and all do one untimed loop before the timed ones (ds_io
--warmup_loops 1; zinf io --loops L+1 with the first dropped). A run's figure is the size x
L over the summed seconds of its timed loops (ds_io's "Task" latency, which excludes
process start and barriers).

Reads read the same file: ds_io's own `_aio_read_<size>.pt.0_0`, made once, untimed, from
random bytes. Writes start from no file each run (ds_io removes its `_aio_write_<size>.pt.0_0`
itself; zinf's files are removed before each run), so the untimed loop allocates the file
and the timed loops overwrite it.

The table: median GB/s (10^9 bytes/s) of the rounds for each, and the ratios to ds_io of
zinf aio (io_uring) and of zinf io. A row that a tool cannot run shows the tool's error.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)


def size_text(n):
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def fs_type(path):
    out = subprocess.run(["stat", "-f", "-c", "%T", path], stdout=subprocess.PIPE, text=True)
    return out.stdout.strip() or "?"


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def last_error(text):
    """The most telling line of a failed run's output."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"(Error|error|Exception|errno|Traceback|failed|Failed)", line):
            return line[:200]
    return lines[-1][:200] if lines else "no output"


class Failure(Exception):
    pass


def ds_io_gbps(cmd, env, size, loops, op):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    word = "Read" if op == "read" else "Write"
    m = re.search(rf"Task {word} Latency = ([0-9.eE+-]+) sec", proc.stdout)
    if proc.returncode != 0 or not m:
        raise Failure(f"ds_io exit {proc.returncode}: {last_error(proc.stdout)}")
    return size * loops / float(m.group(1)) / 1e9


def zinf_gbps(cmd, size):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise Failure(f"zinf io exit {proc.returncode}: {last_error(proc.stderr + proc.stdout)}")
    result = json.loads(proc.stdout)
    if not result["direct_io"]:
        raise Failure("zinf io: the filesystem refused O_DIRECT (figures would include the page cache)")
    timed = result["loops"][1:]
    return size * len(timed) / sum(loop["seconds"] for loop in timed) / 1e9


def worker_gbps(cmd, size):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise Failure(f"zinf_ds_io_worker exit {proc.returncode}: {last_error(proc.stderr + proc.stdout)}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["direct_io"]:
        raise Failure("zinf_ds_io_worker: the filesystem refused O_DIRECT")
    return size * len(result["seconds"]) / sum(result["seconds"]) / 1e9


def make_random_file(path, size):
    chunk = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", action="append", dest="dirs", metavar="DIR",
                    help="folder to run in, repeatable (default: /var/tmp and /dev/shm)")
    ap.add_argument("--size", default="1G", help="bytes per loop, K/M/G binary (default 1G)")
    ap.add_argument("--block-sizes", default="1M,8M")
    ap.add_argument("--queue-depth", type=int, default=8,
                    help="requests in flight, both tools (default 8: zinf's and DeepSpeed's aio default)")
    ap.add_argument("--loops", type=int, default=3, help="timed loops per run (each also does one untimed)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    ap.add_argument("--zinf", default=os.path.join(ROOT, "build", "tools", "zinf"))
    ap.add_argument("--worker", default=os.path.join(ROOT, "build", "bench", "deepspeed", "io", "zinf_ds_io_worker"),
                    help="zinf_ds_io_worker binary (default: build/bench/deepspeed/io/)")
    ap.add_argument("--ds-io", default=os.path.join(os.path.dirname(sys.executable), "ds_io"),
                    help="DeepSpeed's ds_io (default: the one beside this Python)")
    args = ap.parse_args()

    size = parse_size(args.size)
    block_sizes = [parse_size(b) for b in args.block_sizes.split(",")]
    tools = ["ds_io", "zinf aio io_uring", "zinf aio libaio", "zinf io"]
    dirs = args.dirs or ["/var/tmp", "/dev/shm"]
    for tool in (args.zinf, args.worker, args.ds_io):
        if not os.access(tool, os.X_OK):
            sys.exit(f"bench_ds_io: {tool} is not there (build zinf and zinf_ds_io_worker; "
                     "run scripts/install-venv.sh)")
    env = dict(os.environ, DS_ACCELERATOR="cpu")

    workdirs = []
    samples = {}  # (folder, bs, op, tool) -> [GB/s]
    errors = {}  # (folder, bs, op, tool) -> message
    commands = {}  # tool -> an example command line
    try:
        for d in dirs:
            workdirs.append(tempfile.mkdtemp(prefix="bench_ds_io.", dir=d))
        print(f"bench_ds_io: {size_text(size)} per loop, {args.loops} timed loops + 1 untimed, queue depth "
              f"{args.queue_depth}, 1 thread, O_DIRECT, {args.rounds} interleaved rounds; load average "
              f"{load_average()}")
        print(f"  pinned: ds_io and zinf aio {size_text(size)} (one buffer of the size), zinf io block x queue depth")
        for w in workdirs:
            print(f"  folder {w} ({fs_type(w)})")
            make_random_file(os.path.join(w, f"_aio_read_{size}.pt.0_0"), size)

        for rnd in range(args.rounds):
            for w in workdirs:
                for bs in block_sizes:
                    for op in ("write", "read"):
                        shift = rnd % len(tools)
                        for tool in tools[shift:] + tools[:shift]:
                            key = (w, bs, op, tool)
                            if key in errors:
                                continue
                            read_path = os.path.join(w, f"_aio_read_{size}.pt.0_0")
                            write_path = os.path.join(w, "zinf_write.dat")
                            if op == "write" and os.path.exists(write_path):
                                os.unlink(write_path)
                            path = read_path if op == "read" else write_path
                            if tool == "ds_io":
                                cmd = [args.ds_io, "--folder", w, "--io_size", str(size), "--block_size",
                                       size_text(bs), "--queue_depth", str(args.queue_depth), "--loops",
                                       str(args.loops), "--warmup_loops", "1"] + (["--read"] if op == "read" else [])
                            elif tool.startswith("zinf aio"):
                                cmd = [args.worker, "--path", path, "--size", str(size), "--block-size", str(bs),
                                       "--queue-depth", str(args.queue_depth), "--backend", tool.split()[2],
                                       "--loops", str(args.loops), "--warmup", "1"] + (["--read"] if op == "read" else [])
                            else:
                                cmd = [args.zinf, "io", path, "--size", str(size), "--block-size", size_text(bs),
                                       "--queue-depth", str(args.queue_depth), "--io-parallel", "1", "--loops",
                                       str(args.loops + 1), "--backend", "io_uring", "--json",
                                       "--read" if op == "read" else "--write"]
                            commands.setdefault(f"{tool} {op}", " ".join(cmd))
                            try:
                                if tool == "ds_io":
                                    v = ds_io_gbps(cmd, env, size, args.loops, op)
                                elif tool.startswith("zinf aio"):
                                    v = worker_gbps(cmd, size)
                                else:
                                    v = zinf_gbps(cmd, size)
                            except Failure as e:
                                errors[key] = str(e)
                                print(f"  round {rnd + 1} {w} {size_text(bs)} {op:5} {tool:13} FAILED: {e}",
                                      flush=True)
                                continue
                            samples.setdefault(key, []).append(v)
                            print(f"  round {rnd + 1} {w} {size_text(bs)} {op:5} {tool:13} {v:7.3f} GB/s",
                                  flush=True)
    finally:
        for w in workdirs:
            shutil.rmtree(w, ignore_errors=True)

    print()
    print("commands (one of each; the others differ in folder and block size):")
    for k, c in commands.items():
        print(f"  {k}: {c}")
    print()
    print(f"median GB/s (10^9 bytes/s) of {args.rounds} rounds; load average at the end {load_average()}")
    print(f"{'folder':22} {'block':>5} {'op':>5} " + " ".join(f"{c:>17}" for c in tools) +
          f" {'zinf aio/ds_io':>14} {'zinf io/ds_io':>12}")
    for w in workdirs:
        label = f"{os.path.dirname(w)} ({fs_type(os.path.dirname(w))})"
        for bs in block_sizes:
            for op in ("read", "write"):
                med = {}
                cells = []
                for c in tools:
                    s = samples.get((w, bs, op, c))
                    med[c] = statistics.median(s) if s else None
                    cells.append(f"{med[c]:17.3f}" if s else f"{'failed':>17}")

                def ratio(c, width):
                    return f"{med[c] / med['ds_io']:{width}.3f}" if med["ds_io"] and med[c] else f"{'-':>{width}}"
                print(f"{label:22} {size_text(bs):>5} {op:>5} " + " ".join(cells) +
                      f" {ratio('zinf aio io_uring', 14)} {ratio('zinf io', 12)}")
    print("targets (issue 21): zinf / ds_io >= 1.0 in every row, >= 1.2 on tmpfs")
    for (w, bs, op, tool), msg in errors.items():
        print(f"failed: {os.path.dirname(w)} {size_text(bs)} {op} {tool}: {msg}")


if __name__ == "__main__":
    main()
