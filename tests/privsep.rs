//! The privilege split of the mount daemon (issue 42), checked from outside as
//! the issue asks: every thread of every process of a mount that holds a TCP
//! connection to the storage service runs as an unprivileged user with no
//! capability, no_new_privs and a seccomp filter; no root process of the mount
//! holds such a connection; the unprivileged one holds no loop device and no
//! credentials file open. And from inside: the worker, asked on the control
//! socket (`probe-walls`, a command of debug builds), is refused reading
//! /etc/shadow, exec, mount, setuid(0) and unshare. As root, against Azurite;
//! the `blobdrive` user is created when missing
//! (`common::user`).

mod common;
mod faultproxy;

use std::collections::HashSet;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::bd::Harness;
use common::fuseplay::{inval_disk, Disk, Player};
use common::mount::{require_root, Mp};
use common::user::USER;
use common::util::{wait_for, wait_for_exit};
use common::worker::{
    ask, ask_until_answered, channel_of, fd_links, fuse_of, listener_of, mount_processes,
    signal_pending, worker_of, Stopped,
};
use common::Azurite;
use faultproxy::{Config, Proxy};

const BD: Harness = Harness::new("privsep-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);

/// The inodes of the TCP sockets in `pid`'s network namespace connected to
/// 127.0.0.1:`port`.
fn connections_to(pid: u64, port: u16) -> HashSet<String> {
    let mut inodes = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote_port = f[2].rsplit(':').next().unwrap();
            if u16::from_str_radix(remote_port, 16).unwrap() == port {
                inodes.insert(f[9].to_string());
            }
        }
    }
    inodes
}

/// Whether `pid` holds one of the sockets `inodes` open.
fn holds_any(pid: u64, inodes: &HashSet<String>) -> bool {
    fd_links(pid).iter().any(|(_, l)| {
        l.strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .is_some_and(|i| inodes.contains(i))
    })
}

/// A field of /proc/PID/task/TID/status, as written.
fn field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in\n{status}"))
        .trim()
        .to_string()
}

/// Every thread of `pid` walled: an unprivileged user in all four ids, no
/// capability, no_new_privs, seccomp filtering.
fn assert_walled(pid: u64) {
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .collect();
    assert!(tasks.len() > 1, "the worker {pid} runs threads");
    for task in tasks {
        let path = task.path().join("status");
        let Ok(status) = std::fs::read_to_string(&path) else {
            continue; // a thread that ended meanwhile
        };
        let name = field(&status, "Name");
        for ids in ["Uid", "Gid"] {
            let v = field(&status, ids);
            let all: Vec<&str> = v.split_whitespace().collect();
            assert_eq!(all.len(), 4, "{ids} of {}", path.display());
            assert!(
                all.iter().all(|i| *i != "0"),
                "{ids} {v} of thread {name} ({})",
                path.display()
            );
        }
        for caps in ["CapPrm", "CapEff", "CapBnd", "CapInh", "CapAmb"] {
            assert_eq!(
                field(&status, caps),
                "0000000000000000",
                "{caps} of thread {name} ({})",
                path.display()
            );
        }
        assert_eq!(field(&status, "NoNewPrivs"), "1", "thread {name}");
        assert_eq!(field(&status, "Seccomp"), "2", "thread {name}");
    }
}

/// Kills the worker of the mount whose root part is `daemon` (SIGKILL).
fn kill_worker(daemon: u64) {
    let worker = *mount_processes(daemon)
        .iter()
        .find(|&&p| p != daemon)
        .expect("a worker");
    // SAFETY: kill with integer arguments, to the worker this test found.
    unsafe { libc::kill(worker as i32, libc::SIGKILL) };
}

/// The loop device the mount's record names.
fn recorded_device(mp: &Mp) -> String {
    let list = common::util::json(&BD.ok(&["list", "--json"]));
    list.as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountpoint"] == mp.s())
        .and_then(|m| m["device"].as_str().map(str::to_string))
        .expect("the record names the loop device")
}

/// What sysfs names as the loop device `dev`'s backing file ("" once detached).
fn backing_file(dev: &str) -> String {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap_or_default()
}

fn uid_of(pid: u64) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    field(&status, "Uid")
}

/// Writes `data` at `at` of the file `path` and syncs it.
fn write_synced_at(path: &str, at: u64, data: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, at).unwrap();
    f.sync_all().unwrap();
}

/// The issue's check from outside, on the mount whose root part is `daemon`:
/// some process of it holds a connection to the emulator, none of those is
/// root (the root part, the record's pid, is, and holds none), and every thread
/// of each is walled and holds no loop device and no credentials file open.
/// Returns the processes holding connections (the workers). `poke` makes the
/// mount send a request: Azurite closes a connection idle for 5 s, so on a
/// loaded machine the one the caller's last write used may be gone already.
fn assert_split_from_outside(daemon: u64, poke: impl Fn()) -> Vec<u64> {
    let port = Azurite::shared().port;
    let procs = mount_processes(daemon);
    assert!(procs.len() >= 2, "a root part and a worker: {procs:?}");
    let holding = || -> Vec<u64> {
        procs
            .iter()
            .copied()
            .filter(|&p| holds_any(p, &connections_to(p, port)))
            .collect()
    };
    let mut holders = holding();
    for _ in 0..5 {
        if !holders.is_empty() {
            break;
        }
        poke();
        holders = holding();
    }
    assert!(
        !holders.is_empty(),
        "some process of the mount {procs:?} holds a connection to port {port}"
    );
    assert!(
        !holders.contains(&daemon),
        "the root part (pid {daemon}) holds a connection to the service"
    );
    for &p in &procs {
        let uid = uid_of(p);
        if uid.split_whitespace().any(|u| u == "0") {
            assert!(
                !holders.contains(&p),
                "root process {p} holds a connection to the service"
            );
        }
    }
    for &worker in &holders {
        assert_walled(worker);
        for (_, link) in fd_links(worker) {
            assert!(
                !link.starts_with("/dev/loop") && !link.contains("credentials"),
                "the worker {worker} holds {link} open"
            );
        }
    }
    // The root part is root and lives on; it is the record's pid.
    assert!(uid_of(daemon).starts_with("0\t"), "{}", uid_of(daemon));
    holders
}

