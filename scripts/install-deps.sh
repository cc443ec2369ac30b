#!/usr/bin/env bash
# Installs the Debian packages blobdrive's tests, demo and benchmarks use, when a
# command they provide is missing (root; apt). Idempotent and silent when all is
# there. Used by .ci/run, scripts/test.sh and scripts/demo.sh.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# command -> Debian package providing it
declare -A pkg_of=(
    [fusermount3]=fuse3
    [mkfs.ext4]=e2fsprogs
    [qemu-img]=qemu-utils
    [mkfs.xfs]=xfsprogs
    [losetup]=util-linux
    [python3]=python3
    [curl]=curl
    # for the benchmark pipeline
    [fio]=fio
    [s3backer]=s3backer
)
base=(fuse3 e2fsprogs qemu-utils xfsprogs util-linux)
missing=()
for cmd in "${!pkg_of[@]}"; do
    command -v "$cmd" >/dev/null || missing+=("${pkg_of[$cmd]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    # Any gap: install the base set plus whatever else is missing.
    install=("${base[@]}")
    for p in "${missing[@]}"; do
        case " ${install[*]} " in *" $p "*) ;; *) install+=("$p") ;; esac
    done
    echo "missing: ${missing[*]}"
    echo "installing: ${install[*]}"
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends "${install[@]}" </dev/null
fi
