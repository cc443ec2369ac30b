#!/usr/bin/env bash
# Installs blobdrive for mounting at boot (needs root):
#   PREFIX/bin/blobdrive                  the program, built here in release mode
#   /sbin/mount.blobdrive                 a symlink to it: the helper mount(8) runs
#                                         for fstab lines of type blobdrive (mount(8)
#                                         looks only in /sbin; on merged-/usr systems
#                                         /sbin is /usr/sbin, and so is the link)
#   /sbin/umount.blobdrive                another: the helper umount(8) runs for a
#                                         drive's mount (the daemon names it in
#                                         /run/mount/utab), so that `umount DIR`, also
#                                         systemd's at shutdown, returns only once the
#                                         lease is released
#   UNITDIR/blobdrive@.service            the systemd unit template; UNITDIR is
#                                         PREFIX/lib/systemd/system for /usr and
#                                         /usr/local (systemd reads both, and
#                                         /etc/systemd/system stays the admin's),
#                                         else /etc/systemd/system
#   the system user blobdrive             made when missing, with 65536 ids in
#                                         /etc/subuid and /etc/subgid: each mount's
#                                         network-facing part runs as one of its
#                                         own (not for a staged install;
#                                         --uninstall keeps them, as Debian keeps
#                                         system users)
#
#   sudo scripts/install.sh [--prefix DIR] [--binary FILE] [--destdir DIR]
#   sudo scripts/install.sh --uninstall [--prefix DIR] [--destdir DIR]
#
#   --prefix DIR   where the program goes (default /usr/local)
#   --binary FILE  install this already built blobdrive instead of building one
#   --destdir DIR  stage everything under DIR (for packaging; needs no root, and
#                  nothing on this system is touched or reloaded)
#   --uninstall    remove what an install put there (refused while drives are
#                  mounted: their `blobdrive unmount` would be gone)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
destdir=
binary=
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; shift ;;
        --destdir) destdir="${2:?--destdir needs a directory}"; shift 2 ;;
        --destdir=*) destdir="${1#*=}"; shift ;;
        --binary) binary="${2:?--binary needs a file}"; shift 2 ;;
        --binary=*) binary="${1#*=}"; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$prefix" in
    /*) prefix="${prefix%/}" ;;
    *) echo "install.sh: --prefix must be an absolute path, not $prefix" >&2; exit 2 ;;
esac
if [ -z "$destdir" ] && [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: installing into the system needs root (sudo), or stage it with --destdir DIR" >&2
    exit 1
fi

bin="$prefix/bin/blobdrive"
helper=/sbin/mount.blobdrive
uhelper=/sbin/umount.blobdrive
case "$prefix" in
    /usr|/usr/local) unitdir="$prefix/lib/systemd/system" ;;
    *) unitdir=/etc/systemd/system ;;
esac
unit="$unitdir/blobdrive@.service"

# systemd, when it runs this system (never for a staged install).
reload_systemd() {
    if [ -z "$destdir" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl daemon-reload
    fi
}

if [ "$uninstall" = 1 ]; then
    if [ -z "$destdir" ] && [ -x "$bin" ]; then
        # The mounts `blobdrive list --json` lists (not its CSI node plugins).
        . scripts/debian/mounted-drives
        mounted="$(mounted_drives "$bin")"
        if [ -n "$mounted" ]; then
            echo "install.sh: drives are mounted; unmount them first (umount DIR, or $bin unmount DIR):" >&2
            echo "$mounted" | sed 's/^/  /' >&2
            exit 1
        fi
    fi
    # The helpers only if they are our links (another package may own the names).
    for h in "$helper" "$uhelper"; do
        if [ -L "$destdir$h" ] && [ "$(readlink "$destdir$h")" = "$bin" ]; then
            rm -f "$destdir$h"
            echo "removed $h"
        fi
    done
    for f in "$unit" "$bin"; do
        if [ -e "$destdir$f" ]; then
            rm -f "$destdir$f"
            echo "removed $f"
        fi
    done
    reload_systemd
    exit 0
fi

if [ -z "$binary" ]; then
    # What building and mounting need (protoc for the CSI code, fuse3, ...).
    scripts/install-deps.sh --demo
    echo "== cargo build --release --locked"
    cargo build --release --locked
    binary=target/release/blobdrive
fi
[ -x "$binary" ] || { echo "install.sh: $binary is not an executable" >&2; exit 1; }

install -d -m 755 "$destdir$prefix/bin" "$destdir$(dirname "$helper")" "$destdir$unitdir"
install -m 755 "$binary" "$destdir$bin"
echo "installed $bin"
for h in "$helper" "$uhelper"; do
    if [ -e "$destdir$h" ] && ! [ -L "$destdir$h" ]; then
        echo "install.sh: $h exists and is not a link to blobdrive; not replacing it" >&2
        exit 1
    fi
done
for h in "$helper" "$uhelper"; do
    ln -sfn "$bin" "$destdir$h"
    echo "installed $h -> $bin"
done
sed "s|@BINDIR@|$prefix/bin|g" systemd/blobdrive@.service >"$destdir$unit.tmp"
chmod 644 "$destdir$unit.tmp"
mv -f "$destdir$unit.tmp" "$destdir$unit"
echo "installed $unit"
# The user a mount daemon's network-facing part runs as (issue 42): on this
# system only, never for a staged install (the package's postinst makes it).
if [ -z "$destdir" ] && ! id blobdrive >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin blobdrive
    echo "created the system user blobdrive"
fi
# And the ids each mount's network-facing part runs as, one a mount, reserved
# for it in /etc/subuid and /etc/subgid (as the package's postinst does).
if [ -z "$destdir" ]; then
    . scripts/debian/reserve-uids
    reserve_uids
fi
reload_systemd
