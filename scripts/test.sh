#!/usr/bin/env bash
# The project's test command: formatting, lints, then unit, integration and
# end-to-end tests, each test binary against an Azurite of its own. Without
# arguments every binary runs, side by side in lanes (see below); exits non-zero
# if any failed. Arguments make it plain `cargo test` with them, e.g.
#   scripts/test.sh --test cli
#   scripts/test.sh -- --nocapture
# and it exits with cargo's status.
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
# container timed out twice, 25 s). Their blobs are on disk, not in memory:
# Azurite collects garbage every ten minutes from its start, and over a large
# in-memory store that kept it from answering for over 18 minutes, which a binary
# slowed by the lanes beside it, or run long with the soak knobs, would meet.
# Set BLOBDRIVE_TEST_AZURITE_PORT to point a single binary at one emulator.
unset BLOBDRIVE_TEST_AZURITE_PORT

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
if [ $# -gt 0 ]; then
    echo "== cargo test $*"
    set +e
    cargo test "$@" 2>&1 | tee "$STATE/cargo-test.log"
    status=${PIPESTATUS[0]}
    set -e
    awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' \
        "$STATE/cargo-test.log"
    exit "$status"
fi

# A full run: build every test binary once, then run them side by side in
# BLOBDRIVE_TEST_LANES lanes (default 3), longest first. Each binary has its own
# Azurite, run directory and mountpoints, and most of their time is spent waiting
# (outages, held requests, lease and token lifetimes), so lanes overlap the waits
# instead of adding them up. Each binary's output is printed in one piece when it
# ends. BLOBDRIVE_TEST_LANES=1 runs them one after another.
LANES="${BLOBDRIVE_TEST_LANES:-3}"
case "$LANES" in ''|*[!0-9]*|0) echo "BLOBDRIVE_TEST_LANES must be a number of at least 1" >&2; exit 2 ;; esac
echo "== cargo test --no-run"
cargo test --no-run --message-format=json-render-diagnostics >"$STATE/build.json"
python3 - "$STATE/build.json" >"$STATE/binaries" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = t["name"] if t["kind"] == ["test"] else f'{t["name"]}-{t["kind"][0]}'
        print(f'{name}\t{m["executable"]}')
PY
# Longest first (seconds each took alone on 2 cores): the two long tests,
# #[ignore]d in plain `cargo test` (a mount whose one-minute tokens are renewed across
# four lifetimes, 260; an outage at the default I/O timeout, 430, and beside it in
# the same binary fsyncs past a 20 s one, 95), then durability (180), torture (100),
# reliability (120), lies (85), replay (75), fsx (60).
order="entra_mount--ignored reliability--ignored durability torture reliability lies replay fsx concurrency entra_mount"
jobs_list() {
    for name in $order; do
        case "$name" in
            *--ignored) exe="$(awk -F'\t' -v n="${name%--ignored}" '$1 == n { print $2 }' "$STATE/binaries")"
                        printf '%s\t%s\t--ignored\n' "$name" "$exe" ;;
            *) awk -F'\t' -v n="$name" '$1 == n { print $0 "\t" }' "$STATE/binaries" ;;
        esac
    done
    awk -F'\t' -v o=" $order " 'index(o, " " $1 " ") == 0 { print $0 "\t" }' "$STATE/binaries"
}
mkdir "$STATE/logs"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; cleanup' EXIT
reported=" "
failed=()
report() {
    local f name rc secs
    for f in "$STATE"/logs/*.done; do
        [ -e "$f" ] || continue
        name="$(basename "$f" .done)"
        case "$reported" in *" $name "*) continue ;; esac
        reported="$reported$name "
        read -r rc secs <"$f"
        echo "== $name: exit $rc after ${secs}s"
        # The crash-state replay's figures (states checked, writes in flight,
        # answers dropped, states found wrong), one line per drive.
        grep -E '^test result:|^replay [^ ]+: [0-9]+ states checked' "$STATE/logs/$name.log" || true
        if [ "$rc" -ne 0 ]; then
            failed+=("$name")
            cat "$STATE/logs/$name.log"
        fi
    done
}
# Binaries running in the lanes (the long tests beside them do not count).
LONG_PIDS=""
in_lanes() {
    local all p
    all="$(jobs -rp)"
    for p in $LONG_PIDS; do all="$(grep -vx "$p" <<<"$all" || true)"; done
    grep -c . <<<"$all" || true
}
start_all=$(date +%s)
while IFS=$'\t' read -r name exe extra; do
    [ -n "$exe" ] || { echo "test binary $name was not built" >&2; failed+=("$name"); continue; }
    while [ "$(in_lanes)" -ge "$LANES" ]; do
        wait -n || true
        report
    done
    (
        t0=$(date +%s)
        set +e
        # shellcheck disable=SC2086 # $extra is one optional flag
        "$exe" $extra >"$STATE/logs/$name.log" 2>&1
        echo "$? $(( $(date +%s) - t0 ))" >"$STATE/logs/$name.done"
    ) &
    PIDS+=($!)
    # The long tests run beside the lanes: they mostly wait (for tokens to
    # expire, for an outage to pass the I/O timeout).
    case "$name" in *--ignored) LONG_PIDS="$LONG_PIDS $!" ;; esac
    echo "== started $name"
done < <(jobs_list)
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    wait -n || true
    report
done
report
echo "== cargo test --doc"
if cargo test --doc >"$STATE/logs/doc.log" 2>&1; then
    grep -E '^test result:' "$STATE/logs/doc.log" || true
else
    cat "$STATE/logs/doc.log"
    failed+=("doc")
fi
echo "== all test binaries ran in $(( $(date +%s) - start_all ))s with $LANES lanes"
cat "$STATE"/logs/*.log | awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }'
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
