#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, start a local Azure
# emulator (Azurite, 127.0.0.1 only), create a drive on it, and show it.
# Everything it starts it stops again; the emulator keeps data in memory only.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing test dependencies (Azurite from scripts/package-lock.json)"
if [ ! -x scripts/node_modules/.bin/azurite-blob ]; then
    npm ci --prefix scripts --no-audit --no-fund --loglevel=error
fi

say "building blobdrive"
cargo build --release --quiet
BD="$PWD/target/release/blobdrive"

say "starting Azurite"
STATE="$(mktemp -d /tmp/blobdrive-demo.XXXXXX)"
scripts/azurite.sh start "$STATE" >/dev/null
trap 'scripts/azurite.sh stop "$STATE" >/dev/null; rm -rf "$STATE"' EXIT
PORT="$(cat "$STATE/port")"
export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:$PORT/devstoreaccount1;"
echo "Azurite listens on 127.0.0.1:$PORT"

say "blobdrive create disks/demo.vhd --size 1GiB --create-container"
"$BD" create disks/demo.vhd --size 1GiB --create-container

say "blobdrive info disks/demo.vhd"
"$BD" info disks/demo.vhd

say "blobdrive lease status disks/demo.vhd --json"
"$BD" lease status disks/demo.vhd --json

say "done: the emulator is stopped again and its in-memory data is gone"
