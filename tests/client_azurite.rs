//! Every client operation against a real Azurite.

mod common;

use blobdrive::azure::{
    Account, AzureError, BlobClient, BlobService, DeleteSnapshots, PageRange, SegmentPlan,
};
use bytes::Bytes;
use common::azurite::{unique_container, Azurite};

const MIB: u64 = 1024 * 1024;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A fresh container with one new page blob of `size` bytes.
async fn fresh_blob(svc: &BlobService, tag: &str, size: u64) -> BlobClient {
    let container = svc.container(&unique_container(tag));
    assert!(container.create().await.unwrap());
    let blob = svc.blob(container.name(), "disk.vhd");
    blob.create_page_blob(size).await.unwrap();
    blob
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn containers_create_exist_and_refuse_duplicates() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let c = svc.container(&unique_container("cont"));
        assert!(!c.exists().await.unwrap());
        assert!(c.create().await.unwrap());
        assert!(
            !c.create().await.unwrap(),
            "second create reports it existed"
        );
        assert!(c.exists().await.unwrap());
    });
}

#[test]
fn create_never_replaces_and_properties_report_the_page_blob() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "create", 4 * MIB + 512).await;
        let p = blob.properties().await.unwrap();
        assert_eq!(p.content_length, 4 * MIB + 512);
        assert_eq!(p.blob_type, "PageBlob");
        assert_eq!(p.lease_state.as_deref(), Some("available"));
        let err = blob.create_page_blob(MIB).await.unwrap_err();
        assert_eq!(err.code(), Some("BlobAlreadyExists"));
        assert!(err.to_string().contains("never replaces"), "{err}");
        assert_eq!(
            blob.properties().await.unwrap().etag,
            p.etag,
            "blob untouched"
        );
        let err = blob.create_page_blob(1000).await.unwrap_err();
        assert!(matches!(err, AzureError::Invalid { .. }));
    });
}

#[test]
fn put_read_clear_and_page_ranges() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "pages", 16 * MIB).await;
        let a = pattern(4 * 1024 * 1024, 1);
        blob.put_pages(0, a.clone(), None).await.unwrap();
        let b = pattern(8192, 2);
        blob.put_pages(8 * MIB, b.clone(), None).await.unwrap();
        // Adjacent write: Azurite does not merge, the client must.
        blob.put_pages(8 * MIB + 8192, pattern(512, 3), None)
            .await
            .unwrap();
        assert_eq!(blob.read(0, 4 * MIB).await.unwrap(), a);
        assert_eq!(blob.read(8 * MIB, 8192).await.unwrap(), b);
        // Holes read as zeros.
        assert!(blob
            .read(5 * MIB, 4096)
            .await
            .unwrap()
            .iter()
            .all(|&x| x == 0));
        let ranges = blob.page_ranges(None).await.unwrap();
        assert_eq!(
            ranges,
            vec![
                PageRange::new(0, 4 * MIB),
                PageRange::new(8 * MIB, 8 * MIB + 8704)
            ]
        );
        let within = blob
            .page_ranges(Some(PageRange::new(MIB, 2 * MIB)))
            .await
            .unwrap();
        assert_eq!(within, vec![PageRange::new(MIB, 2 * MIB)]);
        blob.clear_pages(MIB, 2 * MIB, None).await.unwrap();
        assert!(blob
            .read(MIB, 2 * MIB)
            .await
            .unwrap()
            .iter()
            .all(|&x| x == 0));
        let ranges = blob.page_ranges(None).await.unwrap();
        assert_eq!(
            ranges,
            vec![
                PageRange::new(0, MIB),
                PageRange::new(3 * MIB, 4 * MIB),
                PageRange::new(8 * MIB, 8 * MIB + 8704)
            ]
        );
        let stats = svc.stats();
        assert_eq!(stats.put_page_requests, 3);
        assert_eq!(stats.clear_requests, 1);
        assert_eq!(stats.bytes_uploaded, 4 * MIB + 8192 + 512);
    });
}

