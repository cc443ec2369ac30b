//! Every state a crash can leave, replayed from a log of the requests that
//! changed the blob, as xfstests does with dm-log-writes and Ceph's rbd_fsx
//! for a block device.
//!
//! A recording proxy (`tests/recorder`) stands between blobdrive and Azurite and
//! logs every request that changes the drive's blob: when it was sent, what the
//! service did with it and when, and when its answer reached blobdrive; it drops
//! a share of the answers to writes (the write carried out, the answer lost), so
//! that retries and the write fence are at work. Concurrent writers run on the
//! drive at the shipped settings, with snapshots and online growth among them,
//! each recording when its data was durable. Then the replayer
//! (`tests/replayer`) rebuilds, at chosen instants, the blobs a crash there can
//! leave (every settled write, and subsets of those in flight, placed anywhere
//! the sequence-number fence allows: `tests/replayer/model.rs`) and checks each:
//! the filesystem comes back (a mount replays its journal or log) and its own
//! checker finds nothing to repair, every file fsynced before the instant has its
//! content, every byte fsynced on a raw drive is there; and each snapshot is the
//! blob at its instant, read back unchanged after the run. An encrypted drive's
//! states are decrypted first as any host reads them (cryptsetup opens each
//! header with the passphrase: `tests/replayer/sealed.rs`).
//!
//! Bounded by default (10 s of workload, 16 instants and up to 4 states each per
//! drive, the encrypted drive 6 s, 8 instants and 2 states each: a minute and a
//! half in all); `BLOBDRIVE_REPLAY_SECS`,
//! `BLOBDRIVE_REPLAY_INSTANTS` and `BLOBDRIVE_REPLAY_STATES_PER_INSTANT` lengthen it (a soak:
//! `BLOBDRIVE_REPLAY_SECS=120 BLOBDRIVE_REPLAY_INSTANTS=300
//! BLOBDRIVE_REPLAY_STATES_PER_INSTANT=12 scripts/test.sh --test replay`),
//! `BLOBDRIVE_REPLAY_DROP_PERCENT` sets the share of dropped answers (5), and
//! each run prints its seed, `BLOBDRIVE_REPLAY_SEED`.

mod common;
mod faultproxy;
mod recorder;
mod replayer;

use std::time::Duration;

use recorder::Plant;
use replayer::check::Settings;
use replayer::fscheck::Fs;
use replayer::rawload::marker_at;
use replayer::report::Report;
use replayer::run::{run, Kind, Workload};

/// The drives replayed. An encrypted drive's states are opened by cryptsetup
/// and decrypted by an AES-XTS not blobdrive's before they are checked
/// (`tests/replayer/sealed.rs`).
const WORKLOADS: &[Workload] = &[
    under_writers("replay-ext4", Kind::Fs(Fs::Ext4), 64, 96),
    under_writers("replay-xfs", Kind::Fs(Fs::Xfs), 320, 384),
    under_writers("replay-raw", Kind::Raw, 32, 48),
    under_writers("replay-block", Kind::Block, 32, 48),
    // The plaintext disk is 16 MiB smaller: the LUKS2 header's.
    Workload {
        encrypted: true,
        ..under_writers("replay-ext4-encrypted", Kind::Fs(Fs::Ext4), 80, 112)
    },
];

/// A plain drive of `size_mib` under the writers, mounted at the shipped
/// settings, snapshotted and grown online to `grow_to_mib`.
const fn under_writers(
    name: &'static str,
    kind: Kind,
    size_mib: u64,
    grow_to_mib: u64,
) -> Workload {
    Workload {
        name,
        kind,
        size_mib,
        grow_to_mib: Some(grow_to_mib),
        snapshots: true,
        writers: true,
        mount_args: &[],
        encrypted: false,
    }
}

fn workload(name: &str) -> &'static Workload {
    WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .expect("a workload of the list")
}

/// Replays workload `name` with `s` and requires every state to be sound,
/// with answers dropped and every request whose answer was lost sent again as
/// it was (the same bytes to the same range) and answered.
fn replay_is_sound(name: &str, s: &Settings) {
    let report = run(workload(name), s, None);
    assert!(
        report.inconsistent.is_empty() && report.lost.is_empty(),
        "{report}"
    );
    assert!(report.states > 0, "no state was checked: {report}");
    assert!(report.dropped > 0, "no answer was dropped: {report}");
    assert_eq!(report.retried, report.dropped, "{report}");
}

