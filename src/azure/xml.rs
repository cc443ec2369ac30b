//! The few XML bodies the blob service sends, parsed into plain structs.
//!
//! A tiny path-based walker over quick-xml events is enough: each body is a flat
//! list of records, and unknown elements are ignored so newer service versions that
//! add fields do not break parsing.

use quick_xml::events::{BytesCData, BytesText, Event};
use quick_xml::Reader;

use super::ranges::PageRange;

/// How deep elements may nest. The service's bodies go five deep; an answer
/// nesting deeper is not one of them (a hostile one nested 200,000 deep).
const MAX_DEPTH: usize = 16;

/// The longest `NextMarker` taken. The service's are a few hundred bytes (they
/// encode a blob name, at most 1,024 characters); each is sent back in the next
/// request's URL, so a longer one is not followed.
const MARKER_MAX: usize = 8 << 10;

/// What the walker reports, in document order.
enum Item<'a, 'b> {
    /// Text inside the element at this path (names from the root, joined by `/`).
    Text(&'a str, Raw<'b>),
    /// The element at this path closed.
    End(&'a str),
}

/// A piece of text as it stands in the body, borrowed from it: unescaped and
/// copied only when a parser asks for it, so text that nobody keeps costs
/// nothing, however long a hostile answer makes it.
enum Raw<'b> {
    Text(BytesText<'b>),
    CData(BytesCData<'b>),
}

impl Raw<'_> {
    /// Its length in the body, escapes included: at least as long as the text.
    fn len(&self) -> usize {
        match self {
            Raw::Text(t) => t.len(),
            Raw::CData(t) => t.len(),
        }
    }

    /// The text, unescaped and trimmed.
    fn text(&self) -> Result<String, String> {
        match self {
            Raw::Text(t) => Ok(t.unescape().map_err(|e| e.to_string())?.trim().to_string()),
            Raw::CData(t) => Ok(String::from_utf8_lossy(t).trim().to_string()),
        }
    }

    /// [`Self::text`], refused unescaping when longer than `max` bytes in the
    /// body; `what` names it in the error.
    fn text_within(&self, max: usize, what: &str) -> Result<String, String> {
        if self.len() > max {
            return Err(format!(
                "a {what} of {} bytes, longer than the service sends (at most {max})",
                self.len()
            ));
        }
        self.text()
    }
}

/// Walks a body, calling `each` with its text and end-of-element items and their
/// paths. Work and memory are linear in the body: the path is one string, grown
/// and cut back as elements open and close, never joined again per element, and
/// text is handed over as it stands in the body, not copied.
fn walk(
    body: &[u8],
    mut each: impl FnMut(Item<'_, '_>) -> Result<(), String>,
) -> Result<(), String> {
    let mut reader = Reader::from_reader(body);
    let mut path = String::new();
    // Where each open element's name starts in `path` (minus its `/`).
    let mut marks: Vec<usize> = Vec::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => open(&mut path, &mut marks, e.name().as_ref())?,
            Ok(Event::Empty(e)) => {
                open(&mut path, &mut marks, e.name().as_ref())?;
                each(Item::End(&path))?;
                close(&mut path, &mut marks);
            }
            Ok(Event::Text(t)) if !marks.is_empty() => each(Item::Text(&path, Raw::Text(t)))?,
            Ok(Event::CData(t)) if !marks.is_empty() => each(Item::Text(&path, Raw::CData(t)))?,
            Ok(Event::End(_)) => {
                each(Item::End(&path))?;
                close(&mut path, &mut marks);
            }
            Ok(Event::Eof) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("bad XML at byte {}: {e}", reader.buffer_position())),
        }
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

/// A `NextMarker`'s text: `None` when empty (the last page).
fn next_marker(raw: &Raw<'_>) -> Result<Option<String>, String> {
    let t = raw.text_within(MARKER_MAX, "NextMarker")?;
    Ok((!t.is_empty()).then_some(t))
}

/// The longest number taken, in the body: `u64::MAX` is 20 digits, and some
/// room is left for blanks around it.
const NUMBER_MAX: usize = 64;

/// One page of a Get Page Ranges answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PageListPage {
    /// Ranges holding data, half-open, in the order sent.
    pub ranges: Vec<PageRange>,
    /// Ranges cleared since `prevsnapshot` (diff queries only).
    pub cleared: Vec<PageRange>,
    /// Continuation marker; `None` when this was the last page.
    pub next_marker: Option<String>,
    /// How many ranges came off the 512-byte grid, each rounded outward to
    /// whole pages (reading a little more than was written, never less).
    pub off_grid: usize,
}

