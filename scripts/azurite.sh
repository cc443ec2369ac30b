#!/usr/bin/env bash
# Start or stop an Azurite blob service on 127.0.0.1 for tests.
#
#   scripts/azurite.sh start [STATE_DIR]   # prints AZURITE_PORT=, AZURITE_PID=, AZURITE_STATE=
#   scripts/azurite.sh stop STATE_DIR
#
# STATE_DIR (default: a new mktemp directory) receives `pid`, `port` and `log`.
# Stopping signals that pid only, never a process found by name: SIGTERM, then
# SIGKILL after about 5 s, because Azurite's in-memory store can make a graceful
# shutdown slow.
#
# AZURITE_PERSISTENCE=disk keeps the blobs in STATE_DIR/data instead of in memory
# (the default, which the benchmarks were measured with). Azurite collects garbage
# every ten minutes from its start, and over a large in-memory store that has
# kept it from answering for over 18 minutes at full CPU: whatever may run that
# long (the test suite's emulators, soak runs) should keep its blobs on disk.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="$HERE/node_modules/.bin/azurite-blob"
START_TIMEOUT_S=30
STOP_TIMEOUT_S=5

die() { echo "azurite.sh: $*" >&2; exit 1; }

# A port the kernel just handed out for 127.0.0.1; another process may still take
# it before Azurite binds, which `start` detects and retries.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# True once something answers HTTP on the port. Azurite refuses the unsigned
# request (403), which is all that is needed to know it is serving.
answers() {
    local port="$1" code
    if command -v curl >/dev/null; then
        code="$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$port/devstoreaccount1?comp=list" || true)"
        [ -n "$code" ] && [ "$code" != "000" ]
    else
        python3 - "$port" <<'PY'
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2) as s:
        s.sendall(b"GET /devstoreaccount1?comp=list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        sys.exit(0 if s.recv(8).startswith(b"HTTP/1.") else 1)
except OSError:
    sys.exit(1)
PY
    fi
}

# Is PID alive and still the Azurite we started (guards against pid reuse)?
is_ours() {
    local pid="$1"
    kill -0 "$pid" 2>/dev/null || return 1
    [ -r "/proc/$pid/stat" ] || return 0
    local stat cmdline
    stat="$(cat "/proc/$pid/stat" 2>/dev/null || true)"
    stat="${stat##*) }"
    # A zombie has exited already; its reaper may not be us.
    [ "${stat:0:1}" != Z ] || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    # Empty while the process is being torn down: still ours.
    [ -z "$cmdline" ] || [[ "$cmdline" == *azurite-blob* ]]
}

stop_pid() {
    local pid="$1" deadline
    is_ours "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    deadline=$((SECONDS + STOP_TIMEOUT_S))
    while [ "$SECONDS" -lt "$deadline" ]; do
        is_ours "$pid" || return 0
        sleep 0.1
    done
    echo "azurite.sh: pid $pid still running after SIGTERM + ${STOP_TIMEOUT_S} s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        is_ours "$pid" || return 0
        sleep 0.1
    done
    die "pid $pid survived SIGKILL"
}

ensure_deps() {
    if [ ! -x "$BIN" ]; then
        command -v npm >/dev/null || die "npm is not installed; it is needed to install Azurite"
        echo "azurite.sh: installing Azurite (npm ci --prefix scripts)" >&2
        npm ci --prefix "$HERE" --no-audit --no-fund --loglevel=error >&2
        [ -x "$BIN" ] || die "npm ci did not provide $BIN"
    fi
}

start() {
    local dir="${1:-}"
    if [ -z "$dir" ]; then
        dir="$(mktemp -d "${TMPDIR:-/tmp}/azurite.XXXXXX")"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    ensure_deps

    local persistence
    case "${AZURITE_PERSISTENCE:-memory}" in
        memory) persistence=(--inMemoryPersistence) ;;
        disk) mkdir -p "$dir/data"; persistence=(--location "$dir/data") ;;
        *) die "AZURITE_PERSISTENCE must be memory or disk, not ${AZURITE_PERSISTENCE}" ;;
    esac

    local try port pid deadline
    for try in 1 2 3 4 5; do
        port="$(free_port)"
        "$BIN" "${persistence[@]}" --disableTelemetry --blobHost 127.0.0.1 \
            --blobPort "$port" --skipApiVersionCheck --loose \
            >"$dir/log" 2>&1 </dev/null &
        pid=$!
        echo "$pid" >"$dir/pid"
        echo "$port" >"$dir/port"

        deadline=$((SECONDS + START_TIMEOUT_S))
        while [ "$SECONDS" -lt "$deadline" ]; do
            if ! kill -0 "$pid" 2>/dev/null; then
                break
            fi
            if answers "$port"; then
                echo "AZURITE_PORT=$port"
                echo "AZURITE_PID=$pid"
                echo "AZURITE_STATE=$dir"
                return 0
            fi
            sleep 0.1
        done

        if kill -0 "$pid" 2>/dev/null; then
            stop_pid "$pid"
            echo "azurite.sh: Azurite (pid $pid) did not answer on 127.0.0.1:$port within ${START_TIMEOUT_S} s; last lines of $dir/log:" >&2
            tail -n 30 "$dir/log" >&2 || true
            exit 1
        fi
        if grep -q EADDRINUSE "$dir/log" 2>/dev/null; then
            echo "azurite.sh: port $port was taken meanwhile (try $try); retrying" >&2
            continue
        fi
        echo "azurite.sh: Azurite (pid $pid) exited during startup; last lines of $dir/log:" >&2
        tail -n 30 "$dir/log" >&2 || true
        exit 1
    done
    die "no usable port after 5 tries"
}

stop() {
    local dir="${1:?usage: azurite.sh stop STATE_DIR}"
    [ -f "$dir/pid" ] || die "no pid file in $dir"
    stop_pid "$(cat "$dir/pid")"
    rm -f "$dir/pid"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start [STATE_DIR] | stop STATE_DIR" >&2; exit 2 ;;
esac
