//! Real-Azure behaviour that Azurite does not have, against recorded responses
//! served by a local stub: pagination, diffs with cleared ranges, 413, throttling,
//! server-side timeouts, retries with identical bytes, SAS handling.

mod common;
mod stub;

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::azure::{
    crc64, Account, AzureError, BlobService, Credential, PageRange, RetryPolicy, SegmentPlan,
};
use bytes::Bytes;
use common::util::rt;
use stub::{pageblob, Recorded, Reply, Stub};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/azure/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        budget: Duration::from_secs(10),
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
    }
}

fn service(stub: &Stub, policy: RetryPolicy) -> BlobService {
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint={}",
        blobdrive::azure::account::DEV_KEY,
        stub.endpoint()
    );
    BlobService::with_policy(Account::from_connection_string(&cs).unwrap(), policy)
}

#[test]
fn page_ranges_follow_next_marker_and_merge_across_pages() {
    let stub = Stub::start(|req: &Recorded, _| match req.query("marker") {
        None => Reply::xml(200, &fixture("pagelist-page1.xml")),
        Some(m) if m == "2!128!MDAwMDM2IWZpbGUtdGFpbC1tYXJrZXItMDAwMDQxOTg0MDAh" => {
            Reply::xml(200, &fixture("pagelist-page2.xml"))
        }
        Some(_) => Reply::status(400),
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let ranges = rt().block_on(blob.page_ranges(None)).unwrap();
    assert_eq!(
        ranges,
        vec![
            PageRange::new(0, 1048576),
            // 4194304..4198400 on page 1 and 4198400..4202496 on page 2 are one run.
            PageRange::new(4194304, 4202496),
            PageRange::new(67108864, 67109376),
        ]
    );
    let reqs = stub.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].query("comp").as_deref(), Some("pagelist"));
    assert!(reqs[0].query("marker").is_none());
    assert!(reqs[1].query("marker").is_some());
}

