//! HTTP/1.1 on the wire for the fast path: request and response heads parsed with `httparse`
//! into offsets of the connection's buffer, the rewritten heads, and the body framing of a
//! response (`Content-Length`, chunked, or until close), tracked byte by byte so the body can be
//! relayed as it arrives and the upstream connection reused after it.
//!
//! Everything here is synchronous and allocation-free once the connection's buffers have grown.

use std::net::IpAddr;
use std::ops::Range;

use std::time::Duration;

use lbkit_core::signal::Pushback;
use lbkit_core::{Clock, EndpointStats, FailureKind, Outcome, Timestamp};
use lbkit_strategy::KeySource;
use lbkit_tower::http::grpc_status_failure;
use lbkit_tower::orca;
use lbkit_tower::policy::GrpcCodes;

use crate::config::ForwardedHeaders;
use crate::envelope::MAX_REPLAY_BODY;
use crate::headers::{tokens, HOP_BY_HOP};
use crate::request::{is_normal, is_uri_target, valid_host};

/// Headers parsed per head; a request with more goes to hyper (which answers 431 past the
/// configured `max_headers`).
pub(super) const MAX_HEADERS: usize = 128;

/// One header as offsets into the buffer it was parsed from.
#[derive(Clone, Debug)]
pub(super) struct Hdr {
    pub(super) name: Range<usize>,
    pub(super) value: Range<usize>,
}

/// A request head the fast path serves.
#[derive(Clone, Debug)]
pub(super) struct ReqHead {
    /// Bytes of the head, blank line included.
    pub(super) len: usize,
    pub(super) method: Range<usize>,
    pub(super) target: Range<usize>,
    pub(super) host: Option<Range<usize>>,
    /// `Content-Length` (0 when absent).
    pub(super) body: usize,
    /// `Connection: close`.
    pub(super) close: bool,
    /// `Connection` names headers to drop.
    pub(super) listed: bool,
}

/// What parsing a request buffer gave.
#[derive(Debug)]
pub(super) enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// A plain HTTP/1.1 request with an origin-form target, a `Host` and at most a small
    /// `Content-Length` body.
    Plain(ReqHead),
    /// Anything else (HTTP/1.0, h2c preface, `Upgrade`, `Expect`, chunked or large bodies,
    /// absolute or `*` targets, CONNECT, malformed or too many headers): hyper serves it.
    Other,
}

