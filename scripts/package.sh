#!/usr/bin/env bash
# Builds the Debian package blobdrive_VERSION-1_ARCH.deb into target/debian/:
#   /usr/bin/blobdrive                          the program (stripped)
#   /usr/sbin/mount.blobdrive, /usr/sbin/umount.blobdrive
#                                               links to it: the helpers mount(8)
#                                               and umount(8) run (they look in
#                                               /sbin, which /usr/sbin is on a
#                                               merged-/usr system; elsewhere
#                                               postinst links them into /sbin,
#                                               scripts/debian/helper-links)
#   /usr/lib/systemd/system/blobdrive@.service  the unit template
#   /usr/share/man/man8/*.8.gz                  `blobdrive manpages`
#   bash, zsh and fish completions              `blobdrive completions SHELL`
#   /usr/share/doc/blobdrive/                   copyright (machine-readable,
#                                               scripts/debian/copyright),
#                                               changelog.Debian.gz, and the
#                                               manual: README.md and docs/*.md
#                                               (the man pages point there)
#   /usr/share/lintian/overrides/blobdrive      lintian's two warnings that do
#                                               not apply, with the reason
#                                               (scripts/debian/lintian-overrides)
# and maintainer scripts that make the blobdrive system user (with its range of
# ids for mounts, scripts/debian/reserve-uids) and /etc/blobdrive,
# refuse removal while drives are mounted (naming them, one a line, as
# `blobdrive list --json` lists them: scripts/debian/mounted-drives), and on
# purge remove the enablement links of the unit (`systemctl enable
# blobdrive@NAME`), /etc/blobdrive if the admin left nothing in it (saying so
# if it is kept) and the logs the package's own program left in /run/blobdrive
# (the directory too, once empty; never a live mount's files, nor another
# install's logs).
#
# Made with dpkg-deb from a staged tree: everything it needs comes with dpkg
# (cargo-deb would first have to be built from crates.io, minutes on 2 cores),
# and the pages and completions come from the binary being packaged anyway.
#
#   scripts/package.sh [--binary FILE | --profile NAME] [--out DIR] [--lintian]
#
#   --binary FILE  package this already built blobdrive (no build)
#   --profile NAME build with `cargo build --profile NAME` (e.g. dev); default:
#                  `cargo build --release`
#   --out DIR      where the .deb goes (default target/debian)
#   --lintian      check the package with lintian (installed with apt-get when
#                  missing) and fail if it reports an error
# Prints the path of the package last.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=
profile=release
out=target/debian
lint=0
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="${2:?--binary needs a file}"; shift 2 ;;
        --binary=*) binary="${1#*=}"; shift ;;
        --profile) profile="${2:?--profile needs a name}"; shift 2 ;;
        --profile=*) profile="${1#*=}"; shift ;;
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --out=*) out="${1#*=}"; shift ;;
        --lintian) lint=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ -z "$binary" ]; then
    echo "== cargo build --profile $profile --locked" >&2
    cargo build --profile "$profile" --locked
    case "$profile" in dev|test) dir=debug ;; bench) dir=release ;; *) dir="$profile" ;; esac
    binary="target/$dir/blobdrive"
fi
[ -x "$binary" ] || { echo "package.sh: $binary is not an executable" >&2; exit 1; }

name=blobdrive
upstream="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
version="$upstream-1"
arch="$(dpkg --print-architecture)"
maintainer="blobdrive maintainers <maintainers@users.noreply.a-seed-c65d9461.example>"
# Reproducible: every date and file time is the last commit's.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
export SOURCE_DATE_EPOCH

mkdir -p "$out"
# Absolute: the control data is made from inside the stage (below).
out="$(cd "$out" && pwd)"
stage="$(mktemp -d "$out/stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
root="$stage/root"

# The program and its helpers.
install -D -m 755 "$binary" "$root/usr/bin/blobdrive"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/blobdrive"
install -d -m 755 "$root/usr/sbin"
for h in mount.blobdrive umount.blobdrive; do
    ln -s ../bin/blobdrive "$root/usr/sbin/$h"
done
install -d -m 755 "$root/usr/lib/systemd/system"
sed "s|@BINDIR@|/usr/bin|g" systemd/blobdrive@.service >"$root/usr/lib/systemd/system/blobdrive@.service"
chmod 644 "$root/usr/lib/systemd/system/blobdrive@.service"

