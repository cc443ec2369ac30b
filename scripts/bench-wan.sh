#!/usr/bin/env bash
# The WAN profile of the benchmarks: blobdrive and its ceilings measured through a
# shaping proxy (examples/wan_proxy.rs) that adds latency each way between the
# daemon and Azurite, as a VM a few milliseconds from its storage account sees it,
# and then with Azure's per-blob page-blob targets enforced (503 ServerBusy above
# them). Every figure has its ceiling measured through the same proxy in this run.
#
#   sudo scripts/bench.sh --wan            # full run (release build)
#   sudo scripts/bench.sh --wan --quick    # small sizes, debug build (CI)
#   sudo scripts/bench.sh --wan --only caps,fs   # some parts: ceiling, raw, fs, caps,
#                                          # diskcache (the summary then skips what is missing)
#
# Knobs (environment): BENCH_WAN_DELAY_MS (each way, default 5, so 10 ms round
# trips), BENCH_WAN_CAP_MIB_S (default 60) and BENCH_WAN_CAP_REQUESTS_S (default
# 500): a standard page blob's published targets; BENCH_WAN_RETRY_AFTER_S makes the
# throttling answers carry Retry-After (Azure documents none for storage).
# Results: target/bench/results-wan-<time>.json and a summary with the targets; a
# run that docs/benchmarks.md cites is copied, under the same name, into
# docs/benchmarks/ (never the top of docs/).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

QUICK=0
ONLY="ceiling,raw,fs,caps,diskcache"
PARTIAL=()
usage() { echo "usage: scripts/bench.sh --wan [--quick] [--only ceiling,raw,fs,caps,diskcache]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --wan) ;;
        --only)
            [ $# -ge 2 ] || usage
            ONLY="$2"; PARTIAL=(--partial); shift
            for part in ${ONLY//,/ }; do
                case "$part" in ceiling | raw | fs | caps | diskcache) ;; *) usage ;; esac
            done ;;
        *) usage ;;
    esac
    shift
done
# part NAME: whether this run measures that part.
part() { [[ ",$ONLY," == *",$1,"* ]]; }
DELAY_MS="${BENCH_WAN_DELAY_MS:-5}"
CAP_MIB_S="${BENCH_WAN_CAP_MIB_S:-60}"
CAP_REQ_S="${BENCH_WAN_CAP_REQUESTS_S:-500}"
if [ "$QUICK" = 1 ]; then
    # SIZE: sequential jobs; REGION: data the random reads spread over.
    SIZE=64M; SIZE_MIB=64; REGION_MIB=256; RUNTIME=2; CEIL_MIB=64; SMALL_S=1; PROFILE=debug
    CAPPED_MIB=64
else
    SIZE=1G; SIZE_MIB=1024; REGION_MIB=2048; RUNTIME=5; CEIL_MIB=1024; SMALL_S=3; PROFILE=release
    CAPPED_MIB=512
fi
RSIZE="${REGION_MIB}M"
[ "$(id -u)" = 0 ] || { echo "bench.sh needs root (FUSE, loop devices, mount)" >&2; exit 1; }
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

say "dependencies"
scripts/install-deps.sh --bench >&2
[ -x scripts/node_modules/.bin/azurite-blob ] || npm ci --prefix scripts --no-audit --no-fund --loglevel=error >&2
cargo_profile=()
[ "$PROFILE" = release ] && cargo_profile=(--release)
cargo build "${cargo_profile[@]}" --quiet --bin blobdrive --example backend_ceiling --example wan_proxy
BD="$ROOT/target/$PROFILE/blobdrive"
CEILING="$ROOT/target/$PROFILE/examples/backend_ceiling"
PROXY="$ROOT/target/$PROFILE/examples/wan_proxy"

WORK="$(mktemp -d /tmp/blobdrive-bench-wan.XXXXXX)"
OUT="$ROOT/target/bench"
mkdir -p "$OUT"
RESULT="$OUT/results-wan-$(date -u +%Y%m%dT%H%M%SZ).json"
echo '{}' >"$WORK/r.json"
export BLOBDRIVE_RUN_DIR="$WORK/run"

