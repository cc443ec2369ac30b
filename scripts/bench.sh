#!/usr/bin/env bash
# Benchmarks: every figure next to a ceiling measured in the same run.
#
#   sudo scripts/bench.sh           # full run (1 GiB sequential, 30 s random reads, 10 s random writes)
#   sudo scripts/bench.sh --quick   # same pipeline, small sizes (CI keeps it working)
#   sudo scripts/bench.sh --only encryption   # some parts: ceiling, local, fs,
#                          # encryption (3a's sequential jobs, then 3a'), raw, tera, peer
#   sudo scripts/bench.sh --wan [--quick] [--only PARTS]   # WAN profile: 10 ms
#                          # round trips, caps (scripts/bench-wan.sh, which see)
#   sudo scripts/bench.sh --idle [--quick]   # many idle volumes: what they cost a
#                          # node (scripts/bench-idle.sh, which see)
#
# Order: backend ceiling (blobdrive's client, no FUSE) -> local ceiling (ext4 on a
# loop device over a plain file) -> blobdrive (ext4 via --mode fs, and --mode raw) ->
# peer (s3backer over moto's S3 server) with that emulator's own ceiling.
# Results: target/bench/results-<time>.json and a summary on stdout. A run that
# docs/benchmarks.md cites is copied, under the same name, into docs/benchmarks/
# (never the top of docs/). Everything runs on 127.0.0.1; everything started here
# is stopped here, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

# The WAN profile: the same daemon behind a proxy that adds network latency; it
# reads its own options.
for arg in "$@"; do
    [ "$arg" = --wan ] && exec "$ROOT/scripts/bench-wan.sh" "$@"
    [ "$arg" = --idle ] && exec "$ROOT/scripts/bench-idle.sh" "$@"
done
QUICK=0
ONLY="ceiling,local,fs,encryption,raw,tera,peer"
PARTIAL=()
usage() {
    echo "usage: scripts/bench.sh [--quick] [--only ceiling,local,fs,encryption,raw,tera,peer] [--wan [--only PARTS] | --idle]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --only)
            [ $# -ge 2 ] || usage
            ONLY="$2"; PARTIAL=(--partial); shift
            for part in ${ONLY//,/ }; do
                case "$part" in ceiling | local | fs | encryption | raw | tera | peer) ;; *) usage ;; esac
            done ;;
        *) usage ;;
    esac
    shift
done
# part NAME: whether this run measures that part.
part() { [[ ",$ONLY," == *",$1,"* ]]; }
if [ "$QUICK" = 1 ]; then
    SIZE=64M; SIZE_MIB=64; RSIZE=32M; RUNTIME=3; RW_RUNTIME=3; CEIL_MIB=64; SMALL_S=2; PROFILE=debug
else
    SIZE=1G; SIZE_MIB=1024; RSIZE=256M; RUNTIME=30; RW_RUNTIME=10; CEIL_MIB=1024; SMALL_S=10; PROFILE=release
fi
[ "$(id -u)" = 0 ] || { echo "bench.sh needs root (FUSE, loop devices, mount)" >&2; exit 1; }
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

say "dependencies"
scripts/install-deps.sh --bench >&2
VENV="$ROOT/target/bench-venv"
if ! cmp -s scripts/bench-requirements.txt "$VENV/installed.txt"; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r scripts/bench-requirements.txt >&2
    cp scripts/bench-requirements.txt "$VENV/installed.txt"
fi
[ -x scripts/node_modules/.bin/azurite-blob ] || npm ci --prefix scripts --no-audit --no-fund --loglevel=error >&2
if [ "$PROFILE" = release ]; then
    cargo build --release --quiet --bin blobdrive --example backend_ceiling
else
    cargo build --quiet --bin blobdrive --example backend_ceiling
fi
BD="$ROOT/target/$PROFILE/blobdrive"
CEILING="$ROOT/target/$PROFILE/examples/backend_ceiling"

WORK="$(mktemp -d /tmp/blobdrive-bench.XXXXXX)"
OUT="$ROOT/target/bench"
mkdir -p "$OUT"
RESULT="$OUT/results-$(date -u +%Y%m%dT%H%M%SZ).json"
echo '{}' >"$WORK/r.json"
export BLOBDRIVE_RUN_DIR="$WORK/run"

