//! Reading a trace back: both segments, oldest first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::format::{
    RawAttempt, TraceOutcome, ATTEMPT_LEN, FLAG_HEDGE, FORMAT_VERSION, HEADER_LEN, KIND_ATTEMPT,
    KIND_ENDPOINT, KIND_STREAM, MAGIC,
};
use crate::{previous_segment, TraceError};

/// One recorded attempt.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Record {
    /// When it was picked, ns since the Unix epoch.
    pub picked_at_ns: u64,
    /// How long it took, ns.
    pub latency_ns: u64,
    /// The request it belongs to (every attempt of a request has the same id).
    pub request: u64,
    /// The service called.
    pub service: Arc<str>,
    /// The strategy that picked.
    pub strategy: Arc<str>,
    /// The endpoint's address.
    pub endpoint: Arc<str>,
    /// The share of requests the recorder sampled (1 in `1 / sample_rate` requests is here).
    pub sample_rate: f64,
    /// Calls in flight on the endpoint when it was picked, this one not counted.
    pub in_flight: u32,
    /// 0 for the first attempt.
    pub attempt: u16,
    /// How it ended.
    pub outcome: TraceOutcome,
    /// A retry (attempt > 0).
    pub retry: bool,
    /// Sent while an earlier attempt was still open.
    pub hedge: bool,
}

/// A whole trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Every attempt, in the order written (oldest segment first; within one, in the order
    /// attempts finished).
    pub records: Vec<Record>,
    /// Segments read (1 or 2).
    pub segments: usize,
    /// A segment ended inside a record (the writer stopped mid-write): the records before it
    /// are kept.
    pub truncated: bool,
}

/// Read the trace at `path`: `PATH.1` (when present) then `PATH`.
///
/// # Errors
/// `PATH` cannot be read; a segment is not a trace or has another version; a record refers to
/// a definition the segment does not have.
pub fn read(path: &Path) -> Result<Trace, TraceError> {
    let mut trace = Trace::default();
    let older = previous_segment(path);
    if older.is_file() {
        read_into(&older, &mut trace)?;
    }
    read_into(path, &mut trace)?;
    Ok(trace)
}

/// Read one segment file alone.
///
/// # Errors
/// As [`read`].
pub fn read_segment(path: &Path) -> Result<Trace, TraceError> {
    let mut trace = Trace::default();
    read_into(path, &mut trace)?;
    Ok(trace)
}

/// Parse one segment's bytes; `name` names it in errors.
///
/// # Errors
/// As [`read`], except I/O.
pub fn parse_segment(bytes: &[u8], name: &Path) -> Result<Trace, TraceError> {
    let mut trace = Trace::default();
    parse_into(bytes, name, &mut trace)?;
    Ok(trace)
}

fn read_into(path: &Path, trace: &mut Trace) -> Result<(), TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    parse_into(&bytes, path, trace)
}

fn parse_into(bytes: &[u8], path: &Path, trace: &mut Trace) -> Result<(), TraceError> {
    let mut seg = SegmentReader {
        path: path.to_owned(),
        bytes,
        at: 0,
        streams: HashMap::new(),
        endpoints: HashMap::new(),
        pending_error: None,
    };
    seg.header()?;
    trace.segments += 1;
    loop {
        match seg.record() {
            Ok(Some(r)) => trace.records.push(r),
            Ok(None) => return seg.pending_error.take().map_or(Ok(()), Err),
            Err(Cut) => {
                trace.truncated = true;
                return Ok(());
            }
        }
    }
}

/// The segment ended inside a record.
struct Cut;

struct SegmentReader<'a> {
    path: PathBuf,
    bytes: &'a [u8],
    at: usize,
    streams: HashMap<u32, (Arc<str>, Arc<str>, f64)>,
    endpoints: HashMap<u32, Arc<str>>,
    /// A malformed record ended the segment.
    pending_error: Option<TraceError>,
}