PROXY_PID=""
cleanup() {
    set +e
    for m in "$WORK"/mnt-*; do [ -d "$m" ] && "$BD" unmount "$m" >/dev/null 2>&1; done
    [ -n "$PROXY_PID" ] && { kill -TERM "$PROXY_PID"; wait_pid "$PROXY_PID"; }
    scripts/azurite.sh stop "$WORK/azurite" >/dev/null 2>&1
    rm -rf "$WORK"
    release_page_reporting
}
trap cleanup EXIT
hold_page_reporting

# proxy_start [CAP ARGS...]: a fresh proxy in front of the running Azurite; sets
# WAN_CS (the connection string through it) and DIRECT_CS (straight to Azurite).
proxy_start() {
    local port
    port="$(cat "$WORK/azurite/port")"
    DIRECT_CS="$(connection_string "$port")"
    "$PROXY" --upstream "127.0.0.1:$port" --delay-ms "$DELAY_MS" --stats-file "$WORK/proxy.json" "$@" \
        >"$WORK/proxy.port" &
    PROXY_PID=$!
    for _ in $(seq 1 50); do [ -s "$WORK/proxy.port" ] && break; sleep 0.1; done
    WAN_CS="$(connection_string "$(head -1 "$WORK/proxy.port")")"
}
proxy_stop() { kill -TERM "$PROXY_PID"; wait_pid "$PROXY_PID"; PROXY_PID=""; rm -f "$WORK/proxy.port"; }
proxy_stat() { python3 -c "import json; print(json.load(open('$WORK/proxy.json'))['$1'])"; }

# rand_read TARGET QD: random 4 KiB direct reads (libaio) over the data region for
# RUNTIME seconds -> prints IOPS.
rand_read() {
    fio --output-format=json --name=rr --filename="$1" --rw=randread --bs=4k --size="$RSIZE" \
        --direct=1 --ioengine=libaio --iodepth="$2" --time_based --runtime="$RUNTIME" \
        --randrepeat=0 >"$WORK/fio.json"
    python3 -c "import json; print(round(json.load(open('$WORK/fio.json'))['jobs'][0]['read']['iops'], 1))"
}

# write_fsync TARGET: 4 KiB writes each followed by fsync, one at a time, for
# RUNTIME seconds (into the second half of TARGET, away from the read region)
# -> prints "ms-per-write+fsync count".
write_fsync() {
    fio --output-format=json --name=wf --filename="$1" --rw=randwrite --bs=4k --size="$2" \
        --offset="$3" --fsync=1 --ioengine=psync --time_based --runtime="$RUNTIME" \
        --randrepeat=0 >"$WORK/fio.json"
    python3 -c "
import json; j = json.load(open('$WORK/fio.json'))['jobs'][0]
n = j['write']['total_ios']
print(round(j['job_runtime'] / max(1, n), 3), n)"
}

# miss_fraction MOUNTPOINT: the share of reads since mount that went to the blob.
miss_fraction() {
    "$BD" stats "$1" --json | python3 -c "
import json, sys; s = json.load(sys.stdin)
print(round(s['cache_misses'] / max(1, s['cache_misses'] + s['cache_hits']), 3))"
}

# fill_raw BLOB MIB: writes MIB of random data at the start of BLOB, straight to
# Azurite (no proxy: preparing data is not what is measured).
fill_raw() {
    local m="$WORK/mnt-fill"
    mkdir -p "$m"
    AZURE_STORAGE_CONNECTION_STRING="$DIRECT_CS" "$BD" mount "$1" "$m" --mode raw >/dev/null
    dd if=/dev/urandom of="$m/disk" bs=1M count="$2" conv=notrunc,fsync status=none
    "$BD" unmount "$m" >/dev/null
}

# settle_azurite: waits (at most 30 s) until Azurite has been idle for a second.
# After gigabytes were written into it, it goes on working (its in-memory store)
# for a while, and the job measured next paid for that: the raw file, measured
# first after the data was written, ran 0.5-0.7 of its ceiling in the bench and
# 0.9 in manual runs on a quiet emulator.
settle_azurite() {
    local pid before
    pid="$(cat "$WORK/azurite/pid")"
    ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
    for _ in $(seq 1 30); do
        before="$(ticks)"
        sleep 1
        [ $(( $(ticks) - before )) -lt 10 ] && return 0
    done
}

