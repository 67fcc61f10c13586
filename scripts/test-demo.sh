#!/usr/bin/env bash
# Tests scripts/demo.sh in a scratch copy of the repository layout, with a fake
# scripts/build.sh (CMake's configure lines, then ninja's [done/total] lines) and a fake
# build/tools/zinf (hermetic: nothing is compiled, no file is timed).
# Usage: scripts/test-demo.sh [DEMO_SCRIPT]
set -euo pipefail
demo=$(realpath "${1:-$(dirname "$0")/demo.sh}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts" "$tmp/build/tools"
cp "$demo" "$tmp/scripts/demo.sh"
cat >"$tmp/scripts/build.sh" <<'EOF'
#!/usr/bin/env bash
echo "-- The CXX compiler identification is GNU 12.2.0"
echo "-- Configuring done"
echo "-- Build files have been written to: build"
for i in $(seq 1 40); do
  echo "[$i/40] Building CXX object aio/CMakeFiles/zinf_aio.dir/file$i.cc.o"
  if [[ -n ${FAKE_BUILD_FAIL:-} && $i == 17 ]]; then
    echo "aio/file17.cc:3:1: error: expected ';' before '}' token"
    echo "ninja: build stopped: subcommand failed."
    exit 1
  fi
done
EOF
cat >"$tmp/build/tools/zinf" <<'EOF'
#!/usr/bin/env bash
echo "fake zinf $*"
EOF
chmod +x "$tmp/scripts/build.sh" "$tmp/build/tools/zinf"

failures=0
fail() {
  echo "FAIL $1; output:"
  sed 's/^/    /' "$tmp/out"
  failures=$((failures + 1))
}

# 1. A successful build shows its stages and progress, then runs zinf train once, passing
#    the demo's arguments on.
rc=0
(cd "$tmp" && ZINF_JOBS=2 bash scripts/demo.sh --steps 5) >"$tmp/out" 2>&1 || rc=$?
progress=$(grep -c '^demo: build \[[0-9]*/40\]' "$tmp/out" || true)
if ((rc != 0)); then
  fail "build: exit $rc"
elif ! grep -q '^demo: configuring' "$tmp/out"; then
  fail "build: no configure stage line"
elif ((progress < 5 || progress > 11)); then
  fail "build: $progress progress lines, expected 5 to 11"
elif ! grep -q '^demo: build \[40/40\]' "$tmp/out"; then
  fail "build: no final progress line"
elif grep -q 'Building CXX object' "$tmp/out"; then
  fail "build: ninja's raw lines shown"
elif [[ $(grep -c '^fake zinf train --plot build/zinf-train-loss.png --steps 5$' "$tmp/out") != 1 ]]; then
  fail "build: zinf train not run once with the plot in build/ and the demo's arguments"
else
  echo "ok   progress lines while building, then zinf train"
fi

# 2. A failed build stops the demo with the build's own output.
rc=0
(cd "$tmp" && FAKE_BUILD_FAIL=1 bash scripts/demo.sh) >"$tmp/out" 2>&1 || rc=$?
if ((rc == 0)); then
  fail "failed build: exit 0"
elif ! grep -q "error: expected ';'" "$tmp/out"; then
  fail "failed build: compiler error not shown"
elif grep -q '^fake zinf' "$tmp/out"; then
  fail "failed build: zinf run anyway"
else
  echo "ok   a failed build shows its output and stops"
fi

if ((failures > 0)); then
  echo "test-demo: $failures failed"
  exit 1
fi
echo "test-demo: all passed"
