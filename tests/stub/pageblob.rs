//! One drive's snapshots as real Azure serves them, where Azurite cannot: Get
//! Page Ranges paged at 10,000 ranges with `NextMarker` (Azurite 3.35 never
//! pages: a blob of 10,050 ranges came back in one answer, `maxresults`
//! ignored), `prevsnapshot` diffs with `ClearRange` (Azurite ignores
//! `prevsnapshot`), and a snapshot's diff against itself empty. Each snapshot is a map of written
//! pages, each page with the write that put it there; a diff is the pages
//! whose write differs, written (`PageRange`) or cleared (`ClearRange`), as the
//! REST reference describes them. Answers are in Azure's form (inclusive ends,
//! ranges interleaved in order); a range query gets every range that touches
//! the range asked, unclipped, which is the most a client must clip.
//!
//! Only what reading a drive's page lists asks is served: properties (HEAD),
//! the footer (a ranged GET), the container's existence and Get Page Ranges.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{Recorded, Reply};

/// Ranges in one answer page when the request names no `maxresults`: what the
/// service pages at.
pub const SERVICE_PAGE: usize = 10_000;
const PAGE: u64 = 512;

/// The pages of one snapshot: page index -> the write that put it there.
pub type Pages = BTreeMap<u64, u32>;

/// A drive (`container/name`) of `disk` bytes and its snapshots.
pub struct Drive {
    pub container: String,
    pub name: String,
    pub disk: u64,
    /// The footer's 512 bytes.
    pub footer: Vec<u8>,
    /// Snapshot id -> its pages (the footer's page included).
    pub snapshots: BTreeMap<String, Pages>,
    /// Whether a diff between two snapshots is refused, as Azure refuses one
    /// when the blob was overwritten by a copy since the older (a snapshot's
    /// diff against itself is still answered).
    pub diff_refused: bool,
    /// Page lists made, by (snapshot, prevsnapshot).
    lists: Mutex<BTreeMap<ListKey, Arc<Vec<Entry>>>>,
}

type ListKey = (Option<String>, Option<String>);

/// A page list entry: a range (half-open) and whether it was cleared.
type Entry = (u64, u64, bool);

impl Drive {
    /// The stub's handler: answers as Azure would for this drive.
    pub fn handler(self) -> impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static {
        let drive = Arc::new(self);
        move |req, _| drive.answer(req)
    }

    fn answer(&self, req: &Recorded) -> Reply {
        let path = req.target.split('?').next().unwrap_or("");
        let blob_path = format!("/devstoreaccount1/{}/{}", self.container, self.name);
        if path == format!("/devstoreaccount1/{}", self.container) {
            return Reply::status(200);
        }
        if path != blob_path {
            return not_found();
        }
        let pages = match req.query("snapshot") {
            Some(s) => match self.snapshots.get(&s) {
                Some(p) => p,
                None => return not_found(),
            },
            // The drive itself: its newest snapshot's pages.
            None => match self.snapshots.values().last() {
                Some(p) => p,
                None => return not_found(),
            },
        };
        match (req.method.as_str(), req.query("comp").as_deref()) {
            ("HEAD", None) => Reply::status(200)
                .with("Content-Length-Override", &(self.disk + PAGE).to_string())
                .with("x-ms-blob-type", "PageBlob")
                .with("ETag", "\"0x1\"")
                .with("Last-Modified", "Sun, 22 Nov 2026 11:05:54 GMT"),
            ("GET", None) => self.read(req),
            ("GET", Some("pagelist")) => self.page_list(req, pages),
            _ => Reply::status(400),
        }
    }

    /// A ranged read: the footer where it lies, zeros elsewhere.
    fn read(&self, req: &Recorded) -> Reply {
        let Some((start, end)) = range_of(req) else {
            return Reply::status(400);
        };
        let mut body = vec![0u8; (end - start) as usize];
        for (i, b) in body.iter_mut().enumerate() {
            let at = start + i as u64;
            if at >= self.disk && at < self.disk + PAGE {
                *b = self.footer[(at - self.disk) as usize];
            }
        }
        Reply::part(req, self.disk + PAGE, body)
    }

