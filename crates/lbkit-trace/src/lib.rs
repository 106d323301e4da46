//! # lbkit-trace
//!
//! Sampled traces of real calls, so that `lbkit sim --trace` can replay them under other
//! strategies. The [`Recorder`] is a [`TraceSink`](lbkit_core::trace::TraceSink) for a
//! [`Balancer`](lbkit_core::Balancer)'s tracer (lbkit-tower's `BalanceLayer::trace` and the
//! proxy's `[service.NAME.trace]` table attach one); [`read`] gives the records back, and
//! `lbkit trace print FILE` prints them as JSON lines.
//!
//! # Bounds
//! - **Memory**: the call path pushes each record into a lock-free queue of
//!   [`QUEUE_CAPACITY`] records (about 1.5 MB); when the writer falls behind, records are
//!   dropped and counted ([`RecorderStats::dropped`]), never waited for.
//! - **Disk**: at most `max_bytes` over the trace's two files: `PATH`, the segment being
//!   written, and `PATH.1`, the one before it. When `PATH` would pass `max_bytes / 2` it becomes
//!   `PATH.1` (replacing the older one) and a new `PATH` starts. Opening a recorder starts a new
//!   segment the same way, so the previous run's last segment is kept.
//! - **Time**: a writer thread drains the queue every [`DRAIN_PERIOD`] and on
//!   [`Recorder::flush`]; the call path never does I/O.
//!
//! # Format, version 1
//! Every integer is little-endian. A segment is a header, then records; a definition comes
//! before the first record that uses it, within each segment (a segment is readable alone).
//!
//! | part | bytes |
//! |---|---|
//! | header | `LBKTRACE` (8), version `u16` = 1, 6 zero bytes (16 in all) |
//! | stream definition | kind `u8` = 1, id `u32`, service (`u16` length + UTF-8), strategy (`u16` length + UTF-8), sample rate `f64` (the share of requests recorded) |
//! | endpoint definition | kind `u8` = 2, id `u32`, address (`u16` length + UTF-8) |
//! | attempt | kind `u8` = 3, picked at `u64` (ns since the Unix epoch), latency `u64` (ns), request `u64`, stream `u32`, endpoint `u32`, in flight at pick `u32`, attempt `u16` (0 = first), outcome `u8`, flags `u8` (41 in all) |
//!
//! Outcomes: 0 success, 1 connect failure, 2 timeout, 3 server failure, 4 other failure,
//! 5 cancelled. Flags: bit 0 retry (attempt > 0), bit 1 hedge (sent while an earlier attempt was
//! still open). A reader refuses another version by name; a segment cut short (the process
//! died mid-write) keeps every whole record and says so ([`Trace::truncated`]).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::*;
//! use lbkit_trace::{read, Recorder, TraceConfig};
//! # struct First; struct FirstPicker(EndpointIdx);
//! # impl Picker for FirstPicker { fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0) } }
//! # impl Strategy for First { type Picker = FirstPicker; fn name(&self) -> &str { "first" }
//! #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstPicker { FirstPicker(s.eligible()[0]) } }
//! let dir = tempfile::Builder::new().prefix("lbkit-trace-doc-").tempdir().unwrap();
//! let config = TraceConfig::new(dir.path().join("calls.lbkt")).with_sample_rate(1.0);
//! let recorder = Recorder::open(&config).unwrap();
//!
//! let now = Timestamp::from_millis(1_000);
//! let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("10.0.0.1:80")], now));
//! let balancer = Balancer::new(First, snap, now).with_tracer(recorder.sink(), "shop", 1.0);
//! let mut rng = FastRng::seed_from_u64(1);
//! let guard = balancer.pick(&mut PickContext::new(now, &mut rng)).unwrap();
//! guard.finish_at(Outcome::Success, Timestamp::from_millis(1_012));
//!
//! recorder.flush();
//! let trace = read(&config.path).unwrap();
//! assert_eq!(trace.records.len(), 1);
//! let r = &trace.records[0];
//! assert_eq!((&*r.service, &*r.strategy, &*r.endpoint), ("shop", "first", "10.0.0.1:80"));
//! assert_eq!(r.latency_ns, 12_000_000);
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod format;
mod reader;
mod recorder;

pub use format::{TraceOutcome, FORMAT_VERSION, MAGIC};
pub use reader::{parse_segment, read, read_segment, Record, Trace};
pub use recorder::{
    Recorder, RecorderStats, TraceConfig, DRAIN_PERIOD, MAX_MAX_BYTES, MIN_MAX_BYTES,
    QUEUE_CAPACITY,
};

use std::path::{Path, PathBuf};

/// What can go wrong with a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A configuration value is out of range.
    #[error("trace {field}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not a trace, or not one this version reads.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the byte offset.
        reason: String,
    },
}

impl TraceError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        TraceError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// The older segment of the trace at `path`: `PATH.1`.
pub fn previous_segment(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}