MOTO_PID=""; S3B_PID=""
cleanup() {
    set +e
    for m in "$WORK"/mnt-*; do [ -d "$m" ] && "$BD" unmount "$m" >/dev/null 2>&1; done
    mountpoint -q "$WORK/s3fs" && umount "$WORK/s3fs"
    [ -n "${S3B_LOOP:-}" ] && losetup -d "$S3B_LOOP" 2>/dev/null
    mountpoint -q "$WORK/s3b" && fusermount3 -u "$WORK/s3b"
    [ -n "$S3B_PID" ] && wait_pid "$S3B_PID"
    mountpoint -q "$WORK/localfs" && umount "$WORK/localfs"
    [ -n "${LOCAL_LOOP:-}" ] && losetup -d "$LOCAL_LOOP" 2>/dev/null
    [ -n "$MOTO_PID" ] && { kill -TERM "$MOTO_PID"; wait_pid "$MOTO_PID"; }
    scripts/azurite.sh stop "$WORK/azurite" >/dev/null 2>&1
    rm -rf "$WORK"
    release_page_reporting
}
trap cleanup EXIT
hold_page_reporting

put machine "$(python3 -c "import json,os,platform; print(json.dumps({'cores': os.cpu_count(), 'kernel': platform.release(), 'memory_gib': round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1), 'quick': $QUICK == 1, 'profile': '$PROFILE'}))")"
put machine.page_reporting "$(page_reporting_json)"
# The load average at the start (1, 5 and 15 minutes): other work on the machine.
put machine.load_average "[$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ',')]"

# The memory cache of every blobdrive mount here.
CACHE=$((SIZE_MIB * 2 + 256))M

ceilings() {
    say "1. backend ceiling (blobdrive client, no FUSE)"
    fresh_azurite
    put backend_ceiling "$("$CEILING" "$AZURE_STORAGE_CONNECTION_STRING" bench-ceiling "$CEIL_MIB" "$SMALL_S")"

    say "1b. Microsoft's Python SDK: 8 parallel 4 MiB Put Page / ranged Get calls from memory"
    fresh_azurite
    put sdk "$("$VENV/bin/python" scripts/sdk_ceiling.py "$AZURE_STORAGE_CONNECTION_STRING" bench-sdk "$SIZE_MIB")"
}

local_ceiling() {
    say "2. local ceiling (ext4 on a loop device over a local file)"
    truncate -s $((SIZE_MIB * 2 + 512))M "$WORK/local.img"
    LOCAL_LOOP="$(losetup --find --show "$WORK/local.img")"
    mkfs.ext4 -q -F -E nodiscard "$LOCAL_LOOP"
    mkdir "$WORK/localfs"
    mount "$LOCAL_LOOP" "$WORK/localfs"
    read -r mb _ < <(fio_run seq-write "$WORK/localfs"); put local.seq_write_mib_s "$mb"
    drop_caches
    read -r mb _ < <(fio_run seq-read "$WORK/localfs"); put local.seq_read_cold_mib_s "$mb"
    read -r mb _ < <(fio_run seq-read "$WORK/localfs"); put local.seq_read_warm_mib_s "$mb"
    read -r _ iops < <(RUNTIME="$RW_RUNTIME" fio_run rand-write "$WORK/localfs"); put local.rand_write_iops "$iops"
    read -r _ iops < <(fio_run rand-read "$WORK/localfs"); put local.rand_read_iops "$iops"
    umount "$WORK/localfs"; losetup -d "$LOCAL_LOOP"; LOCAL_LOOP=""; rm -f "$WORK/local.img"
}

