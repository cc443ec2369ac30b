#!/usr/bin/env bash
# The project's test command: formatting, lints, then unit, integration and
# end-to-end tests against one Azurite started here on a free port and stopped
# (by pid) on exit. Extra arguments go to `cargo test`, e.g.
#   scripts/test.sh --test cli
#   scripts/test.sh -- --nocapture
# Exits with cargo's status.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages (fuse3, e2fsprogs, qemu-utils, ...) when missing; needs root.
scripts/install-deps.sh

# Node dependencies (Azurite): install when missing or older than the lock file.
if [ ! -x scripts/node_modules/.bin/azurite-blob ] \
    || [ scripts/package-lock.json -nt scripts/node_modules/.package-lock.json ]; then
    echo "== npm ci --prefix scripts"
    npm ci --prefix scripts --no-audit --no-fund --loglevel=error
fi

STATE="$(mktemp -d "${TMPDIR:-/tmp}/blobdrive-test.XXXXXX")"
cleanup() {
    rm -rf "$STATE"
}
trap cleanup EXIT
# Make sure an interrupt still runs the EXIT trap.
trap 'exit 130' INT
trap 'exit 143' TERM
# Every test binary starts an Azurite of its own (on a free port, stopped by pid
# when the binary exits; see tests/common/azurite.rs), a few seconds each. One
# emulator for the whole run held gigabytes by its end and, late in the run,
# stopped answering for tens of seconds (once a fresh clone's create of a
# container timed out twice, 25 s); no binary runs long enough for that, and
# Azurite's in-memory store first garbage-collects ten minutes after it starts.
# Set BLOBDRIVE_TEST_AZURITE_PORT to point a single binary at one emulator.
unset BLOBDRIVE_TEST_AZURITE_PORT

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
# The one long test (a mount whose 60 s tokens are renewed across four lifetimes,
# about 4.5 minutes) is #[ignore]d in plain `cargo test`; a full run starts it here,
# beside the rest of the suite, from its built test binary (a second `cargo test`
# would wait for the first one's lock).
LONG_PID=""
if [ $# -eq 0 ]; then
    echo "== building tests; starting tests/entra_mount.rs --ignored in the background"
    LONG_EXE="$(cargo test --no-run --test entra_mount --message-format=json 2>/dev/null \
        | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "entra_mount":
        print(m["executable"])')"
    [ -n "$LONG_EXE" ] || { echo "cannot build tests/entra_mount.rs" >&2; exit 1; }
    "$LONG_EXE" --ignored >"$STATE/long.log" 2>&1 &
    LONG_PID=$!
    trap 'kill "$LONG_PID" 2>/dev/null || true; cleanup' EXIT
fi
echo "== cargo test $*"
set +e
cargo test "$@" 2>&1 | tee "$STATE/cargo-test.log"
status=${PIPESTATUS[0]}
if [ -n "$LONG_PID" ]; then
    echo "== waiting for the long test (tests/entra_mount.rs --ignored)"
    wait "$LONG_PID"
    long_status=$?
    LONG_PID=""
    cat "$STATE/long.log" | tee -a "$STATE/cargo-test.log"
    [ "$long_status" -eq 0 ] || status=$long_status
fi
set -e
# One closing line over every test binary (the last binary cargo runs is the
# doc-test pass, which has no tests of its own).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' \
    "$STATE/cargo-test.log"
exit "$status"