#[test]
fn a_scattered_read_fills_its_parts_in_order_with_one_get() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "scatter", 20 * MIB).await;
        let data = pattern(16 * MIB as usize, 7);
        for (i, run) in data.chunks(4 * MIB as usize).enumerate() {
            blob.put_pages(i as u64 * 4 * MIB, Bytes::copy_from_slice(run), None)
                .await
                .unwrap();
        }
        // 64 KiB blocks and odd-sized parts, poisoned, over data and a hole.
        let sizes: Vec<usize> = std::iter::repeat_n(65536, 255)
            .chain([512, 65536 - 512, 3 * 65536])
            .collect();
        let mut mem: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xEE; n]).collect();
        let mut parts: Vec<&mut [u8]> = mem.iter_mut().map(|m| &mut m[..]).collect();
        let before = svc.stats().get_requests;
        blob.read_scattered(MIB, &mut parts).await.unwrap();
        assert_eq!(svc.stats().get_requests - before, 1, "one GET");
        let got: Vec<u8> = mem.concat();
        let want_data = &data[MIB as usize..];
        assert!(got[..want_data.len()] == *want_data, "the data, in order");
        assert!(got[want_data.len()..].iter().all(|&b| b == 0), "the hole");
        // Parts that reach past the blob's end: an error, not padding.
        let mut tail = [vec![0u8; 2 * MIB as usize], vec![0u8; 4096]];
        let mut parts: Vec<&mut [u8]> = tail.iter_mut().map(|m| &mut m[..]).collect();
        let err = blob.read_scattered(18 * MIB, &mut parts).await.unwrap_err();
        assert!(
            matches!(err, AzureError::Garbled { .. }) || err.code().is_some(),
            "{err}"
        );
    });
}

#[test]
fn segmented_page_ranges_equal_one_query_and_merge_at_edges() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "segments", 64 * MIB).await;
        // Runs that straddle the 4 MiB segment edges, and scattered small ones.
        blob.put_pages(4 * MIB - 1024, pattern(2048, 1), None)
            .await
            .unwrap();
        blob.put_pages(12 * MIB - 512, pattern(MIB as usize, 2), None)
            .await
            .unwrap();
        for i in 0..20u64 {
            blob.put_pages(20 * MIB + i * 1_000_448, pattern(512, 3), None)
                .await
                .unwrap();
        }
        let whole = blob.page_ranges(None).await.unwrap();
        let plan = SegmentPlan {
            initial: 4 * MIB,
            min: 4 * MIB,
            max: 4 * MIB,
            grow_below: 0,
            shrink_above: usize::MAX,
        };
        let before = svc.stats().page_range_requests;
        let segmented = blob.page_ranges_segmented(64 * MIB, plan).await.unwrap();
        assert_eq!(segmented, whole);
        assert_eq!(svc.stats().page_range_requests - before, 16);
        // The adaptive default needs few calls on a sparse blob.
        let before = svc.stats().page_range_requests;
        let adaptive = blob
            .page_ranges_segmented(64 * MIB, SegmentPlan::default())
            .await
            .unwrap();
        assert_eq!(adaptive, whole);
        assert_eq!(svc.stats().page_range_requests - before, 1);
    });
}

/// What a mount's acquire relies on: lease operations leave the ETag alone (so a
/// retried acquire still matches), a raised sequence number moves it on, and an
/// acquire on the condition of an ETag that has moved on is refused even on a
/// blob nobody holds (a copy of it landing after the holder let go takes nothing);
/// so is a break (a copy landing after a new holder took it breaks nothing).
#[test]
fn an_acquire_or_break_on_an_old_etag_is_refused_once_the_sequence_number_rose() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "leaseetag", 4 * MIB).await;
        let id = "44444444-4444-4444-8444-444444444444";
        let etag = blob.properties().await.unwrap().etag.unwrap();
        let got = blob
            .acquire_lease_if_match(id, None, Some(&etag))
            .await
            .unwrap();
        assert_eq!(got.id, id);
        assert!(!got.earlier_attempt_unanswered);
        assert_eq!(
            blob.properties().await.unwrap().etag.as_deref(),
            Some(&*etag)
        );
        // A retry of the same acquire still matches.
        blob.acquire_lease_if_match(id, None, Some(&etag))
            .await
            .unwrap();
        blob.increment_sequence_number(Some(id)).await.unwrap();
        let moved = blob.properties().await.unwrap().etag.unwrap();
        assert_ne!(moved, etag, "raising the sequence number kept the ETag");
        blob.release_lease(id).await.unwrap();
        assert_eq!(
            blob.properties().await.unwrap().etag.as_deref(),
            Some(&*moved)
        );
        let err = blob
            .acquire_lease_if_match(id, None, Some(&etag))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ConditionNotMet"), "{err}");
        let p = blob.properties().await.unwrap();
        assert_eq!(p.lease_state.as_deref(), Some("available"));
        // A break on an old ETag leaves a lease taken since alone.
        blob.acquire_lease(id, None).await.unwrap();
        let err = blob
            .break_lease_if_match(None, Some(&etag))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ConditionNotMet"), "{err}");
        let p = blob.properties().await.unwrap();
        assert_eq!(p.lease_state.as_deref(), Some("leased"));
        let broken = blob
            .break_lease_if_match(None, p.etag.as_deref())
            .await
            .unwrap();
        assert_eq!(broken.seconds_left, 0);
    });
}

