//! The client's side of an HTTP/2 connection, frame by frame: every frame
//! passes as it came, but a request's header block (HEADERS and its
//! CONTINUATIONs), which is decoded and written again with `:authority` set to
//! `localhost`, the authority Go's gRPC sends on a unix socket.

use super::hpack::{self, Decoder, HpackError};

/// What opens every HTTP/2 connection, before the first frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame taken: HTTP/2's default SETTINGS_MAX_FRAME_SIZE (which
/// the server does not raise), and the largest this side sends.
pub const MAX_FRAME: usize = 16 << 10;

/// The most a request's header block may hold (gRPC's are a few hundred bytes).
const MAX_BLOCK: usize = 256 << 10;

/// The authority every request is given.
const AUTHORITY: &[u8] = b"localhost";

/// Why the client's bytes cannot be passed on.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("HTTP/2 frame of {0} bytes, over the limit")]
    TooLarge(usize),
    #[error("HTTP/2 header block over {MAX_BLOCK} bytes")]
    BlockTooLarge,
    #[error("HTTP/2 frame of type {0} inside a header block")]
    Interleaved(u8),
    #[error("malformed HTTP/2 HEADERS frame")]
    Malformed,
    #[error(transparent)]
    Hpack(#[from] HpackError),
}

/// A header block being gathered: its stream, its flags, the fragments so far.
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// The rewriting of one connection's client-to-server bytes.
#[derive(Default)]
pub struct Rewriter {
    input: Vec<u8>,
    preface_left: Option<usize>,
    block: Option<Block>,
    decoder: Decoder,
}

impl Rewriter {
    /// Takes `bytes` from the client; appends to `out` what the server is to
    /// get of everything taken so far (whole frames only).
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        self.input.extend_from_slice(bytes);
        let mut at = 0;
        let preface = self.preface_left.get_or_insert(PREFACE.len());
        if *preface > 0 {
            let n = (*preface).min(self.input.len());
            out.extend_from_slice(&self.input[..n]);
            *preface -= n;
            at = n;
        }
        while let Some(header) = self.input.get(at..at + 9) {
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            if len > MAX_FRAME {
                return Err(FrameError::TooLarge(len));
            }
            let Some(frame) = self.input.get(at..at + 9 + len) else {
                break;
            };
            let frame = frame.to_vec();
            at += 9 + len;
            self.frame(&frame, out)?;
        }
        self.input.drain(..at);
        Ok(())
    }

    /// The bytes taken but not passed on yet (part of a frame).
    pub fn pending(&self) -> usize {
        self.input.len()
    }

    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[9..];
        match (kind, &mut self.block) {
            (CONTINUATION, Some(block)) if block.stream == stream => {
                if block.bytes.len() + payload.len() > MAX_BLOCK {
                    return Err(FrameError::BlockTooLarge);
                }
                block.bytes.extend_from_slice(payload);
            }
            (k, Some(_)) => return Err(FrameError::Interleaved(k)),
            (HEADERS, None) => {
                self.block = Some(Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    bytes: fragment(flags, payload)?.to_vec(),
                });
            }
            _ => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        if flags & END_HEADERS != 0 {
            let block = self.block.take().expect("a block is gathered");
            self.rewrite(block, out)?;
        }
        Ok(())
    }

    /// Writes `block` again, its `:authority` replaced, as HEADERS and as many
    /// CONTINUATIONs as it takes.
    fn rewrite(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let mut fields = self.decoder.decode(&block.bytes)?;
        for (name, value) in &mut fields {
            if name == b":authority" {
                *value = AUTHORITY.to_vec();
            }
        }
        let mut encoded = Vec::with_capacity(block.bytes.len() + 64);
        hpack::encode(&fields, &mut encoded);
        let chunks: Vec<&[u8]> = if encoded.is_empty() {
            vec![&[]]
        } else {
            encoded.chunks(MAX_FRAME).collect()
        };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut flags = if i == last { END_HEADERS } else { 0 };
            let kind = if i == 0 {
                if block.end_stream {
                    flags |= END_STREAM;
                }
                HEADERS
            } else {
                CONTINUATION
            };
            let len = (chunk.len() as u32).to_be_bytes();
            out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
            out.extend_from_slice(&block.stream.to_be_bytes());
            out.extend_from_slice(chunk);
        }
        Ok(())
    }
}

