//! HPACK (RFC 7541) as much as rewriting a client's request headers takes: a
//! decoder of the client's header blocks, keeping the dynamic table the client
//! encodes against, and an encoder that writes every field as a literal
//! without indexing, so the server's table stays empty and never has to agree
//! with the client's.

use std::collections::VecDeque;

use super::huffman;

/// Why a header block cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[error("bad HPACK header block: {0}")]
pub struct HpackError(&'static str);

/// The largest dynamic table a client may use: the default of
/// SETTINGS_HEADER_TABLE_SIZE, which the server (tonic's h2) does not change.
pub const TABLE_SIZE: usize = 4096;

/// The longest string taken (a name or a value).
const MAX_STRING: usize = 64 << 10;

/// The static table (RFC 7541, Appendix A), from index 1.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

pub type Field = (Vec<u8>, Vec<u8>);

/// A decoder of one connection's header blocks.
pub struct Decoder {
    table: VecDeque<Field>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: TABLE_SIZE,
        }
    }
}

/// A position in a header block being read.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, HpackError> {
        let v = *self.b.get(self.at).ok_or(HpackError("truncated"))?;
        self.at += 1;
        Ok(v)
    }

    /// An integer with an `n`-bit prefix (RFC 7541, 5.1).
    fn int(&mut self, n: u32) -> Result<usize, HpackError> {
        let mask = (1u32 << n) - 1;
        let mut v = u32::from(self.byte()?) & mask;
        if v < mask {
            return Ok(v as usize);
        }
        for shift in (0..28).step_by(7) {
            let b = self.byte()?;
            v += u32::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v as usize);
            }
        }
        Err(HpackError("integer too large"))
    }

    /// A string (RFC 7541, 5.2), Huffman-decoded if coded.
    fn string(&mut self) -> Result<Vec<u8>, HpackError> {
        let coded = self.b.get(self.at).ok_or(HpackError("truncated"))? & 0x80 != 0;
        let len = self.int(7)?;
        if len > MAX_STRING {
            return Err(HpackError("string too long"));
        }
        let raw = self
            .b
            .get(self.at..self.at + len)
            .ok_or(HpackError("truncated string"))?;
        self.at += len;
        if coded {
            huffman::decode(raw).ok_or(HpackError("bad Huffman code"))
        } else {
            Ok(raw.to_vec())
        }
    }
}

impl Decoder {
    /// The fields of one whole header block, in order.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut r = Reader { b: block, at: 0 };
        let mut fields = Vec::new();
        while r.at < block.len() {
            let first = block[r.at];
            if first & 0x80 != 0 {
                let i = r.int(7)?;
                fields.push(self.entry(i)?);
            } else if first & 0xc0 == 0x40 {
                let f = self.literal(&mut r, 6)?;
                self.insert(f.clone());
                fields.push(f);
            } else if first & 0xe0 == 0x20 {
                let size = r.int(5)?;
                if size > TABLE_SIZE {
                    return Err(HpackError("table size over the limit"));
                }
                self.max = size;
                self.evict();
            } else {
                // Without indexing (0000) or never indexed (0001).
                fields.push(self.literal(&mut r, 4)?);
            }
        }
        Ok(fields)
    }

    fn literal(&self, r: &mut Reader, prefix: u32) -> Result<Field, HpackError> {
        let i = r.int(prefix)?;
        let name = if i == 0 {
            r.string()?
        } else {
            self.entry(i)?.0
        };
        Ok((name, r.string()?))
    }

    fn entry(&self, i: usize) -> Result<Field, HpackError> {
        match i {
            0 => Err(HpackError("index 0")),
            1..=61 => {
                let (n, v) = STATIC[i - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .table
                .get(i - 62)
                .cloned()
                .ok_or(HpackError("index past the table")),
        }
    }

    fn insert(&mut self, f: Field) {
        let size = f.0.len() + f.1.len() + 32;
        if size > self.max {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.size += size;
        self.table.push_front(f);
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }
}

/// Appends `fields` to `out` as literals without indexing, new names, no
/// Huffman coding.
pub fn encode(fields: &[Field], out: &mut Vec<u8>) {
    for (name, value) in fields {
        out.push(0);
        string(name, out);
        string(value, out);
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    int(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

/// An integer with an `n`-bit prefix, the prefix's other bits `high`.
fn int(mut v: usize, n: u32, high: u8, out: &mut Vec<u8>) {
    let mask = (1usize << n) - 1;
    if v < mask {
        out.push(high | v as u8);
        return;
    }
    out.push(high | mask as u8);
    v -= mask;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::authority::hex;

    fn text(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn the_rfcs_requests_decode_with_huffman_and_the_dynamic_table() {
        // RFC 7541, C.4.1 to C.4.3: three requests on one connection.
        let mut d = Decoder::default();
        let one = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            text(&one)[3],
            (":authority".into(), "www.example.com".into())
        );
        let two = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            text(&two)[3],
            (":authority".into(), "www.example.com".into())
        );
        assert_eq!(text(&two)[4], ("cache-control".into(), "no-cache".into()));
        let three = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(text(&three)[2], (":path".into(), "/index.html".into()));
        assert_eq!(
            text(&three)[3],
            (":authority".into(), "www.example.com".into())
        );
        assert_eq!(
            text(&three)[4],
            ("custom-key".into(), "custom-value".into())
        );
        assert_eq!(d.size, 164);
    }

    #[test]
    fn what_is_encoded_decodes_the_same_and_leaves_no_table() {
        let fields: Vec<Field> = vec![
            (b":authority".to_vec(), b"localhost".to_vec()),
            (b"x-long".to_vec(), vec![b'v'; 300]),
        ];
        let mut out = Vec::new();
        encode(&fields, &mut out);
        let mut d = Decoder::default();
        assert_eq!(d.decode(&out).unwrap(), fields);
        assert!(d.table.is_empty());
    }

    #[test]
    fn hostile_blocks_are_refused() {
        let mut d = Decoder::default();
        for bad in [
            &[0x80][..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[0x00, 0x05, b'a'],
            &[0x3f, 0xe2, 0x1f],
        ] {
            assert!(d.decode(bad).is_err(), "{bad:?}");
        }
    }
}
