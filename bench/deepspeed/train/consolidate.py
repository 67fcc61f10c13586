"""Part 4 of bench_ds_train.py (--consolidate): DeepSpeed's installed zero_to_fp32.py against
`zinf zero-to-fp32` on a ZeRO-3 checkpoint each runtime saved in the training matrix.

For each checkpoint (DeepSpeed's, zinf's) and each converter, --consolidate-rounds runs (the
converters alternating), each into a fresh folder with --safe_serialization (one
model.safetensors): wall time and peak RSS (VmHWM of the process, polled) as medians. Then
the two converters' outputs for the same checkpoint are compared tensor by tensor (names,
shapes, dtypes, bit patterns).
"""
import os
import shutil
import statistics
import subprocess
import time

import bench_ds_train as b

DS_SCRIPT = os.path.join(b.ROOT, ".venv", "lib", "python3.11", "site-packages", "deepspeed", "utils",
                         "zero_to_fp32.py")


def measure(cmd, env, poll):
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    watch = b.Watch(proc.pid, None, poll)
    out = proc.stdout.read()
    rc = proc.wait()
    wall = time.perf_counter() - start
    watch.stop()
    return rc, wall, watch.peak_rss()[0], out


def load_safetensors(d):
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(f for f in os.listdir(d) if f.endswith(".safetensors")):
        out.update(load_file(os.path.join(d, f)))
    return out


def compare(dir_a, dir_b):
    """'equal (N tensors)' or what differs."""
    a, c = load_safetensors(dir_a), load_safetensors(dir_b)
    if set(a) != set(c):
        return f"different names: only in DeepSpeed's {sorted(set(a) - set(c))[:5]}, only in zinf's {sorted(set(c) - set(a))[:5]}"
    bad = [n for n in a if a[n].dtype != c[n].dtype or a[n].shape != c[n].shape or a[n].tobytes() != c[n].tobytes()]
    if bad:
        worst = max(float(abs(a[n].astype("f8") - c[n].astype("f8")).max()) if a[n].shape == c[n].shape else float("inf")
                    for n in bad)
        return f"{len(bad)} of {len(a)} tensors differ (max |diff| {worst:.3g}), e.g. {bad[:3]}"
    return f"equal ({len(a)} tensors, {sum(v.nbytes for v in a.values()) / 2**20:.1f} MiB, bit for bit)"


def compare_consolidation(checkpoints, args, work):
    # Run from a copy, as DeepSpeed's save_checkpoint places one in the checkpoint folder: run
    # where it is installed, its folder (deepspeed/utils) comes first on sys.path and its
    # types.py shadows the standard library's (ImportError: cannot import name 'IntEnum' from
    # partially initialized module 'enum').
    script = os.path.join(work, "ds_zero_to_fp32", "zero_to_fp32.py")
    os.makedirs(os.path.dirname(script), exist_ok=True)
    shutil.copy(DS_SCRIPT, script)
    env = b.base_env(1, 29999)
    env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    rounds = getattr(args, "consolidate_rounds", 3)
    rows = []
    finals = {}  # owner -> its own converter's output (DeepSpeed's script for DeepSpeed's)
    for owner, ckpt in checkpoints:
        tools = {
            "zero_to_fp32.py": lambda out: [os.path.join(b.VENV, "python"), script, ckpt, out,
                                            "--safe_serialization"],
            "zinf zero-to-fp32": lambda out: [args.zinf, "zero-to-fp32", ckpt, out, "--safe-serialization"],
        }
        runs = {name: [] for name in tools}
        outputs = {}
        for rnd in range(rounds):
            order = list(tools) if rnd % 2 == 0 else list(reversed(tools))
            for name in order:
                out = os.path.join(work, f"fp32-{owner}-{name.split()[0]}-{rnd}")
                cmd = tools[name](out)
                rc, wall, rss, text = measure(cmd, env, args.poll)
                if rnd == 0:
                    print(f"  {' '.join(cmd)}", flush=True)
                if rc != 0:
                    print(f"  FAILED ({rc}): {' '.join(cmd)}\n{text[-3000:]}")
                    runs[name].append(None)
                    continue
                runs[name].append((wall, rss))
                if name not in outputs:
                    outputs[name] = out
                else:
                    shutil.rmtree(out, ignore_errors=True)
        ok = {n: [r for r in v if r] for n, v in runs.items()}
        verdict = (compare(outputs["zero_to_fp32.py"], outputs["zinf zero-to-fp32"])
                   if len(outputs) == 2 else "not compared (a converter failed)")
        rows.append((owner, ok, verdict))
        finals[owner] = outputs.get("zero_to_fp32.py") if owner == "deepspeed" else outputs.get("zinf zero-to-fp32")
    print(f"\n### consolidation ({rounds} round(s), medians; safetensors output)\n")
    print("| checkpoint written by | zero_to_fp32.py s | zinf s | zinf / DS time | zero_to_fp32.py peak RSS "
          "| zinf peak RSS | outputs |")
    print("| --- " * 7 + "|")
    for owner, ok, verdict in rows:
        ds, zf = ok["zero_to_fp32.py"], ok["zinf zero-to-fp32"]
        t = lambda rs: statistics.median(r[0] for r in rs) if rs else None  # noqa: E731
        s = lambda rs: f"{t(rs):.3f}" if rs else "failed"  # noqa: E731
        m = lambda rs: b.mib(statistics.median(r[1] for r in rs)) if rs else "failed"  # noqa: E731
        print(f"| {owner} | {s(ds)} | {s(zf)} "
              f"| {b.ratio(t(zf), t(ds)) if ds and zf else '-'} | {m(ds)} | {m(zf)} | {verdict} |")

    # The two trainings' final weights (the same steps on the same data), each as its own
    # converter writes them.
    if finals.get("deepspeed") and finals.get("zinf"):
        import numpy as np

        a, c = load_safetensors(finals["deepspeed"]), load_safetensors(finals["zinf"])
        common = sorted(set(a) & set(c))
        worst = max(float(np.abs(a[n].astype("f8") - c[n].astype("f8")).max()) for n in common)
        scale = max(float(np.abs(a[n]).max()) for n in common)
        print(f"\nfinal weights, DeepSpeed's training (zero_to_fp32.py) against zinf's (zinf zero-to-fp32): "
              f"{len(common)} common tensors of {len(a)} / {len(c)}, max |diff| {worst:.3g} (max |w| {scale:.3g})")