# Manual pages and completions, from the binary being packaged.
man8="$root/usr/share/man/man8"
"$root/usr/bin/blobdrive" manpages "$man8" >/dev/null
gzip -9n "$man8"/*.8
comp="$root/usr/share/bash-completion/completions/blobdrive"
zcomp="$root/usr/share/zsh/vendor-completions/_blobdrive"
fcomp="$root/usr/share/fish/vendor_completions.d/blobdrive.fish"
install -d -m 755 "$(dirname "$comp")" "$(dirname "$zcomp")" "$(dirname "$fcomp")"
"$root/usr/bin/blobdrive" completions bash >"$comp"
"$root/usr/bin/blobdrive" completions zsh >"$zcomp"
"$root/usr/bin/blobdrive" completions fish >"$fcomp"

# Documentation: the copyright file in the machine-readable format (DEP-5,
# scripts/debian/copyright: blobdrive's MIT license with its text, and the CSI
# spec's Apache-2.0 for proto/csi, whose text Debian policy and lintian want
# referenced in /usr/share/common-licenses rather than copied), written for the
# license Cargo.toml declares, and the Debian changelog.
doc="$root/usr/share/doc/$name"
install -d -m 755 "$doc"
license="$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
[ "$license" = MIT ] || { echo "package.sh: scripts/debian/copyright is written for MIT, Cargo.toml says $license" >&2; exit 1; }
install -m 644 scripts/debian/copyright "$doc/copyright"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
    echo "$name ($version) unstable; urgency=medium"
    echo
    echo "  * Built by scripts/package.sh from commit $commit."
    echo
    echo " -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$doc/changelog.Debian.gz"
chmod 644 "$doc"/copyright "$doc"/changelog.Debian.gz
# The manual, laid out as in the source so that its links between pages work:
# the man pages and --help name its pages (boot.md, kubernetes.md, ...).
install -m 644 README.md "$doc/README.md"
install -d -m 755 "$doc/docs"
install -m 644 docs/*.md "$doc/docs/"
install -D -m 644 scripts/debian/lintian-overrides "$root/usr/share/lintian/overrides/$name"

# Control data. Depends: what the binary links (dpkg-shlibdeps), the programs it
# runs: mkfs.ext4 and resize2fs (e2fsprogs), mount, umount and losetup (mount),
# and FUSE (fuse3); adduser for postinst. xfsprogs only for xfs drives. blkid's
# util-linux is Essential, so not named (lintian counts naming it an error).
# dpkg-shlibdeps reads a debian/control in the directory it runs in; what it
# says on failure is shown (a failed substitution would otherwise end the script
# under `set -e` without a word).
mkdir -p "$stage/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$name" "$name" >"$stage/debian/control"
if ! shlibs="$(cd "$stage" && dpkg-shlibdeps -O "$root/usr/bin/blobdrive" 2>"$stage/shlibdeps.err")"; then
    echo "package.sh: dpkg-shlibdeps failed (dpkg-dev installed?): $(cat "$stage/shlibdeps.err")" >&2
    exit 1
fi
shlibs="$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs")"
[ -n "$shlibs" ] || { echo "package.sh: dpkg-shlibdeps found no libraries: $(cat "$stage/shlibdeps.err")" >&2; exit 1; }
install -d -m 755 "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<EOF
Package: $name
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $shlibs, fuse3, e2fsprogs, mount, adduser
Recommends: xfsprogs
Suggests: bash-completion
Section: admin
Priority: optional
Description: Azure page blobs as Linux drives
 blobdrive mounts a fixed-format VHD stored as an Azure page blob as a
 filesystem (ext4 or xfs), a block device or a raw file, through a FUSE daemon
 and a loop device. It creates, inspects, resizes, snapshots, uploads and
 downloads drives, holds an infinite blob lease while a drive is mounted
 writable, and mounts drives at boot from /etc/fstab (mount.blobdrive) or with
 the unit template blobdrive@.service.
EOF
for script in postinst prerm postrm; do
    install -m 755 "scripts/debian/$script" "$root/DEBIAN/$script"
done
# The pieces shared with scripts/install.sh (and install-deps.sh) go into the
# maintainer scripts where they say so: the uid range's reservation into
# postinst (#RESERVE_UIDS#), the helpers' links into /sbin into postinst and
# postrm (#HELPER_LINKS#), the mounts that block a removal into prerm
# (#MOUNTED_DRIVES#).
put() {
    grep -qx "#$2#" "$root/DEBIAN/$1" || { echo "package.sh: $1 has no #$2# line" >&2; exit 1; }
    sed -i -e "/^#$2#\$/{r scripts/debian/$3" -e 'd}' "$root/DEBIAN/$1"
}
put postinst RESERVE_UIDS reserve-uids
put postinst HELPER_LINKS helper-links
put postrm HELPER_LINKS helper-links
put prerm MOUNTED_DRIVES mounted-drives
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control"

deb="$out/${name}_${version}_${arch}.deb"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
if [ "$lint" = 1 ]; then
    if ! command -v lintian >/dev/null; then
        echo "== installing lintian" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian </dev/null >&2 \
            || { apt-get update -qq </dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian </dev/null >&2; }
    fi
    echo "== lintian $deb" >&2
    lintian --fail-on error --tag-display-limit 0 "$deb" >&2
fi
echo "$deb"
