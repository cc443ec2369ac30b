# shellcheck shell=bash
# Helpers shared by the benchmark scripts (bench.sh, bench-wan.sh); sourced, not run.
# Expects ROOT, WORK, BD and SIZE/RSIZE/RUNTIME to be set by the caller.

say() { printf '\n== %s\n' "$*" >&2; }

# Free page reporting (a virtio-balloon feature of VMs such as this Firecracker
# guest) hands freed guest memory back to the hypervisor within moments, and the
# next write to such a page waits while the host backs it again. That wait is
# charged as CPU time to whoever touches the page first: for a read through ext4,
# the daemon's FUSE reply copying into the page cache that `drop_caches` just
# freed. Measured on this VM, the same 1 GiB read from the daemon's memory cost it
# 0.22-0.29 CPU s with the pages still backed and 2.0-2.6 s after they went back
# (`scripts/refault-cost.sh`). So that the CPU figures measure the daemon and not
# the hypervisor, the benchmarks hold reporting off while they run (a reporting
# order above the largest the kernel has, which it then never reaches), then touch
# and free six times the bytes a job moves (BENCH_PRIME_MIB; at most half the free
# memory), so that the memory the jobs take is memory the host already backs, and
# put the old order back when they end. BENCH_PAGE_REPORTING=as-is measures as the
# machine is. Sets PAGE_REPORTING_WAS (empty: nothing held).
PAGE_REPORTING=/sys/module/page_reporting/parameters/page_reporting_order
PAGE_REPORTING_WAS=""
hold_page_reporting() {
    [ "${BENCH_PAGE_REPORTING:-hold}" = as-is ] && return 0
    [ -w "$PAGE_REPORTING" ] || return 0
    local orders
    # /proc/buddyinfo has one column per order after its four leading fields.
    orders=$(awk 'NR == 1 {print NF - 4}' /proc/buddyinfo)
    PAGE_REPORTING_WAS="$(cat "$PAGE_REPORTING")"
    echo "$orders" >"$PAGE_REPORTING"
    local prime avail
    avail=$(awk '/MemAvailable/ {print int($2 / 2048)}' /proc/meminfo)
    prime="${BENCH_PRIME_MIB:-$(( ${SIZE_MIB:-1024} * 6 ))}"
    [ "$prime" -le "$avail" ] || prime="$avail"
    say "free page reporting held off for the run (order $PAGE_REPORTING_WAS -> $orders; BENCH_PAGE_REPORTING=as-is keeps it); priming $prime MiB"
    python3 - "$prime" <<'PY'
import mmap, sys
mib = int(sys.argv[1])
if mib > 0:
    m = mmap.mmap(-1, mib << 20)
    chunk = b"\1" * (1 << 20)
    for _ in range(mib):
        m.write(chunk)
    m.close()
PY
}
release_page_reporting() {
    [ -n "$PAGE_REPORTING_WAS" ] || return 0
    echo "$PAGE_REPORTING_WAS" >"$PAGE_REPORTING"
    PAGE_REPORTING_WAS=""
}
# single_mount_work NAME: a work directory for a script that mounts one drive at
# $MNT, with an EXIT trap that unmounts it, stops the emulator started there and
# puts page reporting back. Sets WORK, MNT and BLOBDRIVE_RUN_DIR; expects BD.
single_mount_work() {
    WORK="$(mktemp -d "/tmp/blobdrive-$1.XXXXXX")"
    export BLOBDRIVE_RUN_DIR="$WORK/run"
    MNT="$WORK/mnt"
    trap single_mount_cleanup EXIT
}
single_mount_cleanup() {
    set +e
    [ -d "$MNT" ] && "$BD" unmount "$MNT" >/dev/null 2>&1
    scripts/azurite.sh stop "$WORK/azurite" >/dev/null 2>&1
    rm -rf "$WORK"
    release_page_reporting
}

# page_reporting_json: what the run measured under, for the results.
page_reporting_json() {
    if [ -n "$PAGE_REPORTING_WAS" ]; then
        printf '{"held": true, "order_was": %s}' "$PAGE_REPORTING_WAS"
    elif [ -r "$PAGE_REPORTING" ]; then
        printf '{"held": false, "order": %s}' "$(cat "$PAGE_REPORTING")"
    else
        printf '{"held": false, "order": null}'
    fi
}

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

# root_pid MOUNTPOINT: the mount's root part (the pid its record names).
root_pid() {
    "$BD" list --json | python3 -c "import json,sys; print([m['pid'] for m in json.load(sys.stdin) if m.get('mountpoint')=='$1'][0])"
}

# daemon_pid MOUNTPOINT: the mount's worker, which does all its I/O (the root
# part's only child): what the CPU and memory figures measure.
daemon_pid() {
    ps -o pid= --ppid "$(root_pid "$1")" | head -n 1 | tr -d ' '
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
