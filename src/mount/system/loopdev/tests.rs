use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A file of 1 MiB in `dir`, by its real path (as sysfs names it).
fn backing(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    p.canonicalize().unwrap()
}

fn open_rw(p: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap()
}

fn losetup(args: &[&str]) -> bool {
    Command::new("losetup")
        .args(args)
        .status()
        .unwrap()
        .success()
}

fn sysfs(dev: &LoopDevice, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/block/{}/loop/{file}", dev.name())).unwrap_or_default()
}

/// Attached through a descriptor, the device is known by its numbers: the
/// file's name changing under it (unlinked, which makes sysfs say
/// "(deleted)", as a FUSE_NOTIFY_INVAL_ENTRY for `disk` did) changes
/// nothing, autoclear and direct I/O are set without asking the file, and a
/// detach is seen.
#[test]
fn a_device_attached_through_a_descriptor_is_known_by_numbers_not_its_file_s_name() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), "disk");
    let file = RegularFile::checked(open_rw(&path)).unwrap();
    let a = LoopDevice::attach_for_network(&file, false, BlockSize::B512).unwrap();
    drop(file);
    let (dev, binding) = (a.pinned.dev.clone(), a.binding);
    assert!(
        binding.seq.is_some(),
        "this kernel has disk sequence numbers"
    );
    assert_eq!(sysfs(&dev, "backing_file").trim(), path.to_str().unwrap());
    assert_eq!(sysfs(&dev, "dio").trim(), "1");
    set_autoclear(&a.pinned.file).unwrap();
    assert_eq!(sysfs(&dev, "autoclear").trim(), "1");
    assert_eq!(sysfs(&dev, "dio").trim(), "1", "direct I/O kept");
    std::fs::remove_file(&path).unwrap();
    assert!(sysfs(&dev, "backing_file").contains("(deleted)"));
    assert_eq!(dev.serves_now(&binding), Now::Serves);
    assert!(matches!(dev.serves(&binding), Serves::Yes(_)));
    // The last close lets it go (autoclear), as the kernel sees it soon.
    drop(a);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dev.serves_now(&binding) != Now::Gone {
        assert!(std::time::Instant::now() < until, "{dev} still attached");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    dev.detach(&binding).unwrap();
}

/// A mount's loop device let go of its disk by itself and the loop driver
/// gave it to another file before the mount's teardown detached it (seen in
/// a CI run, where test binaries attach loop devices at the same time): the
/// teardown leaves the other file's device alone, and the other's own detach
/// still works.
#[test]
fn a_device_given_to_another_file_meanwhile_is_not_detached() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (backing(dir.path(), "mine"), backing(dir.path(), "other"));
    // Another process may take the device between the two steps: again.
    let (dev, binding) = (0..5)
        .find_map(|_| {
            let a = LoopDevice::attach_through(&open_rw(&mine), false, BlockSize::B512).unwrap();
            let (dev, binding) = (a.pinned.dev.clone(), a.binding);
            drop(a);
            assert!(losetup(&["-d", dev.path()]));
            losetup(&[dev.path(), other.to_str().unwrap()]).then_some((dev, binding))
        })
        .expect("a loop device given to the other file");
    assert_eq!(sysfs(&dev, "backing_file").trim(), other.to_str().unwrap());
    dev.detach(&binding).unwrap();
    let after = sysfs(&dev, "backing_file");
    assert!(losetup(&["-d", dev.path()]), "the other's device");
    assert_eq!(after.trim(), other.to_str().unwrap(), "the other's device");
}

/// Only a regular file is attached: a block device (another drive's loop
/// device, say) is refused before the driver is asked.
#[test]
fn only_a_regular_file_is_attached() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = LoopDevice::attach_through(
        &open_rw(&backing(dir.path(), "disk")),
        false,
        BlockSize::B512,
    )
    .unwrap();
    let dev = open_rw(Path::new(a.pinned.dev.path()));
    let err = LoopDevice::attach_through(&dev, false, BlockSize::B512)
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    drop(dev);
    let (d, b) = (a.pinned.dev.clone(), a.binding);
    drop(a);
    d.detach(&b).unwrap();
}