impl SegmentReader<'_> {
    fn format_error(&self, reason: String) -> TraceError {
        TraceError::Format {
            path: self.path.clone(),
            reason,
        }
    }

    fn header(&mut self) -> Result<(), TraceError> {
        if self.bytes.len() < HEADER_LEN || &self.bytes[..8] != MAGIC {
            return Err(self.format_error("not an lbkit trace (no LBKTRACE header)".into()));
        }
        let version = u16::from_le_bytes([self.bytes[8], self.bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(self.format_error(format!(
                "trace format version {version}; this lbkit reads version {FORMAT_VERSION}"
            )));
        }
        self.at = HEADER_LEN;
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Cut> {
        let end = self.at.checked_add(n).ok_or(Cut)?;
        let b = self.bytes.get(self.at..end).ok_or(Cut)?;
        self.at = end;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, Cut> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn text(&mut self) -> Result<Result<Arc<str>, String>, Cut> {
        let b = self.take(2)?;
        let n = usize::from(u16::from_le_bytes([b[0], b[1]]));
        let at = self.at;
        let b = self.take(n)?;
        Ok(std::str::from_utf8(b)
            .map(Arc::from)
            .map_err(|_| format!("byte {at}: a name is not UTF-8")))
    }

    /// The next attempt, past any definitions; `None` at the end.
    fn record(&mut self) -> Result<Option<Record>, Cut> {
        loop {
            let Some(&kind) = self.bytes.get(self.at) else {
                return Ok(None);
            };
            let start = self.at;
            self.at += 1;
            let read = match kind {
                KIND_STREAM => self.define_stream()?.map(|()| None),
                KIND_ENDPOINT => self.define_endpoint()?.map(|()| None),
                KIND_ATTEMPT => self.attempt(start)?.map(Some),
                other => Err(format!("byte {start}: unknown record kind {other}")),
            };
            match read {
                Ok(None) => continue,
                Ok(Some(record)) => return Ok(Some(record)),
                Err(e) => return self.fail(e),
            }
        }
    }

    /// A stream's definition (its id, service, strategy and sample rate), past its kind byte;
    /// `Err` inside for a malformed one.
    fn define_stream(&mut self) -> Result<Result<(), String>, Cut> {
        let id = self.u32()?;
        let service = self.text()?;
        let strategy = self.text()?;
        let b = self.take(8)?;
        let mut rate = [0u8; 8];
        rate.copy_from_slice(b);
        let rate = f64::from_le_bytes(rate);
        Ok(match (service, strategy) {
            (Ok(a), Ok(b)) => {
                self.streams.insert(id, (a, b, rate));
                Ok(())
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        })
    }

    /// An endpoint's definition (its id and address), past its kind byte; `Err` inside for a
    /// malformed one.
    fn define_endpoint(&mut self) -> Result<Result<(), String>, Cut> {
        let id = self.u32()?;
        Ok(self.text()?.map(|a| {
            self.endpoints.insert(id, a);
        }))
    }

    /// An attempt starting at byte `start`, past its kind byte, with its stream's and
    /// endpoint's definitions; `Err` inside for a malformed one or one defined nowhere before.
    fn attempt(&mut self, start: usize) -> Result<Result<Record, String>, Cut> {
        let b = self.take(ATTEMPT_LEN - 1)?;
        let mut fixed = [0u8; ATTEMPT_LEN - 1];
        fixed.copy_from_slice(b);
        let raw = RawAttempt::get(&fixed);
        let Some((service, strategy, sample_rate)) = self.streams.get(&raw.stream).cloned() else {
            let stream = raw.stream;
            return Ok(Err(format!(
                "byte {start}: attempt of stream {stream} before its definition"
            )));
        };
        let Some(endpoint) = self.endpoints.get(&raw.endpoint).cloned() else {
            let endpoint = raw.endpoint;
            return Ok(Err(format!(
                "byte {start}: attempt to endpoint {endpoint} before its definition"
            )));
        };
        let Some(outcome) = TraceOutcome::from_code(raw.outcome) else {
            return Ok(Err(format!(
                "byte {start}: unknown outcome {}",
                raw.outcome
            )));
        };
        Ok(Ok(Record {
            picked_at_ns: raw.picked_at_ns,
            latency_ns: raw.latency_ns,
            request: raw.request,
            service,
            strategy,
            endpoint,
            sample_rate,
            in_flight: raw.in_flight,
            attempt: raw.attempt,
            outcome,
            retry: raw.attempt > 0,
            hedge: raw.flags & FLAG_HEDGE != 0,
        }))
    }

    /// Stop at a malformed record: reported as an error by `read_into`.
    fn fail(&mut self, reason: String) -> Result<Option<Record>, Cut> {
        self.pending_error = Some(self.format_error(reason));
        self.at = self.bytes.len();
        Ok(None)
    }
}