#[test]
fn a_split_raw_mount_reads_the_network_only_behind_the_walls() {
    require_root();
    let spec = BD.new_drive("privsep-raw", "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw", "--run-as", USER]);
    let daemon = mp.pid();
    // The drive works: written, flushed to the blob, read back.
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    {
        let mut disk = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mp.disk())
            .unwrap();
        disk.seek(SeekFrom::Start(3 << 20)).unwrap();
        disk.write_all(&data).unwrap();
        disk.sync_all().unwrap();
        let mut back = vec![0u8; data.len()];
        disk.read_exact_at(&mut back, 3 << 20).unwrap();
        assert!(back == data, "read back what was written");
        let mut first = [0u8; 16];
        disk.read_exact(&mut first).unwrap();
    }
    let stats = mp.stats();
    assert!(stats.is_object(), "stats answer: {stats}");
    // libmount's entry, made by the root part for its FUSE mount, known by its
    // device (not by a stat of the mountpoint, which waits on the worker).
    let utab = std::fs::read_to_string("/run/mount/utab").unwrap_or_default();
    assert!(
        utab.lines()
            .any(|l| l.contains(&format!(" TARGET={} ", mp.s())) && l.contains("helper=blobdrive")),
        "{utab}"
    );

    let holders = assert_split_from_outside(daemon, || write_synced_at(&mp.disk(), 3 << 20, &data));

    let said = BD.unmount(&mp);
    assert!(said.is_empty() || !said.contains("error"), "{said}");
    wait_for_exit(daemon, "the root part", Duration::from_secs(20));
    for &worker in &holders {
        wait_for_exit(worker, "the worker", Duration::from_secs(20));
    }
    BD.assert_nothing_left(mp.path(), &spec);
    // What was written is on the blob: a new mount reads it back.
    let mp2 = BD.mp();
    BD.mount(&spec, &mp2, &["--mode", "raw", "--run-as", USER]);
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(mp2.disk())
        .unwrap()
        .read_exact_at(&mut back, 3 << 20)
        .unwrap();
    assert!(back == data, "the data is on the blob");
    BD.unmount(&mp2);
    BD.assert_nothing_left(mp2.path(), &spec);
}

/// fstab's `run-as=USER` picks the worker's user as `--run-as USER` does: the
/// helper mount(8) runs, by that name, with no BLOBDRIVE_RUN_AS in its
/// environment, and a user other than the default (`nobody`).
#[test]
fn an_fstab_line_s_run_as_picks_the_worker_s_user() {
    require_root();
    let other = "nobody";
    let id = Command::new("id").args(["-u", other]).output().unwrap();
    assert!(id.status.success(), "this test needs the user {other}");
    let other_uid = String::from_utf8(id.stdout).unwrap().trim().to_string();
    let spec = BD.new_drive("privsep-fstab", "16MiB");
    let mp = BD.mp();
    let helpers = tempfile::tempdir().unwrap();
    let helper = helpers.path().join("mount.blobdrive");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_blobdrive"), &helper).unwrap();
    let mut cmd = Command::new(&helper);
    cmd.args([&spec, mp.s(), "-o", &format!("mode=raw,run-as={other}")])
        .env("AZURE_STORAGE_CONNECTION_STRING", BD.cs())
        .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
        .env_remove("BLOBDRIVE_RUN_AS");
    common::bd::Bd::from(cmd).ok();
    let daemon = mp.pid();
    // Written through the worker, so that it holds a connection to the service.
    let disk = std::fs::OpenOptions::new()
        .write(true)
        .open(mp.disk())
        .unwrap();
    disk.write_all_at(&[7u8; 4096], 1 << 20).unwrap();
    disk.sync_all().unwrap();
    drop(disk);
    for worker in assert_split_from_outside(daemon, || {
        write_synced_at(&mp.disk(), 1 << 20, &[7u8; 4096])
    }) {
        let uid = uid_of(worker);
        assert!(
            uid.split_whitespace().all(|u| u == other_uid),
            "the worker {worker} runs as {uid}, not {other} ({other_uid})"
        );
    }
    BD.unmount(&mp);
    wait_for_exit(daemon, "the root part", Duration::from_secs(20));
    BD.assert_nothing_left(mp.path(), &spec);
}

/// The first of `pid`'s uids.
fn first_uid(pid: u64) -> u32 {
    uid_of(pid)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The ids /etc/subuid reserves for the user blobdrive, as ranges.
fn reserved_uids() -> Vec<std::ops::Range<u64>> {
    std::fs::read_to_string("/etc/subuid")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let (start, count): (u64, u64) = (f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?);
            (f[0] == USER).then_some(start..start + count)
        })
        .collect()
}

/// Every mount's worker runs as a uid of its own unless --run-as names a
/// user: two mounts at once get two uids from the range reserved for
/// blobdrive (/etc/subuid; neither 0 nor blobdrive's own uid), as uid and
/// gid, held in /run/blobdrive/uids while mounted and given back after; a
/// process of one's uid cannot stop the other's worker (kill -STOP refused),
/// and the drive's disk cache directory is its worker's while mounted and
/// root's again after.
#[test]
fn two_mounts_workers_run_as_uids_of_their_own_that_cannot_stop_each_other() {
    require_root();
    let (spec1, spec2) = (
        BD.new_drive("privsep-uid1", "16MiB"),
        BD.new_drive("privsep-uid2", "16MiB"),
    );
    let cache = tempfile::tempdir().unwrap();
    let (mp1, mp2) = (BD.mp(), BD.mp());
    let cache_dir = cache.path().to_str().unwrap();
    BD.mount(&spec1, &mp1, &["--mode", "raw", "--disk-cache", cache_dir]);
    BD.mount(&spec2, &mp2, &["--mode", "raw"]);
    let mut workers = Vec::new();
    for mp in [&mp1, &mp2] {
        // Written through the worker, so that it holds a connection.
        let disk = std::fs::OpenOptions::new()
            .write(true)
            .open(mp.disk())
            .unwrap();
        disk.write_all_at(&[9u8; 4096], 0).unwrap();
        disk.sync_all().unwrap();
        let holders =
            assert_split_from_outside(mp.pid(), || write_synced_at(&mp.disk(), 0, &[9u8; 4096]));
        assert_eq!(holders.len(), 1, "{holders:?}");
        workers.push(holders[0]);
    }
    let uids: Vec<u32> = workers.iter().map(|&w| first_uid(w)).collect();
    assert_ne!(uids[0], uids[1], "two mounts, one uid");
    let own = Command::new("id").args(["-u", USER]).output().unwrap();
    let own: u32 = String::from_utf8_lossy(&own.stdout).trim().parse().unwrap();
    let reserved = reserved_uids();
    for (&worker, &uid) in workers.iter().zip(&uids) {
        assert!(uid != 0 && uid != own, "{uid}");
        assert!(
            reserved.iter().any(|r| r.contains(&u64::from(uid))),
            "uid {uid} is not in blobdrive's range {reserved:?}"
        );
        let status = std::fs::read_to_string(format!("/proc/{worker}/status")).unwrap();
        assert_eq!(field(&status, "Gid"), format!("{uid}\t{uid}\t{uid}\t{uid}"));
        assert!(std::path::Path::new(&format!("/run/blobdrive/uids/{uid}")).exists());
    }
    // The first worker's uid tries to stop the second worker: refused.
    let tried = Command::new("setpriv")
        .arg(format!("--reuid={}", uids[0]))
        .arg(format!("--regid={}", uids[0]))
        .args(["--clear-groups", "kill", "-STOP"])
        .arg(workers[1].to_string())
        .output()
        .unwrap();
    let state = std::fs::read_to_string(format!("/proc/{}/stat", workers[1])).unwrap();
    // SAFETY: kill with integer arguments, to the worker this test found.
    unsafe { libc::kill(workers[1] as i32, libc::SIGCONT) };
    assert!(
        !tried.status.success(),
        "uid {} stopped the other mount's worker",
        uids[0]
    );
    assert!(!state.contains(") T "), "{state}");
    // The disk cache's drive directory: the worker's, then root's again.
    use std::os::unix::fs::MetadataExt;
    let drive_dir = std::fs::read_dir(cache.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(drive_dir.metadata().unwrap().uid(), uids[0]);
    for (mp, worker) in [(&mp1, workers[0]), (&mp2, workers[1])] {
        let daemon = mp.pid();
        BD.unmount(mp);
        wait_for_exit(daemon, "the root part", Duration::from_secs(20));
        wait_for_exit(worker, "the worker", Duration::from_secs(20));
    }
    for uid in &uids {
        assert!(!std::path::Path::new(&format!("/run/blobdrive/uids/{uid}")).exists());
    }
    assert_eq!(drive_dir.metadata().unwrap().uid(), 0);
    for entry in std::fs::read_dir(&drive_dir).unwrap().flatten() {
        assert_eq!(
            entry.metadata().unwrap().uid(),
            0,
            "{}",
            entry.path().display()
        );
    }
    BD.assert_nothing_left(mp1.path(), &spec1);
    BD.assert_nothing_left(mp2.path(), &spec2);
}

#[test]
fn a_missing_user_fails_the_mount_in_one_line_saying_how_to_create_it() {
    require_root();
    let spec = BD.new_drive("privsep-nouser", "16MiB");
    let mp = BD.mp();
    let err = BD
        .mount_cmd(
            &spec,
            &mp,
            &["--mode", "raw", "--run-as", "no-such-user-bd42"],
        )
        .fails_in_one_line();
    assert!(err.contains("useradd --system"), "{err}");
    BD.assert_nothing_left(mp.path(), &spec);
}

#[test]
fn when_the_worker_dies_the_root_part_takes_the_mount_down_and_says_so() {
    require_root();
    let spec = BD.new_drive("privsep-die", "16MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw", "--run-as", USER]);
    let daemon = mp.pid();
    kill_worker(daemon);
    wait_for_exit(daemon, "the root part", Duration::from_secs(20));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mp.s()), "FUSE left at {}", mp.s());
    // `unmount` says what was lost and ends.
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("died") || text.contains("killed"), "{text}");
    // The dead worker's lease is still held: the one step the message names.
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.assert_nothing_left(mp.path(), &spec);
}