/// Parses `<PageList>` with `PageRange`, `ClearRange` and `NextMarker`. The
/// body must be one whole, well-formed `PageList` element and nothing else:
/// an empty body, junk, another element or a list cut short is an error,
/// never a list of nothing written. A range off the 512-byte grid is rounded
/// outward to whole pages and counted.
pub fn parse_page_list(body: &[u8]) -> Result<PageListPage, String> {
    let mut out = PageListPage::default();
    let (mut start, mut end) = (None, None);
    let mut whole = false;
    walk(body, |item| {
        let path = match &item {
            Item::Text(p, _) | Item::End(p) => *p,
        };
        if whole {
            return Err("more follows the PageList element".to_string());
        }
        if path != "PageList" && !path.starts_with("PageList/") {
            let root = path.split('/').next().unwrap_or_default();
            return Err(format!(
                "not a page list: its element is <{}>",
                crate::azure::text::service_text(root)
            ));
        }
        match item {
            Item::Text(p, raw) => {
                let field = match p {
                    "PageList/PageRange/Start" | "PageList/ClearRange/Start" => &mut start,
                    "PageList/PageRange/End" | "PageList/ClearRange/End" => &mut end,
                    "PageList/NextMarker" => {
                        out.next_marker = next_marker(&raw)?;
                        return Ok(());
                    }
                    _ => return Ok(()),
                };
                let t = raw.text_within(NUMBER_MAX, p)?;
                *field = Some(t.parse::<u64>().map_err(|_| {
                    format!(
                        "{p} is not a number: '{}'",
                        crate::azure::text::service_text(&t)
                    )
                })?);
            }
            Item::End("PageList") => whole = true,
            Item::End(p) if p == "PageList/PageRange" || p == "PageList/ClearRange" => {
                let range = whole_pages(start.take(), end.take(), &mut out.off_grid)?;
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
    if !whole {
        return Err("not a whole page list: the answer holds no closed PageList element".into());
    }
    Ok(out)
}

/// The half-open range of a listed `Start` and inclusive `End`, rounded
/// outward to whole 512-byte pages (counted in `off_grid` when it had to be).
fn whole_pages(
    start: Option<u64>,
    end: Option<u64>,
    off_grid: &mut usize,
) -> Result<PageRange, String> {
    use super::ranges::PAGE;
    let (s, e) = match (start, end) {
        (Some(s), Some(e)) if e >= s && e < u64::MAX - PAGE => (s, e + 1),
        _ => return Err("page range without a valid Start and End".to_string()),
    };
    let (rs, re) = (s - s % PAGE, e.div_ceil(PAGE) * PAGE);
    if (rs, re) != (s, e) {
        *off_grid += 1;
    }
    Ok(PageRange::new(rs, re))
}

/// The longest blob name Azure allows, in characters.
pub const NAME_MAX_CHARS: usize = 1024;
/// The most metadata one blob may carry in Azure, names and values together.
pub const METADATA_MAX: usize = 8 << 10;
/// The most body bytes one character takes escaped (`&#x10FFFF;`): text longer
/// than this many times a limit is over it without unescaping it.
const ESCAPED_MAX: usize = 10;
/// The longest short property (a blob type, a snapshot id) taken, in the body.
const FIELD_MAX: usize = 256;

/// One entry of a List Blobs answer: what the commands and the CSI driver use
/// of it, nothing else (the rest of each entry is skipped while parsing).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlobItem {
    pub name: String,
    /// Set for snapshots.
    pub snapshot: Option<String>,
    pub content_length: Option<u64>,
    pub blob_type: Option<String>,
    /// Name and value of each metadata entry (kept only when the listing asked
    /// for it: see [`ListingKeep`]).
    pub metadata: Vec<(String, String)>,
}

impl BlobItem {
    /// About what keeping it costs: the struct and the text it holds.
    fn kept_bytes(&self) -> usize {
        std::mem::size_of::<BlobItem>()
            + self.name.len()
            + self.snapshot.as_ref().map_or(0, String::len)
            + self.blob_type.as_ref().map_or(0, String::len)
            + self
                .metadata
                .iter()
                .map(|(k, v)| std::mem::size_of::<(String, String)>() + k.len() + v.len())
                .sum::<usize>()
    }
}

/// One page of a List Blobs answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlobListPage {
    pub items: Vec<BlobItem>,
    pub next_marker: Option<String>,
}

/// What one listing keeps of its items across all its pages: metadata only if
/// asked for, and at most so many bytes. Each page is bounded by the answer's
/// size, but a listing follows up to a thousand of them, so without a bound on
/// what it keeps an endpoint sending a 15 MiB metadata value on every page had
/// a listing hold 15 GiB.
#[derive(Debug)]
pub struct ListingKeep {
    metadata: bool,
    max_bytes: usize,
    kept: usize,
}

impl ListingKeep {
    pub fn new(metadata: bool, max_bytes: usize) -> ListingKeep {
        ListingKeep {
            metadata,
            max_bytes,
            kept: 0,
        }
    }

    /// Counts `item` as kept; fails once the listing passes its bound.
    fn keep(&mut self, item: &BlobItem) -> Result<(), String> {
        self.kept += item.kept_bytes();
        if self.kept > self.max_bytes {
            return Err(format!(
                "the listing passed {} MiB, more than this client keeps of one",
                self.max_bytes >> 20
            ));
        }
        Ok(())
    }
}

/// Whether `t` looks like a snapshot id as the service names one
/// (`2026-11-22T11:05:54.5810000Z`): one is printed, and sent back in URLs.
pub fn is_snapshot_id(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'-'))
}

