#!/usr/bin/python3
"""bench/zero_to_fp32: `zinf zero-to-fp32` against a python3-torch baseline (the core of
DeepSpeed's zero_to_fp32.py, baseline_zero_to_fp32.py) on the same stage-3 checkpoint, in the
same run: wall time and peak RSS of each child (os.wait4), and the ratios.

  bench_zero_to_fp32.py [--zinf build/tools/zinf] [--work build/bench_zero_to_fp32]
                        [--gb 4.2] [--world-size 2] [--rounds 2] [--threads 0]

The checkpoint (make_ds_checkpoints.py --big: bf16 run, fp32 partitions split over two
sub-groups per rank, params of odd numel) is made under --work and deleted at the end, with
every output. Disk held at once: the checkpoint plus one output (about 2 x --gb).

Page cache: a "cold" run first evicts the checkpoint's files from the page cache
(posix_fadvise DONTNEED on each file, which touches no other file on the machine); a "warm"
run follows a run that read them. Each round runs zinf cold, the baseline cold, zinf warm and
the baseline warm, so the ratios compare runs made under the same conditions, then measures
the write floor: the checkpoint's size written sequentially and fsynced (what the disk allows
any tool whose output is durable).
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "consolidate", "make_ds_checkpoints.py")
BASELINE = os.path.join(HERE, "baseline_zero_to_fp32.py")
PYTHON = "/usr/bin/python3"


def evict(paths):
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_floor(path, size):
    """Seconds to write `size` bytes sequentially in 8 MiB blocks and fsync them: what the disk
    allows any tool that makes its output durable."""
    block = os.urandom(8 << 20)
    start = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, block[:min(left, len(block))])
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.monotonic() - start
    os.remove(path)
    return seconds


def run(command):
    """Wall seconds and peak RSS bytes of one child."""
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({child.returncode}):\n{output}")
    return seconds, usage.ru_maxrss * 1024, output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zinf", default=os.path.join(REPO, "build", "tools", "zinf"))
    parser.add_argument("--work", default=os.path.join(REPO, "build", "bench_zero_to_fp32"))
    parser.add_argument("--gb", type=float, default=4.2)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    free = shutil.disk_usage(os.path.dirname(args.work) or ".").free
    if free < 2.5 * args.gb * 1e9:
        sys.exit(f"needs {2.5 * args.gb:.1f} GB free beside {args.work}, has {free / 1e9:.1f}")
    ckpt = os.path.join(args.work, "ckpt")
    out = os.path.join(args.work, "out")
    shutil.rmtree(args.work, ignore_errors=True)
    try:
        start = time.monotonic()
        subprocess.run([PYTHON, FIXTURES, ckpt, "--big", str(args.gb), "--world-size",
                        str(args.world_size)], check=True)
        inputs = sorted(glob.glob(os.path.join(ckpt, "*", "*.pt")))
        size = sum(os.path.getsize(p) for p in inputs)
        print(f"checkpoint: stage 3, world size {args.world_size}, {len(inputs)} files, "
              f"{size / 1e9:.2f} GB (made in {time.monotonic() - start:.0f} s)")

        zinf = [args.zinf, "zero-to-fp32", ckpt, out, "--threads", str(args.threads)]
        baseline = [PYTHON, BASELINE, ckpt, os.path.join(out, "pytorch_model.bin")]
        results = {}
        for round_ in range(args.rounds):
            for cache in ("cold", "warm"):
                for name, command in (("zinf", zinf), ("baseline", baseline)):
                    shutil.rmtree(out, ignore_errors=True)
                    os.makedirs(out)
                    if cache == "cold":
                        evict(inputs)
                    else:  # warm: read the inputs once so they are all in the page cache
                        for path in inputs:
                            with open(path, "rb") as f:
                                while f.read(64 << 20):
                                    pass
                    seconds, rss, output = run(command)
                    written = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "*")))
                    fsync = 0.0
                    for line in output.splitlines():
                        if line.startswith("fsync_seconds "):
                            fsync = float(line.split()[1])
                        elif "s of it completing the files" in line:
                            fsync = float(line.split("; ")[1].split(" s of it")[0])
                    results.setdefault((name, cache), []).append((seconds, rss, fsync))
                    print(f"round {round_ + 1} {cache:4} {name:8}: {seconds:7.2f} s  "
                          f"peak RSS {rss / 2**30:6.2f} GiB  wrote {written / 1e9:.2f} GB" +
                          f"  (of which fsync {fsync:.2f} s)")
                    if name == "baseline":
                        z = results[("zinf", cache)][-1]
                        print(f"  ratio in this pair: {z[0] / seconds:.3f}x time")
                    if name == "zinf" and round_ == 0 and cache == "cold":
                        print("  " + output.strip().replace("\n", "\n  "))
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            floor = write_floor(os.path.join(out, "floor.dat"), size)
            results.setdefault("floor", []).append(floor)
            print(f"round {round_ + 1} write floor  : {floor:7.2f} s  ({size / 1e9:.2f} GB written "
                  f"in 8 MiB blocks and fsynced: {size / floor / 1e9:.2f} GB/s)")
        print()
        print(f"write floor (fastest round): {min(results['floor']):.2f} s")
        for cache in ("cold", "warm"):
            z = min(results[("zinf", cache)])
            b = min(results[("baseline", cache)])
            print(f"{cache}: zinf {z[0]:.2f} s / baseline {b[0]:.2f} s = {z[0] / b[0]:.3f}x time "
                  f"(target <= 0.2; both without their fsync: {z[0] - z[2]:.2f} s / "
                  f"{b[0] - b[2]:.2f} s = {(z[0] - z[2]) / (b[0] - b[2]):.3f}x); peak RSS zinf {z[1] / 2**30:.2f} GiB, baseline "
                  f"{b[1] / 2**30:.2f} GiB (target <= one shard + 1 GiB)")
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