#[test]
fn prevsnapshot_diff_reports_cleared_ranges() {
    let stub = Stub::start(|req: &Recorded, _| {
        if req.query("prevsnapshot").as_deref() == Some("2026-11-22T11:05:54.5810000Z") {
            Reply::xml(200, &fixture("pagelist-diff.xml"))
        } else {
            Reply::status(400)
        }
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let diff = rt()
        .block_on(blob.page_ranges_diff("2026-11-22T11:05:54.5810000Z", None))
        .unwrap();
    assert_eq!(
        diff.changed,
        vec![PageRange::new(0, 512), PageRange::new(8388608, 12582912)]
    );
    assert_eq!(
        diff.cleared,
        vec![
            PageRange::new(1048576, 2097152),
            PageRange::new(33554432, 33558528)
        ]
    );
}

#[test]
fn oversize_put_page_is_refused_before_sending() {
    let stub = Stub::start(|_, _| Reply::status(201));
    let svc = service(&stub, fast_policy());
    let blob = svc.blob("disks", "a.vhd");
    let err = rt()
        .block_on(blob.put_pages(0, Bytes::from(vec![1u8; 4 * 1024 * 1024 + 512]), None))
        .unwrap_err();
    assert!(matches!(err, AzureError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("at most 4 MiB"), "{err}");
    let err = rt()
        .block_on(blob.put_pages(100, Bytes::from(vec![1u8; 512]), None))
        .unwrap_err();
    assert!(matches!(err, AzureError::Invalid { .. }), "{err}");
    assert!(stub.requests().is_empty(), "nothing may reach the service");
}

#[test]
fn a_413_answer_is_a_clear_error_and_not_retried() {
    let stub =
        Stub::start(|_, _| Reply::error(413, "RequestBodyTooLarge", &fixture("error-413.xml")));
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let err = rt()
        .block_on(blob.put_pages(0, Bytes::from(vec![7u8; 4 * 1024 * 1024]), None))
        .unwrap_err();
    assert_eq!(err.status(), Some(413));
    assert_eq!(err.code(), Some("RequestBodyTooLarge"));
    assert!(err.to_string().contains("at most 4 MiB"), "{err}");
    assert!(!err.to_string().contains('\n'));
    assert_eq!(stub.requests().len(), 1);
}

#[test]
fn throttled_put_page_is_retried_with_the_same_range_and_bytes() {
    let stub = Stub::start(|_, i| {
        if i < 2 {
            Reply::error(503, "ServerBusy", &fixture("error-503.xml"))
        } else {
            Reply::status(201)
        }
    });
    let svc = service(&stub, fast_policy());
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    rt().block_on(svc.blob("disks", "a.vhd").put_pages(
        1024,
        Bytes::from(data.clone()),
        Some("lease-1"),
    ))
    .unwrap();
    let reqs = stub.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.method, "PUT");
        assert_eq!(r.header("x-ms-range"), Some("bytes=1024-9215"));
        assert_eq!(r.header("x-ms-lease-id"), Some("lease-1"));
        assert_eq!(r.header("x-ms-page-write"), Some("update"));
        assert_eq!(r.body, data);
    }
    let stats = svc.stats();
    assert_eq!(stats.retries, 2);
    assert_eq!(stats.put_page_requests, 1);
    assert_eq!(stats.bytes_uploaded, 8192);
}

#[test]
fn connection_reset_is_retried() {
    let stub = Stub::start(|_, i| cut_off_first(i));
    let svc = service(&stub, fast_policy());
    rt().block_on(svc.blob("disks", "a.vhd").clear_pages(0, 4096, None))
        .unwrap();
    assert_eq!(stub.requests().len(), 2);
    assert_eq!(svc.stats().retries, 1);
}

#[test]
fn persistent_503_gives_up_within_the_budget() {
    let stub = Stub::start(|_, _| Reply::error(503, "ServerBusy", &fixture("error-503.xml")));
    let mut policy = fast_policy();
    policy.max_attempts = 4;
    let svc = service(&stub, policy);
    let err = rt()
        .block_on(svc.blob("disks", "a.vhd").read(0, 512))
        .unwrap_err();
    assert_eq!(err.code(), Some("ServerBusy"));
    assert_eq!(stub.requests().len(), 4);
}

#[test]
fn lease_lost_codes_are_not_retried() {
    let stub = Stub::start(|_, _| {
        Reply::error(412, "LeaseIdMismatchWithBlobOperation", "<?xml version=\"1.0\"?><Error><Code>LeaseIdMismatchWithBlobOperation</Code><Message>The lease ID specified did not match the lease ID for the blob.</Message></Error>")
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let err = rt()
        .block_on(blob.put_pages(0, Bytes::from(vec![0u8; 512]), Some("old")))
        .unwrap_err();
    assert!(err.is_lease_lost());
    assert!(
        err.to_string().contains("lease on 'disks/a.vhd' was lost"),
        "{err}"
    );
    assert_eq!(stub.requests().len(), 1);
}

#[test]
fn segmented_page_ranges_split_a_segment_the_service_could_not_finish() {
    // A large range times out server-side; its halves succeed.
    let stub = Stub::start(|req: &Recorded, _| {
        let range = req.header("x-ms-range").unwrap_or("");
        let (s, e) = range
            .trim_start_matches("bytes=")
            .split_once('-')
            .map(|(s, e)| (s.parse::<u64>().unwrap(), e.parse::<u64>().unwrap()))
            .unwrap();
        if e - s + 1 > 8 * 1024 * 1024 {
            return Reply::error(500, "OperationTimedOut", &fixture("error-500-timeout.xml"));
        }
        // Data in every segment, right up to its edges, so merging across edges shows.
        Reply::xml(
            200,
            &format!("<?xml version=\"1.0\"?><PageList><PageRange><Start>{s}</Start><End>{e}</End></PageRange></PageList>"),
        )
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let plan = SegmentPlan {
        initial: 32 * 1024 * 1024,
        min: 4 * 1024 * 1024,
        max: 64 * 1024 * 1024,
        grow_below: 0,
        shrink_above: 1000,
    };
    let ranges = rt()
        .block_on(blob.page_ranges_segmented(40 * 1024 * 1024, plan))
        .unwrap();
    assert_eq!(ranges, vec![PageRange::new(0, 40 * 1024 * 1024)]);
    let reqs = stub.requests();
    let ok: Vec<&Recorded> = reqs
        .iter()
        .filter(|r| {
            let range = r.header("x-ms-range").unwrap();
            let (s, e) = range.trim_start_matches("bytes=").split_once('-').unwrap();
            e.parse::<u64>().unwrap() - s.parse::<u64>().unwrap() < 8 * 1024 * 1024
        })
        .collect();
    assert_eq!(ok.len(), 5, "40 MiB in 8 MiB segments");
}

#[test]
fn sas_goes_in_the_query_never_in_errors() {
    let stub = Stub::start(|_, _| {
        Reply::error(403, "AuthenticationFailed", "<?xml version=\"1.0\"?><Error><Code>AuthenticationFailed</Code><Message>Server failed to authenticate the request.</Message></Error>")
    });
    let account = Account {
        name: "devstoreaccount1".into(),
        blob_endpoint: url::Url::parse(&stub.endpoint()).unwrap(),
        credential: Credential::Sas("sv=2021-12-02&sp=r&sig=TOPSECRETSIG%3D".into()),
    };
    let svc = BlobService::with_policy(account, fast_policy());
    let err = rt()
        .block_on(svc.blob("disks", "a.vhd").read(0, 512))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("account key or SAS"), "{msg}");
    assert!(!msg.contains("TOPSECRET"), "{msg}");
    let reqs = stub.requests();
    assert!(reqs[0].target.contains("sig=TOPSECRETSIG%3D"));
    assert!(reqs[0].header("authorization").is_none());
}

#[test]
fn unreachable_endpoint_fails_within_the_budget() {
    // Bind then drop: nothing listens on this port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1",
        blobdrive::azure::account::DEV_KEY
    );
    let mut policy = fast_policy();
    policy.max_attempts = 100;
    policy.budget = Duration::from_secs(2);
    policy.max_delay = Duration::from_millis(200);
    let svc = BlobService::with_policy(Account::from_connection_string(&cs).unwrap(), policy);
    let started = Instant::now();
    let err = rt()
        .block_on(svc.blob("disks", "a.vhd").properties())
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, AzureError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("no answer from the storage service"),
        "{err}"
    );
    assert!(svc.stats().retries >= 2);
}

const OLD: &str = "2026-11-22T11:05:54.5810000Z";

#[test]
fn incremental_plan_uses_a_diff_that_passes_the_self_check() {
    // Real Azure: the old snapshot against itself has no changes, so the service's
    // diff (with its ClearRange entries) is trusted.
    let stub =
        Stub::start(
            |req: &Recorded, _| match (req.query("snapshot"), req.query("prevsnapshot")) {
                (Some(s), None) if s == OLD => Reply::xml(200, &fixture("pagelist-old.xml")),
                (Some(s), Some(p)) if s == OLD && p == OLD => {
                    Reply::xml(200, &fixture("pagelist-empty.xml"))
                }
                (None, Some(p)) if p == OLD => Reply::xml(200, &fixture("pagelist-diff.xml")),
                _ => Reply::status(400),
            },
        );
    let svc = service(&stub, fast_policy());
    let new = svc.blob("disks", "a.vhd");
    let old = new.at_snapshot(Some(OLD));
    let plan = rt()
        .block_on(blobdrive::transfer::download::plan_incremental(
            &new,
            &old,
            64 * 1024 * 1024,
        ))
        .unwrap();
    assert_eq!(plan.method, "diff");
    assert_eq!(
        plan.fetch,
        vec![PageRange::new(0, 512), PageRange::new(8388608, 12582912)]
    );
    assert_eq!(
        plan.zero,
        vec![
            PageRange::new(1048576, 2097152),
            PageRange::new(33554432, 33558528)
        ]
    );
}

#[test]
fn incremental_plan_falls_back_when_the_service_ignores_prevsnapshot() {
    // Azurite-like: prevsnapshot is ignored, so the self-diff returns the full list
    // and the plan compares page lists instead of trusting the "diff".
    let stub =
        Stub::start(
            |req: &Recorded, _| match (req.query("snapshot"), req.query("prevsnapshot")) {
                (Some(_), _) => Reply::xml(200, &fixture("pagelist-old.xml")),
                (None, _) => Reply::xml(200, &fixture("pagelist-page2.xml")),
            },
        );
    let svc = service(&stub, fast_policy());
    let new = svc.blob("disks", "a.vhd");
    let old = new.at_snapshot(Some(OLD));
    let plan = rt()
        .block_on(blobdrive::transfer::download::plan_incremental(
            &new,
            &old,
            64 * 1024 * 1024,
        ))
        .unwrap();
    assert_eq!(plan.method, "full-compare");
    // Everything the new image holds is fetched; what only the old held is zeroed.
    assert_eq!(plan.fetch, vec![PageRange::new(4198400, 4202496)]);
    assert_eq!(
        plan.zero,
        vec![
            PageRange::new(0, 2097152),
            PageRange::new(33554432, 33558528)
        ]
    );
    assert!(stub
        .requests()
        .iter()
        .all(|r| r.query("prevsnapshot").is_none() || r.query("snapshot").is_some()));
}

#[test]
fn a_blob_whose_length_is_not_whole_pages_is_refused() {
    // Page blobs cannot have such a length on Azure or Azurite; a broken proxy or
    // service could still report one, and it must not be taken for a drive.
    let stub = Stub::start(|req: &Recorded, _| {
        if req.method == "HEAD" {
            Reply::status(200)
                .with("x-ms-blob-type", "PageBlob")
                .with("Content-Length-Override", "1049000")
        } else {
            Reply::status(400)
        }
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let err = rt()
        .block_on(blobdrive::drive::Drive::open(&blob))
        .unwrap_err();
    assert!(err.to_string().contains("not a multiple of 512"), "{err}");
    assert_eq!(stub.requests().len(), 1, "nothing but the HEAD was sent");
}

/// The answer to the `i`th request of a kind: the first cut off (the
/// connection closed with no answer), each other 201 Created.
fn cut_off_first(i: usize) -> Reply {
    if i == 0 {
        Reply::Hangup
    } else {
        Reply::status(201)
    }
}

/// A stub whose Set Blob Properties answers count the sequence number up from
/// `first` (Get Blob Properties says the number the next raise will answer),
/// and whose Put Page answers come from `page` (by Put Page index).
fn fenced_stub(first: u64, page: fn(usize) -> Reply) -> Stub {
    fenced_stub_telling(first, page, |n| n)
}

/// [`fenced_stub`] whose raises are answered with `told(number)`.
fn fenced_stub_telling(first: u64, page: fn(usize) -> Reply, told: fn(u64) -> u64) -> Stub {
    let raised = std::sync::atomic::AtomicU64::new(first);
    let pages = std::sync::atomic::AtomicUsize::new(0);
    Stub::start(move |req: &Recorded, _| {
        use std::sync::atomic::Ordering::SeqCst;
        match (req.method.as_str(), req.query("comp").as_deref()) {
            ("HEAD", None) => Reply::status(200)
                .with("x-ms-blob-type", "PageBlob")
                .with("Content-Length-Override", "1049088")
                .with("x-ms-lease-state", "leased")
                .with(
                    "x-ms-blob-sequence-number",
                    &raised.load(SeqCst).to_string(),
                ),
            (_, Some("properties")) => Reply::status(200).with(
                "x-ms-blob-sequence-number",
                &told(raised.fetch_add(1, SeqCst)).to_string(),
            ),
            (_, Some("page")) => page(pages.fetch_add(1, SeqCst)),
            _ => Reply::status(400),
        }
    })
}

/// (comp, or the method, x-ms-if-sequence-number-eq,
/// x-ms-sequence-number-action) of each request.
fn fence_trace(stub: &Stub) -> Vec<(String, Option<String>, Option<String>)> {
    stub.requests()
        .iter()
        .map(|r| {
            (
                r.query("comp").unwrap_or_else(|| r.method.clone()),
                r.header("x-ms-if-sequence-number-eq").map(str::to_string),
                r.header("x-ms-sequence-number-action").map(str::to_string),
            )
        })
        .collect()
}

/// Fails unless the requests `stub` got are `want`: (comp or method,
/// x-ms-if-sequence-number-eq, x-ms-sequence-number-action) each.
fn trace_is(stub: &Stub, want: &[(&str, Option<&str>, Option<&str>)]) {
    let want: Vec<(String, Option<String>, Option<String>)> = want
        .iter()
        .map(|(c, n, a)| (c.to_string(), n.map(str::to_string), a.map(str::to_string)))
        .collect();
    assert_eq!(fence_trace(stub), want);
}

/// One Put Page of 512 bytes at 0 to `stub` under the lease `lease-1`,
/// fenced: the fence it went through.
fn one_fenced_write(stub: &Stub) -> Arc<blobdrive::azure::WriteFence> {
    let blob = service(stub, fast_policy()).blob("disks", "a.vhd");
    let fence = blobdrive::azure::WriteFence::new(blob.clone(), Some("lease-1".into()));
    rt().block_on(blob.put_pages_fenced(0, Bytes::from(vec![1u8; 512]), Some("lease-1"), &fence))
        .unwrap();
    fence
}

#[test]
fn an_unanswered_fenced_write_raises_the_sequence_number_before_it_is_sent_again() {
    let stub = fenced_stub(7, cut_off_first);
    let fence = one_fenced_write(&stub);
    trace_is(
        &stub,
        &[
            ("properties", None, Some("increment")),
            ("page", Some("7"), None),
            // The first attempt may still land: it carries 7, which is gone now.
            ("properties", None, Some("increment")),
            ("page", Some("8"), None),
        ],
    );
    for r in stub.requests() {
        assert_eq!(r.header("x-ms-lease-id"), Some("lease-1"));
    }
    assert_eq!(fence.current(), Some(8));
}

#[test]
fn a_fenced_write_refused_for_its_number_learns_the_current_one_and_lands() {
    let stub = fenced_stub(3, |i| {
        if i == 0 {
            Reply::error(
                412,
                "SequenceNumberConditionNotMet",
                "<?xml version=\"1.0\"?><Error><Code>SequenceNumberConditionNotMet</Code><Message>The sequence number condition specified was not met.</Message></Error>",
            )
        } else {
            Reply::status(201)
        }
    });
    let svc = service(&stub, fast_policy());
    let blob = svc.blob("disks", "a.vhd");
    let fence = blobdrive::azure::WriteFence::new(blob.clone(), None);
    rt().block_on(blob.clear_pages_fenced(0, 4096, None, &fence))
        .unwrap();
    trace_is(
        &stub,
        &[
            ("properties", None, Some("increment")),
            ("page", Some("3"), None),
            // Refused: nothing was written, and the number moved on. It is
            // read, not raised again.
            ("HEAD", None, None),
            ("page", Some("4"), None),
        ],
    );
}

#[test]
fn a_raise_answered_with_a_number_nobody_asked_for_is_read_again_before_it_is_used() {
    // The first answer of a Put Page is lost; the raise after it is answered
    // with 2^63-1 (or a number below the one known): read again with Get
    // Blob Properties, the write carries the blob's real number and lands,
    // one read later.
    for told in [
        |n| if n == 8 { i64::MAX as u64 } else { n },
        |n| if n == 8 { 2 } else { n },
    ] {
        let stub = fenced_stub_telling(7, cut_off_first, told);
        let fence = one_fenced_write(&stub);
        trace_is(
            &stub,
            &[
                ("properties", None, Some("increment")),
                ("page", Some("7"), None),
                ("properties", None, Some("increment")),
                ("HEAD", None, None),
                ("page", Some("9"), None),
            ],
        );
        assert_eq!(fence.current(), Some(9));
    }
}

#[test]
fn a_throttled_fenced_write_is_sent_again_with_the_same_number() {
    // 503 ServerBusy is a refusal before the request ran: raising the fence for it
    // would cost one more request to a blob that is already over its target.
    let stub = fenced_stub(5, |i| {
        if i < 2 {
            Reply::error(503, "ServerBusy", &fixture("error-503.xml"))
        } else {
            Reply::status(201)
        }
    });
    let svc = service(&stub, fast_policy());
    let blob = svc.blob("disks", "a.vhd");
    let fence = blobdrive::azure::WriteFence::new(blob.clone(), None);
    rt().block_on(blob.put_pages_fenced(0, Bytes::from(vec![2u8; 512]), None, &fence))
        .unwrap();
    trace_is(
        &stub,
        &[
            ("properties", None, Some("increment")),
            ("page", Some("5"), None),
            ("page", Some("5"), None),
            ("page", Some("5"), None),
        ],
    );
    assert_eq!(fence.current(), Some(5));
}

/// Writers sending Put Pages to a stub service, all at once, with the client's
/// default retry policy (backoff from 50-100 ms) and attempts enough never to
/// give up; fails if more than `at_most` requests were refused. Each writer backing
/// off alone kept them all probing: several refusals per request served.
fn refusals_at_most(stub: &Stub, writers: u64, each: u64, at_most: usize) {
    let policy = RetryPolicy {
        max_attempts: 1000,
        budget: Duration::from_secs(120),
        ..RetryPolicy::default()
    };
    let svc = service(stub, policy);
    let blob = svc.blob("disks", "a.vhd");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..writers {
            let blob = blob.clone();
            tasks.spawn(async move {
                for i in 0..each {
                    blob.put_pages((w * each + i) * 512, Bytes::from(vec![3u8; 512]), None)
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    });
    let served = (writers * each) as usize;
    let refused = stub.requests().len() - served;
    eprintln!(
        "{refused} requests refused for {served} served in {:?}",
        started.elapsed()
    );
    assert!(
        refused <= at_most,
        "{refused} requests refused for {served} served: the client kept probing"
    );
}

#[test]
fn a_throttled_client_slows_down_instead_of_probing_a_busy_service() {
    // A blob whose service takes 2 requests at a time, 20 ms each, and refuses the
    // rest with 503 ServerBusy. 16 writers send 128 Put Pages at once.
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let busy = Arc::new(AtomicUsize::new(0));
    let b = busy.clone();
    let stub = Stub::start(move |_, _| {
        if b.fetch_add(1, SeqCst) >= 2 {
            b.fetch_sub(1, SeqCst);
            return Reply::error(503, "ServerBusy", &fixture("error-503.xml"));
        }
        std::thread::sleep(Duration::from_millis(20));
        b.fetch_sub(1, SeqCst);
        Reply::status(201)
    });
    // Paced as a whole, the client settles near what is served (1.28 s at best).
    refusals_at_most(&stub, 16, 8, 45);
}

#[test]
fn a_throttled_client_paces_itself_to_a_rate_target() {
    // A blob over its scalability target: 100 requests a second, with a burst of
    // 10, as Azure's targets are rates. 8 writers send 160 Put Pages at once.
    let bucket = Arc::new(std::sync::Mutex::new((10.0f64, Instant::now())));
    let stub = Stub::start(move |_, _| {
        let mut b = bucket.lock().unwrap();
        let now = Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * 100.0).min(10.0);
        b.1 = now;
        if b.0 < 1.0 {
            return Reply::error(503, "ServerBusy", &fixture("error-503.xml"));
        }
        b.0 -= 1.0;
        Reply::status(201)
    });
    // 1.5 s at best.
    refusals_at_most(&stub, 8, 20, 40);
}

#[test]
fn retry_after_on_503_is_honoured() {
    let stub = Stub::start(|_, i| {
        if i == 0 {
            Reply::error(503, "ServerBusy", &fixture("error-503.xml")).with("Retry-After", "1")
        } else {
            Reply::status(201)
        }
    });
    let svc = service(&stub, fast_policy());
    let started = Instant::now();
    rt().block_on(svc.blob("disks", "a.vhd").clear_pages(0, 512, None))
        .unwrap();
    // The policy's own backoff is at most 20 ms; the service asked for a second.
    assert!(started.elapsed() >= Duration::from_millis(950));
    assert_eq!(stub.requests().len(), 2);
}

#[test]
fn every_request_tells_the_server_when_to_give_up() {
    let stub = Stub::start(|_, _| Reply::status(201));
    let svc = service(&stub, fast_policy());
    rt().block_on(svc.blob("disks", "a.vhd").clear_pages(0, 512, None))
        .unwrap();
    assert_eq!(stub.requests()[0].query("timeout").as_deref(), Some("5"));
}

#[test]
fn a_try_cut_off_on_a_pooled_connection_is_made_again_on_a_new_one() {
    // The first answer leaves its connection in the client's pool; the next
    // request on that connection is cut off, as on a connection an outage left
    // dead while the service is back. Even with a single attempt allowed (a
    // mount's I/O past its I/O timeout gets one try), the operation succeeds: a
    // try on a kept connection that got no answer is made again on a new one.
    const EMPTY: &str = "<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList></PageList>";
    let stub = Stub::start(|req: &Recorded, index| {
        if index > 0 && req.connection == 0 {
            Reply::Hangup
        } else {
            Reply::xml(200, EMPTY)
        }
    });
    let policy = RetryPolicy {
        max_attempts: 1,
        ..fast_policy()
    };
    let svc = service(&stub, policy);
    let blob = svc.blob("disks", "a.vhd");
    let rt = rt();
    rt.block_on(blob.page_ranges(None)).unwrap();
    let second = rt.block_on(blob.page_ranges(None));
    let seen: Vec<usize> = stub.requests().iter().map(|r| r.connection).collect();
    assert!(
        second.is_ok(),
        "failed on a dead pooled connection: {second:?} (connections {seen:?})"
    );
    assert_eq!(seen.len(), 3, "connections of the requests: {seen:?}");
    assert_eq!(
        seen[1], 0,
        "the second request reused the pooled connection"
    );
    assert_ne!(seen[2], 0, "the try again went on a new connection");
}

#[test]
fn a_ranged_read_answered_with_more_bytes_than_asked_fails_and_writes_no_further() {
    // A hostile endpoint answers a 128 KiB ranged GET (two 64 KiB cache blocks)
    // with 4 GiB: the read fails as soon as the answer passes what was asked,
    // and no byte lands beyond the parts.
    let stub = Stub::start(|_, _| Reply::Stream {
        status: 206,
        headers: vec![("Content-Range".into(), "bytes 0-131071/4294967296".into())],
        len: 4 << 30,
        unit: vec![0xAB; 4096],
    });
    let svc = service(&stub, fast_policy());
    let blob = svc.blob("disks", "a.vhd");
    let mut mem = vec![0u8; 3 * 65536];
    let (asked, beyond) = mem.split_at_mut(2 * 65536);
    let (a, b) = asked.split_at_mut(65536);
    let mut parts: Vec<&mut [u8]> = vec![a, b];
    let started = Instant::now();
    let err = rt()
        .block_on(blob.read_scattered(0, &mut parts))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("longer than the 131072 bytes asked for"),
        "{err}"
    );
    assert!(beyond.iter().all(|&x| x == 0), "written past the parts");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "read {} s of the endless answer",
        started.elapsed().as_secs()
    );
}

/// A service that accepts connections and reads requests but never answers (a
/// black-holed route, a paused middlebox); counts the connections it accepted.
fn silent_service() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!(
        "http://127.0.0.1:{}/devstoreaccount1",
        listener.local_addr().unwrap().port()
    );
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut sink = [0u8; 65536];
                while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    (endpoint, accepted)
}

#[test]
fn one_try_past_the_io_timeout_ends_by_its_deadline_at_the_default_settings() {
    // Issue 46: past an outage's I/O timeout an I/O gets one try. With the
    // default policy (20 s request timeout, 25 s budget) a fenced Put Page to a
    // silent service took a request timeout, then the fence's raise a whole
    // budget of its own: 45 s and more, whatever the I/O timeout. As one try it
    // is over by the deadline the mount gives it (one request timeout from its
    // start; a short one here), after one attempt on a new connection, however
    // long the budget. Nothing here depends on the I/O timeout's value.
    let (endpoint, accepted) = silent_service();
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint={endpoint}",
        blobdrive::azure::account::DEV_KEY,
    );
    let svc = BlobService::with_policy(
        Account::from_connection_string(&cs).unwrap(),
        RetryPolicy::default(),
    );
    let blob = svc.blob("disks", "a.vhd");
    // No sequence number known yet: the fence raises it first, within the try.
    let fence = blobdrive::azure::WriteFence::new(blob.clone(), Some("lease".into()));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(1500);
    let put = blob.put_pages_fenced(0, Bytes::from(vec![7u8; 512]), Some("lease"), &fence);
    let err = rt()
        .block_on(blobdrive::azure::pipeline::one_try(deadline, put))
        .unwrap_err();
    let took = started.elapsed();
    assert!(err.is_outage(), "{err}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(2500),
        "one try took {took:?}: {err}"
    );
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one attempt, on a connection of its own"
    );
}

