//! What a successful answer must be to count as the answer to its request.
//!
//! A status that says success is not enough: an answer is checked against the
//! question before anything acts on it. A ranged read must be answered with
//! 206, a `Content-Range` naming exactly the range asked, that many bytes, and
//! the CRC64 of those bytes when the answer carries one; a body whose request
//! says what it must be (a page list) must be that; no answer may come encoded
//! (`Content-Encoding`) since none is ever asked for. One that is not is
//! garbled: never returned, never stored, retried as after a server error.
//! A body that can only be checked by parsing it (a page list) is parsed
//! here, once, and what it holds handed over with the answer ([`Found`]).

use reqwest::header::HeaderMap;

use crate::azure::crc64;
use crate::azure::scatter::Scatter;
use crate::azure::xml::{self, PageListPage};

/// What a request's successful answer must hold besides its status.
#[derive(Clone, Copy)]
pub(crate) enum Expect {
    /// The bytes `[start, start + len)` of the blob.
    Range { start: u64, len: u64 },
    /// A body `check` accepts (it says why not).
    Body(fn(&[u8]) -> Result<(), String>),
    /// One whole page list ([`xml::parse_page_list`]), handed over parsed.
    PageList,
}

/// What checking a successful answer found in its body, when that took
/// parsing it: kept, so the body is parsed once.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing beyond the body itself.
    #[default]
    Nothing,
    /// The page list [`Expect::PageList`] asked for.
    PageList(PageListPage),
}

/// The body an answer brought: read whole, or streamed into the caller's
/// buffers.
pub(super) enum Got<'a, 'p, 'b> {
    Body(&'a [u8]),
    Streamed(&'a Scatter<'p, 'b>),
}

impl Got<'_, '_, '_> {
    fn len(&self) -> u64 {
        match self {
            Got::Body(b) => b.len() as u64,
            Got::Streamed(s) => s.filled() as u64,
        }
    }

    fn crc64(&self) -> u64 {
        match self {
            Got::Body(b) => crc64::of(b),
            Got::Streamed(s) => s.crc64(),
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Got::Body(b) => Some(b),
            Got::Streamed(_) => None,
        }
    }
}

/// Why an answer's headers say it cannot be used, before its body is read:
/// it is encoded, though no encoding was asked for.
pub(super) fn unasked_encoding(headers: &HeaderMap) -> Option<String> {
    let enc = headers.get("content-encoding")?;
    let enc = String::from_utf8_lossy(enc.as_bytes());
    let enc = enc.trim();
    (!enc.is_empty() && !enc.eq_ignore_ascii_case("identity")).then(|| {
        format!(
            "the answer came encoded ({}), which was never asked for",
            crate::azure::text::service_text(enc)
        )
    })
}

/// What a successful answer (`status`, `headers`, `got`) holds, if it is the
/// one `expect`ed; else why it is garbled.
pub(super) fn checked(
    expect: Option<Expect>,
    status: u16,
    headers: &HeaderMap,
    got: Got<'_, '_, '_>,
) -> Result<Found, String> {
    let why = match expect {
        None => None,
        Some(Expect::Range { start, len }) => wrong_range(start, len, status, headers, &got),
        Some(Expect::Body(check)) => got.bytes().and_then(|b| check(b).err()),
        Some(Expect::PageList) => {
            let body = got.bytes().ok_or("a page list must be read whole")?;
            return xml::parse_page_list(body).map(Found::PageList);
        }
    };
    why.map_or(Ok(Found::Nothing), Err)
}

