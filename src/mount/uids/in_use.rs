//! Which ids are in use already: by an account (`/etc/passwd`, `/etc/group`)
//! or by a running process (`/proc/PID/status`, all four uids and gids).

use std::collections::HashSet;
use std::path::Path;

/// The uids and gids of `passwd` (users' uids and primary groups) and the
/// gids of `group`, in those files' formats. An id an account has is never a
/// mount's: files that account owns would be the worker's.
pub fn account_ids(passwd: &str, group: &str) -> HashSet<u64> {
    let mut ids = HashSet::new();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        for field in f.iter().skip(2).take(2) {
            ids.extend(field.parse::<u64>().ok());
        }
    }
    for line in group.lines() {
        ids.extend(line.split(':').nth(2).and_then(|g| g.parse::<u64>().ok()));
    }
    ids
}

/// Every uid and gid (real, effective, saved, filesystem) of the processes
/// under `proc_dir` (`/proc`). A process that ends while it is read is passed
/// over.
pub fn process_ids(proc_dir: &Path) -> std::io::Result<HashSet<u64>> {
    let mut ids = HashSet::new();
    for entry in std::fs::read_dir(proc_dir)?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        ids.extend(ids_of_status(&status));
    }
    Ok(ids)
}

/// The ids on the `Uid:` and `Gid:` lines of a `/proc/PID/status`.
fn ids_of_status(status: &str) -> impl Iterator<Item = u64> + '_ {
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Uid:").or_else(|| l.strip_prefix("Gid:")))
        .flat_map(|rest| rest.split_whitespace().filter_map(|n| n.parse().ok()))
}

/// The start time of process `pid` (field 22 of its `stat`, in clock ticks
/// since boot): with the pid, it names the process even after the pid is
/// reused. `None` when there is no such process (or only its zombie).
pub fn start_time(proc_dir: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_dir.join(pid.to_string()).join("stat")).ok()?;
    // The command may hold spaces and parentheses: fields count from the last ')'.
    let after = stat.rsplit_once(')')?.1;
    let mut fields = after.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    // After the state (field 3) come fields 4..; the start time is field 22.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_take_their_uids_and_gids() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      blobdrive:x:999:995::/nonexistent:/usr/sbin/nologin\n\
                      odd:x:100010:100020::/:/bin/sh\n\
                      broken line\n";
        let group = "root:x:0:\nblobdrive:x:995:\nteam:x:100030:a,b\n";
        let ids = account_ids(passwd, group);
        for id in [0, 999, 995, 100010, 100020, 100030] {
            assert!(ids.contains(&id), "{id}");
        }
        assert!(!ids.contains(&100000));
    }

    #[test]
    fn every_id_of_every_process_counts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("4242");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(
            p.join("status"),
            "Name:\tx\nUid:\t100001\t100002\t100003\t100004\nGid:\t100005\t100005\t100005\t100006\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::create_dir(dir.path().join("77")).unwrap(); // gone meanwhile
        let ids = process_ids(dir.path()).unwrap();
        let mut v: Vec<u64> = ids.into_iter().collect();
        v.sort();
        assert_eq!(v, vec![100001, 100002, 100003, 100004, 100005, 100006]);
    }

    #[test]
    fn the_start_time_is_read_past_a_command_with_parentheses() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("9");
        std::fs::create_dir(&p).unwrap();
        let mut stat = String::from("9 (a (b) c) S");
        for n in 4..=21 {
            stat.push_str(&format!(" {n}"));
        }
        stat.push_str(" 123456 99 98\n");
        std::fs::write(p.join("stat"), &stat).unwrap();
        assert_eq!(start_time(dir.path(), 9), Some(123456));
        std::fs::write(p.join("stat"), stat.replace(") S", ") Z")).unwrap();
        assert_eq!(start_time(dir.path(), 9), None);
        assert_eq!(start_time(dir.path(), 10), None);
        // This process's own, from the real /proc.
        assert!(start_time(Path::new("/proc"), std::process::id()).is_some());
    }
}
