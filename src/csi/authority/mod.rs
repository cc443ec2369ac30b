//! Any `:authority` a gRPC client sends is served.
//!
//! The HTTP/2 server under tonic (h2) refuses a request whose `:authority` is
//! not a valid URI authority with RST_STREAM (PROTOCOL_ERROR), and gRPC
//! clients choose their own on a unix socket: Go's send `localhost`, but
//! Python's grpcio sends the socket's path, percent-encoded, and so do others
//! (grpc-java sends the path as it is). Every call of such a client failed. A
//! unix socket has no authority to check, so each connection's
//! client-to-server bytes go through [`frames::Rewriter`], which gives every
//! request the authority `localhost` before h2 reads it; the server's side is
//! passed as it is.

mod frames;
mod hpack;
mod huffman;

/// The bytes of a hex dump as the RFCs print their examples (spaces and line
/// breaks between bytes), for the tests.
#[cfg(test)]
fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

/// A client's connection whose requests are given the authority `localhost`.
pub struct AnyAuthority {
    inner: UnixStream,
    rewriter: frames::Rewriter,
    /// What the server is to read next, from `at`.
    out: Vec<u8>,
    at: usize,
    /// The client closed its side (or broke the protocol).
    done: bool,
}

impl AnyAuthority {
    pub fn new(inner: UnixStream) -> AnyAuthority {
        AnyAuthority {
            inner,
            rewriter: frames::Rewriter::default(),
            out: Vec::new(),
            at: 0,
            done: false,
        }
    }
}

impl Connected for AnyAuthority {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for AnyAuthority {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.at);
                buf.put_slice(&this.out[this.at..this.at + n]);
                this.at += n;
                if this.at == this.out.len() {
                    this.out.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.done {
                return Poll::Ready(Ok(()));
            }
            let mut raw = [0u8; frames::MAX_FRAME];
            let mut read = ReadBuf::new(&mut raw);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The end: a frame cut short is for h2 to refuse.
                    this.done = true;
                    if this.rewriter.pending() > 0 {
                        return Poll::Ready(Err(std::io::Error::from(
                            std::io::ErrorKind::UnexpectedEof,
                        )));
                    }
                }
                Poll::Ready(Ok(())) => {
                    if let Err(e) = this.rewriter.feed(read.filled(), &mut this.out) {
                        this.done = true;
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            e,
                        )));
                    }
                }
            }
        }
    }
}

impl AsyncWrite for AnyAuthority {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