    fn page_list(&self, req: &Recorded, pages: &Pages) -> Reply {
        let key = (req.query("snapshot"), req.query("prevsnapshot"));
        let known = self.lists.lock().unwrap().get(&key).cloned();
        let entries = match known {
            Some(entries) => entries,
            None => match self.entries(req, pages) {
                Ok(entries) => {
                    let entries = Arc::new(entries);
                    self.lists.lock().unwrap().insert(key, entries.clone());
                    entries
                }
                Err(refused) => return refused,
            },
        };
        let (lo, hi) = range_of(req).unwrap_or((0, u64::MAX));
        // Sorted and disjoint: the entries touching [lo, hi) are a run.
        let first = entries.partition_point(|&(_, e, _)| e <= lo);
        let touching: Vec<Entry> = entries[first..]
            .iter()
            .take_while(|&&(s, _, _)| s < hi)
            .copied()
            .collect();
        self.paged(req, &touching)
    }

    /// The whole list a page list request asks for, or the refusal.
    fn entries(&self, req: &Recorded, pages: &Pages) -> Result<Vec<Entry>, Reply> {
        Ok(match req.query("prevsnapshot") {
            None => coalesce(pages.keys().map(|&p| (p, false))),
            Some(prev) if self.diff_refused && req.query("snapshot") != Some(prev.clone()) => {
                return Err(Reply::error(
                    409,
                    "PreviousSnapshotOperationNotSupported",
                    "<?xml version=\"1.0\"?><Error><Code>PreviousSnapshotOperationNotSupported</Code><Message>Differential Get Page Ranges is not supported on the previous snapshot.</Message></Error>",
                ))
            }
            Some(prev) => match self.snapshots.get(&prev) {
                Some(old) => diff(old, pages),
                None => {
                    return Err(Reply::error(
                        409,
                        "PreviousSnapshotNotFound",
                        "<?xml version=\"1.0\"?><Error><Code>PreviousSnapshotNotFound</Code><Message>The previous snapshot is not found.</Message></Error>",
                    ))
                }
            },
        })
    }

    /// The page of `touching` the request's marker names, at most
    /// `maxresults` (the service's page at most) long.
    fn paged(&self, req: &Recorded, touching: &[Entry]) -> Reply {
        let from: usize = req
            .query("marker")
            .and_then(|m| m.strip_prefix("2!")?.parse().ok())
            .unwrap_or(0);
        let size = req
            .query("maxresults")
            .and_then(|m| m.parse().ok())
            .unwrap_or(SERVICE_PAGE)
            .min(SERVICE_PAGE);
        let to = (from + size).min(touching.len());
        let mut xml = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList>");
        for &(s, e, cleared) in &touching[from.min(to)..to] {
            let tag = if cleared { "ClearRange" } else { "PageRange" };
            xml.push_str(&format!(
                "<{tag}><Start>{s}</Start><End>{}</End></{tag}>",
                e - 1
            ));
        }
        if to < touching.len() {
            xml.push_str(&format!("<NextMarker>2!{to}</NextMarker>"));
        } else {
            xml.push_str("<NextMarker />");
        }
        xml.push_str("</PageList>");
        Reply::xml(200, &xml)
    }
}

fn not_found() -> Reply {
    Reply::error(
        404,
        "BlobNotFound",
        "<?xml version=\"1.0\"?><Error><Code>BlobNotFound</Code><Message>The specified blob does not exist.</Message></Error>",
    )
}

/// `[start, end)` of the request's `x-ms-range` (or `Range`).
fn range_of(req: &Recorded) -> Option<(u64, u64)> {
    let v = req.header("x-ms-range").or_else(|| req.header("range"))?;
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse::<u64>().ok()? + 1))
}