/// The header block fragment of a HEADERS frame's payload: without its padding
/// and priority fields.
fn fragment(flags: u8, payload: &[u8]) -> Result<&[u8], FrameError> {
    let (mut start, mut end) = (0, payload.len());
    if flags & PADDED != 0 {
        let pad = *payload.first().ok_or(FrameError::Malformed)? as usize;
        start = 1;
        end = end.checked_sub(pad).ok_or(FrameError::Malformed)?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or(FrameError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn block(fields: &[(&str, &str)]) -> Vec<u8> {
        let fields: Vec<hpack::Field> = fields
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let mut out = Vec::new();
        hpack::encode(&fields, &mut out);
        out
    }

    /// The headers the server gets: decoded from what the rewriter passed on.
    fn server_sees(out: &[u8]) -> Vec<(String, String)> {
        let mut d = Decoder::default();
        let mut at = PREFACE.len();
        let mut fields = vec![];
        let mut gathered = vec![];
        while at < out.len() {
            let len = u32::from_be_bytes([0, out[at], out[at + 1], out[at + 2]]) as usize;
            let (kind, flags) = (out[at + 3], out[at + 4]);
            if kind == HEADERS || kind == CONTINUATION {
                gathered.extend_from_slice(&out[at + 9..at + 9 + len]);
                if flags & END_HEADERS != 0 {
                    fields.extend(d.decode(&gathered).unwrap());
                    gathered.clear();
                }
            }
            at += 9 + len;
        }
        fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    #[test]
    fn a_path_as_authority_becomes_localhost_and_the_rest_passes() {
        let mut input = PREFACE.to_vec();
        let settings = frame(0x4, 0, 0, &[]);
        input.extend_from_slice(&settings);
        let b = block(&[
            (":authority", "tmp%2Fcsi.sock"),
            (":path", "/csi.v1.Identity/Probe"),
        ]);
        // Split across HEADERS (padded, with priority) and a CONTINUATION.
        let mut first = vec![2u8, 0, 0, 0, 0, 16];
        first.extend_from_slice(&b[..10]);
        first.extend_from_slice(&[0, 0]);
        input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &first));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &b[10..]));
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\0");
        input.extend_from_slice(&data);
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        // Byte by byte: frames are passed on only once whole.
        for byte in &input {
            r.feed(&[*byte], &mut out).unwrap();
        }
        assert_eq!(r.pending(), 0);
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        assert_eq!(
            &out[PREFACE.len()..PREFACE.len() + settings.len()],
            &settings[..]
        );
        assert!(out.ends_with(&data));
        assert_eq!(
            server_sees(&out),
            vec![
                (":authority".to_string(), "localhost".to_string()),
                (":path".to_string(), "/csi.v1.Identity/Probe".to_string())
            ]
        );
    }

    #[test]
    fn a_block_larger_than_a_frame_is_sent_in_several() {
        let long = "v".repeat(40 << 10);
        let b = block(&[(":authority", "x"), ("x-long", &long)]);
        let mut input = PREFACE.to_vec();
        for (i, chunk) in b.chunks(MAX_FRAME).enumerate() {
            let last = (i + 1) * MAX_FRAME >= b.len();
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 3, chunk));
        }
        let mut out = Vec::new();
        Rewriter::default().feed(&input, &mut out).unwrap();
        let seen = server_sees(&out);
        assert_eq!(seen[0].1, "localhost");
        assert_eq!(seen[1].1, long);
    }

    #[test]
    fn oversized_or_interleaved_frames_are_refused() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0x10, 0, 1, 0, 0, 0, 0, 0, 1]);
        assert!(matches!(
            Rewriter::default().feed(&input, &mut Vec::new()),
            Err(FrameError::TooLarge(_))
        ));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &block(&[("a", "b")])));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert!(matches!(
            Rewriter::default().feed(&input, &mut Vec::new()),
            Err(FrameError::Interleaved(0))
        ));
    }
}
