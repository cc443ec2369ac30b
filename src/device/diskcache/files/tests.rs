use super::*;

fn state() -> BlobState {
    BlobState {
        etag: "\"0x8DC\"".into(),
        content_length: 64 << 20,
        sequence_number: 3,
    }
}

#[test]
fn index_bytes_come_back_and_any_damage_is_refused() {
    let entries = vec![
        (
            3,
            Chunk {
                slot: 1,
                valid: 0b101,
                crc: [7; PIECES],
            },
        ),
        (
            0,
            Chunk {
                slot: 0,
                valid: u16::MAX,
                crc: [9; PIECES],
            },
        ),
    ];
    let bytes = encode(&state(), &entries);
    assert_eq!(decode(&bytes), Some((state(), entries)));
    for i in [0, 9, 30, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[i] ^= 1;
        assert_eq!(decode(&bad), None, "byte {i} flipped");
    }
    assert_eq!(decode(&bytes[..bytes.len() - 5]), None);
    assert_eq!(decode(&[]), None);
}

#[test]
fn directory_names_keep_drives_apart_and_stay_short() {
    let ep = "http://127.0.0.1:10000/acct";
    let a = dir_name(ep, "acct", "disks", "a/b.vhd", None);
    assert!(a.starts_with("acct.disks.a%2Fb%2Evhd.e"), "{a}");
    assert_ne!(
        a,
        dir_name(ep, "acct", "disks", "a/b.vhd", Some("2026-01-01"))
    );
    assert_ne!(a, dir_name(ep, "acct", "disks.a", "b.vhd", None));
    let long = dir_name(ep, "acct", "disks", &"x".repeat(1000), None);
    assert!(long.len() < 220);
    assert_ne!(long, dir_name(ep, "acct", "disks", &"x".repeat(999), None));
    assert!(!dir_name(ep, "a", "b", "..", None).contains('/'));
}

#[test]
fn the_same_drive_through_another_endpoint_has_another_cache() {
    let a = dir_name("http://127.0.0.1:10000/acct", "acct", "d", "a.vhd", None);
    let b = dir_name("http://127.0.0.1:10001/acct", "acct", "d", "a.vhd", None);
    assert_ne!(a, b);
}

/// As root (the test binary is run as root in the suite): a drive's
/// directory goes to each mount's uid and back to root after it, and one
/// left with another uid is taken over only when that uid is idle.
#[test]
fn a_drive_s_directory_goes_to_each_mount_s_uid_and_back() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let owner = |p: &Path| std::fs::metadata(p).unwrap().uid();
    let (a, b) = (1_900_000_100u32, 1_900_000_101u32);
    let holder = |_: Option<u32>| "someone".to_string();
    let open = |owner, left_to: &dyn Fn(u32) -> LeftTo| {
        open_drive_dir(parent.path(), "d", Some(owner), left_to, &holder)
    };
    let dir = open((a, a), &|_| LeftTo::NotPool).unwrap().dir;
    let path = parent.path().join("d");
    // The worker's files, made as uid a; one hard link it made to a file
    // of someone else's is left alone.
    for name in ["data", "index"] {
        std::fs::write(path.join(name), b"x").unwrap();
        std::os::unix::fs::chown(path.join(name), Some(a), Some(a)).unwrap();
    }
    std::fs::write(parent.path().join("other"), b"y").unwrap();
    std::fs::remove_file(path.join("lock")).unwrap();
    std::fs::hard_link(parent.path().join("other"), path.join("lock")).unwrap();
    assert_eq!(owner(&path), a);
    take_back(&dir, a).unwrap();
    for p in [path.clone(), path.join("data"), path.join("index")] {
        assert_eq!(owner(&p), 0, "{}", p.display());
    }
    // Left with uid a (a root part killed before it took it back): b gets
    // it only while a is idle.
    give_to(&dir, (a, a), 0).unwrap();
    let err = open((b, b), &|_| LeftTo::NotPool).err().unwrap();
    assert!(err.contains("must be root's"), "{err}");
    let idle = |u| {
        if u == a {
            LeftTo::Idle
        } else {
            LeftTo::NotPool
        }
    };
    drop(open((b, b), &idle).unwrap());
    for p in [path.clone(), path.join("data"), path.join("index")] {
        assert_eq!(owner(&p), b, "{}", p.display());
    }
    // The lock that was a second link to another's file is not given, and
    // a lock file of the cache's own replaced it.
    assert_eq!(std::fs::read(parent.path().join("other")).unwrap(), b"y");
    assert_eq!(std::fs::metadata(path.join("lock")).unwrap().nlink(), 1);
    // Left with uid b while another mount now runs as b: c gets it
    // emptied, with a new lock.
    let c = 1_900_000_102u32;
    let in_use = |u| {
        if u == b {
            LeftTo::InUse
        } else {
            LeftTo::NotPool
        }
    };
    let held = open((c, c), &in_use).unwrap();
    let names: Vec<_> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["lock"]);
    assert_eq!(owner(&path), c);
    assert_eq!(std::fs::read(parent.path().join("other")).unwrap(), b"y");
    // While it is held, another mount is refused and changes nothing.
    let err = open((a, a), &|_| LeftTo::InUse).err().unwrap();
    assert!(err.contains("is in use by someone"), "{err}");
    assert_eq!(owner(&path), c);
    drop(held);
}
