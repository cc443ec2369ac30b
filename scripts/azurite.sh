#!/usr/bin/env bash
# Start or stop an in-memory Azurite blob service on 127.0.0.1 for tests.
#
#   scripts/azurite.sh start [STATE_DIR]   # prints AZURITE_PORT=.. and AZURITE_PID=..
#   scripts/azurite.sh stop STATE_DIR
#
# STATE_DIR receives `pid`, `port` and `log`. Stopping signals that pid only (never
# a process found by name): SIGTERM, then SIGKILL after a few seconds, because a
# graceful shutdown with a large in-memory store can take much longer.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="$HERE/node_modules/.bin/azurite-blob"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

answers() {
    # Any HTTP answer means the server is up (an unauthenticated GET gets 4xx).
    python3 - "$1" <<'PY'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
    s.sendall(b"GET /devstoreaccount1?comp=list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    ok = s.recv(16).startswith(b"HTTP/1.")
    s.close()
    sys.exit(0 if ok else 1)
except OSError:
    sys.exit(1)
PY
}

start() {
    local dir="${1:-}"
    [ -n "$dir" ] || dir="$(mktemp -d /tmp/azurite.XXXXXX)"
    mkdir -p "$dir"
    if [ ! -x "$BIN" ]; then
        npm ci --prefix "$HERE" --no-audit --no-fund --loglevel=error >&2
    fi
    local try port pid
    for try in 1 2 3 4 5; do
        port="$(free_port)"
        "$BIN" --inMemoryPersistence --disableTelemetry --blobHost 127.0.0.1 \
            --blobPort "$port" --skipApiVersionCheck --loose \
            >"$dir/log" 2>&1 </dev/null &
        pid=$!
        echo "$pid" >"$dir/pid"
        echo "$port" >"$dir/port"
        for _ in $(seq 1 300); do
            if answers "$port"; then
                echo "AZURITE_PORT=$port"
                echo "AZURITE_PID=$pid"
                echo "AZURITE_STATE=$dir"
                return 0
            fi
            if ! kill -0 "$pid" 2>/dev/null; then
                break
            fi
            sleep 0.1
        done
        # Died (port taken in the meantime?) or never answered: stop it and retry.
        stop_pid "$pid"
        if grep -q EADDRINUSE "$dir/log" 2>/dev/null; then
            continue
        fi
        echo "azurite did not start within 30 s; last lines of $dir/log:" >&2
        tail -n 20 "$dir/log" >&2 || true
        return 1
    done
    echo "azurite: no free port after 5 tries" >&2
    return 1
}

stop_pid() {
    local pid="$1"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

stop() {
    local dir="${1:?usage: azurite.sh stop STATE_DIR}"
    [ -f "$dir/pid" ] || { echo "no pid file in $dir" >&2; return 1; }
    stop_pid "$(cat "$dir/pid")"
    rm -f "$dir/pid"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start [STATE_DIR] | stop STATE_DIR" >&2; exit 2 ;;
esac
