use super::*;
use std::os::unix::fs::PermissionsExt;

/// Ids far from any this host gives, so the host's own processes never
/// stand in the way.
const BASE: u64 = 1_900_000_000;

/// A pool of `count` ids from [`BASE`] in a directory of its own: its files,
/// and a `/proc` holding this process (for its start time) and the
/// processes `procs` (each with the ids given).
struct Fake {
    dir: tempfile::TempDir,
    places: Places,
}

impl Fake {
    fn new(count: u64, passwd: &str, group: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(
            d.join("subuid"),
            format!("someone:100000:65536\nblobdrive:{BASE}:{count}\n"),
        )
        .unwrap();
        std::fs::write(d.join("subgid"), format!("blobdrive:{BASE}:{count}\n")).unwrap();
        std::fs::write(d.join("passwd"), passwd).unwrap();
        std::fs::write(d.join("group"), group).unwrap();
        let me = d.join("proc").join(std::process::id().to_string());
        std::fs::create_dir_all(&me).unwrap();
        std::fs::copy("/proc/self/stat", me.join("stat")).unwrap();
        std::fs::write(me.join("status"), "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n").unwrap();
        let places = Places {
            subuid: d.join("subuid"),
            subgid: d.join("subgid"),
            passwd: d.join("passwd"),
            group: d.join("group"),
            proc_dir: d.join("proc"),
            claims: d.join("run").join("uids"),
            claims_root: d.to_path_buf(),
            nss: false,
        };
        Fake { dir, places }
    }

    /// A process `pid` running with `id` as one of its uids.
    fn process(&self, pid: u32, id: u64) {
        let p = self.places.proc_dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(
            p.join("status"),
            format!("Name:\tw\nUid:\t{id}\t{id}\t{id}\t{id}\nGid:\t{id}\t{id}\t{id}\t{id}\n"),
        )
        .unwrap();
    }

    fn claimed(&self) -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(&self.places.claims)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        v.sort();
        v
    }
}

#[test]
fn ids_of_accounts_processes_and_live_mounts_are_passed_over() {
    let passwd = format!("blobdrive:x:999:995::/:/bin/false\nu:x:{BASE}:1::/:/bin/sh\n");
    let group = format!("g:x:{}:\n", BASE + 1);
    let fake = Fake::new(10, &passwd, &group);
    fake.process(4242, BASE + 2);
    let a = claim(&fake.places).unwrap();
    assert_eq!(u64::from(a.uid()), BASE + 3, "the first id no one has");
    assert_eq!(a.uid(), a.gid());
    let b = claim(&fake.places).unwrap();
    assert_eq!(
        u64::from(b.uid()),
        BASE + 4,
        "a live mount's id is not given again"
    );
    assert_eq!(fake.claimed(), vec![BASE + 3, BASE + 4]);
    a.release();
    assert_eq!(fake.claimed(), vec![BASE + 4], "given back");
    let c = claim(&fake.places).unwrap();
    assert_eq!(
        u64::from(c.uid()),
        BASE + 5,
        "the next in turn, not the one given back"
    );
    drop((b, c));
    assert!(fake.claimed().is_empty(), "dropped, given back");
    drop(fake.dir);
}

#[test]
fn a_claim_whose_holder_is_gone_is_removed_unless_a_process_still_runs_as_it() {
    let fake = Fake::new(10, "", "");
    ClaimsDir::open(&fake.places.claims, &fake.places.claims_root).unwrap();
    // pid 1's start time is never this one's: a holder that is gone.
    std::fs::write(fake.places.claims.join(BASE.to_string()), "1 1\n").unwrap();
    std::fs::write(fake.places.claims.join((BASE + 1).to_string()), "1 1\n").unwrap();
    fake.process(4243, BASE + 1);
    let a = claim(&fake.places).unwrap();
    assert_eq!(
        u64::from(a.uid()),
        BASE,
        "the stale claim's id, given again"
    );
    assert_eq!(fake.claimed(), vec![BASE], "both stale claims gone");
    let b = claim(&fake.places).unwrap();
    assert_eq!(
        u64::from(b.uid()),
        BASE + 2,
        "the id a process still runs as is passed over"
    );
    let state = |id| pool_id_state(&fake.places, id);
    assert_eq!(state(BASE + 1), LeftTo::InUse, "a process has it");
    assert_eq!(state(BASE), LeftTo::InUse, "a live mount holds it");
    assert_eq!(state(BASE + 5), LeftTo::Idle, "reserved and unused");
    assert_eq!(state(BASE + 10), LeftTo::NotPool, "not reserved");
}

#[test]
fn a_child_s_copy_of_a_claim_gives_nothing_back() {
    let fake = Fake::new(2, "", "");
    let a = claim(&fake.places).unwrap();
    let copy = Claim {
        id: a.id,
        holder: Holder {
            pid: a.holder.pid + 1,
            start: a.holder.start,
        },
        dir: ClaimsDir::open(&fake.places.claims, &fake.places.claims_root).unwrap(),
    };
    drop(copy);
    assert_eq!(fake.claimed(), vec![BASE]);
    drop(a);
    assert!(fake.claimed().is_empty());
}

#[test]
fn mounts_starting_at_once_get_ids_of_their_own_until_none_is_left() {
    let fake = Fake::new(8, "", "");
    let places = fake.places.clone();
    let claims: Vec<Claim> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| claim(&places).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ids: HashSet<u32> = claims.iter().map(Claim::uid).collect();
    assert_eq!(ids.len(), 8, "{ids:?}");
    let err = claim(&fake.places).err().unwrap();
    assert!(matches!(err, UidError::Exhausted(8)), "{err}");
    assert!(!err.to_string().contains('\n'));
}

#[test]
fn no_reservation_is_one_line_saying_how_to_make_one() {
    let fake = Fake::new(10, "", "");
    std::fs::write(&fake.places.subgid, "").unwrap();
    let err = claim(&fake.places).err().unwrap();
    assert!(matches!(err, UidError::NotReserved), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("usermod --add-subuids") && text.contains("--run-as") && !text.contains('\n'),
        "{text}"
    );
    // A reservation below 65536 only (systemd's DynamicUser range) is none.
    std::fs::write(&fake.places.subuid, "blobdrive:61184:4336\n").unwrap();
    std::fs::write(&fake.places.subgid, "blobdrive:61184:4336\n").unwrap();
    assert!(matches!(claim(&fake.places), Err(UidError::NotReserved)));
}

#[test]
fn an_id_given_back_comes_again_only_after_the_others() {
    let fake = Fake::new(3, "", "");
    let mut given = Vec::new();
    for _ in 0..5 {
        let c = claim(&fake.places).unwrap();
        given.push(c.uid());
        c.release();
    }
    let b = BASE as u32;
    assert_eq!(given, vec![b, b + 1, b + 2, b, b + 1]);
    // A held id is passed over, and the turn goes on after the one given.
    let held = claim(&fake.places).unwrap();
    assert_eq!(held.uid(), b + 2);
    let next = claim(&fake.places).unwrap();
    assert_eq!(next.uid(), b);
    drop(next);
    assert_eq!(claim(&fake.places).unwrap().uid(), b + 1);
    // A record that is not a number, or of an id no longer reserved, starts
    // from the first.
    std::fs::write(fake.places.claims.join("last"), "junk").unwrap();
    assert_eq!(claim(&fake.places).unwrap().uid(), b);
    std::fs::write(fake.places.claims.join("last"), "7\n").unwrap();
    assert_eq!(claim(&fake.places).unwrap().uid(), b);
}