/// The fragmented drive of `stub::pageblob` (two snapshots, S1 and S2, with
/// more ranges than the service's page), served as Azure serves it.
fn fragmented_drive(diff_refused: bool) -> (Stub, pageblob::Drive) {
    let footer = || {
        blobdrive::vhd::Footer::new_fixed(1 << 30)
            .unwrap()
            .to_bytes()
            .to_vec()
    };
    let mut served = pageblob::Drive::fragmented("disks", "frag.vhd", footer());
    served.diff_refused = diff_refused;
    let model = pageblob::Drive::fragmented("disks", "frag.vhd", footer());
    (Stub::start(served.handler()), model)
}

/// Every extent of a stream, in batches of `max`, checked on the way: each
/// batch holds at most `max`, and extents are in order and disjoint across
/// batches.
fn drain(extents: &mut blobdrive::changes::Extents, max: usize) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = Vec::new();
    let rt = rt();
    while let Some(batch) = rt.block_on(extents.next_batch(max)).unwrap() {
        assert!(!batch.is_empty() && batch.len() <= max, "{}", batch.len());
        for r in batch {
            if let Some(last) = all.last() {
                assert!(last.1 < r.start, "{last:?} then {r:?}");
            }
            all.push((r.start, r.end));
        }
    }
    all
}