# 3a's sequential jobs: also the plain figures that 3a' is measured against.
fs_sequential() {
    say "3a. blobdrive --mode fs (ext4)"
    fresh_azurite
    "$BD" create bench/fs.vhd --size $((SIZE_MIB * 2 + 512))M --create-container >/dev/null
    MNT="$WORK/mnt-fs"; mkdir -p "$MNT"
    "$BD" mount bench/fs.vhd "$MNT" --mkfs ext4 --cache-size "$CACHE" >/dev/null
    P0=$(stat_of "$MNT" put_page_requests)
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    read -r mb _ < <(fio_run seq-write "$MNT"); put blobdrive_fs.seq_write_mib_s "$mb"
    put blobdrive_fs.seq_write_cpu_s_per_gib "$(cpu_per_gib "$T0" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    put blobdrive_fs.seq_write_put_page_calls "$(( $(stat_of "$MNT" put_page_requests) - P0 ))"
    put blobdrive_fs.peak_mib_after_seq_write "$(hwm_mib "$(daemon_pid "$MNT")")"
    "$BD" unmount "$MNT" >/dev/null
    "$BD" mount bench/fs.vhd "$MNT" --cache-size "$CACHE" >/dev/null
    drop_caches
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    read -r mb _ < <(fio_run seq-read "$MNT"); put blobdrive_fs.seq_read_cold_mib_s "$mb"
    T1="$(ticks_of "$DPID")"
    put blobdrive_fs.seq_read_cold_cpu_s_per_gib "$(cpu_per_gib "$T0" "$T1" "$SIZE_MIB")"
    drop_caches
    read -r mb _ < <(fio_run seq-read "$MNT"); put blobdrive_fs.seq_read_warm_mib_s "$mb"
    put blobdrive_fs.seq_read_warm_cpu_s_per_gib "$(cpu_per_gib "$T1" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    put blobdrive_fs.peak_mib_after_seq_read "$(hwm_mib "$(daemon_pid "$MNT")")"
    "$BD" unmount "$MNT" >/dev/null
}

fs_random() {
    say "3a. blobdrive --mode fs (ext4): the random jobs"
    # The random jobs on an emulator of their own, and the random writes for 10 s
    # (RW_RUNTIME), not 30: under them the kernel writes the 256 MiB file back
    # through FUSE over and over (about 700 MiB/s), the daemon uploads some 450 MiB/s
    # of it (flush units bridge clean gaps), and Azurite keeps every overwritten page
    # in memory until its garbage collector runs. 30 s sent 9.8-14 GiB, past
    # Azurite's in-memory limit (half the machine's memory) in two runs, after which
    # every Put Page was refused (409 MemoryExtentStoreAtSizeLimit).
    fresh_azurite
    MNT="$WORK/mnt-fs"; mkdir -p "$MNT"
    "$BD" create bench/fs.vhd --size $((SIZE_MIB * 2 + 512))M --create-container >/dev/null
    "$BD" mount bench/fs.vhd "$MNT" --mkfs ext4 --cache-size "$CACHE" >/dev/null
    # Lay the random-write file out sequentially first (fio would), then measure.
    BENCH_DIR="$MNT" BENCH_RSIZE="$RSIZE" python3 -c "
import os
with open(os.environ['BENCH_DIR'] + '/rand.dat', 'wb') as f:
    n = int(os.environ['BENCH_RSIZE'].rstrip('M')) 
    for _ in range(n): f.write(os.urandom(1 << 20))
    f.flush(); os.fsync(f.fileno())
"
    P0=$(stat_of "$MNT" put_page_requests); B0=$(stat_of "$MNT" bytes_written); U0=$(stat_of "$MNT" bytes_uploaded)
    read -r _ iops < <(RUNTIME="$RW_RUNTIME" fio_run rand-write "$MNT"); put blobdrive_fs.rand_write_iops "$iops"
    sync
    P1=$(stat_of "$MNT" put_page_requests); B1=$(stat_of "$MNT" bytes_written)
    put blobdrive_fs.rand_write_uploaded_mib "$(( ($(stat_of "$MNT" bytes_uploaded) - U0) >> 20 ))"
    put blobdrive_fs.rand_write_put_page_calls_per_mib "$(python3 -c "print(round(($P1 - $P0) / max(1, ($B1 - $B0) / 1048576), 3))")"
    read -r _ iops < <(fio_run rand-read "$MNT"); put blobdrive_fs.rand_read_iops "$iops"
    put blobdrive_fs.peak_mib "$(hwm_mib "$(daemon_pid "$MNT")")"
    put blobdrive_fs.cache_mib "$((SIZE_MIB * 2 + 256))"
    "$BD" unmount "$MNT" >/dev/null
}

