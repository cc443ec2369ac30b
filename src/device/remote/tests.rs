use super::*;

#[test]
fn long_reads_go_out_as_ranged_gets_of_at_most_the_most() {
    // Blocks of 4 bytes read in GETs of at most 10: whole blocks per GET
    // where they fit, and the bytes in order, each in exactly one GET.
    let mut mem = [[0u8; 4]; 6];
    let mut parts: Vec<&mut [u8]> = mem.iter_mut().map(|m| &mut m[..]).collect();
    let groups = ranged_gets(100, &mut parts, 10);
    let shape: Vec<(u64, Vec<usize>)> = groups
        .iter()
        .map(|(at, g)| (*at, g.iter().map(|p| p.len()).collect()))
        .collect();
    assert_eq!(
        shape,
        vec![(100, vec![4, 4]), (108, vec![4, 4]), (116, vec![4, 4])]
    );
    // A part longer than a GET is cut.
    let mut big = [0u8; 25];
    let mut parts: Vec<&mut [u8]> = vec![&mut big[..]];
    let groups = ranged_gets(0, &mut parts, 10);
    let shape: Vec<(u64, usize)> = groups.iter().map(|(at, g)| (*at, g[0].len())).collect();
    assert_eq!(shape, vec![(0, 10), (10, 10), (20, 5)]);
    // Writing through the groups fills the parts in order.
    let mut mem = [[0u8; 3]; 3];
    let mut parts: Vec<&mut [u8]> = mem.iter_mut().map(|m| &mut m[..]).collect();
    for (at, group) in ranged_gets(0, &mut parts, 5) {
        let mut n = at as u8;
        for p in group {
            for b in p.iter_mut() {
                *b = n;
                n += 1;
            }
        }
    }
    assert_eq!(mem, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]);
}

fn patience(io_timeout: Duration) -> Patience {
    Patience {
        io_timeout,
        try_time: Duration::from_secs(20),
        unbounded: AtomicBool::new(false),
        give_up: AtomicBool::new(false),
        refusing_since: std::sync::Mutex::new(None),
        health: Arc::new(Health::default()),
    }
}

/// A runtime to wait on, patience with `io_timeout`, and a lease not lost.
fn waiting(io_timeout: Duration) -> (tokio::runtime::Runtime, Patience, LeaseLoss) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    (rt, patience(io_timeout), LeaseLoss::default())
}

fn unreachable() -> AzureError {
    AzureError::Unreachable {
        op: crate::azure::Op::PutPage,
        target: "c/d.vhd".into(),
        endpoint: "http://127.0.0.1:1/acct".into(),
        detail: "connection refused".into(),
        attempts: 3,
        elapsed: Duration::from_secs(2),
    }
}

fn refused() -> AzureError {
    AzureError::Service {
        op: crate::azure::Op::PutPage,
        target: "c/d.vhd".into(),
        status: 412,
        code: Some(SEQUENCE_REFUSED.into()),
        message: None,
        denied: None,
    }
}

#[test]
fn past_the_io_timeout_of_an_outage_io_fails_after_one_try_until_the_service_answers() {
    let (rt, p, fenced) = waiting(Duration::from_secs(10));
    // A write refused by the sequence-number fence once the service is
    // back, in an I/O that has waited longer than the I/O timeout: the
    // service answered, so it is sent again, not failed for its age.
    p.health
        .failed(Instant::now() - Duration::from_secs(20), "down");
    let mut a = p.begin(Instant::now() - Duration::from_secs(20));
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, refused()))
        .is_ok());
    // And if it then meets no answer again, a new outage begins for it.
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, unreachable()))
        .is_ok());
    drop(a);
    p.health.succeeded();
    // A new I/O early in an outage waits and tries again.
    let mut a = p.begin(Instant::now());
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, unreachable()))
        .is_ok());
    drop(a);
    // The service has failed everything for longer than the I/O timeout: a
    // new I/O fails after its one try.
    p.health
        .failed(Instant::now() - Duration::from_secs(20), "down");
    let mut a = p.begin(Instant::now());
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, unreachable()))
        .is_err());
    drop(a);
    // A write the sequence-number fence refused is an answer: the outage is
    // over, and the write is sent again instead of failing.
    let mut a = p.begin(Instant::now());
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, refused()))
        .is_ok());
    assert_eq!(p.health.failing_for(), None);
}

