#!/usr/bin/python3
"""bench/zero_to_fp32: `zinf zero-to-fp32` against a python3-torch baseline (the core of
DeepSpeed's zero_to_fp32.py, baseline_zero_to_fp32.py) on the same stage-3 checkpoint, in the
same run: wall time and peak RSS of each child (os.wait4), and the ratios.

  bench_zero_to_fp32.py [--zinf build/tools/zinf] [--work build/bench_zero_to_fp32]
                        [--gb 4.2] [--world-size 2] [--rounds 2] [--threads 0]
                        [--zinf-before OTHER_ZINF] [--safetensors]

--zinf-before adds another zinf binary (an earlier build) to every pair, so a change is
measured before and after in one run; --safetensors adds zinf writing model.safetensors (no
CRC) to every pair. Their order alternates between rounds with zinf's.

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
    """Wall seconds, peak RSS bytes, output and CPU seconds (user + system: the work done,
    which the load of other jobs disturbs less than the wall time) of one child."""
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({child.returncode}):\n{output}")
    return seconds, usage.ru_maxrss * 1024, output, usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zinf", default=os.path.join(REPO, "build", "tools", "zinf"))
    parser.add_argument("--work", default=os.path.join(REPO, "build", "bench_zero_to_fp32"))
    parser.add_argument("--gb", type=float, default=4.2)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--zinf-before", default=None)
    parser.add_argument("--safetensors", action="store_true")
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
        zincs = [("zinf", zinf)]
        if args.zinf_before:
            zincs.append(("zinf-before", [args.zinf_before] + zinf[1:]))
        if args.safetensors:
            zincs.append(("zinf-st", zinf + ["--safe-serialization"]))
        results = {}
        for round_ in range(args.rounds):
            order = zincs if round_ % 2 == 0 else zincs[::-1]
            for cache in ("cold", "warm"):
                for name, command in order + [("baseline", baseline)]:
                    shutil.rmtree(out, ignore_errors=True)
                    os.makedirs(out)
                    if cache == "cold":
                        evict(inputs)
                    else:  # warm: read the inputs once so they are all in the page cache
                        for path in inputs:
                            with open(path, "rb") as f:
                                while f.read(64 << 20):
                                    pass
                    seconds, rss, output, cpu = run(command)
                    written = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "*")))
                    fsync = 0.0
                    for line in output.splitlines():
                        if line.startswith("fsync_seconds "):
                            fsync = float(line.split()[1])
                        elif "s of it completing the files" in line:
                            fsync = float(line.split("; ")[1].split(" s of it")[0])
                    results.setdefault((name, cache), []).append((seconds, rss, fsync, cpu))
                    print(f"round {round_ + 1} {cache:4} {name:8}: {seconds:7.2f} s  "
                          f"peak RSS {rss / 2**30:6.2f} GiB  wrote {written / 1e9:.2f} GB" +
                          f"  (of which fsync {fsync:.2f} s)  CPU {cpu:.2f} s")
                    if name == "baseline":
                        z = results[("zinf", cache)][-1]
                        for zname, _ in zincs:
                            o = results[(zname, cache)][-1]
                            print(f"  ratio in this pair: {zname} {o[0] / seconds:.3f}x time" +
                                  ("" if zname == "zinf" else f", zinf / {zname} {z[0] / o[0]:.3f}"))
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
            for zname, _ in zincs[1:]:
                o = min(results[(zname, cache)])
                print(f"{cache}: {zname} {o[0]:.2f} s = {o[0] / b[0]:.3f}x baseline; zinf / "
                      f"{zname} = {z[0] / o[0]:.3f}; peak RSS {o[1] / 2**30:.2f} GiB; CPU (least) "
                      f"zinf {min(r[3] for r in results[('zinf', cache)]):.2f} s, {zname} "
                      f"{min(r[3] for r in results[(zname, cache)]):.2f} s")
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