#[test]
fn leases_fence_writers() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "lease", 4 * MIB).await;
        let id = "11111111-1111-4111-8111-111111111111";
        assert_eq!(blob.acquire_lease(id, None).await.unwrap(), id);
        // Re-acquiring with the same id is safe (a retry after a lost answer).
        assert_eq!(blob.acquire_lease(id, None).await.unwrap(), id);
        let p = blob.properties().await.unwrap();
        assert_eq!(p.lease_state.as_deref(), Some("leased"));
        assert_eq!(p.lease_duration.as_deref(), Some("infinite"));
        let other = "22222222-2222-4222-8222-222222222222";
        let err = blob.acquire_lease(other, None).await.unwrap_err();
        assert_eq!(err.code(), Some("LeaseAlreadyPresent"));
        assert!(err.to_string().contains("in use"), "{err}");
        // Writes without the id, or with a wrong one, are refused.
        let err = blob.put_pages(0, pattern(512, 1), None).await.unwrap_err();
        assert_eq!(err.code(), Some("LeaseIdMissing"));
        let err = blob
            .put_pages(0, pattern(512, 1), Some(other))
            .await
            .unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        blob.put_pages(0, pattern(512, 1), Some(id)).await.unwrap();
        blob.renew_lease(id).await.unwrap();
        let new_id = "33333333-3333-4333-8333-333333333333";
        assert_eq!(blob.change_lease(id, new_id).await.unwrap(), new_id);
        let err = blob
            .put_pages(0, pattern(512, 1), Some(id))
            .await
            .unwrap_err();
        assert!(err.is_lease_lost(), "old id is dead after change: {err}");
        blob.release_lease(new_id).await.unwrap();
        assert_eq!(
            blob.properties().await.unwrap().lease_state.as_deref(),
            Some("available")
        );
        // Break: immediate without period, leaves the blob writable without a lease.
        blob.acquire_lease(id, None).await.unwrap();
        assert_eq!(blob.break_lease(None).await.unwrap(), 0);
        assert_eq!(
            blob.properties().await.unwrap().lease_state.as_deref(),
            Some("broken")
        );
        let err = blob
            .put_pages(0, pattern(512, 1), Some(id))
            .await
            .unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        blob.put_pages(0, pattern(512, 1), None).await.unwrap();
        // A break with a period leaves it "breaking" for a while.
        blob.acquire_lease(id, None).await.unwrap();
        assert!(blob.break_lease(Some(30)).await.unwrap() > 0);
        assert_eq!(
            blob.properties().await.unwrap().lease_state.as_deref(),
            Some("breaking")
        );
        blob.break_lease(Some(0)).await.unwrap();
        let err = blob.break_lease(Some(61)).await.unwrap_err();
        assert!(matches!(err, AzureError::Invalid { .. }));
    });
}