/// Pages asked of the stub since request `since`: (x-ms-range, marker,
/// prevsnapshot, snapshot).
type PageAsk = (String, Option<String>, Option<String>, Option<String>);
fn page_asks(stub: &Stub, since: usize) -> Vec<PageAsk> {
    stub.requests()[since..]
        .iter()
        .filter(|r| r.query("comp").as_deref() == Some("pagelist"))
        .map(|r| {
            (
                r.header("x-ms-range").unwrap_or_default().to_string(),
                r.query("marker"),
                r.query("prevsnapshot"),
                r.query("snapshot"),
            )
        })
        .collect()
}

/// A snapshot with 16,000 scattered pages in its first segment: the service
/// pages its answers at 10,000, the stream follows the pages and the segments
/// (the run across 128 MiB is one extent), holds no more than one page of the
/// service and one batch at a time (not the blob's 16,000 ranges), and
/// resuming from an offset asks the service from that offset's page.
#[test]
fn allocated_extents_follow_the_service_pages_and_hold_one_page() {
    let (stub, model) = fragmented_drive(false);
    let svc = service(&stub, fast_policy());
    let s1 = svc
        .blob("disks", "frag.vhd")
        .at_snapshot(Some(pageblob::S1));
    let want = model.allocated(pageblob::S1);
    assert!(want.len() > 16_000, "{}", want.len());
    let mut extents = rt()
        .block_on(blobdrive::changes::allocated(&s1, 0))
        .unwrap();
    assert_eq!(extents.disk_size(), 1 << 30);
    let got = drain(&mut extents, 3);
    assert_eq!(got.len(), want.len());
    assert_eq!(got, want);
    let held = extents.peak_held();
    assert!(
        held <= pageblob::SERVICE_PAGE + 3 + 1,
        "held {held} ranges at once"
    );
    let asks = page_asks(&stub, 0);
    assert!(asks.iter().any(|a| a.1.is_some()), "no NextMarker followed");
    assert!(asks.iter().all(|a| a.0.starts_with("bytes=")), "{asks:?}");
    // Resumed inside the 5,000th extent: the rest, the first one cut at the
    // offset, asked from the offset's page on, with no marker first.
    let k = 5_000;
    let from = want[k].0 + 100;
    let since = stub.requests().len();
    let mut rest = rt()
        .block_on(blobdrive::changes::allocated(&s1, from))
        .unwrap();
    let got = drain(&mut rest, 1000);
    let mut tail = vec![(from, want[k].1)];
    tail.extend_from_slice(&want[k + 1..]);
    assert_eq!(got, tail);
    let first = &page_asks(&stub, since)[0];
    let aligned = from - from % 512;
    assert!(
        first.0.starts_with(&format!("bytes={aligned}-")) && first.1.is_none(),
        "{first:?}"
    );
    let past = rt().block_on(blobdrive::changes::allocated(&s1, (1 << 30) + 1));
    assert!(matches!(
        past,
        Err(blobdrive::changes::ChangesError::PastTheEnd { .. })
    ));
}