encrypted_sequential() {
    say "3a'. blobdrive --mode fs (ext4) on an encrypted drive (LUKS2, aes-xts-plain64)"
    # The same sequential jobs as 3a on a fresh emulator, the drive encrypted:
    # their MiB/s against 3a's of this run, and the daemon's CPU per GiB.
    fresh_azurite
    printf '%s' bench-passphrase >"$WORK/bench.key"; chmod 600 "$WORK/bench.key"
    "$BD" create bench/enc.vhd --size $((SIZE_MIB * 2 + 512))M --create-container \
        --encrypt --key-file "$WORK/bench.key" >/dev/null
    MNT="$WORK/mnt-enc"; mkdir "$MNT"
    "$BD" mount bench/enc.vhd "$MNT" --mkfs ext4 --cache-size "$CACHE" --key-file "$WORK/bench.key" >/dev/null
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    read -r mb _ < <(fio_run seq-write "$MNT"); put blobdrive_fs_encrypted.seq_write_mib_s "$mb"
    put blobdrive_fs_encrypted.seq_write_cpu_s_per_gib "$(cpu_per_gib "$T0" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    "$BD" unmount "$MNT" >/dev/null
    "$BD" mount bench/enc.vhd "$MNT" --cache-size "$CACHE" --key-file "$WORK/bench.key" >/dev/null
    drop_caches
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    read -r mb _ < <(fio_run seq-read "$MNT"); put blobdrive_fs_encrypted.seq_read_cold_mib_s "$mb"
    put blobdrive_fs_encrypted.seq_read_cold_cpu_s_per_gib "$(cpu_per_gib "$T0" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    "$BD" unmount "$MNT" >/dev/null
}

raw_file() {
    say "3b. blobdrive --mode raw"
    fresh_azurite
    "$BD" create bench/raw.vhd --size $((SIZE_MIB + 64))M --create-container >/dev/null
    MNT="$WORK/mnt-raw"; mkdir "$MNT"
    "$BD" mount bench/raw.vhd "$MNT" --mode raw --cache-size "$CACHE" >/dev/null
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    BENCH_DIR="$MNT" BENCH_SIZE="$SIZE" fio --output-format=json --filename="$MNT/disk" --name=raw-write \
        --rw=write --bs=1M --size="$SIZE" --ioengine=psync --end_fsync=1 >"$WORK/fio.json"
    put blobdrive_raw.seq_write_cpu_s_per_gib "$(cpu_per_gib "$T0" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    read -r mb _ < <(fio_result "$WORK/fio.json"); put blobdrive_raw.seq_write_mib_s "$mb"
    "$BD" unmount "$MNT" >/dev/null
    "$BD" mount bench/raw.vhd "$MNT" --mode raw --cache-size "$CACHE" >/dev/null
    DPID="$(daemon_pid "$MNT")"; T0="$(ticks_of "$DPID")"
    fio --output-format=json --filename="$MNT/disk" --name=raw-read --rw=read --bs=1M --size="$SIZE" \
        --ioengine=psync >"$WORK/fio.json"
    put blobdrive_raw.seq_read_cold_cpu_s_per_gib "$(cpu_per_gib "$T0" "$(ticks_of "$DPID")" "$SIZE_MIB")"
    read -r mb _ < <(fio_result "$WORK/fio.json"); put blobdrive_raw.seq_read_cold_mib_s "$mb"
    "$BD" unmount "$MNT" >/dev/null
}

sparse_tera() {
    say "3c. mount time of a sparse 1 TiB drive; time to first byte"
    fresh_azurite
    "$BD" create bench/tera.vhd --size 1TiB --create-container >/dev/null
    MNT="$WORK/mnt-tera"; mkdir "$MNT"
    "$BD" mount bench/tera.vhd "$MNT" --mode raw >/dev/null
    for g in 1 300 700 1000; do
        dd if=/dev/urandom of="$MNT/disk" bs=1M count=4 seek=$((g * 1024)) conv=notrunc,fsync status=none
    done
    "$BD" unmount "$MNT" >/dev/null
    T0=$(date +%s.%N)
    "$BD" mount bench/tera.vhd "$MNT" --mode raw >/dev/null
    T1=$(date +%s.%N)
    dd if="$MNT/disk" of=/dev/null bs=4k count=1 skip=$((300 * 262144)) status=none
    T2=$(date +%s.%N)
    put blobdrive_tera.mount_s "$(python3 -c "print(round($T1 - $T0, 3))")"
    put blobdrive_tera.first_byte_s "$(python3 -c "print(round($T2 - $T1, 4))")"
    put blobdrive_tera.page_range_calls "$(stat_of "$MNT" page_range_requests)"
    "$BD" unmount "$MNT" >/dev/null
}

