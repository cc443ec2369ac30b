use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn a_missing_user_or_root_is_refused_in_one_line_that_says_what_to_do() {
    let err = WorkerUser::lookup("no-such-user-for-blobdrive").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, WallError::NoSuchUser(_)), "{text}");
    assert!(text.contains("useradd --system --no-create-home"), "{text}");
    assert!(!text.contains('\n'));
    assert!(matches!(
        WorkerUser::lookup("root").unwrap_err(),
        WallError::RootUser(_)
    ));
    assert_eq!(
        WorkerUser::lookup("nobody").unwrap(),
        WorkerUser {
            uid: 65534,
            gid: 65534
        }
    );
}

#[test]
fn only_plain_user_names_are_taken() {
    for ok in [
        "blobdrive",
        "_bd",
        "bd-worker_2",
        "a",
        &"a".repeat(USER_NAME_MAX),
    ] {
        assert_eq!(check_user_name(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "Blobdrive",
        "1000",
        "-bd",
        "bd.worker",
        "root:root",
        "bd$",
        "../etc",
        "bd worker",
        "bd\u{1b}[2J",
        "blöbdrive",
        &"a".repeat(USER_NAME_MAX + 1),
    ] {
        let e = check_user_name(bad).unwrap_err();
        assert!(e.contains("is not a user name"), "{bad:?}: {e}");
        assert!(!e.contains('\u{1b}') && !e.contains('\n'), "{e}");
    }
}

#[test]
fn the_seccomp_programs_build_for_this_machine() {
    let programs = seccomp_programs(Purpose::Worker).unwrap();
    assert_eq!(programs.len(), 2);
    assert!(programs.iter().all(|p| !p.is_empty()));
    // A tool's: its own program may start, sockets are refused besides.
    let programs = seccomp_programs(Purpose::Tool).unwrap();
    assert_eq!(programs.len(), 4);
    assert!(programs.iter().all(|p| !p.is_empty()));
}

/// In a child of a fork: the descriptors of `fds` still open after
/// `close_descriptors_but(keep)`, as bits of the exit status.
fn open_after_closing_but(fds: &[libc::c_int], keep: &[libc::c_int]) -> i32 {
    // SAFETY: the child makes system calls only, then exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut bits = 0;
        if close_descriptors_but(keep).is_ok() {
            for (i, &fd) in fds.iter().enumerate() {
                // SAFETY: F_GETFD only looks.
                if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 {
                    bits |= 1 << i;
                }
            }
        } else {
            bits = 0x7f;
        }
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(bits) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    libc::WEXITSTATUS(status)
}

#[test]
fn only_the_descriptors_kept_stay_open() {
    use std::os::fd::AsRawFd;
    let files: Vec<std::fs::File> = (0..4)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let fds: Vec<libc::c_int> = files.iter().map(|f| f.as_raw_fd()).collect();
    // The second and the fourth kept (given out of order, with stderr).
    assert_eq!(open_after_closing_but(&fds, &[fds[3], 2, fds[1]]), 0b1010);
    assert_eq!(open_after_closing_but(&fds, &[]), 0);
    // In this process, they are all still open.
    assert_eq!(open_after_closing_but(&fds, &fds), 0b1111);
}

/// errno of the last failed call, 0 if `rc` says it succeeded.
fn errno_if(failed: bool) -> i32 {
    if failed {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

fn open_errno(path: &CString) -> i32 {
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    errno_if(fd < 0)
}

extern "C" fn thread_body(_: *mut libc::c_void) -> *mut libc::c_void {
    std::ptr::null_mut()
}

/// What the walled child tried, in order, as errnos (0: it worked).
const TRIES: [&str; 10] = [
    "walls up",
    "open /etc/passwd (readable by nobody, outside what Landlock allows)",
    "open the allowed file",
    "open /etc/shadow",
    "execve /bin/true",
    "mount tmpfs",
    "unshare a user namespace",
    "clone into a new user namespace",
    "setuid 0",
    "start a thread",
];

/// Runs in the child of the fork: puts the walls up, tries each of [`TRIES`],
/// writes the errnos to `out`, waits for a byte on `go`, and exits.
fn walled_child(walls: Walls, paths: &[CString; 4], out: libc::c_int, go: libc::c_int) -> ! {
    let mut got = [0i32; TRIES.len()];
    got[0] = match walls.apply() {
        Ok(LandlockState::Enforced) => 0,
        Ok(LandlockState::NotInKernel) => -2,
        Err(_) => -1,
    };
    got[1] = open_errno(&paths[0]);
    got[2] = open_errno(&paths[1]);
    got[3] = open_errno(&paths[2]);
    let argv = [paths[3].as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: valid NULL-terminated argument and environment lists; all calls
    // below are plain system calls on our own process.
    unsafe {
        got[4] = errno_if(libc::execve(paths[3].as_ptr(), argv.as_ptr(), envp.as_ptr()) != 0);
        let tmpfs = c"tmpfs".as_ptr();
        // On a path that does not exist: without the filter this is ENOENT
        // (the path is looked up before the capability is asked for).
        let nowhere = c"/nonexistent-blobdrive-walls-test".as_ptr();
        got[5] = errno_if(libc::mount(tmpfs, nowhere, tmpfs, 0, std::ptr::null()) != 0);
        got[6] = errno_if(libc::unshare(libc::CLONE_NEWUSER) != 0);
        let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
        let pid = libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0);
        if pid == 0 {
            libc::_exit(0);
        }
        got[7] = errno_if(pid < 0);
        got[8] = errno_if(libc::setuid(0) != 0);
        let mut thread: libc::pthread_t = 0;
        got[9] = libc::pthread_create(
            &mut thread,
            std::ptr::null(),
            thread_body,
            std::ptr::null_mut(),
        );
        if got[9] == 0 {
            libc::pthread_join(thread, std::ptr::null_mut());
        }
        libc::write(out, got.as_ptr().cast(), std::mem::size_of_val(&got));
        let mut byte = 0u8;
        libc::read(go, (&mut byte as *mut u8).cast(), 1);
        libc::_exit(0);
    }
}

/// One field of a /proc status file, as its text.
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in status"))
        .trim()
}

/// The walls checked from outside (every thread's /proc status, as an
/// operator would) and from inside (what the child is
/// refused), in a child forked from this test and walled as `nobody`.
#[test]
fn a_walled_process_holds_no_privilege_and_is_refused_files_exec_and_mount() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let allowed = dir.path().join("allowed");
    std::fs::write(&allowed, "yes").unwrap();
    std::fs::set_permissions(&allowed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let walls = Walls::prepare(
        WorkerUser::lookup("nobody").unwrap(),
        &Allowed {
            read_only: vec![dir.path().to_path_buf()],
            ..Allowed::default()
        },
    )
    .unwrap();
    let c = |p: &str| CString::new(p).unwrap();
    let paths = [
        c("/etc/passwd"),
        c(allowed.to_str().unwrap()),
        c("/etc/shadow"),
        c("/bin/true"),
    ];
    let (mut results, mut go) = ([0; 2], [0; 2]);
    // SAFETY: pipe(2) into two-element arrays.
    unsafe {
        assert_eq!(libc::pipe(results.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(go.as_mut_ptr()), 0);
    }
    // SAFETY: the child makes only system calls (the walls were built above)
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        walled_child(walls, &paths, results[1], go[0]);
    }
    let mut got = [0i32; TRIES.len()];
    // SAFETY: reading into our own buffer from our own pipe.
    let n = unsafe {
        libc::read(
            results[0],
            got.as_mut_ptr().cast(),
            std::mem::size_of_val(&got),
        )
    };
    let mut statuses = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        statuses.push(std::fs::read_to_string(task.unwrap().path().join("status")).unwrap());
    }
    // SAFETY: our own pipe and child.
    unsafe {
        libc::write(go[1], b"g".as_ptr().cast(), 1);
        let mut wstatus = 0;
        libc::waitpid(pid, &mut wstatus, 0);
        for fd in results.into_iter().chain(go) {
            libc::close(fd);
        }
    }
    assert_eq!(
        n as usize,
        std::mem::size_of_val(&got),
        "the child said nothing"
    );
    assert!(!statuses.is_empty());
    for status in &statuses {
        assert_eq!(field(status, "Uid"), "65534\t65534\t65534\t65534");
        assert_eq!(field(status, "Gid"), "65534\t65534\t65534\t65534");
        assert_eq!(field(status, "Groups"), "");
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(status, set), "0000000000000000", "{set}");
        }
        assert_eq!(field(status, "NoNewPrivs"), "1");
        assert_eq!(field(status, "Seccomp"), "2");
    }
    let want = [
        0,
        libc::EACCES,
        0,
        libc::EACCES,
        libc::EPERM,
        libc::EPERM,
        libc::EPERM,
        libc::EPERM,
        libc::EPERM,
        0,
    ];
    for ((what, got), want) in TRIES.iter().zip(got).zip(want) {
        assert_eq!(got, want, "{what}: errno {got}, expected {want}");
    }
}
