#!/usr/bin/env bash
# Tests scripts/soak.sh's verdicts against a fake zinf (hermetic: nothing is trained, a run
# takes seconds): a fake that holds everything flat passes; one that leaks an fd, a thread,
# memory, pinned memory or swap-file bytes per step fails on that metric alone; one whose
# rank 1 exits 1 at the end (its swap file left), or that prints no loss for a step, fails
# "trained"; and the temporary folder is always removed.
# Usage: scripts/test-soak.sh [SOAK_SCRIPT]
set -euo pipefail
soak=$(realpath "${1:-$(dirname "$0")/soak.sh}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/var"

# The fake `zinf train`: reads the arguments soak.py passes and the nvme_path of its config,
# keeps swap files under <nvme>/zinf_swap/rank<r>/, prints rank 0's per-step loss lines, save
# lines and summary, writes each rank's checkpoint files, burns a little CPU per step, and
# leaks what FAKE_LEAK names (fds, threads, rss, locked, swap) on FAKE_LEAK_RANK (default 0).
cat >"$tmp/zinf" <<'EOF'
#!/usr/bin/python3
import ctypes, json, mmap, os, sys, threading, time
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
rank = int(os.environ["RANK"])
steps, interval = int(args["--steps"]), int(args["--save-interval"])
nvme = json.load(open(args["--config"]))["zero_optimization"]["offload_param"]["nvme_path"]
swap = os.path.join(nvme, "zinf_swap", f"rank{rank}")
os.makedirs(swap)
with open(os.path.join(swap, "param.swp"), "wb") as f:
    f.write(b"\0" * 65536)
leak = os.environ.get("FAKE_LEAK", "") if rank == int(os.environ.get("FAKE_LEAK_RANK", "0")) else ""
libc = ctypes.CDLL(None, use_errno=True)
kept, stop = [], threading.Event()
for step in range(1, steps + 1):
    end = time.monotonic() + 0.01
    while time.monotonic() < end:
        pass
    if leak == "fds":
        kept.append(open("/dev/null"))
    elif leak == "threads":
        t = threading.Thread(target=stop.wait, daemon=True); t.start(); kept.append(t)
    elif leak == "rss":  # 256 KiB a step
        m = mmap.mmap(-1, 256 * 1024); m.write(b"x" * len(m)); kept.append(m)
    elif leak == "locked":  # 16 KiB a step: 3.2 MiB in all, below the 8 MiB RLIMIT_MEMLOCK
        m = mmap.mmap(-1, 16 * 1024); kept.append(m)
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(len(m)))
    elif leak == "swap":
        with open(os.path.join(swap, "param.swp"), "ab") as f:
            f.write(b"\0" * 4096)
    if rank == 0 and not (os.environ.get("FAKE_NO_LOSS") and step == steps // 2):
        print(f"step {step} | loss {5.0 - 2.0 * step / steps:.4f} | lr 1e-3", flush=True)
    if step % interval == 0 or step == steps:
        folder = os.path.join(args["--save"], f"global_step{step}")
        os.makedirs(folder, exist_ok=True)
        for kind in ("model_states", "optim_states"):
            with open(os.path.join(folder, f"zero_pp_rank_{rank}_mp_rank_00_{kind}.pt"), "wb") as f:
                f.write(b"PK")
        if rank == 0:
            print(f"checkpoint saved: {folder} (2 B in 0.01 s)", flush=True)
# Like the real ranks' last collective: neither ends before the other has trained every step.
open(os.path.join(nvme, f"done{rank}"), "w").close()
deadline = time.monotonic() + 10
while not os.path.exists(os.path.join(nvme, f"done{1 - rank}")) and time.monotonic() < deadline:
    time.sleep(0.01)
if rank == 1 and os.environ.get("FAKE_RANK1_FAILS"):
    print("zinf train: rank 1: an I/O error", file=sys.stderr)
    sys.exit(1)  # its swap file left behind
os.remove(os.path.join(swap, "param.swp"))
if rank == 0:
    print(f"== zinf train: {steps} steps of tiny in 1.0 s ==", flush=True)
EOF
chmod +x "$tmp/zinf"

failures=0
# run NAME EXPECTED_RC FAILING_CHECKS(regex of the FAIL lines, or "") [ENV=VALUE...]
run() {
  local name=$1 want_rc=$2 want_fail=$3
  shift 3
  local rc=0
  env "$@" TMPDIR="$tmp/var" "$soak" --steps 200 --save-interval 50 --interval 0.05 \
    --zinf "$tmp/zinf" --out "$tmp/out-$name" >"$tmp/out" 2>&1 || rc=$?
  local fails
  fails=$(grep '^FAIL' "$tmp/out" | sed 's/:.*//' | tr '\n' ';' || true)
  local why=""
  if ((rc != want_rc)); then
    why="exit $rc, expected $want_rc"
  elif [[ -z $want_fail && -n $fails ]]; then
    why="failed checks: $fails"
  elif [[ -n $want_fail && ! $fails =~ ^($want_fail)\;$ ]]; then
    why="failed checks '$fails', expected '$want_fail;'"
  elif ! grep -Eq '^soak: [0-9]+ passed, [0-9]+ failed$' "$tmp/out"; then
    why="no verdict line"
  elif [[ -n $(ls -A "$tmp/var") ]]; then
    why="temporary folder left: $(ls -A "$tmp/var")"
  elif [[ ! -s $tmp/out-$name/soak.csv ]]; then
    why="no CSV"
  elif [[ -x /usr/bin/gnuplot && ! -s $tmp/out-$name/soak.png ]]; then
    why="no PNG"
  fi
  if [[ -n $why ]]; then
    echo "FAIL $name: $why; output:"
    sed 's/^/    /' "$tmp/out"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

run flat 0 ""
run leak-fds 1 "FAIL rank 0 fds" FAKE_LEAK=fds
run leak-threads 1 "FAIL rank 1 threads" FAKE_LEAK=threads FAKE_LEAK_RANK=1
run leak-rss 1 "FAIL rank 0 rss" FAKE_LEAK=rss
run leak-locked 1 "FAIL rank 0 locked" FAKE_LEAK=locked
run leak-swap 1 "FAIL rank 0 swap" FAKE_LEAK=swap
run rank1-fails 1 "FAIL rank 1 trained" FAKE_RANK1_FAILS=1
run step-without-loss 1 "FAIL rank 0 trained" FAKE_NO_LOSS=1

if ((failures > 0)); then
  echo "test-soak: $failures failed"
  exit 1
fi
echo "test-soak: all passed"