RTT_MS=$((DELAY_MS * 2))
put machine "$(python3 -c "import json,os,platform; print(json.dumps({'cores': os.cpu_count(), 'kernel': platform.release(), 'quick': $QUICK == 1, 'profile': '$PROFILE', 'delay_ms_each_way': $DELAY_MS, 'rtt_ms': $RTT_MS}))")"
put machine.page_reporting "$(page_reporting_json)"

if part ceiling; then
say "W1. backend ceiling through the proxy (${RTT_MS} ms round trips)"
fresh_azurite
proxy_start
put wan_ceiling "$("$CEILING" "$WAN_CS" bench-ceiling "$CEIL_MIB" "$SMALL_S")"
proxy_stop
fi

if part raw; then
say "W2. --mode raw and --mode block: random reads at QD 1 and 32, write + fsync"
fresh_azurite
proxy_start
"$BD" create bench/raw.vhd --size $((REGION_MIB * 2))M --create-container >/dev/null
fill_raw bench/raw.vhd "$REGION_MIB"
settle_azurite
export AZURE_STORAGE_CONNECTION_STRING="$WAN_CS"
MNT="$WORK/mnt-raw"; mkdir "$MNT"
"$BD" mount bench/raw.vhd "$MNT" --mode raw >/dev/null
put wan_raw.rand_read_qd1_iops "$(rand_read "$MNT/disk" 1)"
put wan_raw.rand_read_qd32_iops "$(rand_read "$MNT/disk" 32)"
put wan_raw.miss_fraction "$(miss_fraction "$MNT")"
read -r ms n < <(write_fsync "$MNT/disk" 64M "${REGION_MIB}M")
put wan_raw.write_fsync_ms "$ms"
put wan_raw.write_fsync_count "$n"
"$BD" unmount "$MNT" >/dev/null
MNT="$WORK/mnt-block"; mkdir "$MNT"
DEV="$("$BD" mount bench/raw.vhd "$MNT" --mode block 2>/dev/null | tail -1)"
put wan_block.loop_direct_io "$(cat "/sys/block/${DEV#/dev/}/loop/dio")"
put wan_block.rand_read_qd1_iops "$(rand_read "$DEV" 1)"
put wan_block.rand_read_qd32_iops "$(rand_read "$DEV" 32)"
put wan_block.miss_fraction "$(miss_fraction "$MNT")"
"$BD" unmount "$MNT" >/dev/null
proxy_stop
fi

if part fs; then
say "W3. --mode fs (ext4): sequential write and cold read, random reads, fsync"
fresh_azurite
proxy_start
"$BD" create bench/fs.vhd --size $((SIZE_MIB + REGION_MIB + 512))M --create-container >/dev/null
MNT="$WORK/mnt-fs"; mkdir "$MNT"
AZURE_STORAGE_CONNECTION_STRING="$DIRECT_CS" "$BD" mount bench/fs.vhd "$MNT" --mkfs ext4 >/dev/null
# The random-read file is laid out straight to Azurite; measuring starts after.
dd if=/dev/urandom of="$MNT/rand.dat" bs=1M count="$REGION_MIB" conv=fsync status=none
"$BD" unmount "$MNT" >/dev/null
settle_azurite
export AZURE_STORAGE_CONNECTION_STRING="$WAN_CS"
"$BD" mount bench/fs.vhd "$MNT" >/dev/null
AZ_PID="$(cat "$WORK/azurite/pid")"
# Where the CPU went during each sequential job (busy share of all cores, CPU
# seconds of the emulator, the proxy and the daemon).
put wan_fs.seq_mib "$SIZE_MIB"
c0="$(cpu_now "$AZ_PID" "$PROXY_PID" "$(daemon_pid "$MNT")")"
read -r mb _ < <(fio_run seq-write "$MNT"); put wan_fs.seq_write_mib_s "$mb"
put wan_fs.seq_write_cpu "$(cpu_json "$c0" "$(cpu_now "$AZ_PID" "$PROXY_PID" "$(daemon_pid "$MNT")")" azurite proxy daemon)"
"$BD" unmount "$MNT" >/dev/null
"$BD" mount bench/fs.vhd "$MNT" >/dev/null
drop_caches
c0="$(cpu_now "$AZ_PID" "$PROXY_PID" "$(daemon_pid "$MNT")")"
read -r mb _ < <(fio_run seq-read "$MNT"); put wan_fs.seq_read_cold_mib_s "$mb"
put wan_fs.seq_read_cold_cpu "$(cpu_json "$c0" "$(cpu_now "$AZ_PID" "$PROXY_PID" "$(daemon_pid "$MNT")")" azurite proxy daemon)"
# The sequential ceiling again, on this emulator as the jobs left it (the one of W1
# ran on a fresh Azurite whose JIT had not warmed up and that held nothing; the
# same 1 GiB ceiling measured 198-306 MiB/s within minutes on this machine), with
# its CPU use beside the jobs'. Its reads also read the drive's own blob back
# (blob_get_mib_s); the cold read is held to the better of the two.
settle_azurite
c0="$(cpu_now "$AZ_PID" "$PROXY_PID")"
put wan_fs_ceiling "$("$CEILING" "$WAN_CS" bench "$SIZE_MIB" 0 fs.vhd)"
put wan_fs_ceiling.cpu "$(cpu_json "$c0" "$(cpu_now "$AZ_PID" "$PROXY_PID")" azurite proxy)"
put wan_fs.rand_read_qd1_iops "$(rand_read "$MNT/rand.dat" 1)"
put wan_fs.rand_read_qd32_iops "$(rand_read "$MNT/rand.dat" 32)"
# fsync through ext4: what one 4 KiB write + fsync costs in time and in requests.
F0=$(proxy_stat forwarded); P0=$(stat_of "$MNT" put_page_requests)
read -r ms n < <(write_fsync "$MNT/fsync.dat" 16M 0)
put wan_fs.write_fsync_ms "$ms"
put wan_fs.requests_per_fsync "$(python3 -c "print(round(($(proxy_stat forwarded) - $F0) / $n, 2))")"
put wan_fs.put_pages_per_fsync "$(python3 -c "print(round(($(stat_of "$MNT" put_page_requests) - $P0) / $n, 2))")"
"$BD" unmount "$MNT" >/dev/null
proxy_stop
fi

if part caps; then
say "W4. under the per-blob caps (${CAP_MIB_S} MiB/s, ${CAP_REQ_S} requests/s)"
fresh_azurite
retry_after=()
[ -n "${BENCH_WAN_RETRY_AFTER_S:-}" ] && retry_after=(--retry-after "$BENCH_WAN_RETRY_AFTER_S")
proxy_start --blob-mib-s "$CAP_MIB_S" --blob-requests-s "$CAP_REQ_S" "${retry_after[@]}"
put wan_caps.retry_after_s "${BENCH_WAN_RETRY_AFTER_S:-0}"
put wan_caps.cap_mib_s "$CAP_MIB_S"
put wan_caps.cap_requests_s "$CAP_REQ_S"
export AZURE_STORAGE_CONNECTION_STRING="$WAN_CS"
"$BD" create bench/capped.vhd --size $((CAPPED_MIB + REGION_MIB))M --create-container >/dev/null
MNT="$WORK/mnt-capped"; mkdir "$MNT"
"$BD" mount bench/capped.vhd "$MNT" --mode raw >/dev/null
F0=$(proxy_stat forwarded); R0=$(proxy_stat refused_503)
fio --output-format=json --filename="$MNT/disk" --name=capped-write --rw=write --bs=1M \
    --size="${CAPPED_MIB}M" --ioengine=psync --end_fsync=1 >"$WORK/fio.json"
read -r mb _ < <(fio_result "$WORK/fio.json"); put wan_caps.seq_write_mib_s "$mb"
put wan_caps.seq_write_requests "$(( $(proxy_stat forwarded) - F0 ))"
put wan_caps.seq_write_refused_503 "$(( $(proxy_stat refused_503) - R0 ))"
"$BD" unmount "$MNT" >/dev/null
# Random reads need many small requests: the request cap binds.
"$BD" mount bench/capped.vhd "$MNT" --mode raw >/dev/null
F0=$(proxy_stat forwarded); R0=$(proxy_stat refused_503)
put wan_caps.rand_read_qd32_iops "$(RSIZE="${CAPPED_MIB}M" rand_read "$MNT/disk" 32)"
put wan_caps.rand_read_requests "$(( $(proxy_stat forwarded) - F0 ))"
put wan_caps.rand_read_refused_503 "$(( $(proxy_stat refused_503) - R0 ))"
put wan_caps.rand_read_seconds "$RUNTIME"
"$BD" unmount "$MNT" >/dev/null
proxy_stop
fi

if part diskcache; then
say "W5. --disk-cache: a warm remount against a cold one (${RTT_MS} ms round trips)"
fresh_azurite
proxy_start
"$BD" create bench/dc.vhd --size $((SIZE_MIB + REGION_MIB + 512))M --create-container >/dev/null
MNT="$WORK/mnt-dc"; mkdir "$MNT"
DC="$WORK/disk-caches"; mkdir -m 700 "$DC"
# The data is laid out straight to Azurite, without the disk cache.
AZURE_STORAGE_CONNECTION_STRING="$DIRECT_CS" "$BD" mount bench/dc.vhd "$MNT" --mkfs ext4 >/dev/null
dd if=/dev/urandom of="$MNT/seq.dat" bs=1M count="$SIZE_MIB" conv=fsync status=none
dd if=/dev/urandom of="$MNT/rand.dat" bs=1M count="$REGION_MIB" conv=fsync status=none
"$BD" unmount "$MNT" >/dev/null
settle_azurite
export AZURE_STORAGE_CONNECTION_STRING="$WAN_CS"
# Cold: an empty disk cache. The reads fill it (the random region read whole after
# the random job, so the warm random reads find all of it).
# A memory cache that holds the whole file, so that the same read a third time
# measures what FUSE and ext4 carry from the daemon's memory (the ceiling of any
# read through them).
DC_CACHE=$((SIZE_MIB + 512))
"$BD" mount bench/dc.vhd "$MNT" --disk-cache "$DC" --cache-size "${DC_CACHE}M" >/dev/null
drop_caches
read -r mb _ < <(fio_run seq-read "$MNT"); put wan_dc.seq_read_cold_mib_s "$mb"
put wan_dc.rand_read_qd32_cold_iops "$(rand_read "$MNT/rand.dat" 32)"
cat "$MNT/rand.dat" >/dev/null
put wan_dc.held_after_cold_mib "$("$BD" stats "$MNT" --json | python3 -c "import json,sys; print(round(json.load(sys.stdin)['disk_cache']['bytes'] / 1048576))")"
"$BD" unmount "$MNT" >/dev/null
# Warm: the same cache after a clean unmount; the kernel's caches dropped, so the
# disk cache's own file is read from the disk too.
"$BD" mount bench/dc.vhd "$MNT" --disk-cache "$DC" --cache-size "${DC_CACHE}M" >/dev/null
drop_caches
put wan_dc.warm_start "$("$BD" stats "$MNT" --json | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['disk_cache']['warm_start']))")"
D0="$(stat_of "$MNT" bytes_downloaded)"
read -r mb _ < <(fio_run seq-read "$MNT"); put wan_dc.seq_read_warm_mib_s "$mb"
put wan_dc.seq_read_warm_from_service_mib "$(python3 -c "print(round(($(stat_of "$MNT" bytes_downloaded) - $D0) / 1048576, 2))")"
put wan_dc.seq_mib "$SIZE_MIB"
drop_caches
read -r mb _ < <(fio_run seq-read "$MNT"); put wan_dc.seq_read_memory_mib_s "$mb"
put wan_dc.rand_read_qd32_warm_iops "$(rand_read "$MNT/rand.dat" 32)"
DPID="$(daemon_pid "$MNT")"
put wan_dc.daemon_hwm_mib "$(hwm_mib "$DPID")"
put wan_dc.cache_size_mib "$(( $(stat_of "$MNT" cache_size) / 1048576 ))"
"$BD" unmount "$MNT" >/dev/null
proxy_stop
# The disk's own read speed: the same sequential job on a file of the filesystem
# the disk cache lives on, out of the kernel's cache.
mkdir -p "$WORK/local"
dd if=/dev/urandom of="$WORK/local/seq.dat" bs=1M count="$SIZE_MIB" conv=fsync status=none
drop_caches
read -r mb _ < <(fio_run seq-read "$WORK/local"); put wan_dc.local_seq_read_mib_s "$mb"
rm -rf "$WORK/local" "$DC"
fi

say "summary"
cp "$WORK/r.json" "$RESULT"
python3 scripts/bench_wan_summary.py "$RESULT" "${PARTIAL[@]}"
echo "results: $RESULT (to cite it in docs/benchmarks.md: cp $RESULT docs/benchmarks/)" >&2