/// A buffer of `len` bytes aligned for O_DIRECT, filled by `fill`.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize, fill: impl Fn(usize) -> u8) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        let mut a = Aligned { ptr, layout };
        for (i, b) in a.bytes_mut().iter_mut().enumerate() {
            *b = fill(i);
        }
        a
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// The block device `dev`, opened for O_DIRECT.
fn open_direct(dev: &str) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {dev} O_DIRECT: {e}"))
}

#[test]
fn a_split_block_mount_reads_the_network_only_behind_the_walls() {
    require_root();
    let spec = BD.new_drive("privsep-block", "64MiB");
    let mp = BD.mp();
    let dev = BD
        .mount(&spec, &mp, &["--mode", "block", "--run-as", USER])
        .trim()
        .to_string();
    assert!(dev.starts_with("/dev/loop"), "mount said {dev:?}");
    let daemon = mp.pid();
    // The record names the device, as a mount of one process's does.
    let list = common::util::json(&BD.ok(&["list", "--json"]));
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountpoint"] == mp.s())
        .unwrap_or_else(|| panic!("no record of {}: {list}", mp.s()))
        .clone();
    assert_eq!(entry["device"], dev.as_str(), "{entry}");
    // 1 MiB written with O_DIRECT through the device, straight to the drive.
    let data = Aligned::new(1 << 20, |i| (i * 13 % 253) as u8);
    {
        let f = open_direct(&dev);
        f.write_all_at(data.bytes(), 5 << 20).unwrap();
        f.sync_all().unwrap();
    }
    assert_split_from_outside(daemon, || {
        let f = open_direct(&dev);
        f.write_all_at(data.bytes(), 5 << 20).unwrap();
        f.sync_all().unwrap();
    });
    let said = BD.unmount(&mp);
    assert!(said.is_empty() || !said.contains("error"), "{said}");
    wait_for_exit(daemon, "the root part", Duration::from_secs(20));
    BD.assert_nothing_left(mp.path(), &spec);
    // On the blob: a new split mount reads it back through its device.
    let mp2 = BD.mp();
    let dev2 = BD
        .mount(&spec, &mp2, &["--mode", "block", "--run-as", USER])
        .trim()
        .to_string();
    let mut back = Aligned::new(1 << 20, |_| 0);
    open_direct(&dev2)
        .read_exact_at(back.bytes_mut(), 5 << 20)
        .unwrap();
    assert!(back.bytes() == data.bytes(), "the data is on the blob");
    BD.unmount(&mp2);
    BD.assert_nothing_left(mp2.path(), &spec);
}

#[test]
fn when_a_block_worker_dies_the_root_part_detaches_its_loop_device() {
    require_root();
    let spec = BD.new_drive("privsep-block-die", "16MiB");
    let mp = BD.mp();
    let dev = BD
        .mount(&spec, &mp, &["--mode", "block", "--run-as", USER])
        .trim()
        .to_string();
    let daemon = mp.pid();
    kill_worker(daemon);
    wait_for_exit(daemon, "the root part", Duration::from_secs(30));
    let still = backing_file(&dev);
    assert!(
        !still.contains(mp.s()),
        "{dev} still attached to {still} after the worker died"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mp.s()), "FUSE left at {}", mp.s());
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("died") || text.contains("killed"), "{text}");
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.assert_nothing_left(mp.path(), &spec);
}

#[test]
fn a_split_fs_mount_with_a_disk_cache_keeps_its_cache_the_workers_and_warm() {
    require_root();
    let spec = BD.new_drive("privsep-fs", "128MiB");
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap().to_string();
    let mp = BD.mp();
    let args = [
        "--mkfs",
        "ext4",
        "--disk-cache",
        &cache_dir,
        "--run-as",
        USER,
    ];
    BD.mount(&spec, &mp, &args);
    let daemon = mp.pid();
    let file = mp.path().join("data");
    let data: Vec<u8> = (0..(4 << 20)).map(|i| (i * 31 % 247) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    // A consistent snapshot freezes the filesystem through the root part.
    let out = BD.cmd(&["snapshot", "create", &spec]).output();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.contains("consistent"),
        "{said}"
    );
    assert_split_from_outside(daemon, || {
        std::fs::write(&file, &data).unwrap();
        std::fs::File::open(&file).unwrap().sync_all().unwrap();
    });
    // The drive's own directory in the cache directory is the worker's, and
    // its files but the lock, which the root part holds; the directory the
    // operator named stays root's.
    use std::os::unix::fs::MetadataExt;
    let drive_dirs: Vec<_> = std::fs::read_dir(cache.path()).unwrap().flatten().collect();
    assert_eq!(drive_dirs.len(), 1, "one drive's directory");
    let id = Command::new("id").args(["-u", USER]).output().unwrap();
    let worker_uid: u32 = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
    for entry in std::fs::read_dir(drive_dirs[0].path()).unwrap().flatten() {
        let m = entry.metadata().unwrap();
        let owner = if entry.file_name() == "lock" {
            0
        } else {
            worker_uid
        };
        assert_eq!(m.uid(), owner, "{}", entry.path().display());
    }
    assert_eq!(drive_dirs[0].metadata().unwrap().uid(), worker_uid);
    assert_eq!(cache.path().metadata().unwrap().uid(), 0);
    BD.unmount(&mp);
    wait_for_exit(daemon, "the root part", Duration::from_secs(20));
    BD.assert_nothing_left(mp.path(), &spec);
    // Mounted again, the cache starts warm and the file reads back.
    let mp2 = BD.mp();
    BD.mount(&spec, &mp2, &args);
    let stats = mp2.stats();
    assert_eq!(stats["disk_cache"]["warm_start"], true, "{stats}");
    assert!(std::fs::read(mp2.path().join("data")).unwrap() == data);
    BD.unmount(&mp2);
    BD.assert_nothing_left(mp2.path(), &spec);
}

