#!/usr/bin/env bash
# Tests scripts/install-deps.sh against fake apt-get, dpkg-query and sudo put first on PATH
# (hermetic: nothing is installed, no lock is taken, no network). The fake apt-get behaves
# like apt 2.6 while another process holds the lock: `update` fails at once with "Could not
# get lock" (it ignores DPkg::Lock::Timeout), `install` fails at once unless given
# DPkg::Lock::Timeout, with which it waits. Usage: scripts/test-install-deps.sh [SCRIPT]
set -euo pipefail
script=$(realpath "${1:-$(dirname "$0")/install-deps.sh}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"

cat >"$tmp/bin/dpkg-query" <<'EOF'
#!/usr/bin/env bash
echo -n "unknown ok not-installed"
EOF
cat >"$tmp/bin/sudo" <<'EOF'
#!/usr/bin/env bash
exec "$@"
EOF
# State: $FAKE_STATE/lock_updates = how many more `update` calls find the lists lock held
# (-1: held forever); $FAKE_STATE/update_error = a non-lock error for `update`;
# $FAKE_STATE/install_args = the arguments `install` got.
cat >"$tmp/bin/apt-get" <<'EOF'
#!/usr/bin/env bash
state=$FAKE_STATE
if [[ " $* " == *" update "* ]]; then
  echo x >>"$state/update_calls"
  if [[ -f "$state/update_error" ]]; then
    echo "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease" >&2
    exit 100
  fi
  held=$(cat "$state/lock_updates")
  if ((held != 0)); then
    ((held > 0)) && echo $((held - 1)) >"$state/lock_updates"
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (unattended-upgr)" >&2
    echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
    exit 100
  fi
  exit 0
fi
if [[ " $* " == *" install "* ]]; then
  echo "$*" >"$state/install_args"
  if [[ " $* " != *" DPkg::Lock::Timeout="* && " $* " != *" -oDPkg::Lock::Timeout="* ]] &&
    [[ -f "$state/dpkg_lock_held" ]]; then
    echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (unattended-upgr)" >&2
    exit 100
  fi
  exit 0
fi
echo "fake apt-get: unexpected arguments: $*" >&2
exit 2
EOF
chmod +x "$tmp/bin/"*

failures=0
# run NAME EXPECTED_RC: runs the script with a fresh state set up by the caller in $state.
run() {
  local name=$1 expected=$2 rc=0
  PATH="$tmp/bin:$PATH" FAKE_STATE="$state" ZINF_APT_LOCK_RETRY=0 \
    bash "$script" >"$state/out" 2>&1 || rc=$?
  if [[ $rc != "$expected" ]]; then
    echo "FAIL $name: exit $rc, expected $expected; output:"
    sed 's/^/    /' "$state/out"
    failures=$((failures + 1))
    return 1
  fi
}
expect_output() {
  local name=$1 pattern=$2
  if ! grep -q -- "$pattern" "$state/out"; then
    echo "FAIL $name: output lacks '$pattern'; output:"
    sed 's/^/    /' "$state/out"
    failures=$((failures + 1))
    return 1
  fi
}
fresh_state() {
  state="$tmp/state.$1"
  mkdir "$state"
}

# 1. The lists lock is held for two `update` attempts, the dpkg lock during `install`: the
#    script says it waits, retries, and installs with apt's lock timeout.
fresh_state waits
echo 2 >"$state/lock_updates"
touch "$state/dpkg_lock_held"
if run waits 0 && expect_output waits "waiting"; then
  if [[ $(wc -l <"$state/update_calls") != 3 ]]; then
    echo "FAIL waits: $(wc -l <"$state/update_calls") update calls, expected 3"
    failures=$((failures + 1))
  elif ! grep -q "DPkg::Lock::Timeout=600" "$state/install_args"; then
    echo "FAIL waits: install without DPkg::Lock::Timeout=600: $(cat "$state/install_args")"
    failures=$((failures + 1))
  else
    echo "ok   waits for a held lock, then installs"
  fi
fi

# 2. The lock is never released: the script gives up at its timeout (0 s here) and says so.
fresh_state gives_up
echo -1 >"$state/lock_updates"
if ZINF_APT_LOCK_TIMEOUT=0 run gives_up 100 && expect_output gives_up "gave up"; then
  echo "ok   gives up after ZINF_APT_LOCK_TIMEOUT"
fi

# 3. A failure that is not the lock is not retried.
fresh_state other_error
echo 0 >"$state/lock_updates"
touch "$state/update_error"
if run other_error 100 && expect_output other_error "Failed to fetch"; then
  if [[ $(wc -l <"$state/update_calls") != 1 ]]; then
    echo "FAIL other_error: $(wc -l <"$state/update_calls") update calls, expected 1"
    failures=$((failures + 1))
  else
    echo "ok   other update errors fail at once"
  fi
fi

if ((failures > 0)); then
  echo "test-install-deps: $failures failed"
  exit 1
fi
echo "test-install-deps: all passed"
