//! The XML bodies' parsers, on the service's bodies and on hostile ones.

use super::*;

#[test]
fn page_list_with_clear_ranges_and_marker() {
    let body = br#"<?xml version="1.0" encoding="utf-8"?>
<PageList><PageRange><Start>0</Start><End>511</End></PageRange>
<ClearRange><Start>512</Start><End>1023</End></ClearRange>
<PageRange><Start>4096</Start><End>8191</End></PageRange>
<NextMarker>2!abc</NextMarker></PageList>"#;
    let p = parse_page_list(body).unwrap();
    assert_eq!(
        p.ranges,
        vec![PageRange::new(0, 512), PageRange::new(4096, 8192)]
    );
    assert_eq!(p.cleared, vec![PageRange::new(512, 1024)]);
    assert_eq!(p.next_marker.as_deref(), Some("2!abc"));
}

#[test]
fn empty_page_list() {
    let p = parse_page_list(b"<?xml version=\"1.0\"?><PageList><NextMarker/></PageList>").unwrap();
    assert_eq!(p, PageListPage::default());
    let p = parse_page_list(b"<PageList />").unwrap();
    assert_eq!(p, PageListPage::default());
}

#[test]
fn only_one_whole_page_list_is_a_page_list() {
    for (body, says) in [
        (&b""[..], "no closed PageList"),
        (b"garbage", "no closed PageList"),
        (b"<Error/>", "its element is <Error>"),
        (b"<Error><Code>x</Code></Error>", "its element is <Error>"),
        (
            b"<?xml version=\"1.0\"?><PageList><PageRange><Start>0</Start><End>511</End></PageRange>",
            "no closed PageList",
        ),
        (b"<PageList/><PageList/>", "more follows"),
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00", "no closed PageList"),
    ] {
        let e = parse_page_list(body).unwrap_err();
        assert!(e.contains(says), "{body:?}: {e}");
    }
}

#[test]
fn only_one_whole_listing_is_a_listing() {
    assert!(check_blob_list(b"<EnumerationResults><Blobs/></EnumerationResults>").is_ok());
    for (body, says) in [
        (&b""[..], "no closed EnumerationResults"),
        (b"junk", "no closed EnumerationResults"),
        (b"<Error/>", "its element is <Error>"),
        (
            b"<EnumerationResults><Blobs>",
            "no closed EnumerationResults",
        ),
        (b"<EnumerationResults/><x/>", "more follows"),
    ] {
        let e = check_blob_list(body).unwrap_err();
        assert!(e.contains(says), "{body:?}: {e}");
    }
}

#[test]
fn ranges_off_the_grid_are_rounded_outward_and_counted() {
    let p = parse_page_list(b"<PageList><PageRange><Start>100</Start><End>923</End></PageRange><PageRange><Start>1024</Start><End>2047</End></PageRange><ClearRange><Start>2148</Start><End>2560</End></ClearRange></PageList>").unwrap();
    assert_eq!(
        p.ranges,
        vec![PageRange::new(0, 1024), PageRange::new(1024, 2048)]
    );
    assert_eq!(p.cleared, vec![PageRange::new(2048, 3072)]);
    assert_eq!(p.off_grid, 2);
}

#[test]
fn bad_page_list() {
    assert!(parse_page_list(
        b"<PageList><PageRange><Start>x</Start><End>1</End></PageRange></PageList>"
    )
    .is_err());
    assert!(
        parse_page_list(b"<PageList><PageRange><Start>0</Start></PageRange></PageList>").is_err()
    );
}

#[test]
fn blob_list() {
    let body = br#"<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://x/" ContainerName="c"><Prefix>a.vhd</Prefix>
<Blobs><Blob><Name>a.vhd</Name><Snapshot>2026-11-22T11:05:54.5810000Z</Snapshot>
<Properties><Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType></Properties>
<Metadata><blobdrive_csi_snapshot>snap-1</blobdrive_csi_snapshot></Metadata></Blob>
<Blob><Name>a.vhd</Name><Properties><Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType><LeaseState>leased</LeaseState><Etag>"0x1"</Etag></Properties></Blob>
</Blobs><NextMarker /></EnumerationResults>"#;
    let l = parse_blob_list(body, &mut keep_all()).unwrap();
    assert_eq!(l.items.len(), 2);
    assert_eq!(
        l.items[0].snapshot.as_deref(),
        Some("2026-11-22T11:05:54.5810000Z")
    );
    assert_eq!(l.items[1].snapshot, None);
    assert_eq!(l.items[1].blob_type.as_deref(), Some("PageBlob"));
    assert_eq!(l.items[1].content_length, Some(1049088));
    assert_eq!(
        l.items[0].metadata,
        vec![("blobdrive_csi_snapshot".into(), "snap-1".into())]
    );
    assert_eq!(l.next_marker, None);
    // A listing that did not ask for metadata keeps none sent.
    let l = parse_blob_list(body, &mut ListingKeep::new(false, 1 << 20)).unwrap();
    assert!(l.items[0].metadata.is_empty());
}