/// Run by `sh` in a new mount namespace (its mounts private): lets go of its
/// copies of other tests' drives (FUSE mounts of blobdrive, filesystems on
/// loop devices) and what is mounted on them, deepest first, the filesystem
/// on device `$0` (MAJOR:MINOR) kept, without libmount's shared utab (`-n`)
/// or an unmount helper (`-i`), then sleeps. (The test binaries' sandboxes
/// do the same in the child before exec, tests/common/namespace.rs, out of
/// this crate's reach; this namespace lives for a moment.)
const LET_GO_BUT: &str = r#"
awk -v keep="$0" '{ for (i = 7; $i != "-"; i++) {} }
    $5 != "/" && ($2 in gone || $3 != keep &&
        ($(i + 1) == "fuse.blobdrive" || $(i + 2) ~ /^\/dev\/loop/)) { gone[$1]; print $5 }
' /proc/self/mountinfo | tac | while read -r at; do
    umount -l -n -i "$(printf '%b' "$at")"
done
exec sleep 60
"#;

/// A filesystem unmounted here while a mount namespace made meanwhile (with
/// its mounts private) keeps a copy of it: the device cannot let go, and
/// what a detach that times out says names that namespace's process.
#[test]
fn a_copy_of_the_filesystem_in_another_mount_namespace_is_named_as_a_user() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = backing(dir.path(), "disk");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let a = LoopDevice::attach_through(&open_rw(&path), false, BlockSize::B512).unwrap();
    let dev = a.pinned.dev.clone();
    assert!(Command::new("mkfs.ext4")
        .args(["-q", dev.path()])
        .status()
        .unwrap()
        .success());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    assert!(Command::new("mount")
        .args([dev.path(), mnt.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    let devno = dev.devno().unwrap();
    let mut copy = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            LET_GO_BUT,
        ])
        .arg(&devno)
        .spawn()
        .unwrap();
    let has_copy = || {
        std::fs::read_to_string(format!("/proc/{}/mountinfo", copy.id()))
            .is_ok_and(|t| t.contains(&format!(" {devno} ")))
    };
    // The copy is ready only once the script sleeps: the namespace exists as
    // soon as `unshare` made it, but until its mounts are made private an
    // unmount here still reaches them (seen once under load: the copy was
    // gone before it was looked for). A loaded machine (the suite's lanes
    // beside it) can take seconds to get there: wait, and say so if it never
    // did.
    let sleeping = || {
        std::fs::read_to_string(format!("/proc/{}/comm", copy.id()))
            .is_ok_and(|c| c.trim() == "sleep")
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sleeping() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        sleeping(),
        "the script in another mount namespace never got to sleep"
    );
    assert!(
        has_copy(),
        "the copy in another mount namespace was not kept"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let users = dev.users();
    let _ = copy.kill();
    let _ = copy.wait();
    let (b, pinned) = (a.binding, a.pinned);
    drop(pinned);
    dev.detach(&b).unwrap();
    assert!(
        users.contains(&format!(
            "a mount of it in the mount namespace of pid {}",
            copy.id()
        )),
        "{users}"
    );
}

/// A device attached with 4096-byte blocks has them as its logical block
/// size (what mkfs.xfs takes as its sector size); only 512 and 4096 are
/// block sizes at all.
#[test]
fn a_device_takes_the_block_size_it_is_attached_with() {
    assert_eq!(BlockSize::of(4096), Some(BlockSize::B4096));
    assert_eq!(BlockSize::of(512).map(BlockSize::bytes), Some(512));
    for other in [0, 1024, 2048, 8192, 65536, u32::MAX] {
        assert_eq!(BlockSize::of(other), None, "{other}");
    }
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = RegularFile::checked(open_rw(&backing(dir.path(), "disk"))).unwrap();
    for block in [BlockSize::B4096, BlockSize::B512] {
        let a = LoopDevice::attach_for_network(&file, true, block).unwrap();
        let (dev, binding) = (a.pinned.dev.clone(), a.binding);
        let said = std::fs::read_to_string(format!(
            "/sys/block/{}/queue/logical_block_size",
            dev.name()
        ))
        .unwrap();
        drop(a);
        dev.detach(&binding).unwrap();
        assert_eq!(said.trim(), block.bytes().to_string());
    }
}
