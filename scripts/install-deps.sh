#!/usr/bin/env bash
# Installs the Debian packages an entry point needs, when a command they provide is
# missing (root; apt), and makes the system user blobdrive when there is none, with
# the range of ids mounts' network-facing parts run as (one each) in /etc/subuid
# and /etc/subgid. Idempotent and silent when all is there.
#   scripts/install-deps.sh           what the tests need (scripts/test.sh, .ci/run)
#   scripts/install-deps.sh --demo    what scripts/demo.sh needs (a subset)
#   scripts/install-deps.sh --bench   what scripts/bench.sh needs: the demo's set plus
#                                     the benchmark-only tools (fio, s3backer, venv)
#   add --list to print the packages of that set, one a line, and install nothing.
# The test set also builds fsx (the File System eXerciser, from crates.io, a pinned
# version with its own lock file) into target/tools for tests/fsx.rs, and puts
# Microsoft's Python SDK for Blob Storage (scripts/test-requirements.txt) in a
# virtual environment at target/tools/py, and unpacks Debian's prometheus (prometheus
# and promtool) into target/tools/prometheus.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

mode=test
list=0
for a in "$@"; do
    case "$a" in
        --demo) mode=demo ;;
        --bench) mode=bench ;;
        --test) mode=test ;;
        --list) list=1 ;;
        *) echo "usage: $0 [--demo|--bench|--test] [--list]" >&2; exit 2 ;;
    esac
done

# A check (a command name, "py:MODULE" for a Python module, or "file:PATH") -> the Debian
# package providing it, per set.
declare -A pkg_of=()
# Mounting a drive as ext4, and the emulator script (azurite.sh uses python3, curl).
declare -A demo=([fusermount3]=fuse3 [mkfs.ext4]=e2fsprogs [losetup]=util-linux [python3]=python3 [curl]=curl)
# Building blobdrive: build.rs generates the CSI driver's gRPC code from
# proto/csi/csi.proto with protoc and the protobuf well-known types.
demo[protoc]=protobuf-compiler
demo[file:/usr/include/google/protobuf/wrappers.proto]=libprotobuf-dev
for k in "${!demo[@]}"; do pkg_of[$k]=${demo[$k]}; done
case "$mode" in
    test)
        # xfs mounts, qemu-img interoperability, fio --verify in tests/durability.rs.
        pkg_of[qemu-img]=qemu-utils
        pkg_of[mkfs.xfs]=xfsprogs
        pkg_of[fio]=fio
        # tests/entra*.rs: a CA made at test time, and the token server's check of
        # certificate assertions (tests/fixtures/entra/token_server.py).
        pkg_of[openssl]=openssl
        pkg_of[py:cryptography]=python3-cryptography
        # Encrypted drives: cryptsetup reads and writes their LUKS2 headers on
        # plain files (tests/luks_cryptsetup.rs, tests/encryption.rs), and
        # python3-cryptography (above) is the independent AES-XTS.
        pkg_of[cryptsetup]=cryptsetup-bin
        # tests/package.rs and tests/cli.rs: scripts/package.sh (dpkg-shlibdeps,
        # strip), lintian on its package, and man for the pages it installs.
        pkg_of[dpkg-shlibdeps]=dpkg-dev
        pkg_of[lintian]=lintian
        pkg_of[man]=man-db
        # tests/manual.rs runs the manual's commands as written, sudo included.
        pkg_of[sudo]=sudo
        # The test tools' virtual environment (below).
        pkg_of[py:ensurepip]=python3-venv
        ;;
    bench)
        # The benchmark pipeline only: fio jobs, the s3backer peer, moto in a venv.
        pkg_of[fio]=fio
        pkg_of[s3backer]=s3backer
        pkg_of[py:ensurepip]=python3-venv
        ;;
esac

if [ "$list" = 1 ]; then
    printf '%s\n' "${pkg_of[@]}" | sort -u
    exit 0
fi

# Every set mounts drives (the demo, the tests, the benchmarks), and a mount
# daemon's network-facing part runs as this user. As scripts/install.sh makes it.
if ! id blobdrive >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "creating the system user blobdrive (a mount daemon's network-facing part runs as it)"
        useradd --system --no-create-home --shell /usr/sbin/nologin blobdrive
    else
        echo "warning: no user blobdrive, and making it needs root: sudo useradd --system --no-create-home --shell /usr/sbin/nologin blobdrive" >&2
    fi
fi
# Each mount's network-facing part runs as an id of its own, from the range
# reserved for blobdrive in /etc/subuid and /etc/subgid. As scripts/install.sh
# and the package reserve it.
if [ "$(id -u)" = 0 ] && id blobdrive >/dev/null 2>&1; then
    . "$(dirname "$0")/debian/reserve-uids"
    reserve_uids
fi

present() {
    case "$1" in
        py:*) command -v python3 >/dev/null && python3 -c "import ${1#py:}" 2>/dev/null ;;
        file:*) [ -e "${1#file:}" ] ;;
        *) command -v "$1" >/dev/null ;;
    esac
}
missing=()
for check in "${!pkg_of[@]}"; do
    present "$check" || missing+=("${pkg_of[$check]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    mapfile -t install < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "installing missing packages for the $mode set: ${install[*]}"
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends "${install[@]}" </dev/null
fi

# Tools from crates.io and PyPI, into target/tools (rebuilt when their pins change).
if [ "$mode" = test ]; then
    root="$(cd "$(dirname "$0")/.." && pwd)"
    tools="$root/target/tools"
    # fsx: not packaged for Debian; a Rust port of the tool, built once with cargo.
    FSX_VERSION=0.3.2
    if ! "$tools/bin/fsx" --version 2>/dev/null | grep -qx "fsx $FSX_VERSION"; then
        echo "building fsx $FSX_VERSION from crates.io into $tools"
        cargo install --quiet --locked --version "$FSX_VERSION" --root "$tools" fsx </dev/null
    fi
    # prometheus and promtool for tests/metrics.rs, unpacked from Debian's package
    # into target/tools/prometheus: installing the package would also start a
    # Prometheus service on this machine (with systemd) and pull its web UI's
    # JavaScript libraries; the two static binaries are all the tests run.
    if ! [ -x "$tools/prometheus/usr/bin/promtool" ]; then
        echo "unpacking Debian's prometheus package into $tools/prometheus"
        dl="$(mktemp -d)"
        (cd "$dl" && { apt-get download prometheus </dev/null >/dev/null 2>&1 \
            || { apt-get update -qq </dev/null && apt-get download prometheus </dev/null >/dev/null 2>&1; }; })
        rm -rf "$tools/prometheus"
        dpkg-deb -x "$dl"/prometheus_*.deb "$tools/prometheus"
        rm -rf "$dl"
    fi
    reqs="$root/scripts/test-requirements.txt"
    if ! cmp -s "$reqs" "$tools/py/installed.txt"; then
        echo "installing $reqs into $tools/py"
        rm -rf "$tools/py"
        python3 -m venv "$tools/py"
        "$tools/py/bin/pip" install --quiet --disable-pip-version-check -r "$reqs" </dev/null
        cp "$reqs" "$tools/py/installed.txt"
    fi
fi