peer() {
    say "4. peer: s3backer over moto's S3 server, and that server's own ceiling"
    # moto too starts fresh for its ceiling and again for s3backer.
    moto_start() {
        MOTO_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
        "$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >"$WORK/moto.log" 2>&1 &
        MOTO_PID=$!
        for _ in $(seq 1 100); do
            python3 -c "import socket; socket.create_connection(('127.0.0.1', $MOTO_PORT), 0.2)" 2>/dev/null && break
            sleep 0.2
        done
        "$VENV/bin/python" - "$MOTO_PORT" <<'PY'
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", aws_access_key_id="bench",
                  aws_secret_access_key="bench", region_name="us-east-1")
s3.create_bucket(Bucket="bench")
PY
    }
    moto_stop() { kill -TERM "$MOTO_PID"; wait_pid "$MOTO_PID"; MOTO_PID=""; }
    moto_start
    put s3_ceiling "$("$VENV/bin/python" scripts/s3_ceiling.py "http://127.0.0.1:$MOTO_PORT" bench "$CEIL_MIB" 1)"
    moto_stop
    moto_start
    S3SIZE=$((SIZE_MIB * 2 + 512))M
    s3b_start() {
        mkdir -p "$WORK/s3b"
        s3backer -f --baseURL="http://127.0.0.1:$MOTO_PORT/" --accessId=bench --accessKey=bench \
            --blockSize=1M --size="$S3SIZE" --blockCacheSize=$((SIZE_MIB * 2 + 256)) --force \
            --prefix=disk/ bench "$WORK/s3b" >"$WORK/s3backer.log" 2>&1 &
        S3B_PID=$!
        for _ in $(seq 1 100); do [ -e "$WORK/s3b/file" ] && break; sleep 0.1; done
        S3B_LOOP="$(losetup --find --show "$WORK/s3b/file")"
    }
    s3b_stop() {
        losetup -d "$S3B_LOOP"; S3B_LOOP=""
        fusermount3 -u "$WORK/s3b"
        wait_pid "$S3B_PID"; S3B_PID=""
    }
    s3b_start
    mkfs.ext4 -q -F -E nodiscard "$S3B_LOOP"
    mkdir -p "$WORK/s3fs"
    mount "$S3B_LOOP" "$WORK/s3fs"
    read -r mb _ < <(fio_run seq-write "$WORK/s3fs"); put s3backer.seq_write_mib_s "$mb"
    umount "$WORK/s3fs"
    put s3backer.peak_mib_after_seq_write "$(hwm_mib "$S3B_PID")"
    s3b_stop
    s3b_start
    mount "$S3B_LOOP" "$WORK/s3fs"
    drop_caches
    read -r mb _ < <(fio_run seq-read "$WORK/s3fs"); put s3backer.seq_read_cold_mib_s "$mb"
    drop_caches
    read -r mb _ < <(fio_run seq-read "$WORK/s3fs"); put s3backer.seq_read_warm_mib_s "$mb"
    BENCH_DIR="$WORK/s3fs" BENCH_RSIZE="$RSIZE" python3 -c "
import os
with open(os.environ['BENCH_DIR'] + '/rand.dat', 'wb') as f:
    for _ in range(int(os.environ['BENCH_RSIZE'].rstrip('M'))): f.write(os.urandom(1 << 20))
    f.flush(); os.fsync(f.fileno())
"
    read -r _ iops < <(RUNTIME="$RW_RUNTIME" fio_run rand-write "$WORK/s3fs"); put s3backer.rand_write_iops "$iops"
    read -r _ iops < <(fio_run rand-read "$WORK/s3fs"); put s3backer.rand_read_iops "$iops"
    put s3backer.peak_mib "$(hwm_mib "$S3B_PID")"
    umount "$WORK/s3fs"
    s3b_stop
}

! part ceiling || ceilings
! part local || local_ceiling
if part fs || part encryption; then fs_sequential; fi
! part fs || fs_random
! part encryption || encrypted_sequential
! part raw || raw_file
! part tera || sparse_tera
! part peer || peer

say "summary"
cp "$WORK/r.json" "$RESULT"
python3 scripts/bench_summary.py "$RESULT" "${PARTIAL[@]}"
echo "results: $RESULT (to cite it in docs/benchmarks.md: cp $RESULT docs/benchmarks/)" >&2
