#!/usr/bin/env python3
"""zinf io against fio on the same file: sequential read and write with O_DIRECT.

For each block size (1 MiB, 8 MiB) and direction, runs `zinf io` and fio's libaio and
io_uring engines (io_uring also with registered buffers and files) with the same block size,
queue depth and one thread, interleaved round by round (after an untimed pass of the same
operation, in an order that rotates each round) so that drive state and background noise
hit every tool alike. Prints the median GB/s of each (GB = 10^9 bytes) and the ratio
zinf / best fio engine. The file (default 2 GiB) lives in --dir, which must be on the
filesystem under test, and is removed at the end.
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


def zinf_gbps(zinf, path, size, bs, qd, op, backend):
    out = run([zinf, "io", path, "--size", str(size), f"--{op}", "--block-size", str(bs),
               "--queue-depth", str(qd), "--io-parallel", "1", "--loops", "1",
               "--backend", backend, "--json"])
    result = json.loads(out)
    if not result["direct_io"]:
        sys.exit(f"aio_vs_fio: {path} does not support O_DIRECT; pick a --dir on a real drive")
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
    p.add_argument("--dir", default=os.path.join(root, "build"), help="folder on the filesystem under test")
    p.add_argument("--size", default="2G", help="file size (binary K/M/G), at least 2G for the target")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (median taken)")
    p.add_argument("--queue-depth", type=int, default=8, help="requests in flight (zinf and fio alike)")
    p.add_argument("--block-sizes", default="1M,8M")
    p.add_argument("--backend", default="io_uring", help="zinf's aio backend")
    p.add_argument("--zinf", default=os.path.join(root, "build", "tools", "zinf"))
    args = p.parse_args()

    size = parse_size(args.size)
    block_sizes = [parse_size(b) for b in args.block_sizes.split(",")]
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="aio_vs_fio.", dir=args.dir)
    path = os.path.join(workdir, "bench.dat")
    fio_version = run(["fio", "--version"]).strip()
    print(f"aio_vs_fio: {size / 2**30:.2f} GiB file in {workdir}, queue depth {args.queue_depth}, "
          f"1 thread, O_DIRECT, {args.rounds} interleaved rounds, zinf backend {args.backend}, {fio_version}")

    samples = {}  # (bs, op, tool) -> [GB/s]
    try:
        for rnd in range(args.rounds):
            for bs in block_sizes:
                for op in ("write", "read"):
                    # The first transfer after a change of direction or block size is often
                    # slower on virtual and cached drives: an untimed pass of the same
                    # operation absorbs that, and the order rotates by one place per round
                    # so that every tool takes every position equally often.
                    fio_gbps(path, min(size, 512 << 20), bs, args.queue_depth, op, FIO_ENGINES["libaio"])
                    tools = [("zinf", None)] + list(FIO_ENGINES.items())
                    shift = rnd % len(tools)
                    tools = tools[shift:] + tools[:shift]
                    for name, engine in tools:
                        if name == "zinf":
                            v = zinf_gbps(args.zinf, path, size, bs, args.queue_depth, op, args.backend)
                        else:
                            v = fio_gbps(path, size, bs, args.queue_depth, op, engine)
                        samples.setdefault((bs, op, name), []).append(v)
                        print(f"  round {rnd + 1} {bs >> 20} MiB {op:5} {name:15} {v:7.3f} GB/s", flush=True)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.rmdir(workdir)

    header = f"{'block':>6} {'op':>5} {'zinf':>8} {'fio libaio':>11} {'fio io_uring':>13} {'fio uring+fixed':>16} {'zinf/fio-best':>14}"
    print()
    print("median GB/s (GB = 10^9 bytes)")
    print(header)
    worst = None
    for bs in block_sizes:
        for op in ("read", "write"):
            med = {name: statistics.median(samples[(bs, op, name)]) for name in ["zinf"] + list(FIO_ENGINES)}
            best = max(med[n] for n in FIO_ENGINES)
            ratio = med["zinf"] / best if best else float("nan")
            worst = ratio if worst is None else min(worst, ratio)
            print(f"{str(bs >> 20) + 'M':>6} {op:>5} {med['zinf']:8.3f} {med['libaio']:11.3f} "
                  f"{med['io_uring']:13.3f} {med['io_uring+fixed']:16.3f} {ratio:14.3f}")
    print(f"lowest ratio: {worst:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