/// Parse the request head at the start of `buf`, filling `hdrs` with its headers' offsets.
pub(super) fn parse_request(buf: &[u8], hdrs: &mut Vec<Hdr>, max_headers: usize) -> Parsed {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Parsed::Other;
    };
    if !target.starts_with('/') || method == "CONNECT" || req.headers.len() > max_headers {
        return Parsed::Other;
    }
    let at = |s: &[u8]| offsets(buf, s);
    let mut head = ReqHead {
        len,
        method: at(method.as_bytes()),
        target: at(target.as_bytes()),
        host: None,
        body: 0,
        close: false,
        listed: false,
    };
    let mut length = None;
    hdrs.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if is(name, "transfer-encoding") || is(name, "upgrade") || is(name, "expect") {
            return Parsed::Other;
        }
        if is(name, "content-length") {
            match (length, parse_length(h.value)) {
                (None, Some(n)) if n <= MAX_REPLAY_BODY => length = Some(n),
                _ => return Parsed::Other,
            }
        } else if is(name, "host") {
            if head.host.is_some() {
                return Parsed::Other;
            }
            head.host = Some(at(h.value));
        } else if is(name, "connection") {
            for token in tokens(h.value) {
                if token.eq_ignore_ascii_case(b"close") {
                    head.close = true;
                } else if FRAMING.iter().any(|f| is(token, f)) {
                    // Dropping these would change where the message ends: hyper re-frames it.
                    return Parsed::Other;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    head.listed = true;
                }
            }
        }
        hdrs.push(Hdr {
            name: at(name),
            value: at(h.value),
        });
    }
    // hyper's engine answers a bad `Host` (400) and normalises a path that is not normal yet.
    let host_ok = head.host.clone().is_some_and(|r| valid_host(&buf[r]));
    let target = target.as_bytes();
    if !host_ok || !is_normal(path_of(target)) || !is_uri_target(target) {
        return Parsed::Other;
    }
    head.body = length.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
    Parsed::Plain(head)
}

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`, relayed as it is.
    Chunked,
    /// Until the upstream closes.
    Close,
}

/// A response head from an upstream.
#[derive(Clone, Debug)]
pub(super) struct RespHead {
    pub(super) len: usize,
    pub(super) code: u16,
    pub(super) reason: Range<usize>,
    pub(super) framing: Framing,
    /// The upstream connection can carry another request after this response.
    pub(super) keep_alive: bool,
    /// `Transfer-Encoding` present (then `Content-Length` is ignored and not relayed).
    pub(super) coded: bool,
    /// `Connection` names headers to drop.
    pub(super) listed: bool,
    /// What the head says to the balancer beyond its status.
    pub(super) signals: Signals,
}

/// What a response head says to the balancer beyond its status: a `grpc-status`, a load
/// report, a pushback. Values are ranges of the buffer the head was parsed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Signals {
    /// The failure a `grpc-status` in the head stands for (a trailers-only grpc-web answer).
    pub(super) grpc_failure: Option<FailureKind>,
    /// A load report's value in the head: `endpoint-load-metrics-bin` (true) if present, else
    /// `endpoint-load-metrics` (`lbkit_tower::orca`).
    pub(super) load: Option<(bool, Range<usize>)>,
    /// `Retry-After`.
    retry_after: Option<Range<usize>>,
    /// `grpc-retry-pushback-ms`.
    grpc_pushback: Option<Range<usize>>,
}

impl Signals {
    /// Take note of the header `name: value` (slices of `buf`) if it is one of these.
    fn note(&mut self, buf: &[u8], name: &[u8], value: &[u8]) {
        if is(name, "grpc-status") {
            self.grpc_failure = grpc_status_failure(value, GrpcCodes::DEFAULT);
        } else if is(name, orca::HEADER_BIN) {
            self.load = Some((true, offsets(buf, value)));
        } else if is(name, orca::HEADER) && !self.load.as_ref().is_some_and(|(bin, _)| *bin) {
            self.load = Some((false, offsets(buf, value)));
        } else if is(name, "retry-after") {
            self.retry_after = Some(offsets(buf, value));
        } else if is(name, "grpc-retry-pushback-ms") {
            self.grpc_pushback = Some(offsets(buf, value));
        }
    }

    /// The pushback of an answer with status `code` whose head is in `buf`
    /// (`lbkit_core::signal::pushback`).
    pub(super) fn pushback(&self, buf: &[u8], code: u16, now: Timestamp) -> Option<Pushback> {
        let value = |r: &Option<Range<usize>>| r.clone().and_then(|r| buf.get(r));
        let (retry_after, grpc) = (value(&self.retry_after), value(&self.grpc_pushback));
        if retry_after.is_none() && grpc.is_none() {
            return None;
        }
        lbkit_core::signal::pushback(code, retry_after, grpc, now)
    }

    /// Record what the trailers at the end of `buf` (an answer with status `code`) say about
    /// its endpoint: a load report, and a pushback — the answer is delivered, so the pushback
    /// only passes the endpoint over for the time asked.
    pub(super) fn record_trailers(
        &self,
        buf: &[u8],
        code: u16,
        stats: &EndpointStats,
        clock: &Clock,
    ) {
        if let Some((bin, at)) = &self.load {
            if let Some(value) = buf.get(at.clone()) {
                orca::record_value(*bin, value, stats, clock);
            }
        }
        let now = clock.now();
        if let Some(p) = self.pushback(buf, code, now) {
            p.record(stats, now);
        }
    }
}

/// Parse the response head at the start of `buf`; `Ok(None)` while incomplete, `Err` when it
/// is not HTTP/1.x or its framing is contradictory.
pub(super) fn parse_response(
    buf: &[u8],
    hdrs: &mut Vec<Hdr>,
    head_request: bool,
) -> Result<Option<RespHead>, ()> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let (Some(code), Some(version)) = (resp.code, resp.version) else {
        return Err(());
    };
    let reason = resp.reason.map_or(len..len, |r| offsets(buf, r.as_bytes()));
    let (mut length, mut coded, mut chunked, mut close, mut listed) =
        (None, false, false, false, false);
    let mut signals = Signals::default();
    hdrs.clear();
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if is(name, "content-length") {
            let n = parse_length(h.value).ok_or(())?;
            if length.is_some_and(|m| m != n) {
                return Err(());
            }
            length = Some(n);
        } else if is(name, "transfer-encoding") {
            coded = true;
            chunked = tokens(h.value)
                .last()
                .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if is(name, "connection") {
            for token in tokens(h.value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                    listed = true;
                }
            }
        } else {
            signals.note(buf, name, h.value);
        }
        hdrs.push(Hdr {
            name: offsets(buf, name),
            value: offsets(buf, h.value),
        });
    }
    let framing = if head_request || code == 204 || code == 304 || (100..200).contains(&code) {
        Framing::Empty
    } else if coded {
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        length.map_or(Framing::Close, Framing::Length)
    };
    Ok(Some(RespHead {
        len,
        code,
        reason,
        framing,
        keep_alive: version == 1 && !close && framing != Framing::Close,
        coded,
        listed,
        signals,
    }))
}

/// Append the upstream request: the client's request line and headers minus hop-by-hop ones,
/// `X-Forwarded-For` and `Forwarded` with the client (`fwd`) appended, those of them that
/// `which` names (the others go on as sent), the `deadline` header (the service's
/// `deadline_header`) with a blank value of [`DEADLINE_WIDTH`] bytes whose offset in `out` is
/// returned, for [`patch_deadline`] to fill per attempt, then the body.
pub(super) fn write_request(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &ReqHead,
    hdrs: &[Hdr],
    fwd: &ClientAddr,
    (which, deadline): (ForwardedHeaders, Option<&str>),
) -> Option<usize> {
    out.extend_from_slice(&buf[head.method.clone()]);
    out.push(b' ');
    out.extend_from_slice(&buf[head.target.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let conn = head.listed.then_some((buf, hdrs));
    let (mut xff, mut fwds) = (false, false);
    for h in hdrs {
        let name = &buf[h.name.clone()];
        if which.x_forwarded_for && is(name, "x-forwarded-for") {
            xff = true;
            continue;
        }
        if which.forwarded && is(name, "forwarded") {
            fwds = true;
            continue;
        }
        if dropped(name, conn) || deadline.is_some_and(|d| is(name, d)) {
            continue;
        }
        push_header(out, name, &buf[h.value.clone()]);
    }
    if which.x_forwarded_for {
        start_appended(out, buf, hdrs, "x-forwarded-for", xff);
        out.extend_from_slice(fwd.ip.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if which.forwarded {
        start_appended(out, buf, hdrs, "forwarded", fwds);
        out.extend_from_slice(fwd.node.as_bytes());
        out.extend_from_slice(b";proto=http");
        if let Some(host) = head.host.clone().map(|r| &buf[r]) {
            if host.iter().all(|&b| b.is_ascii_graphic() && b != b'"') {
                out.extend_from_slice(b";host=\"");
                out.extend_from_slice(host);
                out.push(b'"');
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    let at = deadline.map(|name| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        let at = out.len();
        out.extend_from_slice(&[b' '; DEADLINE_WIDTH]);
        out.extend_from_slice(b"\r\n");
        at
    });
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&buf[head.len..head.len + head.body]);
    at
}

/// The width of the deadline header's value in a written request: ten digits of milliseconds
/// (115 days), right-aligned after blanks (optional whitespace that every parser trims).
pub(super) const DEADLINE_WIDTH: usize = 10;

/// Write `left` (whole milliseconds, rounded down; the widest value when there is no limit)
/// into the deadline value that [`write_request`] left blank at `at` in `out`.
pub(super) fn patch_deadline(out: &mut [u8], at: usize, left: Option<Duration>) {
    let Some(field) = out.get_mut(at..at + DEADLINE_WIDTH) else {
        return;
    };
    let mut ms = left.map_or(u128::MAX, |l| l.as_millis()).min(9_999_999_999);
    field.fill(b' ');
    for b in field.iter_mut().rev() {
        *b = b'0' + (ms % 10) as u8;
        ms /= 10;
        if ms == 0 {
            break;
        }
    }
}

/// Start the header `name` (lowercase) that the client is appended to: `name: `, then the
/// client's own values of it joined (when it `sent` any) and `, `.
fn start_appended(out: &mut Vec<u8>, buf: &[u8], hdrs: &[Hdr], name: &str, sent: bool) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    if sent {
        join(out, buf, hdrs, name);
        out.extend_from_slice(b", ");
    }
}

/// The client's address as the forwarding headers write it, made once per connection.
#[derive(Debug)]
pub(super) struct ClientAddr {
    /// For `X-Forwarded-For`: `127.0.0.1`, `::1`.
    ip: String,
    /// For `Forwarded`: `for=127.0.0.1`, `for="[::1]"`.
    node: String,
}

impl ClientAddr {
    pub(super) fn new(ip: IpAddr) -> Self {
        let node = match ip {
            IpAddr::V4(v4) => format!("for={v4}"),
            IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
        };
        ClientAddr {
            ip: ip.to_string(),
            node,
        }
    }
}

/// Append the response head for the client: status line, the upstream's headers minus
/// hop-by-hop ones (`Transfer-Encoding` stays: the body is relayed as it came), and
/// `Connection: close` when the client connection ends after it.
pub(super) fn write_response_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &RespHead,
    hdrs: &[Hdr],
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_code(out, head.code);
    out.push(b' ');
    let reason = &buf[head.reason.clone()];
    if reason.is_empty() {
        let canonical = http::StatusCode::from_u16(head.code)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        out.extend_from_slice(canonical.as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
    let conn = head.listed.then_some((buf, hdrs));
    for h in hdrs {
        let name = &buf[h.name.clone()];
        // The body is relayed as it came, so its `Transfer-Encoding` goes with it.
        let relayed = is(name, "transfer-encoding")
            || !((head.coded && is(name, "content-length")) || dropped(name, conn));
        if relayed {
            push_header(out, name, &buf[h.value.clone()]);
        }
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Append a proxy-made plain-text answer.
pub(super) fn write_local(out: &mut Vec<u8>, code: u16, text: &str, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_code(out, code);
    out.push(b' ');
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ");
    push_decimal(out, text.len() as u64);
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(text.as_bytes());
}

/// [`chunked_trailers`] for a chunked answer (`framing`), else the head's outcome.
pub(super) fn trailers(framing: Framing, buf: &[u8], head: Outcome) -> (Outcome, Option<Signals>) {
    match framing {
        Framing::Chunked => chunked_trailers(buf, head),
        _ => (head, None),
    }
}

/// What the trailer section at the end of a chunked answer says (`grpc-status`, a load
/// report, a pushback): `buf` ends with the answer's last bytes, from its `0` size line on (the
/// trailer fields, then the final blank line). The outcome `head` gave becomes a failure when a
/// `grpc-status` trailer fails (lbkit-tower's `trailers_outcome` rule); the trailers' signals
/// are returned as ranges of `buf`. `head` and none when the section does not lie within `buf`
/// (a streamed answer flushed in its middle).
pub(super) fn chunked_trailers(buf: &[u8], head: Outcome) -> (Outcome, Option<Signals>) {
    let Some(signals) = trailer_signals(buf) else {
        return (head, None);
    };
    let outcome = match (head, signals.grpc_failure) {
        (Outcome::Success, Some(kind)) => Outcome::Failure(kind),
        _ => head,
    };
    (outcome, Some(signals))
}

/// The trailer fields at the end of `buf`, read backwards from the final blank line to the
/// last chunk's size line (`0`, with any extension): a field line has a colon, a size line none.
fn trailer_signals(buf: &[u8]) -> Option<Signals> {
    let body = buf.strip_suffix(b"\r\n")?;
    let mut signals = Signals::default();
    let mut end = body.len();
    loop {
        let line_end = end.checked_sub(2).filter(|&e| &body[e..end] == b"\r\n")?;
        let start = body[..line_end]
            .windows(2)
            .rposition(|w| w == b"\r\n")
            .map_or(0, |p| p + 2);
        let line = &body[start..line_end];
        match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let name = line[..colon].trim_ascii();
                signals.note(buf, name, line[colon + 1..].trim_ascii());
            }
            None => return (line.first() == Some(&b'0')).then_some(signals),
        }
        end = start;
    }
}

/// Where a response body ends, fed the bytes as they arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BodyCursor {
    /// Bytes left of a `Content-Length` body.
    Length(u64),
    /// Until the upstream closes.
    Close,
    /// Chunked, in the given state.
    Chunked(Chunk),
    /// The body is complete.
    Done,
}

/// States of the chunked decoder (RFC 9112 §7.1): size line, data, the CRLF after it, the
/// trailer section after the last chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chunk {
    /// Hex digits of the size so far (`digits` of them).
    Size { size: u64, digits: u8 },
    /// A chunk extension, up to the end of the size line.
    Extension { size: u64 },
    /// After the size line's CR.
    SizeLf { size: u64 },
    /// Data bytes left in this chunk.
    Data(u64),
    /// The CR after the data.
    DataCr,
    /// The LF after the data.
    DataLf,
    /// At the start of a trailer line (or the final blank line).
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    /// After a trailer line's CR.
    TrailerLf,
    /// After the final blank line's CR.
    FinalLf,
}

impl BodyCursor {
    pub(super) fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => BodyCursor::Done,
            Framing::Length(n) => BodyCursor::Length(n),
            Framing::Chunked => BodyCursor::Chunked(Chunk::Size { size: 0, digits: 0 }),
            Framing::Close => BodyCursor::Close,
        }
    }

    pub(super) fn done(&self) -> bool {
        *self == BodyCursor::Done
    }

    /// How many bytes of `data` belong to the body (at the front); `Err` on a malformed chunked
    /// stream. The body is complete when [`BodyCursor::done`] says so afterwards.
    pub(super) fn feed(&mut self, data: &[u8]) -> Result<usize, ()> {
        match self {
            BodyCursor::Done => Ok(0),
            BodyCursor::Close => Ok(data.len()),
            BodyCursor::Length(left) => {
                let take = usize::try_from(*left).map_or(data.len(), |l| l.min(data.len()));
                *left -= take as u64;
                if *left == 0 {
                    *self = BodyCursor::Done;
                }
                Ok(take)
            }
            BodyCursor::Chunked(state) => {
                let mut i = 0;
                while i < data.len() {
                    if let Chunk::Data(left) = state {
                        let take = usize::try_from(*left)
                            .map_or(data.len() - i, |l| l.min(data.len() - i));
                        *left -= take as u64;
                        i += take;
                        if *left == 0 {
                            *state = Chunk::DataCr;
                        }
                        continue;
                    }
                    let b = data[i];
                    i += 1;
                    *state = match (*state, b) {
                        (Chunk::Size { size, digits }, _) if b.is_ascii_hexdigit() => {
                            if digits >= 15 {
                                return Err(());
                            }
                            let d = u64::from((b as char).to_digit(16).ok_or(())?);
                            Chunk::Size {
                                size: size * 16 + d,
                                digits: digits + 1,
                            }
                        }
                        (Chunk::Size { digits: 0, .. }, _) => return Err(()),
                        (Chunk::Size { size, .. }, b';' | b' ' | b'\t') => {
                            Chunk::Extension { size }
                        }
                        (Chunk::Size { size, .. } | Chunk::Extension { size }, b'\r') => {
                            Chunk::SizeLf { size }
                        }
                        (Chunk::Extension { .. }, b'\n') => return Err(()),
                        (Chunk::Extension { size }, _) => Chunk::Extension { size },
                        (Chunk::SizeLf { size: 0 }, b'\n') => Chunk::TrailerStart,
                        (Chunk::SizeLf { size }, b'\n') => Chunk::Data(size),
                        (Chunk::DataCr, b'\r') => Chunk::DataLf,
                        (Chunk::DataLf, b'\n') => Chunk::Size { size: 0, digits: 0 },
                        (Chunk::TrailerStart, b'\r') => Chunk::FinalLf,
                        (Chunk::FinalLf, b'\n') => {
                            *self = BodyCursor::Done;
                            return Ok(i);
                        }
                        (Chunk::Trailer, b'\r') => Chunk::TrailerLf,
                        (Chunk::TrailerLf, b'\n') => Chunk::TrailerStart,
                        // Lines end with CRLF only: a bare LF is where a lenient and a strict
                        // parser would disagree on the end of the body.
                        (Chunk::TrailerStart | Chunk::Trailer, b'\n') => return Err(()),
                        (Chunk::TrailerStart | Chunk::Trailer, _) => Chunk::Trailer,
                        _ => return Err(()),
                    };
                }
                Ok(i)
            }
        }
    }
}

/// A hash-key source over a parsed request.
pub(super) struct Source<'a> {
    pub(super) buf: &'a [u8],
    pub(super) hdrs: &'a [Hdr],
    /// The request target as sent (path and query).
    pub(super) target: &'a [u8],
    pub(super) ip: IpAddr,
}

impl KeySource for Source<'_> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.hdrs
            .iter()
            .find(|h| is(&self.buf[h.name.clone()], name))
            .map(|h| &self.buf[h.value.clone()])
    }

    fn target(&self) -> Option<&[u8]> {
        Some(self.target)
    }

    fn source_ip(&self) -> Option<IpAddr> {
        Some(self.ip)
    }
}

/// The request target's path (without the query), as hash keys read it.
pub(super) fn path_of(target: &[u8]) -> &[u8] {
    lbkit_strategy::split_target(target).0
}

/// Case-insensitive header name comparison.
#[inline]
fn is(name: &[u8], want: &str) -> bool {
    name.len() == want.len() && name.eq_ignore_ascii_case(want.as_bytes())
}

/// Headers that say where a message ends (and `Host`): never dropped because a `Connection`
/// header names them, which would let a peer make the proxy and the next hop disagree on where
/// a message ends (request smuggling, response desync).
const FRAMING: [&str; 3] = ["content-length", "transfer-encoding", "host"];

/// A hop-by-hop header, or one named by the message's `Connection` header (`conn`: the buffer
/// and headers to look it up in, when `Connection` names any) unless it frames the message.
fn dropped(name: &[u8], conn: Option<(&[u8], &[Hdr])>) -> bool {
    if HOP_BY_HOP.iter().any(|h| is(name, h)) {
        return true;
    }
    let Some((buf, hdrs)) = conn else {
        return false;
    };
    if FRAMING.iter().any(|f| is(name, f)) {
        return false;
    }
    hdrs.iter()
        .filter(|h| is(&buf[h.name.clone()], "connection"))
        .flat_map(|h| tokens(&buf[h.value.clone()]))
        .any(|t| t.eq_ignore_ascii_case(name))
}

/// The values of every header `name`, joined with `", "`.
fn join(out: &mut Vec<u8>, buf: &[u8], hdrs: &[Hdr], name: &str) {
    let mut first = true;
    for h in hdrs.iter().filter(|h| is(&buf[h.name.clone()], name)) {
        if !first {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(&buf[h.value.clone()]);
        first = false;
    }
}

fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn push_code(out: &mut Vec<u8>, code: u16) {
    let code = code.min(999);
    out.extend_from_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]);
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// A `Content-Length` value: decimal digits only (RFC 9110 §8.6).
fn parse_length(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// The offsets of `part`, a slice of `buf`, within `buf`.
fn offsets(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(buf.as_ptr() as usize);
    start..start + part.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> (ReqHead, Vec<Hdr>) {
        let mut hdrs = Vec::new();
        match parse_request(text.as_bytes(), &mut hdrs, 100) {
            Parsed::Plain(head) => (head, hdrs),
            other => panic!("{other:?} for {text:?}"),
        }
    }

    fn is_other(text: &str) -> bool {
        matches!(
            parse_request(text.as_bytes(), &mut Vec::new(), 100),
            Parsed::Other
        )
    }

    #[test]
    fn plain_requests_parse_into_offsets() {
        let text = "POST /a?b=1 HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nxyz";
        let (head, hdrs) = plain(text);
        let b = text.as_bytes();
        assert_eq!(&b[head.method.clone()], b"POST");
        assert_eq!(&b[head.target.clone()], b"/a?b=1");
        assert_eq!(&b[head.host.clone().unwrap()], b"api.test");
        assert_eq!((head.body, head.close, head.listed), (3, true, false));
        assert_eq!(head.len + head.body, text.len());
        assert_eq!(hdrs.len(), 3);
        assert_eq!(path_of(&b[head.target.clone()]), b"/a");
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: x\r\n", &mut Vec::new(), 100),
            Parsed::Partial
        ));
    }

    #[test]
    fn anything_unusual_goes_to_hyper() {
        for text in [
            "GET / HTTP/1.0\r\nHost: x\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET http://evil.test/ HTTP/1.1\r\nHost: x\r\n\r\n",
            "CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65537\r\n\r\n",
            "GET / HTTP/1.1\r\nHost x\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: content-length\r\nContent-Length: 1\r\n\r\nx",
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Host\r\n\r\n",
        ] {
            assert!(is_other(text), "{text:?}");
        }
        let mut many = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..10 {
            many.push_str(&format!("x-{i}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert!(matches!(
            parse_request(many.as_bytes(), &mut Vec::new(), 10),
            Parsed::Other
        ));
    }

    #[test]
    fn a_chunked_answers_trailers_decide_its_end() {
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let with = format!(
            "{head}7\r\na:b\r\n\r\n\r\n0\r\ngrpc-status: 14\r\n\
             endpoint-load-metrics: TEXT cpu_utilization=0.5\r\n\r\n"
        );
        let (outcome, signals) = chunked_trailers(with.as_bytes(), Outcome::Success);
        assert!(matches!(outcome, Outcome::Failure(_)), "{outcome:?}");
        let (bin, at) = signals.expect("trailers").load.expect("a load report");
        assert_eq!((bin, &with[at]), (false, "TEXT cpu_utilization=0.5"));
        // No trailers, a size line with an extension, an OK status: the head's outcome.
        for end in ["0\r\n\r\n", "0;x=1\r\ngrpc-status: 0\r\n\r\n"] {
            let text = format!("{head}2\r\nhi\r\n{end}");
            let (outcome, signals) = chunked_trailers(text.as_bytes(), Outcome::Success);
            assert_eq!(outcome, Outcome::Success, "{end:?}");
            assert_eq!(signals.and_then(|s| s.load), None, "{end:?}");
        }
        // A pushback in the trailers is the endpoint's.
        let pushed = format!("{head}2\r\nhi\r\n0\r\ngrpc-retry-pushback-ms: 250\r\n\r\n");
        let (_, signals) = chunked_trailers(pushed.as_bytes(), Outcome::Success);
        let stats = EndpointStats::default();
        let (clock, _) = Clock::manual(Timestamp::from_millis(1_000));
        signals
            .unwrap()
            .record_trailers(pushed.as_bytes(), 200, &stats, &clock);
        assert_eq!(
            stats.pushed_back_until(Timestamp::from_millis(1_000)),
            Some(Timestamp::from_millis(1_250))
        );
        // A section that does not lie within the buffer (flushed in its middle): unread.
        let cut = b"grpc-status: 14\r\n\r\n";
        assert_eq!(
            chunked_trailers(cut, Outcome::Success),
            (Outcome::Success, None)
        );
    }

    #[test]
    fn the_deadline_header_is_rewritten_in_place_per_attempt() {
        let text = "GET /x HTTP/1.1\r\nHost: h\r\nX-Request-Timeout: 900\r\nX-Kept: 1\r\n\r\n";
        let (head, hdrs) = plain(text);
        let fwd = ClientAddr::new("127.0.0.1".parse().unwrap());
        let mut out = Vec::new();
        let rewrite = (ForwardedHeaders::NONE, Some("x-request-timeout"));
        let at = write_request(&mut out, text.as_bytes(), &head, &hdrs, &fwd, rewrite).unwrap();
        patch_deadline(&mut out, at, Some(Duration::from_micros(250_900)));
        let written = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            written,
            "GET /x HTTP/1.1\r\nHost: h\r\nX-Kept: 1\r\nx-request-timeout:        250\r\n\r\n"
        );
        // httparse (hyper's parser) reads the value as a server would.
        let mut raw = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut raw);
        req.parse(&out).unwrap();
        let v = req
            .headers
            .iter()
            .find(|h| h.name == "x-request-timeout")
            .unwrap();
        assert_eq!(
            lbkit_core::signal::parse_timeout_ms(v.value),
            Some(Duration::from_millis(250))
        );
        patch_deadline(&mut out, at, None);
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("x-request-timeout: 9999999999\r\n"));
    }

    #[test]
    fn upstream_request_drops_hop_by_hop_and_appends_the_client() {
        let text = "PUT /x HTTP/1.1\r\nHost: api.test\r\nConnection: keep-alive, X-Secret\r\n\
                    X-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Forwarded-For: 10.0.0.1\r\n\
                    Forwarded: for=10.0.0.1\r\nX-Forwarded-For: 10.0.0.2\r\nX-Kept: yes\r\n\
                    Content-Length: 2\r\n\r\nhi";
        let (head, hdrs) = plain(text);
        assert!(head.listed);
        let fwd = ClientAddr::new("127.0.0.1".parse().unwrap());
        let written = |which| {
            let mut out = Vec::new();
            write_request(&mut out, text.as_bytes(), &head, &hdrs, &fwd, (which, None));
            String::from_utf8(out).unwrap()
        };
        let both = ForwardedHeaders::BOTH;
        assert_eq!(
            written(both),
            "PUT /x HTTP/1.1\r\nHost: api.test\r\nX-Kept: yes\r\nContent-Length: 2\r\n\
             x-forwarded-for: 10.0.0.1, 10.0.0.2, 127.0.0.1\r\n\
             forwarded: for=10.0.0.1, for=127.0.0.1;proto=http;host=\"api.test\"\r\n\r\nhi"
        );
        // A header left out of `forwarded_headers` goes on as the client sent it.
        let only_forwarded = ForwardedHeaders {
            x_forwarded_for: false,
            forwarded: true,
        };
        assert_eq!(
            written(only_forwarded),
            "PUT /x HTTP/1.1\r\nHost: api.test\r\nX-Forwarded-For: 10.0.0.1\r\n\
             X-Forwarded-For: 10.0.0.2\r\nX-Kept: yes\r\nContent-Length: 2\r\n\
             forwarded: for=10.0.0.1, for=127.0.0.1;proto=http;host=\"api.test\"\r\n\r\nhi"
        );
        assert_eq!(
            written(ForwardedHeaders::NONE),
            "PUT /x HTTP/1.1\r\nHost: api.test\r\nX-Forwarded-For: 10.0.0.1\r\n\
             Forwarded: for=10.0.0.1\r\nX-Forwarded-For: 10.0.0.2\r\nX-Kept: yes\r\n\
             Content-Length: 2\r\n\r\nhi"
        );
        let v6 = ClientAddr::new("::1".parse().unwrap());
        // A `Host` that is no host never takes the fast path (hyper's engine answers 400).
        assert!(is_other("GET / HTTP/1.1\r\nHost: a\"b\r\n\r\n"));
        let (head, hdrs) = plain("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let mut out = Vec::new();
        write_request(
            &mut out,
            b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
            &head,
            &hdrs,
            &v6,
            (both, None),
        );
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("x-forwarded-for: ::1\r\n"), "{out}");
        assert!(
            out.contains("forwarded: for=\"[::1]\";proto=http;host=\"h\"\r\n"),
            "{out}"
        );
    }

    fn response(text: &str, head_request: bool) -> (RespHead, Vec<Hdr>) {
        let mut hdrs = Vec::new();
        let head = parse_response(text.as_bytes(), &mut hdrs, head_request)
            .unwrap()
            .unwrap();
        (head, hdrs)
    }

    #[test]
    fn response_framing_and_reuse() {
        let (h, _) = response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false);
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(5), true));
        let (h, _) = response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true);
        assert_eq!(h.framing, Framing::Empty);
        let (h, _) = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n",
            false,
        );
        assert_eq!((h.framing, h.coded), (Framing::Chunked, true));
        let (h, _) = response("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false);
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let (h, _) = response("HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let (h, _) = response("HTTP/1.1 204 No Content\r\n\r\n", false);
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        let (h, _) = response(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        assert!(!h.keep_alive);
        let (h, _) = response("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false);
        assert!(!h.keep_alive);
        let mut hdrs = Vec::new();
        let bad = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(parse_response(bad.as_bytes(), &mut hdrs, false).is_err());
        assert!(matches!(
            parse_response(b"HTTP/1.1 200 OK\r\n", &mut hdrs, false),
            Ok(None)
        ));
    }

    /// The head the client gets for the upstream answer `text`.
    fn client_head(text: &str, close: bool) -> String {
        let (h, hdrs) = response(text, false);
        let mut out = Vec::new();
        write_response_head(&mut out, text.as_bytes(), &h, &hdrs, close);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn client_response_head_keeps_the_framing_it_relays() {
        let text =
            "HTTP/1.1 200 \r\nConnection: X-Hop\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\n\
                    Content-Length: 9\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\n\r\n";
        assert_eq!(
            client_head(text, true),
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\nconnection: close\r\n\r\n"
        );
        // An upstream naming its own framing in `Connection` does not lose it.
        let text = "HTTP/1.1 200 OK\r\nConnection: content-length, x-a\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n";
        assert_eq!(
            client_head(text, false),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        );
        let mut out = Vec::new();
        write_local(&mut out, 503, "no endpoint\n", false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
             content-length: 12\r\n\r\nno endpoint\n"
        );
    }

    /// Feed `data` in pieces of `step` bytes; the body's length, or `None` when malformed.
    fn body_len(framing: Framing, data: &[u8], step: usize) -> Option<usize> {
        let mut cursor = BodyCursor::new(framing);
        let mut total = 0;
        for piece in data.chunks(step) {
            let n = cursor.feed(piece).ok()?;
            total += n;
            if cursor.done() {
                return Some(total);
            }
            assert_eq!(n, piece.len());
        }
        cursor.done().then_some(total)
    }

    #[test]
    fn chunked_bodies_end_where_they_end_however_they_arrive() {
        let body =
            b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let mut stream = body.to_vec();
        stream.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        for step in 1..=stream.len() {
            assert_eq!(
                body_len(Framing::Chunked, &stream, step),
                Some(body.len()),
                "{step}"
            );
        }
        assert_eq!(body_len(Framing::Chunked, b"0\r\n\r\n", 1), Some(5));
        assert_eq!(
            body_len(Framing::Chunked, b"3\r\nab", 2),
            None,
            "incomplete"
        );
        for bad in [
            &b"1;a\nb\r\nx\r\n"[..],
            b"0\r\nX-T: 1\n\r\n",
            b"0\r\n\n",
            b"x\r\n",
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"3\nabc\r\n",
            b"1234567890abcdef0\r\n",
        ] {
            assert_eq!(body_len(Framing::Chunked, bad, 1), None, "{bad:?}");
            assert!(
                BodyCursor::new(Framing::Chunked).feed(bad).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(body_len(Framing::Length(4), b"abcdef", 3), Some(4));
        assert_eq!(body_len(Framing::Empty, b"abc", 1), Some(0));
        assert_eq!(body_len(Framing::Close, b"abc", 1), None);
    }
}
