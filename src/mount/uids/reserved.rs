//! The ids reserved for blobdrive's mounts: the `blobdrive` user's ranges in
//! `/etc/subuid` and `/etc/subgid`, as container tools reserve a user's
//! subordinate ids (`usermod --add-subuids`), clipped to where no other part
//! of the system hands ids out.

use std::io::Read;
use std::path::Path;

/// The lowest id a mount's worker is given. Below it is what the user database
/// and systemd hand out themselves: system users (up to 999), regular users
/// (up to 60000), systemd-homed (60001-60513), systemd's DynamicUser range
/// (61184-65519, allocated by systemd at a unit's start, seen in no file), and
/// `nobody` and the 16-bit -1 (65534, 65535). A reservation reaching down
/// there is cut off.
pub const MIN_ID: u64 = 65536;

/// One past the highest id given: ids from 2^31 on read as negative to
/// programs that keep them in a signed int.
pub const END_ID: u64 = 1 << 31;

/// The most of `/etc/subuid` or `/etc/subgid` read.
const FILE_MAX: u64 = 4 << 20;

/// Ids `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub start: u64,
    pub end: u64,
}

impl IdRange {
    /// How many ids it holds.
    pub fn count(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn contains(&self, id: u64) -> bool {
        (self.start..self.end).contains(&id)
    }
}

/// The ranges `text` (in the format of `/etc/subuid`: `USER:START:COUNT` a
/// line, USER a name or a uid) gives to the user `name` (whose uid is `uid`,
/// when it has one). Lines that do not parse are passed over, as shadow's own
/// tools do.
pub fn parse(text: &str, name: &str, uid: Option<u32>) -> Vec<IdRange> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.trim().split(':');
        let (Some(owner), Some(start), Some(count), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let ours = owner == name || (uid.is_some() && owner.parse::<u32>().ok() == uid);
        let (Ok(start), Ok(count)) = (start.parse::<u32>(), count.parse::<u32>()) else {
            continue;
        };
        if ours && count > 0 {
            out.push(IdRange {
                start: u64::from(start),
                end: u64::from(start) + u64::from(count),
            });
        }
    }
    out
}

/// The ids in both `uids` and `gids` (a worker takes the same number as its
/// uid and its gid), between [`MIN_ID`] and [`END_ID`], in order, without
/// overlaps.
pub fn usable(uids: &[IdRange], gids: &[IdRange]) -> Vec<IdRange> {
    let mut out = Vec::new();
    for u in uids {
        for g in gids {
            let start = u.start.max(g.start).max(MIN_ID);
            let end = u.end.min(g.end).min(END_ID);
            if start < end {
                out.push(IdRange { start, end });
            }
        }
    }
    out.sort_by_key(|r| r.start);
    let mut merged: Vec<IdRange> = Vec::new();
    for r in out {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// The file at `path`, at most [`FILE_MAX`] bytes of it; empty when missing.
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.take(FILE_MAX).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> IdRange {
        IdRange { start, end }
    }

    #[test]
    fn a_user_s_lines_are_found_by_name_or_by_uid() {
        let text = "alice:100000:65536\n\
                    blobdrive:165536:65536\n\
                    # a comment\n\
                    999:300000:10\n\
                    blobdrive:bad:10\n\
                    blobdrive:400000:0\n\
                    blobdrive:500000\n\
                    blobdrive:600000:5:extra\n";
        assert_eq!(
            parse(text, "blobdrive", Some(999)),
            vec![r(165536, 231072), r(300000, 300010)]
        );
        assert_eq!(parse(text, "blobdrive", None), vec![r(165536, 231072)]);
        assert_eq!(parse(text, "bob", None), vec![]);
        // The largest count a line can hold does not overflow.
        let big = parse("blobdrive:4294967295:4294967295", "blobdrive", None);
        assert_eq!(big[0].count(), u64::from(u32::MAX));
    }

    #[test]
    fn only_ids_in_both_files_above_the_system_s_and_below_2_31_are_usable() {
        // The gid range covers part of the uid range.
        assert_eq!(
            usable(&[r(100000, 165536)], &[r(120000, 200000)]),
            vec![r(120000, 165536)]
        );
        // Nothing below 65536: not DynamicUser's 61184-65519, not nobody.
        assert_eq!(
            usable(&[r(60000, 70000)], &[r(0, 1 << 20)]),
            vec![r(65536, 70000)]
        );
        assert_eq!(usable(&[r(61184, 65520)], &[r(61184, 65520)]), vec![]);
        // Nothing from 2^31 on.
        assert_eq!(
            usable(&[r((1 << 31) - 10, (1 << 31) + 10)], &[r(0, 1 << 32)]),
            vec![r((1 << 31) - 10, 1 << 31)]
        );
        // No gid range: no ids.
        assert_eq!(usable(&[r(100000, 165536)], &[]), vec![]);
        // Overlapping lines merge.
        assert_eq!(
            usable(
                &[r(100000, 110000), r(105000, 120000)],
                &[r(100000, 120000)]
            ),
            vec![r(100000, 120000)]
        );
    }
}
