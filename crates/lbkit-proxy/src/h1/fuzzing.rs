//! The fast path's parsers as the fuzz targets (`fuzz/`) and their corpus tests call them:
//! the request head, the response head and the response body framing, in owned results. Not
//! an API: hidden from the docs and free to change.

use super::wire::{self, BodyCursor, Hdr, Parsed};

/// What the fast path decides about the bytes at the start of a client connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestFraming {
    /// The head is not complete yet.
    Partial,
    /// hyper serves it (the fast path hands the connection over).
    Other,
    /// The fast path serves it: a head of `head` bytes and a body of `body` bytes after it.
    Plain {
        /// Bytes of the head, blank line included.
        head: usize,
        /// `Content-Length` (0 when absent).
        body: usize,
        /// The method as sent.
        method: Vec<u8>,
        /// The target as sent.
        target: Vec<u8>,
        /// The `Host` value.
        host: Option<Vec<u8>>,
    },
}

/// The fast path's decision on `buf` with the proxy's `max_headers`.
pub fn request(buf: &[u8], max_headers: usize) -> RequestFraming {
    let mut hdrs: Vec<Hdr> = Vec::new();
    match wire::parse_request(buf, &mut hdrs, max_headers) {
        Parsed::Partial => RequestFraming::Partial,
        Parsed::Other => RequestFraming::Other,
        Parsed::Plain(h) => RequestFraming::Plain {
            head: h.len,
            body: h.body,
            method: buf[h.method].to_vec(),
            target: buf[h.target].to_vec(),
            host: h.host.map(|r| buf[r].to_vec()),
        },
    }
}

/// How an upstream's response body ends, as the fast path reads it.
pub use super::wire::Framing as ResponseFraming;

/// The fast path's reading of a response head at the start of `buf`: `Ok(None)` while
/// incomplete, else the head's length, the status, the body framing and whether the upstream
/// connection can be reused; `Err` for a head the fast path refuses.
#[allow(clippy::result_unit_err)]
pub fn response(
    buf: &[u8],
    head_request: bool,
) -> Result<Option<(usize, u16, ResponseFraming, bool)>, ()> {
    let mut hdrs: Vec<Hdr> = Vec::new();
    let Some(h) = wire::parse_response(buf, &mut hdrs, head_request)? else {
        return Ok(None);
    };
    Ok(Some((h.len, h.code, h.framing, h.keep_alive)))
}

/// What the fast path reads from the trailers at the end of a chunked answer `buf` (its head
/// and whole body): whether a `grpc-status` trailer fails the call, and where a load report's
/// value is.
pub fn chunked_trailers(buf: &[u8]) -> (bool, Option<std::ops::Range<usize>>) {
    let (outcome, signals) = wire::chunked_trailers(buf, lbkit_core::Outcome::Success);
    (
        outcome != lbkit_core::Outcome::Success,
        signals.and_then(|s| s.load).map(|(_, r)| r),
    )
}

/// A response body being read, fed in pieces as they arrive.
#[derive(Debug)]
pub struct Body(BodyCursor);

impl Body {
    /// A body framed as `framing`.
    pub fn new(framing: ResponseFraming) -> Self {
        Body(BodyCursor::new(framing))
    }

    /// How many bytes at the front of `data` belong to the body; `Err` for a malformed
    /// chunked stream.
    #[allow(clippy::result_unit_err)]
    pub fn feed(&mut self, data: &[u8]) -> Result<usize, ()> {
        self.0.feed(data)
    }

    /// Whether the body is complete.
    pub fn done(&self) -> bool {
        self.0.done()
    }
}
