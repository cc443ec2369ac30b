//! The few XML bodies the blob service sends, parsed into plain structs.
//!
//! A tiny path-based walker over quick-xml events is enough: each body is a flat
//! list of records, and unknown elements are ignored so newer service versions that
//! add fields do not break parsing.

use quick_xml::events::Event;
use quick_xml::Reader;

use super::ranges::PageRange;

/// How deep elements may nest. The service's bodies go five deep; an answer
/// nesting deeper is not one of them (a hostile one nested 200,000 deep).
const MAX_DEPTH: usize = 16;

/// What the walker reports, in document order.
enum Item<'a> {
    /// Text inside the element at this path (names from the root, joined by `/`).
    Text(&'a str, String),
    /// The element at this path closed.
    End(&'a str),
}

/// Walks a body, calling `each` with its text and end-of-element items and their
/// paths. Work and memory are linear in the body: the path is one string, grown
/// and cut back as elements open and close, never joined again per element.
fn walk(body: &[u8], mut each: impl FnMut(Item<'_>) -> Result<(), String>) -> Result<(), String> {
    let mut reader = Reader::from_reader(body);
    let mut path = String::new();
    // Where each open element's name starts in `path` (minus its `/`).
    let mut marks: Vec<usize> = Vec::new();
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => open(&mut path, &mut marks, e.name().as_ref())?,
            Ok(Event::Empty(e)) => {
                open(&mut path, &mut marks, e.name().as_ref())?;
                each(Item::End(&path))?;
                close(&mut path, &mut marks);
            }
            Ok(Event::Text(t)) => {
                if !marks.is_empty() {
                    let text = t.unescape().map_err(|e| e.to_string())?;
                    each(Item::Text(&path, text.trim().to_string()))?;
                }
            }
            Ok(Event::CData(t)) => {
                if !marks.is_empty() {
                    let text = String::from_utf8_lossy(&t).trim().to_string();
                    each(Item::Text(&path, text))?;
                }
            }
            Ok(Event::End(_)) => {
                each(Item::End(&path))?;
                close(&mut path, &mut marks);
            }
            Ok(Event::Eof) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("bad XML at byte {}: {e}", reader.buffer_position())),
        }
        buf.clear();
    }
}

fn open(path: &mut String, marks: &mut Vec<usize>, name: &[u8]) -> Result<(), String> {
    if marks.len() >= MAX_DEPTH {
        return Err(format!("elements nested deeper than {MAX_DEPTH}"));
    }
    marks.push(path.len());
    if !path.is_empty() {
        path.push('/');
    }
    path.push_str(&String::from_utf8_lossy(name));
    Ok(())
}

fn close(path: &mut String, marks: &mut Vec<usize>) {
    if let Some(m) = marks.pop() {
        path.truncate(m);
    }
}

/// One page of a Get Page Ranges answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PageListPage {
    /// Ranges holding data, half-open, in the order sent.
    pub ranges: Vec<PageRange>,
    /// Ranges cleared since `prevsnapshot` (diff queries only).
    pub cleared: Vec<PageRange>,
    /// Continuation marker; `None` when this was the last page.
    pub next_marker: Option<String>,
}

/// Parses `<PageList>` with `PageRange`, `ClearRange` and `NextMarker`.
pub fn parse_page_list(body: &[u8]) -> Result<PageListPage, String> {
    let mut out = PageListPage::default();
    let (mut start, mut end) = (None, None);
    walk(body, |item| {
        match item {
            Item::Text(p, t) => {
                let field = match p {
                    "PageList/PageRange/Start" | "PageList/ClearRange/Start" => &mut start,
                    "PageList/PageRange/End" | "PageList/ClearRange/End" => &mut end,
                    "PageList/NextMarker" => {
                        if !t.is_empty() {
                            out.next_marker = Some(t);
                        }
                        return Ok(());
                    }
                    _ => return Ok(()),
                };
                *field = Some(t.parse::<u64>().map_err(|_| {
                    format!(
                        "{p} is not a number: '{}'",
                        crate::azure::text::service_text(&t)
                    )
                })?);
            }
            Item::End(p) if p == "PageList/PageRange" || p == "PageList/ClearRange" => {
                let range = match (start.take(), end.take()) {
                    (Some(s), Some(e)) if e >= s && e < u64::MAX => PageRange::new(s, e + 1),
                    _ => return Err("page range without a valid Start and End".to_string()),
                };
                if p.ends_with("ClearRange") {
                    out.cleared.push(range);
                } else {
                    out.ranges.push(range);
                }
            }
            Item::End(_) => {}
        }
        Ok(())
    })?;
    Ok(out)
}

