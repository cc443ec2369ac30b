#!/usr/bin/env bash
# Where the daemon's CPU goes in one sequential job: runs the job on a fresh
# emulator with `perf record` on the daemon, prints the daemon's CPU seconds per
# GiB and MiB/s, and draws a flame graph (inferno, built from crates.io into
# target/tools on first use).
#
#   sudo scripts/profile.sh JOB [OUT.svg]
#     JOB: fs-write | fs-read | fs-warm | fs-disk | raw-write | raw-read   (ext4
#          through the loop device, or the raw disk file with 1 MiB requests; reads
#          are cold, but fs-warm's, which finds the bytes in the daemon's memory
#          cache, and fs-disk's, which finds them in its disk cache after a remount)
#   BENCH_SIZE=1G (default) the bytes moved; PROFILE_HZ=499 the sampling rate;
#   PROFILE_CACHE=SIZE the daemon's --cache-size (default: twice the bytes moved, as
#   bench.sh; smaller than them, the cache recycles its memory once full);
#   PROFILE_BIN=PATH a blobdrive binary to measure instead of building this tree's
#   (to compare two builds in turn).
#
# perf comes from Debian's linux-perf. Everything runs on 127.0.0.1 and everything
# started here is stopped here, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
JOB="${1:-}"
case "$JOB" in fs-write|fs-read|fs-warm|fs-disk|raw-write|raw-read) ;; *)
    echo "usage: sudo scripts/profile.sh fs-write|fs-read|fs-warm|fs-disk|raw-write|raw-read [OUT.svg]" >&2; exit 2 ;;
esac
SVG="${2:-$ROOT/target/profile/$JOB.svg}"
SIZE="${BENCH_SIZE:-1G}"
SIZE_MIB=$(( $(numfmt --from=iec "$SIZE") >> 20 ))
RSIZE=32M; RUNTIME=1
HZ="${PROFILE_HZ:-499}"
[ "$(id -u)" = 0 ] || { echo "profile.sh needs root (FUSE, loop devices, mount, perf)" >&2; exit 1; }
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"

scripts/install-deps.sh --bench >&2
command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf; } >&2
TOOLS="$ROOT/target/tools"
[ -x "$TOOLS/bin/inferno-flamegraph" ] || cargo install --quiet --locked inferno --root "$TOOLS" >&2
[ -x scripts/node_modules/.bin/azurite-blob ] || npm ci --prefix scripts --no-audit --no-fund --loglevel=error >&2
if [ -n "${PROFILE_BIN:-}" ]; then
    BD="$PROFILE_BIN"
else
    cargo build --release --quiet --bin blobdrive
    BD="$ROOT/target/release/blobdrive"
fi

single_mount_work profile
echo '{}' >"$WORK/r.json"
hold_page_reporting
fresh_azurite
mkdir "$MNT"
CACHE="${PROFILE_CACHE:-$((SIZE_MIB * 2 + 256))M}"
case "$JOB" in
    fs-*) DISK_CACHE=()
          [ "$JOB" = fs-disk ] && { mkdir -m 700 "$WORK/disk-cache"; DISK_CACHE=(--disk-cache "$WORK/disk-cache"); }
          "$BD" create bench/p.vhd --size $((SIZE_MIB * 2 + 512))M --create-container >/dev/null
          "$BD" mount bench/p.vhd "$MNT" --mkfs ext4 --cache-size "$CACHE" "${DISK_CACHE[@]}" >/dev/null
          FIO_JOB="${JOB#fs-}"; [ "$FIO_JOB" = warm ] || [ "$FIO_JOB" = disk ] && FIO_JOB=read
          TARGET=(fio --output-format=json "scripts/fio/seq-$FIO_JOB.fio") ;;
    raw-*) "$BD" create bench/p.vhd --size $((SIZE_MIB + 64))M --create-container >/dev/null
           "$BD" mount bench/p.vhd "$MNT" --mode raw --cache-size "$CACHE" >/dev/null
           TARGET=(fio --output-format=json --filename="$MNT/disk" --name="$JOB" --bs=1M
                   --size="$SIZE" --ioengine=psync)
           if [ "$JOB" = raw-write ]; then TARGET+=(--rw=write --end_fsync=1); else TARGET+=(--rw=read); fi ;;
esac
if [ "$JOB" = fs-warm ]; then
    # Written through this mount: the daemon's cache holds every byte, the kernel's
    # caches are dropped, so the read measures FUSE, the loop device and ext4.
    BENCH_DIR="$MNT" BENCH_SIZE="$SIZE" fio --output-format=json scripts/fio/seq-write.fio >/dev/null
    drop_caches
elif [ "${JOB#*-}" = read ] || [ "$JOB" = fs-disk ]; then
    # Write what is read first, then remount so the read is cold.
    case "$JOB" in
        fs-read|fs-disk) BENCH_DIR="$MNT" BENCH_SIZE="$SIZE" fio --output-format=json scripts/fio/seq-write.fio >/dev/null
                 "$BD" unmount "$MNT" >/dev/null
                 "$BD" mount bench/p.vhd "$MNT" --cache-size "$CACHE" "${DISK_CACHE[@]}" >/dev/null ;;
        raw-read) fio --filename="$MNT/disk" --name=fill --rw=write --bs=1M --size="$SIZE" \
                      --ioengine=psync --end_fsync=1 >/dev/null
                  "$BD" unmount "$MNT" >/dev/null
                  "$BD" mount bench/p.vhd "$MNT" --mode raw --cache-size "$CACHE" >/dev/null ;;
    esac
    drop_caches
fi
DPID="$(daemon_pid "$MNT")"
perf record -q -F "$HZ" --call-graph dwarf,32768 -p "$DPID" -o "$WORK/perf.data" 2>/dev/null &
PERF_PID=$!
sleep 1
R0="$(stat_of "$MNT" bytes_read)"; W0="$(stat_of "$MNT" bytes_written)"; D0="$(stat_of "$MNT" bytes_downloaded)"
T0="$(ticks_of "$DPID")"
BENCH_DIR="$MNT" BENCH_SIZE="$SIZE" "${TARGET[@]}" >"$WORK/fio.json"
T1="$(ticks_of "$DPID")"
kill -INT "$PERF_PID"; wait "$PERF_PID" || true
read -r MBS _ < <(fio_result "$WORK/fio.json")
echo "$JOB: $MBS MiB/s, daemon $(cpu_per_gib "$T0" "$T1" "$SIZE_MIB") CPU s per GiB"
echo "  through FUSE: $(( ($(stat_of "$MNT" bytes_read) - R0) >> 20 )) MiB read, $(( ($(stat_of "$MNT" bytes_written) - W0) >> 20 )) MiB written; from the blob: $(( ($(stat_of "$MNT" bytes_downloaded) - D0) >> 20 )) MiB"
mkdir -p "$(dirname "$SVG")"
perf script -i "$WORK/perf.data" 2>/dev/null | "$TOOLS/bin/inferno-collapse-perf" >"$WORK/folded"
"$TOOLS/bin/inferno-flamegraph" --title "blobdrive daemon: $JOB, $SIZE ($MBS MiB/s)" <"$WORK/folded" >"$SVG"
cp "$WORK/folded" "${SVG%.svg}.folded"
echo "flame graph: $SVG (folded stacks beside it)"
