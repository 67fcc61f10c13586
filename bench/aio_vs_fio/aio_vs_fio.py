#!/usr/bin/env python3
"""zinf io against fio on the same file: sequential read and write with O_DIRECT.

For each folder, block size (1 MiB, 8 MiB) and direction, runs `zinf io` and fio's libaio
and io_uring engines (io_uring also with registered buffers and files) with the same block
size, queue depth and one thread, interleaved round by round (after an untimed pass of the
same operation, in an order that rotates each round) so that drive state and background
noise hit every tool alike. Prints, per folder, the median GB/s of each (GB = 10^9 bytes)
and the ratio zinf / best fio engine.

By default it runs in two folders: build/ (the disk) and /dev/shm (a tmpfs, which accepts
O_DIRECT on the development machine's Linux 6.18): on the tmpfs the device is memory, so the ratio measures the
engine's own overhead against fio's (target >= 0.95 for every block size and direction);
on the disk it also carries the drive's noise. --dir (repeatable) picks the folders. The
file (default 2 GiB) is created in a temporary folder inside each and removed at the end.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

FIO_ENGINES = {
    "libaio": ["--ioengine=libaio"],
    "io_uring": ["--ioengine=io_uring"],
    "io_uring+fixed": ["--ioengine=io_uring", "--fixedbufs=1", "--registerfiles=1"],
}


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def run(cmd):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"aio_vs_fio: command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return proc.stdout


def fs_type(path):
    """The file system type of `path` (stat -f), e.g. ext2/ext3 for ext4, tmpfs."""
    try:
        return subprocess.run(["stat", "-f", "-c", "%T", path], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def zinf_gbps(zinf, path, size, bs, qd, op, backend):
    out = run([zinf, "io", path, "--size", str(size), f"--{op}", "--block-size", str(bs),
               "--queue-depth", str(qd), "--io-parallel", "1", "--loops", "1",
               "--backend", backend, "--json"] + (["--overwrite"] if op == "write" else []))
    result = json.loads(out)
    if not result["direct_io"]:
        sys.exit(f"aio_vs_fio: {path} does not support O_DIRECT here; leave its folder out (--dir)")
    return result["median"]["gb_per_s"]


def fio_gbps(path, size, bs, qd, op, engine_args):
    out = run(["fio", "--name=aio_vs_fio", f"--filename={path}", f"--size={size}",
               f"--bs={bs}", f"--iodepth={qd}", f"--rw={op}", "--direct=1", "--numjobs=1",
               "--thread", "--group_reporting", "--output-format=json"] + engine_args)
    job = json.loads(out)["jobs"][0][op]
    return job["io_bytes"] / (job["runtime"] / 1000.0) / 1e9 if job["runtime"] else job["bw_bytes"] / 1e9


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", action="append", dest="dirs", metavar="DIR",
                   help="folder on a filesystem under test; repeat for several "
                        "(default: build/ and /dev/shm)")
    p.add_argument("--size", default="2G", help="file size (binary K/M/G), at least 2G for the target")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (median taken)")
    p.add_argument("--queue-depth", type=int, default=8, help="requests in flight (zinf and fio alike)")
    p.add_argument("--block-sizes", default="1M,8M")
    p.add_argument("--backend", default="io_uring", help="zinf's aio backend")
    p.add_argument("--zinf", default=os.path.join(root, "build", "tools", "zinf"))
    args = p.parse_args()

    dirs = args.dirs or [os.path.join(root, "build"), "/dev/shm"]
    size = parse_size(args.size)
    block_sizes = [parse_size(b) for b in args.block_sizes.split(",")]
    fio_version = run(["fio", "--version"]).strip()
    print(f"aio_vs_fio: {size / 2**30:.2f} GiB file per folder, queue depth {args.queue_depth}, "
          f"1 thread, O_DIRECT, {args.rounds} interleaved rounds, zinf backend {args.backend}, {fio_version}")

    targets = []  # (label, workdir, path)
    samples = {}  # (label, bs, op, tool) -> [GB/s]
    try:
        for d in dirs:
            os.makedirs(d, exist_ok=True)
            label = f"{d} ({fs_type(d)})"
            if any(label == t[0] for t in targets):
                sys.exit(f"aio_vs_fio: folder {d} given twice")
            workdir = tempfile.mkdtemp(prefix="aio_vs_fio.", dir=d)
            targets.append((label, workdir, os.path.join(workdir, "bench.dat")))
            print(f"  folder {label}: file in {workdir}")
        for rnd in range(args.rounds):
            for label, _, path in targets:
                for bs in block_sizes:
                    for op in ("write", "read"):
                        # The first transfer after a change of direction or block size is
                        # often slower on virtual and cached drives: an untimed pass of the
                        # same operation absorbs that, and the order rotates by one place per
                        # round so that every tool takes every position equally often.
                        fio_gbps(path, min(size, 512 << 20), bs, args.queue_depth, op, FIO_ENGINES["libaio"])
                        tools = [("zinf", None)] + list(FIO_ENGINES.items())
                        shift = rnd % len(tools)
                        tools = tools[shift:] + tools[:shift]
                        for name, engine in tools:
                            if name == "zinf":
                                v = zinf_gbps(args.zinf, path, size, bs, args.queue_depth, op, args.backend)
                            else:
                                v = fio_gbps(path, size, bs, args.queue_depth, op, engine)
                            samples.setdefault((label, bs, op, name), []).append(v)
                            print(f"  round {rnd + 1} {label} {bs >> 20} MiB {op:5} {name:15} {v:7.3f} GB/s",
                                  flush=True)
    finally:
        for _, workdir, path in targets:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            os.rmdir(workdir)

    header = (f"{'block':>6} {'op':>5} {'zinf':>8} {'fio libaio':>11} {'fio io_uring':>13} "
              f"{'fio uring+fixed':>16} {'zinf/fio-best':>14}")
    for label, _, _ in targets:
        print()
        print(f"{label}: median GB/s of {args.rounds} rounds (GB = 10^9 bytes)")
        print(header)
        worst = None
        for bs in block_sizes:
            for op in ("read", "write"):
                med = {name: statistics.median(samples[(label, bs, op, name)])
                       for name in ["zinf"] + list(FIO_ENGINES)}
                best = max(med[n] for n in FIO_ENGINES)
                ratio = med["zinf"] / best if best else float("nan")
                worst = ratio if worst is None else min(worst, ratio)
                print(f"{str(bs >> 20) + 'M':>6} {op:>5} {med['zinf']:8.3f} {med['libaio']:11.3f} "
                      f"{med['io_uring']:13.3f} {med['io_uring+fixed']:16.3f} {ratio:14.3f}")
        if "tmpfs" in label:
            print(f"lowest ratio: {worst:.3f} (target >= 0.95: the device is memory, the ratio is the engine's own)")
        else:
            print(f"lowest ratio: {worst:.3f} (includes the drive's noise)")


if __name__ == "__main__":
    main()
