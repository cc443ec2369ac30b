#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, integration and end-to-end tests,
# against one Azurite started here on a free port and stopped (by pid) at exit.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh --test cli`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x scripts/node_modules/.bin/azurite-blob ]; then
    npm ci --prefix scripts --no-audit --no-fund --loglevel=error
fi

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --quiet --all-targets -- -D warnings

STATE="$(mktemp -d /tmp/blobdrive-test.XXXXXX)"
cleanup() {
    scripts/azurite.sh stop "$STATE" >/dev/null 2>&1 || true
    rm -rf "$STATE"
}
trap cleanup EXIT
scripts/azurite.sh start "$STATE" >/dev/null
export BLOBDRIVE_TEST_AZURITE_PORT="$(cat "$STATE/port")"
echo "== cargo test (Azurite on 127.0.0.1:$BLOBDRIVE_TEST_AZURITE_PORT)"
cargo test "$@"
