use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::*;
use crate::azure::{Account, Credential};

fn sources() -> Sources {
    let account = Account {
        name: "devstoreaccount1".into(),
        blob_endpoint: "http://127.0.0.1:9/devstoreaccount1".parse().unwrap(),
        credential: Credential::Anonymous,
    };
    Sources {
        info: MountInfo {
            mode: "fs".into(),
            fstype: "ext4".into(),
            read_only: false,
            snapshot: String::new(),
        },
        service: BlobService::new(account),
        cache: None,
        lease_held: Arc::new(|| true),
        warm: None,
    }
}

#[test]
fn names_follow_the_conventions_and_carry_the_drive() {
    let text = render(&registry("disks/data.vhd", sources()));
    for want in [
        "# TYPE blobdrive_retries_total counter\n",
        "blobdrive_retries_total{drive=\"disks/data.vhd\"} 0\n",
        "# TYPE blobdrive_sent_bytes_total counter\n",
        "# TYPE blobdrive_lease_held gauge\n",
        "blobdrive_lease_held{drive=\"disks/data.vhd\"} 1\n",
        "# TYPE blobdrive_token_renewals_total counter\n",
        "# TYPE blobdrive_mount_info gauge\n",
        "# TYPE blobdrive_requests_given_up_total counter\n",
        "# TYPE blobdrive_last_success_timestamp_seconds gauge\n",
        "# TYPE process_resident_memory_bytes gauge\n",
        "# TYPE process_cpu_seconds_total counter\n",
        "process_open_fds{drive=\"disks/data.vhd\"} ",
        concat!(
            "blobdrive_mount_info{drive=\"disks/data.vhd\",mode=\"fs\",fstype=\"ext4\",read_only=\"false\",snapshot=\"\",version=\"",
            env!("CARGO_PKG_VERSION"),
            "\"} 1\n"
        ),
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}

#[test]
fn only_get_metrics_is_served() {
    let listener = bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reg = registry("c/d.vhd", sources());
    std::thread::spawn(move || serve(listener, reg));
    let ask = |req: &str| {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let ok = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
    assert!(
        ok.contains("blobdrive_lease_held{drive=\"c/d.vhd\"} 1"),
        "{ok}"
    );
    assert!(ask("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(ask("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    let mut c = TcpStream::connect(addr).unwrap();
    let _ = c.write_all(long.as_bytes());
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    // A second bind of the same address fails with one line.
    let err = bind(&addr.to_string()).unwrap_err();
    assert!(
        err.contains("cannot serve metrics on") && !err.contains('\n'),
        "{err}"
    );
    for bad in [
        "localhost",
        "127.0.0.1",
        ":9101",
        "a b:1",
        "[::1:9101",
        "h:99999",
    ] {
        assert!(bind(bad).unwrap_err().contains("HOST:PORT"), "{bad}");
    }
    // A host name is looked up.
    let named = bind("localhost:0").unwrap();
    assert!(named.local_addr().unwrap().ip().is_loopback());
}

#[test]
fn a_client_that_trickles_its_request_neither_holds_the_port_nor_stays() {
    let listener = bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reg = registry("c/d.vhd", sources());
    std::thread::spawn(move || serve(listener, reg));
    // One byte a second, never a whole request.
    let slow = TcpStream::connect(addr).unwrap();
    let trickle = {
        let mut w = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if w.write_all(b"G").is_err() {
                    return started.elapsed();
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            started.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out)
            .expect("a scrape answered while another client trickles");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    }
    // The server hangs up on the trickling client (its writes then fail)
    // once the whole request's time is up, though bytes keep coming.
    let took = trickle.join().unwrap();
    drop(slow);
    assert!(
        took < Duration::from_secs(20),
        "the trickling client was kept for {took:?}"
    );
}