fn keep_all() -> ListingKeep {
    ListingKeep::new(true, 64 << 20)
}

/// A listing page of one blob named `name` with `metadata` entries.
fn one_blob(name: &str, metadata: &[(&str, &str)]) -> Vec<u8> {
    let meta: String = metadata
        .iter()
        .map(|(k, v)| format!("<{k}>{v}</{k}>"))
        .collect();
    format!("<EnumerationResults><Blobs><Blob><Name>{name}</Name><Metadata>{meta}</Metadata></Blob></Blobs></EnumerationResults>").into_bytes()
}

#[test]
fn a_listed_blob_over_azures_limits_is_refused() {
    // The longest name, escaped; one character more.
    let at_limit = "&amp;".repeat(NAME_MAX_CHARS);
    let l = parse_blob_list(&one_blob(&at_limit, &[]), &mut keep_all()).unwrap();
    assert_eq!(l.items[0].name.len(), NAME_MAX_CHARS);
    let e = parse_blob_list(&one_blob(&"é".repeat(1025), &[]), &mut keep_all()).unwrap_err();
    assert!(e.contains("name of 1025 characters"), "{e}");
    let e = parse_blob_list(&one_blob(&"a".repeat(1 << 20), &[]), &mut keep_all()).unwrap_err();
    assert!(e.contains("longer than Azure allows (1024)"), "{e}");
    // 8 KiB of metadata, names included; a byte more, in two entries or in one
    // value too long to unescape.
    let v = "v".repeat(METADATA_MAX - 2);
    assert!(parse_blob_list(
        &one_blob("a", &[("k", "v"), ("k", &v[1..])]),
        &mut keep_all()
    )
    .is_ok());
    for body in [
        one_blob("a", &[("k", "vv"), ("k", &v[1..])]),
        one_blob("a", &[("k", &"v".repeat(15 << 20))]),
    ] {
        let e = parse_blob_list(&body, &mut keep_all()).unwrap_err();
        assert!(e.contains("metadata of more than 8 KiB"), "{e}");
        // Whether it is kept or not.
        let e = parse_blob_list(&body, &mut ListingKeep::new(false, 1 << 20)).unwrap_err();
        assert!(e.contains("more than Azure allows"), "{e}");
    }
    let marker = format!(
        "<EnumerationResults><NextMarker>{}</NextMarker></EnumerationResults>",
        "m".repeat(1 << 20)
    );
    let e = parse_blob_list(marker.as_bytes(), &mut keep_all()).unwrap_err();
    assert!(e.contains("NextMarker of 1048576 bytes"), "{e}");
}

#[test]
fn a_listing_keeps_at_most_its_bound_across_pages() {
    let v = "v".repeat(8000);
    let page = one_blob("a", &[("k", &v)]);
    let mut keep = ListingKeep::new(true, 20_000);
    parse_blob_list(&page, &mut keep).unwrap();
    parse_blob_list(&page, &mut keep).unwrap();
    let e = parse_blob_list(&page, &mut keep).unwrap_err();
    assert!(e.contains("the listing passed"), "{e}");
}

#[test]
fn error_body() {
    let (c, m) = parse_error(b"<?xml version=\"1.0\"?><Error><Code>BlobNotFound</Code><Message>The specified blob does not exist.\nRequestId:x</Message></Error>");
    assert_eq!(c.as_deref(), Some("BlobNotFound"));
    assert!(m.unwrap().starts_with("The specified blob"));
}

#[test]
fn deep_nesting_is_refused() {
    let depth = 200_000;
    let mut body = "<a>".repeat(depth);
    body.push_str(&"</a>".repeat(depth));
    let e = parse_page_list(body.as_bytes()).unwrap_err();
    assert!(e.contains("nested deeper than 16"), "{e}");
    assert_eq!(parse_error(body.as_bytes()), (None, None));
    // As deep as the service goes, and a little more, is fine.
    let ok = format!("{}{}", "<a>".repeat(16), "</a>".repeat(16));
    assert!(parse_blob_list(ok.as_bytes(), &mut keep_all()).is_ok());
}
