#!/usr/bin/env bash
# What free page reporting costs the daemon: the same 1 GiB sequential read
# through ext4, served from the daemon's memory cache, with the kernel's caches
# dropped just before it, or dropped 10 s before it (time for the guest to hand the
# freed page-cache memory back to the hypervisor), first with page reporting as
# the machine has it and then held off. Prints the daemon's CPU seconds per GiB
# and MiB/s of each read. See "Free page reporting" in docs/benchmarks.md.
#
#   sudo scripts/refault-cost.sh
#
# Everything runs on 127.0.0.1 and everything started here is stopped here, by
# pid; the reporting order is put back at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
[ "$(id -u)" = 0 ] || { echo "refault-cost.sh needs root (FUSE, loop devices, mount)" >&2; exit 1; }
SIZE_MIB=1024
# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
[ -r "$PAGE_REPORTING" ] || { echo "this kernel does not report free pages ($PAGE_REPORTING is missing): nothing to measure" >&2; exit 1; }
[ -x scripts/node_modules/.bin/azurite-blob ] || npm ci --prefix scripts --no-audit --no-fund --loglevel=error >&2
cargo build --release --quiet --bin blobdrive
BD="$ROOT/target/release/blobdrive"
single_mount_work refault
fresh_azurite
mkdir "$MNT"
"$BD" create bench/r.vhd --size 1536M --create-container >/dev/null
"$BD" mount bench/r.vhd "$MNT" --mkfs ext4 --cache-size 1280M >/dev/null
dd if=/dev/urandom of="$MNT/f" bs=1M count="$SIZE_MIB" conv=fsync status=none
DPID="$(daemon_pid "$MNT")"

read_once() {
    local t0 t1 s0 s1
    drop_caches
    sleep "$1"
    t0="$(ticks_of "$DPID")"; s0="$(date +%s.%N)"
    dd if="$MNT/f" of=/dev/null bs=1M status=none
    t1="$(ticks_of "$DPID")"; s1="$(date +%s.%N)"
    printf '%-32s %-28s %8s MiB/s %6s CPU s per GiB\n' "$2" "dropped ${1} s before" \
        "$(python3 -c "print(round($SIZE_MIB / ($s1 - $s0)))")" "$(cpu_per_gib "$t0" "$t1" "$SIZE_MIB")"
}
as_is="reporting as is (order $(cat "$PAGE_REPORTING"))"
for _ in 1 2; do read_once 0 "$as_is"; read_once 10 "$as_is"; done
hold_page_reporting
for _ in 1 2; do read_once 0 "reporting held off"; read_once 10 "reporting held off"; done
