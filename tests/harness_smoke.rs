//! The test harness itself: the shared Azurite answers correctly signed requests
//! made without the project's client, and container names are valid.

mod common;

use common::azurite::{create_container, put_container, unique_container, Azurite};

#[test]
fn shared_azurite_creates_a_container_once() {
    let az = Azurite::shared();
    assert!(az.port > 0);
    if std::env::var(common::azurite::PORT_ENV).is_ok_and(|v| !v.trim().is_empty()) {
        assert!(
            az.own_pid.is_none(),
            "given a port, the harness starts nothing"
        );
    } else {
        assert!(
            az.own_pid.is_some(),
            "without a port, the harness starts Azurite"
        );
    }

    let name = unique_container("harness_smoke::create");
    let (status, body) = put_container(az, &name);
    assert_eq!(status, 201, "first create: {body}");
    let (status, body) = put_container(az, &name);
    assert_eq!(status, 409, "second create: {body}");
    assert!(body.contains("ContainerAlreadyExists"), "{body}");
}

#[test]
fn create_container_helper_and_shared_instance() {
    // A second test in the same binary gets the same emulator.
    let a = Azurite::shared();
    let b = Azurite::shared();
    assert!(std::ptr::eq(a, b));
    create_container(a, &unique_container("helper"));

    assert_eq!(
        a.blob_endpoint(),
        format!("http://127.0.0.1:{}/devstoreaccount1", a.port)
    );
    let cs = a.connection_string();
    assert!(cs.starts_with("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"));
    assert!(cs.contains(&format!("AccountKey={};", common::azurite::DEV_KEY)));
    assert!(cs.ends_with(&format!("BlobEndpoint={};", a.blob_endpoint())));
}

#[test]
fn wrong_signature_is_refused() {
    // Guards against a harness that "works" only because the emulator ignores auth.
    let az = Azurite::shared();
    let name = unique_container("badsig");
    let request = format!(
        "PUT /devstoreaccount1/{name}?restype=container HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         x-ms-date: {}\r\nx-ms-version: 2021-12-02\r\n\
         Authorization: SharedKey devstoreaccount1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", az.port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
}

#[test]
fn container_names_are_valid_and_unique() {
    let tags = [
        "cont",
        "",
        "___",
        "Snapshot_List::Prune",
        "a--b",
        "-lead-and-trail-",
        "ÜnïcødéTag",
        &"x".repeat(200),
    ];
    for tag in tags {
        let a = unique_container(tag);
        let b = unique_container(tag);
        assert_ne!(a, b);
        assert!((3..=63).contains(&a.len()), "{a:?} from {tag:?}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a:?}"
        );
        assert!(!a.contains("--") && !a.ends_with('-'), "{a:?}");
        assert!(a.starts_with("t-"), "{a:?}");
    }
    assert!(unique_container("Snapshot_List").starts_with("t-snapshot-list-"));
}