#[test]
fn when_an_fs_worker_dies_the_root_part_takes_the_filesystem_down() {
    require_root();
    let spec = BD.new_drive("privsep-fs-die", "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mkfs", "ext4", "--run-as", USER]);
    let daemon = mp.pid();
    let dev = recorded_device(&mp);
    let fuse_dir = record_of(&mp)["fuse_dir"].as_str().unwrap().to_string();
    kill_worker(daemon);
    wait_for_exit(daemon, "the root part", Duration::from_secs(30));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(mp.s()),
        "the filesystem left at {}",
        mp.s()
    );
    // (Once detached, the device may be another mount's already: tests run
    // side by side.)
    let still = backing_file(&dev);
    assert!(
        !still.contains(&fuse_dir),
        "{dev} still attached to {still}"
    );
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("killed"), "{text}");
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.assert_nothing_left(mp.path(), &spec);
}

/// The record of the mount at `mp` in the run directory.
fn record_of(mp: &Mp) -> serde_json::Value {
    let mounts = BD.run_dir().join("mounts");
    std::fs::read_dir(&mounts)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .find(|r| r["mountpoint"] == mp.s())
        .unwrap_or_else(|| panic!("no record of {} in {}", mp.s(), mounts.display()))
}

/// The control socket of the mount at `mp`, as its record names it.
fn control_socket(mp: &Mp) -> std::path::PathBuf {
    record_of(mp)["socket"].as_str().unwrap().into()
}

/// The walls from inside, in raw and block mode: the worker, asked on the
/// control socket, tries to read /etc/shadow, to run /bin/true, to mount a
/// tmpfs (on a directory of this test's), to become root and to enter a new
/// namespace; each is refused with the errno the walls give (EACCES for the
/// file: not the worker's to read, and outside what Landlock allows; EPERM for
/// the rest: seccomp, and no capability). The probe's own unit test shows that
/// the same command says ALLOWED where nothing walls the process.
#[test]
fn the_worker_tried_from_inside_is_refused_secrets_exec_mount_and_root() {
    require_root();
    let spec = BD.new_drive("privsep-probe", "16MiB");
    let target = tempfile::tempdir().unwrap();
    let cmd = format!("probe-walls {}", target.path().display());
    let want = [
        ("open /etc/shadow", libc::EACCES),
        ("exec /bin/true", libc::EPERM),
        ("mount tmpfs", libc::EPERM),
        ("setuid 0", libc::EPERM),
        ("unshare a UTS namespace", libc::EPERM),
        ("fork", libc::EPERM),
    ];
    for mode in ["raw", "block"] {
        let mp = BD.mp();
        BD.mount(&spec, &mp, &["--mode", mode, "--run-as", USER]);
        let socket = control_socket(&mp);
        let answer =
            blobdrive::mount::daemon::control(&socket, &cmd, Some(Duration::from_secs(30)))
                .unwrap_or_else(|e| panic!("{mode}: {cmd}: {e}"));
        let tries: serde_json::Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("{mode}: {cmd} answered {answer:?}: {e}"));
        assert_eq!(
            tries.as_object().map(|o| o.len()),
            Some(want.len()),
            "{tries}"
        );
        for (what, errno) in want {
            let said = tries[what].as_str().unwrap_or_default();
            assert!(
                said.starts_with("refused: ") && said.ends_with(&format!("(os error {errno})")),
                "{mode} mode: {what}: {said:?}, expected refused with errno {errno} (all: {tries})"
            );
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(target.path().to_str().unwrap()));
        BD.unmount(&mp);
        BD.assert_nothing_left(mp.path(), &spec);
    }
}

#[test]
fn a_worker_killed_while_its_filesystem_is_frozen_leaves_it_thawed_and_down() {
    use std::sync::atomic::Ordering::SeqCst;
    require_root();
    let spec = BD.new_drive("privsep-frozen", "64MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.via(&cs, &[]).mount(&spec, &["--mkfs", "ext4"]);
    let daemon = mp.pid();
    let dev = recorded_device(&mp);
    let fuse_dir = record_of(&mp)["fuse_dir"].as_str().unwrap().to_string();
    // Fsynced: on the blob. Then data a snapshot's flush must send first.
    let kept: Vec<u8> = (0..(1 << 20)).map(|i| (i * 17 % 251) as u8).collect();
    let kept_path = mp.path().join("kept");
    std::fs::write(&kept_path, &kept).unwrap();
    std::fs::File::open(&kept_path).unwrap().sync_all().unwrap();
    std::fs::File::open(mp.path()).unwrap().sync_all().unwrap();
    std::fs::write(mp.path().join("pending"), vec![9u8; 4 << 20]).unwrap();
    // The service stops answering: the snapshot freezes the filesystem, then
    // waits in its flush.
    proxy.paused.store(true, SeqCst);
    let snapshot = BD.cmd(&["snapshot", "create", &spec]).cs(&cs).spawn_piped();
    // A write to a frozen filesystem waits until it is thawed.
    let mut frozen_probe = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let mut touch = Command::new("touch")
            .arg(mp.path().join("probe"))
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        if touch.try_wait().unwrap().is_none() {
            frozen_probe = Some(touch);
            break;
        }
    }
    let mut frozen_probe = frozen_probe.expect("the snapshot froze the filesystem");
    kill_worker(daemon);
    wait_for_exit(daemon, "the root part", Duration::from_secs(60));
    // Thawed: the write that waited goes on (and fails or not, the drive is
    // gone), and the filesystem let go of the loop device, which is detached.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while frozen_probe.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < until,
            "a write still waits on the frozen filesystem"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(mp.s()),
        "the filesystem left at {}",
        mp.s()
    );
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while backing_file(&dev).contains(&fuse_dir) {
        assert!(
            std::time::Instant::now() < until,
            "{dev} still attached: the frozen filesystem holds it"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = snapshot.wait_with_output();
    proxy.paused.store(false, SeqCst);
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("killed"), "{text}");
    // Nothing fsynced was lost: the next mount finds the file whole.
    BD.ok(&["lease", "break", &spec, "--yes"]);
    let mp2 = BD.mp();
    BD.mount(&spec, &mp2, &[]);
    assert!(std::fs::read(mp2.path().join("kept")).unwrap() == kept);
    BD.unmount(&mp2);
    BD.assert_nothing_left(mp2.path(), &spec);
}

/// A raw mount of a new drive of 16 MiB tagged `tag`, split as every mount is:
/// its mountpoint, spec, root part and worker.
fn raw_mount(tag: &str) -> (Mp, String, u64, u64) {
    let spec = BD.new_drive(tag, "16MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw", "--run-as", USER]);
    let daemon = mp.pid();
    let worker = worker_of(daemon);
    (mp, spec, daemon, worker)
}