#[test]
fn snapshots_list_read_copy_and_delete() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "snap", 4 * MIB).await;
        let v1 = pattern(4096, 1);
        blob.put_pages(0, v1.clone(), None).await.unwrap();
        let snap = blob.create_snapshot().await.unwrap();
        let v2 = pattern(4096, 2);
        blob.put_pages(0, v2.clone(), None).await.unwrap();
        let at = blob.at_snapshot(Some(&snap));
        assert_eq!(at.read(0, 4096).await.unwrap(), v1);
        assert_eq!(blob.read(0, 4096).await.unwrap(), v2);
        assert!(
            at.put_pages(0, v2.clone(), None).await.is_err(),
            "snapshots are read-only"
        );
        let listed = blob.container().list_blobs("disk.vhd", true).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            listed
                .iter()
                .filter(|b| b.snapshot.as_deref() == Some(snap.as_str()))
                .count(),
            1
        );
        // Restore the snapshot by copying it over the base blob, on the
        // condition of its ETag; the blob then names its source, and the same
        // copy on the old ETag is refused (a late copy of it changes nothing).
        let etag = blob.properties().await.unwrap().etag;
        assert!(!blob.last_copy_was_from(&blob.properties().await.unwrap(), &at));
        blob.copy_from(&at, None, etag.as_deref()).await.unwrap();
        assert_eq!(blob.read(0, 4096).await.unwrap(), v1);
        let after = blob.properties().await.unwrap();
        assert!(blob.last_copy_was_from(&after, &at), "{after:?}");
        assert!(after.copy_id.is_some(), "{after:?}");
        assert!(!blob.last_copy_was_from(&after, &blob));
        let err = blob
            .copy_from(&at, None, etag.as_deref())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ConditionNotMet"), "{err}");
        // Deleting a blob with snapshots needs an explicit choice.
        let err = blob.delete(DeleteSnapshots::None, None).await.unwrap_err();
        assert_eq!(err.code(), Some("SnapshotsPresent"));
        assert!(err.to_string().contains("--snapshots"), "{err}");
        at.delete(DeleteSnapshots::None, None).await.unwrap();
        assert_eq!(
            blob.container()
                .list_blobs("disk.vhd", true)
                .await
                .unwrap()
                .len(),
            1
        );
        blob.create_snapshot().await.unwrap();
        blob.delete(DeleteSnapshots::Include, None).await.unwrap();
        assert!(blob
            .container()
            .list_blobs("disk.vhd", true)
            .await
            .unwrap()
            .is_empty());
        let err = blob.properties().await.unwrap_err();
        assert!(err.is_not_found());
    });
}

#[test]
fn metadata_round_trips_and_needs_the_lease() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let blob = fresh_blob(&svc, "meta", MIB).await;
        blob.set_metadata(&[("owner", "ops"), ("purpose", "test")], None)
            .await
            .unwrap();
        let p = blob.properties().await.unwrap();
        assert!(p.metadata.contains(&("owner".into(), "ops".into())));
        let id = "44444444-4444-4444-8444-444444444444";
        blob.acquire_lease(id, None).await.unwrap();
        assert!(blob.set_metadata(&[("owner", "x")], None).await.is_err());
        blob.set_metadata(&[("owner", "x")], Some(id))
            .await
            .unwrap();
        assert!(blob
            .set_metadata(&[("bad-name", "x")], Some(id))
            .await
            .is_err());
        blob.release_lease(id).await.unwrap();
    });
}

#[test]
fn errors_name_the_problem() {
    rt().block_on(async {
        let svc = Azurite::shared().service();
        let missing = svc.blob(&unique_container("nocont"), "disk.vhd");
        let err = missing.create_page_blob(MIB).await.unwrap_err();
        assert_eq!(err.code(), Some("ContainerNotFound"));
        assert!(err.to_string().contains("does not exist"), "{err}");
        let blob = fresh_blob(&svc, "errs", MIB).await;
        let nothing = svc.blob(blob.container_name(), "other.vhd");
        let err = nothing.read(0, 512).await.unwrap_err();
        assert_eq!(err.code(), Some("BlobNotFound"));
        assert!(err.to_string().contains("'") && err.to_string().contains("does not exist"), "{err}");

        // A wrong key is a 403 with a message about keys and clocks.
        let az = Azurite::shared();
        let wrong = az.connection_string().replace(
            common::azurite::DEV_KEY,
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        );
        let bad = BlobService::new(Account::from_connection_string(&wrong).unwrap());
        let err = bad
            .blob(blob.container_name(), "disk.vhd")
            .properties()
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(403));
        assert!(err.to_string().contains("account key or SAS"), "{err}");
        // Reading past the end is an error, not a short buffer (Azurite sends 0 bytes).
        assert!(blob.read(MIB, 512).await.is_err());
    });
}
