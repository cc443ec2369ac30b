# shellcheck shell=bash
# Helpers shared by the benchmark scripts (bench.sh, bench-wan.sh); sourced, not run.
# Expects ROOT, WORK, BD and SIZE/RSIZE/RUNTIME to be set by the caller.

say() { printf '\n== %s\n' "$*" >&2; }

wait_pid() {
    for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
}

# put KEY JSON-VALUE: records one figure.
put() {
    python3 - "$WORK/r.json" "$1" "$2" <<'PY'
import json, sys
path, key, value = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(path))
node = r
parts = key.split(".")
for p in parts[:-1]:
    node = node.setdefault(p, {})
node[parts[-1]] = json.loads(value)
json.dump(r, open(path, "w"), indent=2)
PY
}

# fio_run JOB DIR -> prints "MiB/s IOPS" of the job.
fio_run() {
    BENCH_DIR="$2" BENCH_SIZE="$SIZE" BENCH_RSIZE="$RSIZE" BENCH_RUNTIME="$RUNTIME" \
        fio --output-format=json "scripts/fio/$1.fio" >"$WORK/fio.json"
    fio_result "$WORK/fio.json"
}

# fio_result FIO.JSON -> prints "MiB/s IOPS" of the first job in fio's JSON output
# (its write side if it wrote, else its read side).
fio_result() {
    python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print(round(side["bw_bytes"] / 1048576, 2), round(side["iops"], 1))
PY
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

hwm_mib() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

stat_of() { "$BD" stats "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }

# cpu_now PID...: the machine's busy and idle clock ticks, then each PID's (user and
# system), on one line, for cpu_json.
cpu_now() {
    local line p
    line="$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat)"
    for p in "$@"; do line="$line $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)"; done
    echo "$line"
}

# cpu_json BEFORE AFTER NAME...: what the machine and each process (named in the
# order cpu_now got their PIDs) used between two cpu_now lines, as JSON: the busy
# share of all cores and CPU seconds per process. On a 2-core machine shared with
# the emulator this says whether a job was bound by the CPU rather than the path.
cpu_json() {
    python3 - "$@" <<'PY'
import json, os, sys
before, after = [list(map(int, a.split())) for a in sys.argv[1:3]]
names = sys.argv[3:]
d = [a - b for a, b in zip(after, before)]
hz = os.sysconf("SC_CLK_TCK")
out = {"busy_share": round(d[0] / max(1, d[0] + d[1]), 3)}
out.update({f"{n}_cpu_s": round(v / hz, 2) for n, v in zip(names, d[2:])})
print(json.dumps(out))
PY
}

# ticks_of PID: the user + system clock ticks PID has used so far.
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# cpu_per_gib TICKS_BEFORE TICKS_AFTER MIB: CPU seconds per GiB moved.
cpu_per_gib() {
    python3 -c "import os; print(round(($2 - $1) / os.sysconf('SC_CLK_TCK') / ($3 / 1024), 3))"
}

daemon_pid() {
    "$BD" list --json | python3 -c "import json,sys; print([m['pid'] for m in json.load(sys.stdin) if m['mountpoint']=='$1'][0])"
}

# Each group of jobs, and each ceiling, starts on a freshly started emulator. A
# long-lived emulator carries what earlier jobs left (Azurite keeps deleted blobs'
# memory until its garbage collector gets to it): measured on this 2-core machine,
# a sequential write right after the 1 GiB ceiling ran 173-285 MiB/s, and 279-313
# MiB/s on a fresh Azurite. Fresh starts keep every figure and its ceiling alike.
AZURITE_UP=0
fresh_azurite() {
    [ "$AZURITE_UP" = 1 ] && scripts/azurite.sh stop "$WORK/azurite" >/dev/null
    scripts/azurite.sh start "$WORK/azurite" >/dev/null
    AZURITE_UP=1
    AZURE_STORAGE_CONNECTION_STRING="$(connection_string "$(cat "$WORK/azurite/port")")"
    export AZURE_STORAGE_CONNECTION_STRING
}

# connection_string PORT: the emulator's account reached through 127.0.0.1:PORT.
connection_string() {
    echo "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$1/devstoreaccount1;"
}