/// A listed snapshot id (`None` when empty), refused (never shown) unless
/// [`is_snapshot_id`].
fn snapshot_id(raw: &Raw<'_>) -> Result<Option<String>, String> {
    let t = raw.text_within(FIELD_MAX, "snapshot id")?;
    if t.is_empty() {
        Ok(None)
    } else if is_snapshot_id(&t) {
        Ok(Some(t))
    } else {
        Err(format!(
            "a snapshot id that is not a timestamp: '{}'",
            crate::azure::text::service_text(&t)
        ))
    }
}

/// A listed blob's name, refused when longer than Azure allows.
fn blob_name(raw: &Raw<'_>) -> Result<String, String> {
    let over = |len: String| {
        format!("a blob name of {len} characters, longer than Azure allows ({NAME_MAX_CHARS})")
    };
    if raw.len() > NAME_MAX_CHARS * ESCAPED_MAX {
        return Err(over(format!("about {}", raw.len())));
    }
    let name = raw.text()?;
    match name.chars().count() {
        n if n > NAME_MAX_CHARS => Err(over(n.to_string())),
        _ => Ok(name),
    }
}

/// Counts one metadata entry of the blob being parsed (its name and value)
/// into `total`, refusing the blob once its metadata passes Azure's limit; the
/// value, unless it is too long to be one, unescaped.
fn metadata_value(name: &str, raw: &Raw<'_>, total: &mut usize) -> Result<String, String> {
    let over = || {
        format!(
            "a blob's metadata of more than {} KiB, more than Azure allows",
            METADATA_MAX >> 10
        )
    };
    if raw.len() > METADATA_MAX * ESCAPED_MAX {
        return Err(over());
    }
    let value = raw.text()?;
    *total += name.len() + value.len();
    if *total > METADATA_MAX {
        return Err(over());
    }
    Ok(value)
}

/// Checks that `body` is one whole, well-formed `EnumerationResults` element
/// and nothing else: a List Blobs answer that is empty, junk or cut short is
/// garbled, never a listing of nothing.
pub fn check_blob_list(body: &[u8]) -> Result<(), String> {
    whole(body, "EnumerationResults")
}

/// Checks that `body` is one element named `root`, closed, and nothing else.
fn whole(body: &[u8], root: &str) -> Result<(), String> {
    let mut closed = false;
    walk(body, |item| {
        let path = match &item {
            Item::Text(p, _) | Item::End(p) => *p,
        };
        if closed {
            return Err(format!("more follows the {root} element"));
        }
        if path.split('/').next() != Some(root) {
            return Err(format!(
                "not the answer asked for: its element is <{}>",
                crate::azure::text::service_text(path.split('/').next().unwrap_or_default())
            ));
        }
        closed = matches!(item, Item::End(p) if p == root);
        Ok(())
    })?;
    if closed {
        Ok(())
    } else {
        Err(format!(
            "not a whole answer: it holds no closed {root} element"
        ))
    }
}

/// Parses `<EnumerationResults>` of List Blobs (flat listing), keeping of its
/// items what `keep` says and counting them into it.
pub fn parse_blob_list(body: &[u8], keep: &mut ListingKeep) -> Result<BlobListPage, String> {
    let mut out = BlobListPage::default();
    let mut cur = BlobItem::default();
    let mut metadata = 0;
    const BLOB: &str = "EnumerationResults/Blobs/Blob";
    walk(body, |item| {
        match item {
            Item::Text(p, raw) => {
                let Some(field) = p.strip_prefix(BLOB) else {
                    if p == "EnumerationResults/NextMarker" {
                        out.next_marker = next_marker(&raw)?;
                    }
                    return Ok(());
                };
                match field {
                    "/Name" => cur.name = blob_name(&raw)?,
                    "/Snapshot" => cur.snapshot = snapshot_id(&raw)?,
                    "/Properties/Content-Length" => {
                        cur.content_length = raw.text_within(NUMBER_MAX, field)?.parse().ok()
                    }
                    "/Properties/BlobType" => {
                        cur.blob_type = Some(raw.text_within(FIELD_MAX, "BlobType")?)
                    }
                    f => {
                        if let Some(name) = f.strip_prefix("/Metadata/") {
                            let value = metadata_value(name, &raw, &mut metadata)?;
                            if keep.metadata {
                                cur.metadata.push((name.to_string(), value));
                            }
                        }
                    }
                }
            }
            Item::End(p) if p == BLOB => {
                keep.keep(&cur)?;
                metadata = 0;
                out.items.push(std::mem::take(&mut cur));
            }
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
        if let Item::Text(p, raw) = item {
            match p {
                "Error/Code" => code = Some(raw.text()?),
                "Error/Message" => message = Some(raw.text()?),
                _ => {}
            }
        }
        Ok(())
    });
    (code, message)
}

#[cfg(test)]
mod tests;