/// The service's diff, paged: written and cleared pages in one sorted stream
/// (what S2 cleared is there, across the 128 MiB segment edge too), the self
/// check asked first; a diff the service refuses (the blob overwritten since)
/// gives both snapshots' allocated extents instead.
#[test]
fn delta_extents_merge_written_and_cleared_pages_of_the_service_diff() {
    let (stub, model) = fragmented_drive(false);
    let svc = service(&stub, fast_policy());
    let blob = svc.blob("disks", "frag.vhd");
    let (s1, s2) = (
        blob.at_snapshot(Some(pageblob::S1)),
        blob.at_snapshot(Some(pageblob::S2)),
    );
    let want = model.changed(pageblob::S1, pageblob::S2);
    assert!(want.len() > pageblob::SERVICE_PAGE, "{}", want.len());
    let mut extents = rt()
        .block_on(blobdrive::changes::delta(&s1, &s2, 0))
        .unwrap();
    assert_eq!(extents.method(), blobdrive::changes::Method::Diff);
    assert_eq!(drain(&mut extents, 1000), want);
    let asks = page_asks(&stub, 0);
    assert!(asks
        .iter()
        .any(|a| a.2.as_deref() == Some(pageblob::S1) && a.1.is_some()));
    // Older and newer the wrong way round, or the same: refused before asking.
    for (b, t) in [(&s2, &s1), (&s1, &s1)] {
        let e = rt().block_on(blobdrive::changes::delta(b, t, 0));
        assert!(matches!(
            e,
            Err(blobdrive::changes::ChangesError::NotOlder { .. })
        ));
    }
    let (stub, model) = fragmented_drive(true);
    let blob = service(&stub, fast_policy()).blob("disks", "frag.vhd");
    let (s1, s2) = (
        blob.at_snapshot(Some(pageblob::S1)),
        blob.at_snapshot(Some(pageblob::S2)),
    );
    let mut extents = rt()
        .block_on(blobdrive::changes::delta(&s1, &s2, 0))
        .unwrap();
    assert_eq!(extents.method(), blobdrive::changes::Method::Compare);
    let mut both = model.allocated(pageblob::S1);
    both.extend(model.allocated(pageblob::S2));
    assert_eq!(drain(&mut extents, 1000), common::util::merged_ranges(both));
}

