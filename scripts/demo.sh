#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, start a local Azure
# emulator (Azurite, 127.0.0.1 only), create a drive on it, mount it as ext4, use
# it, show it, unmount it, and prove the data is in the blob by mounting again.
# Everything it starts it stops again; the emulator keeps data in memory only.
# Needs root (FUSE, loop devices, mount).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "scripts/demo.sh mounts a filesystem and needs root: run it with sudo" >&2
    exit 1
fi

say "installing system packages and the user blobdrive if missing"
# (blobdrive's mount daemon runs its network-facing part as that user.)
scripts/install-deps.sh --demo

say "installing test dependencies (Azurite from scripts/package-lock.json)"
if [ ! -x scripts/node_modules/.bin/azurite-blob ]; then
    npm ci --prefix scripts --no-audit --no-fund --loglevel=error
fi

say "building blobdrive (a few minutes the first time; cargo shows its progress)"
cargo build --release
BD="$PWD/target/release/blobdrive"

say "starting Azurite"
STATE="$(mktemp -d /tmp/blobdrive-demo.XXXXXX)"
MNT="$STATE/mnt"
mkdir "$MNT"
scripts/azurite.sh start "$STATE" >/dev/null
cleanup() {
    "$BD" unmount "$MNT" >/dev/null 2>&1 || true
    scripts/azurite.sh stop "$STATE" >/dev/null
    rm -rf "$STATE"
}
trap cleanup EXIT
PORT="$(cat "$STATE/port")"
export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$PORT/devstoreaccount1;"
echo "Azurite listens on 127.0.0.1:$PORT"

say "blobdrive create disks/demo.vhd --size 1GiB --create-container"
"$BD" create disks/demo.vhd --size 1GiB --create-container

say "blobdrive info disks/demo.vhd"
"$BD" info disks/demo.vhd

say "blobdrive mount disks/demo.vhd $MNT --mkfs ext4"
"$BD" mount disks/demo.vhd "$MNT" --mkfs ext4

say "writing files: 200 small ones and one of 100 MiB, then sync"
mkdir "$MNT/docs"
for i in $(seq 1 200); do echo "note $i, written $(date -u +%FT%TZ)" > "$MNT/docs/note$i.txt"; done
head -c 100M /dev/urandom > "$MNT/big.bin"
sync
SUM="$(cd "$MNT" && sha256sum big.bin docs/note1.txt)"
echo "$SUM"
df -h "$MNT"

say "blobdrive list"
"$BD" list

say "blobdrive stats $MNT"
"$BD" stats "$MNT"

say "blobdrive lease status disks/demo.vhd (leased while mounted)"
"$BD" lease status disks/demo.vhd

say "blobdrive unmount $MNT"
"$BD" unmount "$MNT"

say "blobdrive info disks/demo.vhd (lease free, data allocated)"
"$BD" info disks/demo.vhd

say "mounting again read-only and checking the files"
"$BD" mount disks/demo.vhd "$MNT" --read-only
AGAIN="$(cd "$MNT" && sha256sum big.bin docs/note1.txt)"
if [ "$SUM" = "$AGAIN" ]; then echo "checksums match"; else echo "CHECKSUMS DIFFER" >&2; exit 1; fi
ls "$MNT/docs" | wc -l | xargs echo "files in docs:"
"$BD" unmount "$MNT"

say "done: the emulator is stopped again and its in-memory data is gone"