#[test]
fn writes_refused_for_their_sequence_number_fail_once_refusals_outlast_the_io_timeout() {
    let (rt, p, fenced) = waiting(Duration::from_secs(10));
    // Refused, and sent again: an answer, the I/O goes on.
    let mut a = p.begin(Instant::now());
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, refused()))
        .is_ok());
    drop(a);
    // Refusals for longer than the I/O timeout, however young the I/O, and
    // during unmount too: it fails, saying so.
    *p.refusing_since.lock().unwrap() = Some(Instant::now() - Duration::from_secs(11));
    p.unbounded.store(true, Ordering::SeqCst);
    let mut a = p.begin(Instant::now());
    let e = rt
        .block_on(p.wait_or_fail(&mut a, &fenced, refused()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("answers, but has refused writes"), "{e}");
    // A write that lands ends the refusals.
    p.succeeded(&a);
    drop(a);
    let mut a = p.begin(Instant::now());
    assert!(rt
        .block_on(p.wait_or_fail(&mut a, &fenced, refused()))
        .is_ok());
}

#[test]
fn past_the_io_timeout_one_try_is_bounded_by_one_request_timeout_whatever_the_limit() {
    // The I/O timeout bounds how long an application waits, at the default
    // limit (300 s) as at any other: a try past it must be over within one
    // request timeout, and a run of the same I/O queued behind one that
    // failed (or a flush that waited for a failed one) gets no try of its
    // own.
    let p = patience(DEFAULT_IO_TIMEOUT);
    let early = Instant::now() - Duration::from_secs(1);
    let issued = Instant::now();
    let mut a = p.begin(issued);
    assert_eq!(p.one_try(&mut a).unwrap(), None, "no outage: no deadline");
    p.health.failed(
        Instant::now() - DEFAULT_IO_TIMEOUT + Duration::from_secs(1),
        "down",
    );
    assert_eq!(
        p.one_try(&mut a).unwrap(),
        None,
        "within the limit: the budget bounds it"
    );
    // Past the limit, a try that started before this I/O was issued failed
    // (sent while the service was silent, cut off as it came back): this I/O
    // still gets its own try.
    let outage = Instant::now() - DEFAULT_IO_TIMEOUT - Duration::from_secs(1);
    p.health
        .failed_try(outage, early, "down", Failed::Unanswered);
    assert!(p.tried_since(issued).is_ok());
    assert!(p.one_try(&mut a).unwrap().is_some());
    // One that started since failed: no further try.
    p.health
        .failed_try(outage, Instant::now(), "down", Failed::Unanswered);
    assert!(p.one_try(&mut a).is_err());
    assert!(p.tried_since(issued).is_err());
    drop(a);
    // A new I/O past the limit gets one try of one request timeout.
    let mut a = p.begin(Instant::now());
    let deadline = p.one_try(&mut a).unwrap().expect("past the limit: one try");
    assert_eq!(deadline, a.started + p.try_time);
    assert!(p.tried_since(a.started).is_ok());
    drop(a);
    // One issued a while ago (an fsync that waited for a flush under way,
    // whose try had started before it) has what is left of its request
    // timeout, and a moment at least.
    let q = patience(DEFAULT_IO_TIMEOUT);
    let long_ago = Instant::now() - p.try_time - Duration::from_secs(10);
    q.health
        .failed_try(outage, long_ago, "down", Failed::Unanswered);
    let mut a = q.begin(Instant::now() - p.try_time + Duration::from_secs(5));
    let deadline = q.one_try(&mut a).unwrap().unwrap();
    assert_eq!(deadline, a.started + q.try_time);
    drop(a);
    let mut a = q.begin(Instant::now() - p.try_time - Duration::from_secs(5));
    let deadline = q.one_try(&mut a).unwrap().unwrap();
    assert_eq!(deadline, a.tried + LAST_TRY);
    drop(a);
    // During unmount it waits without limit: no deadline.
    p.unbounded.store(true, Ordering::SeqCst);
    let mut a = p.begin(Instant::now());
    assert_eq!(p.one_try(&mut a).unwrap(), None);
}