#[test]
fn a_put_page_carries_the_crc64_of_its_body_for_the_service_to_check() {
    let stub = Stub::start(|_, _| Reply::status(201));
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let body: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    rt().block_on(blob.put_pages(4096, Bytes::from(body.clone()), None))
        .unwrap();
    let reqs = stub.requests();
    let sent = reqs[0].header("x-ms-content-crc64").expect("no CRC64 sent");
    assert_eq!(sent, crc64::header(crc64::of(&body)));
    assert_eq!(reqs[0].body, body);
}

/// A drive's ranged reads served as Azure serves them, except that the
/// first `corrupt` answers have one byte changed on the way (their CRC64 is
/// the true bytes').
fn reads_corrupted(corrupt: usize) -> Stub {
    Stub::start(move |req: &Recorded, i| {
        let (s, e) = req
            .header("x-ms-range")
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split_once('-'))
            .map(|(s, e)| (s.parse::<u64>().unwrap(), e.parse::<u64>().unwrap()))
            .unwrap();
        let body: Vec<u8> = (s..=e).map(|at| (at % 251) as u8).collect();
        let mut reply = Reply::part(req, 64 << 20, body);
        if i < corrupt {
            if let Reply::Respond { body, .. } = &mut reply {
                body[100] ^= 0x40;
            }
        }
        reply
    })
}