/// The mount's processes after a clean unmount: gone, and nothing left.
fn unmount_cleanly(mp: &Mp, spec: &str, daemon: u64) {
    BD.unmount(mp);
    wait_for_exit(daemon, "the root part", Duration::from_secs(30));
    BD.assert_nothing_left(mp.path(), spec);
}

/// Item 1: `( exec 8</root-only; blobdrive mount ... )` left fd 8 to the
/// worker, which read the file behind its walls. Neither process of the
/// mount holds a descriptor the caller left open.
#[test]
fn a_descriptor_the_caller_left_open_reaches_neither_process_of_the_mount() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    require_root();
    let spec = BD.new_drive("privsep-fds", "16MiB");
    let mp = BD.mp();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("root-only");
    std::fs::write(&secret, "not the worker's").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let held = std::fs::File::open(&secret).unwrap();
    let raw = held.as_raw_fd();
    let mut cmd = BD
        .cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--run-as", USER])
        .command();
    // SAFETY: dup2 alone, between fork and exec: fd 8 without close-on-exec,
    // as a shell's `exec 8<` leaves it.
    unsafe {
        cmd.pre_exec(move || match libc::dup2(raw, 8) {
            8 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    common::bd::Bd::from(cmd).ok();
    let daemon = mp.pid();
    let procs = mount_processes(daemon);
    assert_eq!(procs.len(), 2, "a root part and a worker: {procs:?}");
    let secret = secret.to_string_lossy().into_owned();
    for p in procs {
        for (n, link) in fd_links(p) {
            assert_ne!(link, secret, "process {p} of the mount holds it as fd {n}");
        }
    }
    drop(held);
    unmount_cleanly(&mp, &spec, daemon);
}

/// Whether the root part said it leaves the worker's log unread for the rest
/// of its window: the line it writes then ends the log or its rotated part
/// (rotated right after it), so their last 64 KiB are read.
fn holds_the_rest_back(log: &std::path::Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    [log.with_extension("log.1"), log.to_path_buf()]
        .iter()
        .filter_map(|p| std::fs::File::open(p).ok())
        .any(|mut f| {
            let mut tail = Vec::new();
            let _ = f.seek(SeekFrom::End(-(64 << 10)));
            let _ = f.read_to_end(&mut tail);
            String::from_utf8_lossy(&tail).contains("to its log within a minute: the rest waits")
        })
}

/// The mount's log and its rotated part, in bytes.
fn log_bytes(log: &std::path::Path) -> u64 {
    let rotated = log.with_extension("log.1");
    [log, rotated.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// Item 2: writing into the worker's stderr put 7.6 GiB into the mount's log
/// in 19 s, and `remove_log` let the root part write on into a file nobody
/// could see. Now: refused while mounted, and writing into
/// /proc/WORKER/fd/2 as fast as the pipe takes it, until the root part says
/// it holds the rest back (or for 20 s, which the old code never got past),
/// leaves the run directory's logs under 64 MiB, the escape sequences in it
/// shown, not raw.
#[test]
fn the_worker_can_neither_flood_the_log_nor_remove_it_while_mounted() {
    use std::io::ErrorKind;
    use std::os::unix::fs::OpenOptionsExt;
    require_root();
    let (mp, spec, daemon, worker) = raw_mount("privsep-flood");
    let log = std::path::PathBuf::from(record_of(&mp)["log"].as_str().unwrap());
    let stderr = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{worker}/fd/2"))
        .unwrap();
    let mut line = b"\x1b]0;owned\x07\x1b[2J flooding the log ".to_vec();
    line.resize(4095, b'x');
    line.push(b'\n');
    let chunk = line.repeat(16);
    let (mut written, mut most) = (0u64, 0u64);
    let started = std::time::Instant::now();
    let mut next_look = started;
    while started.elapsed() < Duration::from_secs(20) && most < 64 << 20 {
        match (&stderr).write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                most = most.max(log_bytes(&log));
                if std::time::Instant::now() >= next_look {
                    if holds_the_rest_back(&log) {
                        break;
                    }
                    next_look = std::time::Instant::now() + Duration::from_millis(200);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("writing into the worker's stderr: {e}"),
        }
    }
    drop(stderr);
    most = most.max(log_bytes(&log));
    eprintln!(
        "wrote {written} bytes into the worker's stderr in {:.1?}; the logs held at most {most} bytes",
        started.elapsed()
    );
    assert!(most < 64 << 20, "the logs grew to {most} bytes");
    // (Rotated at its bound: the flood is in both parts.)
    let mut text = std::fs::read(log.with_extension("log.1")).unwrap_or_default();
    text.extend(std::fs::read(&log).unwrap());
    assert!(
        !text.contains(&0x1b) && !text.contains(&0x07),
        "raw escapes in the log"
    );
    assert!(
        String::from_utf8_lossy(&text).contains("\\u{1b}]0;owned"),
        "the worker's lines, escaped"
    );
    {
        let _stopped = Stopped::new(worker);
        let channel = channel_of(worker, daemon);
        let answer = ask(&channel, r#"{"op":"remove_log"}"#).unwrap();
        assert!(answer.starts_with(r#"{"refused":"#), "{answer}");
    }
    assert!(log.exists(), "{} removed while mounted", log.display());
    unmount_cleanly(&mp, &spec, daemon);
    assert!(!log.exists(), "a clean unmount removes the log");
}

/// What a command printed, both streams.
fn printed(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Item 3: the control socket is the worker's, and `stats`, `resize`,
/// `snapshot create` and `unmount` printed what it said raw (a terminal's
/// title set, its screen cleared). With the worker stopped, the test answers
/// on its listening socket with escape sequences in every answer and
/// progress line: nothing any command prints holds one.
#[test]
fn what_the_worker_says_on_the_control_socket_reaches_the_terminal_escaped() {
    require_root();
    let (mp, spec, daemon, worker) = raw_mount("privsep-escape");
    let outputs = {
        let _stopped = Stopped::new(worker);
        let listener = listener_of(worker);
        // Served until the test says it is done, not for a count of
        // connections: another test's `blobdrive list` asks every live mount
        // for its stats meanwhile, and a count would leave this test's last
        // command to the real worker once it runs again.
        let socket = listener.local_addr().unwrap();
        let socket = socket.as_pathname().unwrap().to_path_buf();
        let server = std::thread::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                let mut cmd = String::new();
                std::io::BufReader::new(&conn).read_line(&mut cmd).unwrap();
                let answer = match cmd.split_whitespace().next().unwrap_or_default() {
                    "test-done" => break,
                    "stats" => r#"{"lease_state":"\u001b]0;owned\u0007","disk_size":1,"disk_cache":{"dir":"\u001b[2J","off_reason":"\u009b2J"}}"#.to_string(),
                    "resize" => "progress \x1b]0;owned\x07\nok grew\x1b[2J".to_string(),
                    "snapshot" => "ok \x1b]0;owned\x07".to_string(),
                    _ => "progress \x1b[2J\x1b]0;owned\x07\nerror \x1b]0;owned\x07".to_string(),
                };
                let _ = writeln!(conn, "{answer}");
            }
        });
        let run = |args: &[&str]| printed(&BD.cmd(args).output());
        let outputs = [
            run(&["stats", mp.s()]),
            run(&["stats", mp.s(), "--json"]),
            run(&["resize", mp.s(), "--size", "32MiB"]),
            run(&["snapshot", "create", &spec]),
            run(&["unmount", mp.s()]),
        ];
        let mut done = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        writeln!(done, "test-done").unwrap();
        server.join().unwrap();
        outputs
    };
    for out in &outputs {
        assert!(
            !out.contains('\x1b') && !out.contains('\x07') && !out.contains('\u{9b}'),
            "printed raw: {out:?}"
        );
    }
    assert!(outputs[0].contains("\\u{1b}]0;owned"), "{}", outputs[0]);
    unmount_cleanly(&mp, &spec, daemon);
}

/// Item 4: a `finished` request with made-up losses removed the record while
/// FUSE stayed mounted, and `list` and `unmount` no longer saw the mount.
/// The root part asks the kernel: refused while its mount is there.
#[test]
fn a_finished_request_cannot_hide_a_mount_that_is_still_there() {
    require_root();
    let (mp, spec, daemon, worker) = raw_mount("privsep-finished");
    {
        let _stopped = Stopped::new(worker);
        let channel = channel_of(worker, daemon);
        let answer = ask(&channel, r#"{"op":"finished","losses":["made up"]}"#).unwrap();
        assert!(answer.starts_with(r#"{"refused":"#), "{answer}");
    }
    assert_eq!(mp.listed()["pid"], daemon, "the mount is listed still");
    let mut first = [0u8; 512];
    std::fs::File::open(mp.disk())
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    unmount_cleanly(&mp, &spec, daemon);
}

/// Item 6: `disk_size` while the worker does not answer FUSE held the root
/// part in the kernel, deaf to SIGTERM. Now the root part answers within its
/// bound that the call is still under way, and passes SIGTERM on to the
/// worker at once while the call waits; the worker, let go on, takes the
/// mount down.
#[test]
fn a_worker_that_leaves_fuse_unanswered_cannot_hold_the_root_part() {
    require_root();
    let (mp, spec, daemon, worker) = raw_mount("privsep-hold");
    let stopped = Stopped::new(worker);
    let channel = channel_of(worker, daemon);
    let answer = ask(&channel, r#"{"op":"disk_size"}"#)
        .unwrap_or_else(|e| panic!("the root part did not answer disk_size: {e}"));
    assert!(answer.starts_with(r#"{"pending":"#), "{answer}");
    // SAFETY: kill with integer arguments, to the test's own mount.
    unsafe { libc::kill(daemon as i32, libc::SIGTERM) };
    wait_for(
        "SIGTERM passed on to the worker",
        Duration::from_secs(10),
        || signal_pending(worker, libc::SIGTERM),
    );
    drop(channel);
    drop(stopped);
    wait_for_exit(daemon, "the root part", Duration::from_secs(60));
    BD.assert_nothing_left(mp.path(), &spec);
}

/// Item 6: a filesystem frozen for a snapshot and never thawed (the worker
/// asks `freeze`, through the debug builds' `probe-root`, and nothing more)
/// is thawed by the root part once BLOBDRIVE_FREEZE_LIMIT_SECS passed: a
/// write that waited goes through.
#[test]
fn a_freeze_without_a_thaw_is_thawed_by_the_root_part() {
    require_root();
    let spec = BD.new_drive("privsep-freeze", "64MiB");
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4", "--run-as", USER])
        .env("BLOBDRIVE_FREEZE_LIMIT_SECS", "4")
        .ok();
    let daemon = mp.pid();
    let answer = blobdrive::mount::daemon::control(
        &control_socket(&mp),
        r#"probe-root {"op":"freeze"}"#,
        Some(Duration::from_secs(30)),
    )
    .unwrap();
    assert_eq!(answer, r#""done""#);
    let mut touch = Command::new("touch")
        .arg(mp.path().join("after-the-freeze"))
        .spawn()
        .unwrap();
    wait_for("the write to go through", Duration::from_secs(60), || {
        touch.try_wait().unwrap().is_some()
    });
    let log = std::fs::read_to_string(record_of(&mp)["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("not thawed: thawing it"), "{log}");
    unmount_cleanly(&mp, &spec, daemon);
}

/// Item 7: `blobdrive unmount` of a mount whose root part is stopped printed
/// "unmounting" every 3 s for ever. It gives up, in one error line naming the
/// process and what to do; let go on, the daemon finishes the unmount itself.
#[test]
fn unmount_gives_up_on_a_stopped_root_part_and_says_what_to_do() {
    require_root();
    let (mp, spec, daemon, _worker) = raw_mount("privsep-stopped");
    let stopped = Stopped::new(daemon);
    let mut unmount = BD.cmd(&["unmount", mp.s()]).spawn_piped();
    let ended = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        unmount.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = unmount.kill();
    }
    let out = unmount.wait_with_output().unwrap();
    assert!(ended, "unmount still waits after 60 s: {}", printed(&out));
    let err = common::bd::the_error_line(
        &String::from_utf8_lossy(&out.stderr),
        &["does not answer", &format!("(pid {daemon})"), "kill -CONT"],
    );
    assert!(!out.status.success(), "{err}");
    drop(stopped);
    wait_for_exit(daemon, "the root part", Duration::from_secs(60));
    BD.assert_nothing_left(mp.path(), &spec);
}

/// Item 8: workers of all mounts run as one user, and Landlock before ABI 6
/// let one signal another and connect to any abstract unix socket. One
/// mount's worker, asked through the debug builds' `probe-scope`, may neither
/// signal another mount's worker nor connect to an abstract socket this test
/// listens on.
#[test]
fn a_worker_can_neither_signal_another_nor_reach_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    require_root();
    let (mp_a, spec_a, daemon_a, _) = raw_mount("privsep-scope-a");
    let (mp_b, spec_b, daemon_b, worker_b) = raw_mount("privsep-scope-b");
    let name = format!("blobdrive-test-scope-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listening = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let answer = blobdrive::mount::daemon::control(
        &control_socket(&mp_a),
        &format!("probe-scope {worker_b} {name}"),
        Some(Duration::from_secs(30)),
    )
    .unwrap();
    let tries: serde_json::Value = serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("probe-scope answered {answer:?}: {e}"));
    for what in ["signal", "connect abstract"] {
        let said = tries[what].as_str().unwrap_or_default();
        assert!(
            said.starts_with("refused: ") && said.ends_with(&format!("(os error {})", libc::EPERM)),
            "{what}: {said:?} (all: {tries})"
        );
    }
    unmount_cleanly(&mp_a, &spec_a, daemon_a);
    unmount_cleanly(&mp_b, &spec_b, daemon_b);
}

/// Item 5: root ran blkid, e2fsck, resize2fs and mkfs on a device whose
/// bytes the worker serves. A `blkid` first on the daemon's PATH reports
/// what it may do, then fails the mount with that report as its error line:
/// it runs as a uid of its own without capability, no_new_privs, seccomp, in
/// network and mount namespaces of its own whose /dev holds the drive's loop
/// device (which it may open for writing) and nothing of the machine's; it
/// cannot read a file outside what Landlock allows it, nor reach the
/// emulator's port.
#[test]
fn filesystem_tools_run_on_the_drive_without_root_network_or_the_machine() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let spec = BD.new_drive("privsep-tools", "32MiB");
    let mp = BD.mp();
    let open = |dir: &tempfile::TempDir| {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let (tools, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    open(&tools);
    open(&elsewhere);
    let outside = elsewhere.path().join("world-readable");
    std::fs::write(&outside, "anyone's").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = Azurite::shared().port;
    // Python, not a shell: a tool may not start a process, and a shell's
    // every `$(...)` does.
    let python = "/usr/bin/python3";
    assert!(
        std::path::Path::new(python).exists(),
        "this test needs {python}"
    );
    let script = format!(
        r#"#!{python} -I
import os, socket, sys
def tried(f):
    try:
        f()
        return "yes"
    except OSError:
        return "no"
def field(k):
    for line in open("/proc/self/status"):
        if line.startswith(k + ":"):
            return line.split()[1]
def tcp():
    s = socket.socket()
    s.settimeout(5)
    s.connect(("127.0.0.1", {port}))
dev = sys.argv[-1]
said = dict(
    uid=os.getuid(), capeff=field("CapEff"), capbnd=field("CapBnd"),
    nnp=field("NoNewPrivs"), seccomp=field("Seccomp"),
    net=os.readlink("/proc/self/ns/net"), mnt=os.readlink("/proc/self/ns/mnt"),
    dev=",".join(sorted(os.listdir("/dev"))),
    device=tried(lambda: os.close(os.open(dev, os.O_RDWR))),
    outside=tried(lambda: open("{outside}").read()),
    shadow=tried(lambda: open("/etc/shadow").read()),
    tcp=tried(tcp),
)
print(" ".join(f"{{k}}={{v}}" for k, v in said.items()), file=sys.stderr)
sys.exit(1)
"#,
        outside = outside.display()
    );
    let fake = tools.path().join("blkid");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        tools.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let err = BD
        .cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4", "--run-as", USER])
        .env("PATH", path)
        .fails();
    let report: std::collections::HashMap<&str, &str> = err
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect();
    let mine = |ns: &str| {
        std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let want = [
        ("uid", "65533"),
        ("capeff", "0000000000000000"),
        ("capbnd", "0000000000000000"),
        ("nnp", "1"),
        ("seccomp", "2"),
        ("device", "yes"),
        ("outside", "no"),
        ("shadow", "no"),
        ("tcp", "no"),
    ];
    for (k, v) in want {
        assert_eq!(report.get(k).copied(), Some(v), "{k} in: {err}");
    }
    assert_ne!(
        report.get("net").copied(),
        Some(mine("net").as_str()),
        "{err}"
    );
    assert_ne!(
        report.get("mnt").copied(),
        Some(mine("mnt").as_str()),
        "{err}"
    );
    let dev = report.get("dev").copied().unwrap_or_default();
    let mut names: Vec<&str> = dev.split(',').filter(|n| !n.is_empty()).collect();
    names.sort_unstable();
    assert_eq!(names.len(), 4, "{err}");
    assert!(names[0].starts_with("loop"), "{err}");
    assert_eq!(names[1..], ["null", "urandom", "zero"], "{err}");
    BD.assert_nothing_left(mp.path(), &spec);
}

/// The sha256 of the first 16 MiB of `path` (a file or a device), in hex.
fn sha256_of(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .take(16 << 20)
        .read_to_end(&mut bytes)
        .unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The loop devices the kernel says are attached to `path` (sysfs, by the
/// name it gives their backing file).
fn loops_over(path: &str) -> Vec<String> {
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim_end() == path)
        })
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .collect()
}

/// The root part attached, formatted and mounted any file the worker named:
/// `losetup` attached `disk` by path, following the worker's answer to its
/// lookup. Played from a worker held in its lease request, before it attaches
/// anything (its `/dev/fuse` and channel taken), answering `disk` with a
/// symlink to a file only root can read, to another drive's `disk`, to that
/// drive's loop device, and with a block device node: every attach is
/// refused, and so are a stat of `disk`, formatting, mounting and `ready`. No
/// loop device is ever attached to any of them, their bytes are unchanged,
/// nothing is mounted, and `blobdrive mount` says the mount failed.
#[test]
fn the_worker_cannot_make_root_attach_format_or_mount_a_file_it_names() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    let spec_b = BD.new_drive("privsep-named-other", "16MiB");
    let mp_b = BD.mp();
    BD.mount(&spec_b, &mp_b, &["--mode", "block", "--run-as", USER]);
    let loop_b = recorded_device(&mp_b);
    let disk_b = mp_b.disk();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("b.vhd");
    std::fs::write(&secret, b"a text file with no filesystem\n".repeat(1 << 19)).unwrap();
    let secret_s = secret.to_str().unwrap().to_string();
    let sums = || [sha256_of(&secret), sha256_of(std::path::Path::new(&loop_b))];
    let before = sums();
    let spec = BD.new_drive("privsep-named", "16MiB");
    let proxy = Proxy::start(Config::holding(
        Azurite::shared().port,
        "x-ms-lease-action: acquire",
        1,
        Duration::from_secs(10),
    ));
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    let mount = BD
        .via(&cs, &[])
        .cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4", "--run-as", USER])
        .spawn_piped();
    proxy.wait_for_holding("the worker's lease request", Duration::from_secs(60));
    let daemon = mp.pid();
    let worker = worker_of(daemon);
    let stopped = Stopped::new(worker);
    let channel = channel_of(worker, daemon);
    let player = Player::start(fuse_of(worker), Disk::Symlink(secret.clone()));
    let node = Disk::Node {
        mode: libc::S_IFBLK | 0o600,
        rdev: std::fs::metadata(&loop_b).unwrap().rdev() as u32,
    };
    let mut said = Vec::new();
    for disk in [
        Disk::Symlink(secret.clone()),
        Disk::Symlink(disk_b.clone().into()),
        Disk::Symlink(loop_b.clone().into()),
        node,
    ] {
        player.answer(disk.clone());
        for req in [
            r#"{"op":"attach_loop","block_size":512}"#,
            r#"{"op":"disk_size"}"#,
            r#"{"op":"prepare_fs","zeroed":false}"#,
            r#"{"op":"mount_fs","small":null}"#,
        ] {
            said.push((
                format!("{disk:?}: {req}"),
                ask_until_answered(&channel, req).unwrap(),
            ));
        }
        // Never attached, not even for a moment.
        assert_eq!(loops_over(&secret_s), Vec::<String>::new(), "{said:?}");
        assert_eq!(loops_over(&disk_b), vec![loop_b.clone()], "{said:?}");
        assert_eq!(loops_over(&loop_b), Vec::<String>::new(), "{said:?}");
    }
    let ready = ask_until_answered(&channel, r#"{"op":"ready","status":"played"}"#).unwrap();
    drop((player, channel));
    // SAFETY: kill with integer arguments, to the test's own mount's worker.
    unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    drop(stopped);
    for (what, answer) in &said {
        assert!(
            answer.starts_with(r#"{"failed":"#),
            "{what} answered {answer}"
        );
    }
    assert!(said[0].1.contains("symlink"), "{}", said[0].1);
    assert!(
        ready.starts_with(r#"{"refused":"#),
        "ready answered {ready}"
    );
    assert_eq!(sums(), before, "bytes changed");
    let out = mount.wait_with_output().unwrap();
    let printed = printed(&out);
    assert!(!out.status.success(), "{printed}");
    assert!(
        !printed.contains("mounted ") && !printed.contains("created a new"),
        "{printed}"
    );
    wait_for_exit(daemon, "the root part", Duration::from_secs(60));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mp.s()), "something mounted at {}", mp.s());
    // The held lease request lands late: broken, then nothing of it is left.
    proxy.wait_for_held();
    let _ = BD.cmd(&["lease", "break", &spec, "--yes"]).output();
    BD.assert_nothing_left(mp.path(), &spec);
    assert_eq!(sums(), before, "bytes changed");
    BD.unmount(&mp_b);
    BD.assert_nothing_left(mp_b.path(), &spec_b);
}

/// An fs mount, its worker stopped and its channel taken after it sent
/// `FUSE_NOTIFY_INVAL_ENTRY` for `disk` (sysfs then says the loop device's
/// file is "disk (deleted)"): its root part and daemon.
fn fs_mount_after_an_inval_entry(tag: &str) -> (Mp, String, u64, u64, Stopped, UnixStream) {
    let spec = BD.new_drive(tag, "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mkfs", "ext4", "--run-as", USER]);
    std::fs::write(mp.path().join("kept"), b"written before").unwrap();
    let daemon = mp.pid();
    let worker = worker_of(daemon);
    let dev = recorded_device(&mp);
    let stopped = Stopped::new(worker);
    let channel = channel_of(worker, daemon);
    assert!(inval_disk(&fuse_of(worker)), "the kernel took the notice");
    assert!(
        backing_file(&dev).contains("(deleted)"),
        "{}",
        backing_file(&dev)
    );
    (mp, spec, daemon, worker, stopped, channel)
}

/// A `FUSE_NOTIFY_INVAL_ENTRY` for `disk` made sysfs name the loop device's
/// file ".../disk (deleted)", which the root part took for a device that had
/// let go: it forgot the device and the filesystem mounted on it (both still
/// there) and took another attach. Now it still holds both: the device is
/// attached, another attach is refused (one of a block size other than 512
/// or 4096 before anything else), and so is `finished`; the mount stays
/// listed, and `blobdrive unmount` takes it down whole.
#[test]
fn an_inval_entry_for_disk_leaves_the_mount_held_listed_and_unmountable() {
    require_root();
    let (mp, spec, daemon, _worker, stopped, channel) =
        fs_mount_after_an_inval_entry("privsep-inval");
    let attached = ask_until_answered(&channel, r#"{"op":"loop_attached"}"#).unwrap();
    let again = ask_until_answered(&channel, r#"{"op":"attach_loop","block_size":4096}"#).unwrap();
    let odd = ask_until_answered(&channel, r#"{"op":"attach_loop","block_size":1024}"#).unwrap();
    let finished = ask_until_answered(&channel, r#"{"op":"finished","losses":[]}"#).unwrap();
    drop((channel, stopped));
    assert_eq!(attached, r#"{"attached":true}"#);
    assert!(again.contains("attached already"), "{again}");
    assert!(
        odd.starts_with(r#"{"refused":"#) && odd.contains("only 512 and 4096"),
        "{odd}"
    );
    assert!(finished.starts_with(r#"{"refused":"#), "{finished}");
    assert_eq!(mp.listed()["pid"], daemon, "the mount is listed still");
    let kept = std::fs::read(mp.path().join("kept")).unwrap();
    assert_eq!(kept, b"written before");
    unmount_cleanly(&mp, &spec, daemon);
}

/// The same notice, then the worker killed: the root part, which had
/// forgotten the filesystem, left it mounted and released the record, so
/// `blobdrive list` no longer showed a mount `findmnt` did. Now it takes it
/// down with the rest, and nothing is left mounted, listed or not.
#[test]
fn a_worker_killed_after_an_inval_entry_leaves_nothing_mounted() {
    require_root();
    let (mp, spec, daemon, worker, stopped, channel) =
        fs_mount_after_an_inval_entry("privsep-inval-killed");
    let attached = ask_until_answered(&channel, r#"{"op":"loop_attached"}"#).unwrap();
    drop(channel);
    // SAFETY: kill with integer arguments, to the test's own mount's worker.
    unsafe { libc::kill(worker as i32, libc::SIGKILL) };
    drop(stopped);
    wait_for_exit(daemon, "the root part", Duration::from_secs(60));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let listed = BD.ok(&["list", "--json"]).contains(mp.s());
    assert!(
        !mounts.contains(mp.s()),
        "the filesystem left mounted at {} (listed: {listed}; the root part said {attached})",
        mp.s()
    );
    // (A killed worker cannot release its lease.)
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.assert_nothing_left(mp.path(), &spec);
}

/// Each request the root part refused was logged with the worker's whole
/// line (up to 64 KiB) outside the log's bound: 12,348 such lines in 15 s
/// rotated the log twice, pushing what came before out. Now a refusal quotes
/// a few hundred characters, escaped, counted in the worker's share of the
/// log: thousands of 60 KiB requests leave the log's first line in it, no
/// line of it over 2 KiB, and the log under its bound.
#[test]
fn requests_full_of_the_worker_s_text_neither_rotate_the_log_nor_fill_it() {
    require_root();
    let (mp, spec, daemon, worker) = raw_mount("privsep-quotes");
    let log = std::path::PathBuf::from(record_of(&mp)["log"].as_str().unwrap());
    let first = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let junk = format!(r#"{{"op":"\u001b]0;owned\u0007{}"}}"#, "x".repeat(60 << 10));
    let (sent, longest_answer) = {
        let _stopped = Stopped::new(worker);
        let channel = channel_of(worker, daemon);
        let started = std::time::Instant::now();
        let (mut sent, mut longest) = (0, 0);
        while sent < 4000 && started.elapsed() < Duration::from_secs(20) {
            let answer = ask(&channel, &junk).unwrap();
            assert!(answer.starts_with(r#"{"refused":"#), "{answer}");
            longest = longest.max(answer.len());
            sent += 1;
        }
        (sent, longest)
    };
    let mut text = std::fs::read(log.with_extension("log.1")).unwrap_or_default();
    text.extend(std::fs::read(&log).unwrap());
    let text = String::from_utf8_lossy(&text);
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    eprintln!(
        "{sent} requests of 60 KiB; the logs hold {} bytes, the longest line {longest}",
        text.len()
    );
    assert!(text.contains(&first), "the log's first line was pushed out");
    assert!(longest < 2048, "a line of {longest} bytes");
    assert!(
        !text.contains('\x1b') && !text.contains('\x07'),
        "raw escapes"
    );
    assert!(text.contains("\\u{1b}]0;owned"), "the refusals, quoted");
    assert!(log_bytes(&log) < blobdrive::mount::record::LOG_MAX_BYTES);
    assert!(longest_answer < 2048, "an answer of {longest_answer} bytes");
    unmount_cleanly(&mp, &spec, daemon);
}