/// One test a workload: `test: "workload" with settings,` makes `test`, a
/// [`replay_is_sound`] of that workload with those settings.
macro_rules! sound_replays {
    ($($(#[$doc:meta])* $test:ident: $name:literal with $settings:expr,)*) => {$(
        $(#[$doc])*
        #[test]
        fn $test() {
            replay_is_sound($name, &$settings);
        }
    )*};
}

sound_replays! {
    every_crash_state_of_ext4_under_concurrent_writers_recovers_with_every_fsynced_file:
        "replay-ext4" with Settings::from_env(),
    every_crash_state_of_xfs_growing_under_concurrent_writers_recovers_with_every_fsynced_file:
        "replay-xfs" with Settings::from_env(),
    every_crash_state_of_a_raw_drive_under_fsx_and_writers_holds_every_fsynced_byte:
        "replay-raw" with Settings::from_env(),
    every_crash_state_of_a_block_drive_under_writers_holds_every_fsynced_byte:
        "replay-block" with Settings::from_env(),
    /// An encrypted drive (LUKS2) with ext4, grown and snapshotted under the same
    /// writers: each state, opened by cryptsetup and decrypted as any host reads
    /// it, recovers with every fsynced file. Shorter by default than the others
    /// (each state costs a decryption more), and as long with the same
    /// variables.
    every_crash_state_of_encrypted_ext4_under_concurrent_writers_recovers_with_every_fsynced_file:
        "replay-ext4-encrypted" with Settings::from_env_or(6, 8, 2),
}

/// Once `blobdrive resize` of a mounted xfs drive has returned, a crash leaves
/// the grown filesystem whole, every superblock written: XFS writes its
/// secondary superblocks after the grow's own commit and flushes nothing after
/// them, and here no writer flushes anything either.
#[test]
fn a_crash_once_an_online_xfs_grow_returned_leaves_every_superblock_written() {
    let w = Workload {
        name: "replay-xfs-grown",
        snapshots: false,
        writers: false,
        ..*workload("replay-xfs")
    };
    let report = run(&w, &Settings::short(4, 4), None);
    assert!(
        report.inconsistent.is_empty() && report.lost.is_empty() && report.steps.len() == 1,
        "{report}"
    );
}

/// A fault planted on the first Put Page holding `needle`: the proxy answers
/// it 201 itself, and the service gets it four seconds later.
fn planted(needle: &[u8]) -> Plant {
    Plant {
        needle: needle.to_vec(),
        apply_after: Some(Duration::from_secs(4)),
        reader: Default::default(),
    }
}

/// A write acknowledged before it is applied ([`planted`]): the replay must
/// find the states without it, though the blob is right once it lands
/// (nothing else is written where it goes).
#[test]
fn a_write_acknowledged_before_it_is_applied_is_caught() {
    let w = Workload {
        name: "replay-planted",
        grow_to_mib: None,
        snapshots: false,
        ..*workload("replay-block")
    };
    let plant = planted(b"planted: acknowledged before it is applied");
    let report: Report = run(&w, &Settings::short(6, 24), Some(plant));
    let marked = format!("sector {} ", marker_at(w.size_mib << 20) / 512);
    assert!(
        report.inconsistent.is_empty()
            && !report.lost.is_empty()
            && report.lost.iter().all(|l| {
                l.contains(&format!("the first: {marked}")) && l.contains("acknowledged data lost")
            }),
        "the planted fault was not found, or not alone: {report}"
    );
}

/// The same in ext4, on the data of a file the workload writes first: the
/// replay must find states in which the file, fsynced, lacks its content.
#[test]
fn a_file_write_acknowledged_before_it_is_applied_is_caught_in_ext4() {
    file_write_planted_is_caught("replay-ext4", "replay-planted-ext4");
}

/// The same on an encrypted drive: the write planted is the one whose
/// plaintext holds the marker, and the states, opened by cryptsetup, must
/// lack it.
#[test]
fn a_file_write_acknowledged_before_it_is_applied_is_caught_in_encrypted_ext4() {
    file_write_planted_is_caught("replay-ext4-encrypted", "replay-planted-encrypted");
}

/// A fault planted in the first file of workload `of`'s drive (run as
/// `name`), found by its replay. The workload runs no longer than the planted
/// write is held back (4 s), so that every flush point after the file's fsync
/// is a moment it is missing: half the instants are flush points.
fn file_write_planted_is_caught(of: &str, name: &'static str) {
    let w = Workload {
        name,
        grow_to_mib: None,
        snapshots: false,
        ..*workload(of)
    };
    let plant = planted(b"planted in a file: acknowledged before it is applied");
    let report = run(&w, &Settings::short(4, 12), Some(plant));
    assert!(
        report
            .lost
            .iter()
            .any(|l| l.contains("buffered/marked-0 (fsynced at")),
        "the planted fault was not found: {report}"
    );
}