#[test]
fn a_ranged_read_whose_bytes_do_not_match_their_crc64_is_read_again() {
    let stub = reads_corrupted(2);
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let got = rt().block_on(blob.read(1024, 65536)).unwrap();
    let truth: Vec<u8> = (1024..1024 + 65536u64).map(|at| (at % 251) as u8).collect();
    assert!(got == truth, "a corrupted answer was returned");
    let reqs = stub.requests();
    assert_eq!(reqs.len(), 3, "two corrupted answers, then the truth");
    for r in &reqs {
        assert_eq!(r.header("x-ms-range-get-content-crc64"), Some("true"));
    }
    // Corrupted every time: an error naming why, never the bytes.
    let stub = reads_corrupted(usize::MAX);
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let mut buf = vec![0u8; 65536];
    let err = rt()
        .block_on(blob.read_into(0, &mut buf))
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not match the CRC64"), "{err}");
    // The service gives the CRC64 of at most 4 MiB: a longer read does not ask.
    let stub = reads_corrupted(0);
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    rt().block_on(blob.read(0, (4 << 20) + 512)).unwrap();
    assert_eq!(
        stub.requests()[0].header("x-ms-range-get-content-crc64"),
        None
    );
}

/// An answer written as `head` (status line and headers, without the blank
/// line) and `body`.
fn raw_page_list(head: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!("{head}\r\n\r\n").into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[test]
fn answers_with_a_lying_length_broken_chunks_or_a_mebibyte_of_headers_fail_within_the_budget() {
    const LIST: &[u8] =
        b"<?xml version=\"1.0\"?><PageList><PageRange><Start>0</Start><End>511</End></PageRange></PageList>";
    let huge = format!("HTTP/1.1 200 OK\r\nx-ms-junk: {}", "j".repeat(1 << 20));
    for (what, reply) in [
        (
            "a Content-Length longer than the body",
            raw_page_list("HTTP/1.1 200 OK\r\nContent-Length: 100000", LIST),
        ),
        (
            "a Content-Length shorter than the body",
            raw_page_list("HTTP/1.1 200 OK\r\nContent-Length: 40", LIST),
        ),
        (
            "a chunk size that is not hex",
            raw_page_list(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
                b"zz\r\n<PageList/>\r\n0\r\n\r\n",
            ),
        ),
        (
            "a chunk larger than what follows",
            raw_page_list(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
                b"ffffffffffff\r\n<PageList/>\r\n",
            ),
        ),
        ("a mebibyte of headers", raw_page_list(&huge, LIST)),
    ] {
        // The same broken answer every time, the connection closed after it.
        let stub = Stub::start(move |_, _| Reply::Raw(reply.clone()));
        let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
        let started = Instant::now();
        let got = rt().block_on(blob.page_ranges(None));
        let took = started.elapsed();
        let err = got.expect_err(what).to_string();
        assert!(err.contains("page ranges"), "{what}: {err}");
        assert!(took < Duration::from_secs(15), "{what}: {took:?}");
    }
}

#[test]
fn a_retry_after_of_days_is_not_waited_for() {
    let stub = Stub::start(|_, _| {
        Reply::error(503, "ServerBusy", &fixture("error-503.xml")).with("Retry-After", "999999")
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let started = Instant::now();
    let err = rt().block_on(blob.clear_pages(0, 512, None)).unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    // Not 11 days, nor the minute the pause is capped at: the budget (10 s).
    assert!(
        started.elapsed() < Duration::from_secs(11),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn unsorted_overlapping_and_out_of_range_page_lists_are_merged_and_clipped_to_the_blob() {
    let stub = Stub::start(|_, _| {
        Reply::xml(
            200,
            "<?xml version=\"1.0\"?><PageList>\
             <PageRange><Start>8192</Start><End>12287</End></PageRange>\
             <PageRange><Start>0</Start><End>1023</End></PageRange>\
             <PageRange><Start>512</Start><End>2047</End></PageRange>\
             <PageRange><Start>10240</Start><End>16383</End></PageRange>\
             <PageRange><Start>1048576</Start><End>4194303</End></PageRange>\
             </PageList>",
        )
    });
    let blob = service(&stub, fast_policy()).blob("disks", "a.vhd");
    let plan = SegmentPlan {
        initial: 1 << 20,
        min: 1 << 20,
        max: 1 << 20,
        grow_below: 0,
        shrink_above: usize::MAX,
    };
    let ranges = rt()
        .block_on(blob.page_ranges_segmented(1 << 20, plan))
        .unwrap();
    assert_eq!(
        ranges,
        vec![PageRange::new(0, 2048), PageRange::new(8192, 16384)]
    );
}