/// Consecutive pages of the same kind as one range each.
fn coalesce(pages: impl Iterator<Item = (u64, bool)>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for (p, cleared) in pages {
        match out.last_mut() {
            Some(last) if last.1 == p * PAGE && last.2 == cleared => last.1 += PAGE,
            _ => out.push((p * PAGE, (p + 1) * PAGE, cleared)),
        }
    }
    out
}

/// The pages of `new` written since `old` (their write differs) and those
/// cleared since (written in `old`, not in `new`).
fn diff(old: &Pages, new: &Pages) -> Vec<Entry> {
    let mut changed: BTreeMap<u64, bool> = BTreeMap::new();
    for (p, w) in new {
        if old.get(p) != Some(w) {
            changed.insert(*p, false);
        }
    }
    for p in old.keys() {
        if !new.contains_key(p) {
            changed.insert(*p, true);
        }
    }
    coalesce(changed.into_iter())
}

impl Drive {
    /// A 1 GiB drive with two snapshots, `S1` and `S2`, fragmented past the
    /// service's page: S1 holds 16,000 scattered pages in its first 64 MiB, a
    /// 2 MiB run across 128 MiB (where a segmented query cuts) and a 4 MiB run
    /// at 300 MiB; S2 rewrites every other scattered page, clears some of the
    /// rest and half of the run across 128 MiB, writes 10,500 new 4 KiB pages
    /// from 400 MiB and a MiB of the run at 300 MiB.
    pub fn fragmented(container: &str, name: &str, footer: Vec<u8>) -> Drive {
        const MIB: u64 = 1 << 20;
        let disk = 1 << 30;
        let page = |offset: u64| offset / PAGE;
        let mut s1 = Pages::new();
        for i in 0..16_000u64 {
            s1.insert(i * 8, 1);
        }
        for p in page(127 * MIB)..page(129 * MIB) {
            s1.insert(p, 1);
        }
        for p in page(300 * MIB)..page(304 * MIB) {
            s1.insert(p, 1);
        }
        s1.insert(page(disk), 0);
        let mut s2 = s1.clone();
        for i in 0..16_000u64 {
            if i % 2 == 0 {
                s2.insert(i * 8, 2);
            } else if i % 3 == 0 {
                s2.remove(&(i * 8));
            }
        }
        for p in page(127 * MIB + MIB / 2)..page(128 * MIB + MIB / 2) {
            s2.remove(&p);
        }
        for i in 0..10_500u64 {
            for p in 0..8 {
                s2.insert(page(400 * MIB) + i * 16 + p, 2);
            }
        }
        for p in page(301 * MIB)..page(302 * MIB) {
            s2.insert(p, 2);
        }
        Drive {
            container: container.into(),
            name: name.into(),
            disk,
            footer,
            snapshots: BTreeMap::from([(S1.to_string(), s1), (S2.to_string(), s2)]),
            diff_refused: false,
            lists: Mutex::default(),
        }
    }

    /// The disk's allocated extents in `snapshot`, merged, the footer left out.
    pub fn allocated(&self, snapshot: &str) -> Vec<(u64, u64)> {
        let pages = &self.snapshots[snapshot];
        self.on_disk(coalesce(pages.keys().map(|&p| (p, false))))
    }

    /// The disk's extents written or cleared in `target` since `base`, merged.
    pub fn changed(&self, base: &str, target: &str) -> Vec<(u64, u64)> {
        self.on_disk(diff(&self.snapshots[base], &self.snapshots[target]))
    }

    fn on_disk(&self, entries: Vec<Entry>) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (s, e, _) in entries {
            let e = e.min(self.disk);
            if s >= e {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.1 >= s => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        out
    }
}

/// The ids of [`Drive::fragmented`]'s snapshots.
pub const S1: &str = "2026-11-22T11:05:54.5810000Z";
pub const S2: &str = "2026-11-22T12:00:00.0000000Z";
