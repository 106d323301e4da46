//! The bytes of format version 1 (the table in the crate docs).

use lbkit_core::{FailureKind, Outcome};
use serde::Serialize;

/// The first 8 bytes of every segment.
pub const MAGIC: &[u8; 8] = b"LBKTRACE";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Header length.
pub(crate) const HEADER_LEN: usize = 16;
pub(crate) const KIND_STREAM: u8 = 1;
pub(crate) const KIND_ENDPOINT: u8 = 2;
pub(crate) const KIND_ATTEMPT: u8 = 3;
/// An attempt record's length, its kind byte included.
pub(crate) const ATTEMPT_LEN: usize = 41;
pub(crate) const FLAG_RETRY: u8 = 1;
pub(crate) const FLAG_HEDGE: u8 = 2;

/// How an attempt ended, as a trace stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceOutcome {
    /// An answer that is not the endpoint's failure.
    Success,
    /// Could not connect (nothing was sent).
    Connect,
    /// No answer in time.
    Timeout,
    /// The server answered with an error.
    Server,
    /// Any other failure.
    Other,
    /// The caller gave up.
    Cancelled,
}

// === impl TraceOutcome ===

impl TraceOutcome {
    /// The byte stored.
    pub fn code(self) -> u8 {
        match self {
            TraceOutcome::Success => 0,
            TraceOutcome::Connect => 1,
            TraceOutcome::Timeout => 2,
            TraceOutcome::Server => 3,
            TraceOutcome::Other => 4,
            TraceOutcome::Cancelled => 5,
        }
    }

    /// The outcome stored as `code`, if it is one.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => TraceOutcome::Success,
            1 => TraceOutcome::Connect,
            2 => TraceOutcome::Timeout,
            3 => TraceOutcome::Server,
            4 => TraceOutcome::Other,
            5 => TraceOutcome::Cancelled,
            _ => return None,
        })
    }

    /// Whether the attempt counts as the endpoint's failure.
    pub fn is_failure(self) -> bool {
        !matches!(self, TraceOutcome::Success | TraceOutcome::Cancelled)
    }
}

impl From<Outcome> for TraceOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Success => TraceOutcome::Success,
            Outcome::Cancelled => TraceOutcome::Cancelled,
            Outcome::Failure(FailureKind::Connect) => TraceOutcome::Connect,
            Outcome::Failure(FailureKind::Timeout) => TraceOutcome::Timeout,
            Outcome::Failure(FailureKind::Server) => TraceOutcome::Server,
            Outcome::Failure(_) => TraceOutcome::Other,
        }
    }
}

/// The segment header.
pub(crate) fn header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Append `text` as a `u16` length and its bytes, cut at a character boundary to fit.
pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(usize::from(u16::MAX));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

/// One attempt's fields, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawAttempt {
    pub(crate) picked_at_ns: u64,
    pub(crate) latency_ns: u64,
    pub(crate) request: u64,
    pub(crate) stream: u32,
    pub(crate) endpoint: u32,
    pub(crate) in_flight: u32,
    pub(crate) attempt: u16,
    pub(crate) outcome: u8,
    pub(crate) flags: u8,
}

impl RawAttempt {
    pub(crate) fn put(&self, out: &mut Vec<u8>) {
        out.push(KIND_ATTEMPT);
        out.extend_from_slice(&self.picked_at_ns.to_le_bytes());
        out.extend_from_slice(&self.latency_ns.to_le_bytes());
        out.extend_from_slice(&self.request.to_le_bytes());
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.extend_from_slice(&self.endpoint.to_le_bytes());
        out.extend_from_slice(&self.in_flight.to_le_bytes());
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.push(self.outcome);
        out.push(self.flags);
    }

    /// Parse the 40 bytes after the kind byte.
    pub(crate) fn get(b: &[u8; ATTEMPT_LEN - 1]) -> Self {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let u32_at = |i: usize| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[i..i + 4]);
            u32::from_le_bytes(a)
        };
        RawAttempt {
            picked_at_ns: u64_at(0),
            latency_ns: u64_at(8),
            request: u64_at(16),
            stream: u32_at(24),
            endpoint: u32_at(28),
            in_flight: u32_at(32),
            attempt: u16::from_le_bytes([b[36], b[37]]),
            outcome: b[38],
            flags: b[39],
        }
    }
}