/// Why an answer to a read of `[start, start + len)` is not that range.
fn wrong_range(
    start: u64,
    len: u64,
    status: u16,
    headers: &HeaderMap,
    got: &Got<'_, '_, '_>,
) -> Option<String> {
    let asked = format!("bytes {start}-{}", start + len - 1);
    if status != 206 {
        return Some(format!(
            "a read of {asked} was answered {status}, not 206 (a part of the blob)"
        ));
    }
    let named = header(headers, "content-range");
    match named.as_deref().and_then(content_range) {
        Some((s, e)) if s == start && e == start + len - 1 => {}
        _ => {
            return Some(format!(
                "a read of {asked} was answered with Content-Range '{}'",
                crate::azure::text::service_text(named.as_deref().unwrap_or("(none)"))
            ))
        }
    }
    if got.len() != len {
        return Some(format!(
            "a read of {asked} brought {} bytes, not {len}",
            got.len()
        ));
    }
    let sent = header(headers, "x-ms-content-crc64")?;
    match crc64::parse_header(&sent) {
        Some(crc) if crc == got.crc64() => None,
        Some(_) => Some(format!(
            "the bytes of a read of {asked} do not match the CRC64 the answer carries"
        )),
        None => Some(format!(
            "a read of {asked} carries a CRC64 that is not one: '{}'",
            crate::azure::text::service_text(&sent)
        )),
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    Some(String::from_utf8_lossy(headers.get(name)?.as_bytes()).into_owned())
}

/// `(first, last)` of a `Content-Range: bytes FIRST-LAST/TOTAL`.
fn content_range(v: &str) -> Option<(u64, u64)> {
    let range = v.trim().strip_prefix("bytes ")?.split('/').next()?;
    let (s, e) = range.split_once('-')?;
    Some((s.trim().parse().ok()?, e.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn read(status: u16, h: &[(&'static str, &str)], body: &[u8]) -> Option<String> {
        let expect = Some(Expect::Range { start: 512, len: 4 });
        checked(expect, status, &headers(h), Got::Body(body)).err()
    }

    #[test]
    fn a_read_is_the_range_asked_or_garbled() {
        let cr = ("content-range", "bytes 512-515/4096");
        assert_eq!(read(206, &[cr], b"abcd"), None);
        let e = read(200, &[cr], b"abcd").unwrap();
        assert!(e.contains("answered 200"), "{e}");
        for other in ["bytes 0-3/4096", "bytes 512-516/4096", "junk"] {
            let e = read(206, &[("content-range", other)], b"abcd").unwrap();
            assert!(e.contains("Content-Range"), "{other}: {e}");
        }
        let e = read(206, &[], b"abcd").unwrap();
        assert!(e.contains("(none)"), "{e}");
        let e = read(206, &[cr], b"abc").unwrap();
        assert!(e.contains("brought 3 bytes, not 4"), "{e}");
    }

    #[test]
    fn a_read_carrying_a_crc64_must_match_it() {
        let cr = ("content-range", "bytes 512-515/4096");
        let right = crc64::header(crc64::of(b"abcd"));
        assert_eq!(
            read(206, &[cr, ("x-ms-content-crc64", &right)], b"abcd"),
            None
        );
        let wrong = crc64::header(crc64::of(b"abce"));
        let e = read(206, &[cr, ("x-ms-content-crc64", &wrong)], b"abcd").unwrap();
        assert!(e.contains("do not match the CRC64"), "{e}");
        let e = read(206, &[cr, ("x-ms-content-crc64", "xyz")], b"abcd").unwrap();
        assert!(e.contains("not one"), "{e}");
    }

    #[test]
    fn an_encoding_nobody_asked_for_is_refused() {
        assert_eq!(unasked_encoding(&headers(&[])), None);
        assert_eq!(
            unasked_encoding(&headers(&[("content-encoding", "identity")])),
            None
        );
        let e = unasked_encoding(&headers(&[("content-encoding", "gzip")])).unwrap();
        assert!(e.contains("encoded (gzip)"), "{e}");
    }

    #[test]
    fn a_body_is_what_its_request_says_it_must_be() {
        fn list(b: &[u8]) -> Result<(), String> {
            (b == b"list")
                .then_some(())
                .ok_or_else(|| "not a list".into())
        }
        let h = headers(&[]);
        assert_eq!(
            checked(Some(Expect::Body(list)), 200, &h, Got::Body(b"list")),
            Ok(Found::Nothing)
        );
        assert_eq!(
            checked(Some(Expect::Body(list)), 200, &h, Got::Body(b"junk")),
            Err("not a list".into())
        );
        assert_eq!(
            checked(None, 200, &h, Got::Body(b"junk")),
            Ok(Found::Nothing)
        );
    }

    #[test]
    fn a_page_list_is_checked_and_handed_over_in_one_parse() {
        let h = headers(&[]);
        let list = b"<PageList><PageRange><Start>0</Start><End>511</End></PageRange></PageList>";
        let Ok(Found::PageList(page)) = checked(Some(Expect::PageList), 200, &h, Got::Body(list))
        else {
            panic!("a whole page list was refused");
        };
        assert_eq!(page.ranges.len(), 1);
        let e = checked(Some(Expect::PageList), 200, &h, Got::Body(b"<PageList>")).unwrap_err();
        assert!(e.contains("not a whole page list"), "{e}");
    }
}