/// One entry of a List Blobs answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlobItem {
    pub name: String,
    /// Set for snapshots.
    pub snapshot: Option<String>,
    pub content_length: Option<u64>,
    pub blob_type: Option<String>,
    pub lease_state: Option<String>,
    pub last_modified: Option<String>,
    pub etag: Option<String>,
    /// Name and value of each metadata entry (listed with `include=metadata`).
    pub metadata: Vec<(String, String)>,
}

/// One page of a List Blobs answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlobListPage {
    pub items: Vec<BlobItem>,
    pub next_marker: Option<String>,
}

/// Whether `t` looks like a snapshot id as the service names one
/// (`2026-11-22T11:05:54.5810000Z`): one is printed, and sent back in URLs.
pub fn is_snapshot_id(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'-'))
}

/// A listed snapshot id, refused (never shown) unless [`is_snapshot_id`].
fn snapshot_id(t: String) -> Result<String, String> {
    if is_snapshot_id(&t) {
        Ok(t)
    } else {
        Err(format!(
            "a snapshot id that is not a timestamp: '{}'",
            crate::azure::text::service_text(&t)
        ))
    }
}

/// Parses `<EnumerationResults>` of List Blobs (flat listing).
pub fn parse_blob_list(body: &[u8]) -> Result<BlobListPage, String> {
    let mut out = BlobListPage::default();
    let mut cur = BlobItem::default();
    const BLOB: &str = "EnumerationResults/Blobs/Blob";
    walk(body, |item| {
        match item {
            Item::Text(p, t) => {
                let Some(field) = p.strip_prefix(BLOB) else {
                    if p == "EnumerationResults/NextMarker" && !t.is_empty() {
                        out.next_marker = Some(t);
                    }
                    return Ok(());
                };
                match field {
                    "/Name" => cur.name = t,
                    "/Snapshot" if !t.is_empty() => cur.snapshot = Some(snapshot_id(t)?),
                    "/Properties/Content-Length" => cur.content_length = t.parse().ok(),
                    "/Properties/BlobType" => cur.blob_type = Some(t),
                    "/Properties/LeaseState" => cur.lease_state = Some(t),
                    "/Properties/Last-Modified" => cur.last_modified = Some(t),
                    "/Properties/Etag" => cur.etag = Some(t),
                    f => {
                        if let Some(name) = f.strip_prefix("/Metadata/") {
                            cur.metadata.push((name.to_string(), t));
                        }
                    }
                }
            }
            Item::End(p) if p == BLOB => out.items.push(std::mem::take(&mut cur)),
            Item::End(_) => {}
        }
        Ok(())
    })?;
    Ok(out)
}

/// `(Code, Message)` of an `<Error>` body, when there is one.
pub fn parse_error(body: &[u8]) -> (Option<String>, Option<String>) {
    let mut code = None;
    let mut message = None;
    // A body that is not XML (or too deep) just has no code: the status speaks.
    let _ = walk(body, |item| {
        if let Item::Text(p, t) = item {
            match p {
                "Error/Code" => code = Some(t),
                "Error/Message" => message = Some(t),
                _ => {}
            }
        }
        Ok(())
    });
    (code, message)
}

#[cfg(test)]
mod tests {
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
        let p =
            parse_page_list(b"<?xml version=\"1.0\"?><PageList><NextMarker/></PageList>").unwrap();
        assert_eq!(p, PageListPage::default());
        let p = parse_page_list(b"<PageList />").unwrap();
        assert_eq!(p, PageListPage::default());
    }

    #[test]
    fn bad_page_list() {
        assert!(parse_page_list(
            b"<PageList><PageRange><Start>x</Start><End>1</End></PageRange></PageList>"
        )
        .is_err());
        assert!(
            parse_page_list(b"<PageList><PageRange><Start>0</Start></PageRange></PageList>")
                .is_err()
        );
    }

    #[test]
    fn blob_list() {
        let body = br#"<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://x/" ContainerName="c"><Prefix>a.vhd</Prefix>
<Blobs><Blob><Name>a.vhd</Name><Snapshot>2026-11-22T11:05:54.5810000Z</Snapshot>
<Properties><Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType></Properties></Blob>
<Blob><Name>a.vhd</Name><Properties><Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType><LeaseState>leased</LeaseState><Etag>"0x1"</Etag></Properties></Blob>
</Blobs><NextMarker /></EnumerationResults>"#;
        let l = parse_blob_list(body).unwrap();
        assert_eq!(l.items.len(), 2);
        assert_eq!(
            l.items[0].snapshot.as_deref(),
            Some("2026-11-22T11:05:54.5810000Z")
        );
        assert_eq!(l.items[1].snapshot, None);
        assert_eq!(l.items[1].lease_state.as_deref(), Some("leased"));
        assert_eq!(l.items[1].content_length, Some(1049088));
        assert_eq!(l.next_marker, None);
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
        assert!(parse_blob_list(ok.as_bytes()).is_ok());
    }
}
