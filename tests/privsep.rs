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
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::Duration;

use common::bd::Harness;
use common::mount::{require_root, Mp};
use common::user::USER;
use common::util::wait_for_exit;
use common::Azurite;
use faultproxy::{Config, Proxy};

const BD: Harness = Harness::new("privsep-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);

/// The processes of a mount: its daemon (the record's pid) and its children.
fn mount_processes(daemon: u64) -> Vec<u64> {
    let mut out = vec![daemon];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u64 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == daemon {
            out.push(pid);
        }
    }
    out
}

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

/// What `pid`'s descriptors lead to.
fn fd_links(pid: u64) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` holds one of the sockets `inodes` open.
fn holds_any(pid: u64, inodes: &HashSet<String>) -> bool {
    fd_links(pid).iter().any(|l| {
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

/// The check from outside, on the mount whose root part is `daemon`:
/// some process of it holds a connection to the emulator, none of those is
/// root (the root part, the record's pid, is, and holds none), and every thread
/// of each is walled and holds no loop device and no credentials file open.
/// Returns the processes holding connections (the workers).
fn assert_split_from_outside(daemon: u64) -> Vec<u64> {
    let port = Azurite::shared().port;
    let procs = mount_processes(daemon);
    assert!(procs.len() >= 2, "a root part and a worker: {procs:?}");
    let holders: Vec<u64> = procs
        .iter()
        .copied()
        .filter(|&p| holds_any(p, &connections_to(p, port)))
        .collect();
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
        for link in fd_links(worker) {
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

    let holders = assert_split_from_outside(daemon);

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
    for worker in assert_split_from_outside(daemon) {
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

#[test]
fn a_missing_user_fails_the_mount_in_one_line_saying_how_to_create_it() {
    require_root();
    let spec = BD.new_drive("privsep-nouser", "16MiB");
    let mp = BD.mp();
    let err = BD
        .cmd(&[
            "mount",
            &spec,
            mp.s(),
            "--mode",
            "raw",
            "--run-as",
            "no-such-user-bd42",
        ])
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
    assert_split_from_outside(daemon);
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
    assert_split_from_outside(daemon);
    // The drive's own directory in the cache directory is the worker's; the
    // directory the operator named stays root's.
    use std::os::unix::fs::MetadataExt;
    let drive_dirs: Vec<_> = std::fs::read_dir(cache.path()).unwrap().flatten().collect();
    assert_eq!(drive_dirs.len(), 1, "one drive's directory");
    let id = Command::new("id").args(["-u", USER]).output().unwrap();
    let worker_uid: u32 = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
    for entry in std::fs::read_dir(drive_dirs[0].path()).unwrap().flatten() {
        let m = entry.metadata().unwrap();
        assert_eq!(m.uid(), worker_uid, "{}", entry.path().display());
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
    kill_worker(daemon);
    wait_for_exit(daemon, "the root part", Duration::from_secs(30));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(mp.s()),
        "the filesystem left at {}",
        mp.s()
    );
    let still = backing_file(&dev);
    assert!(still.trim().is_empty(), "{dev} still attached to {still}");
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("killed"), "{text}");
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.assert_nothing_left(mp.path(), &spec);
}

/// The control socket of the mount at `mp`, as its record in the run
/// directory names it.
fn control_socket(mp: &Mp) -> std::path::PathBuf {
    let mounts = BD.run_dir().join("mounts");
    std::fs::read_dir(&mounts)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .find(|r| r["mountpoint"] == mp.s())
        .and_then(|r| r["socket"].as_str().map(Into::into))
        .unwrap_or_else(|| panic!("no record of {} in {}", mp.s(), mounts.display()))
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
    while !backing_file(&dev).trim().is_empty() {
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
