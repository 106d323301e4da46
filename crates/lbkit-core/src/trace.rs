//! Sampled call traces: which attempts of which requests went where, with what result — the
//! raw material for replaying real traffic under other strategies (`lbkit sim --trace`).
//!
//! A [`Tracer`] is attached to a [`Balancer`](crate::Balancer) with
//! [`with_tracer`](crate::Balancer::with_tracer). At a request's first pick it decides, with the
//! caller's random source, whether the request is sampled; the decision travels in
//! [`PickContext::trace`] and [`CallGuard::trace_id`](crate::CallGuard::trace_id) to every
//! retry ([`Attempts`](crate::Attempts) carries it), so a sampled request has all its attempts
//! in the trace. A sampled attempt's guard hands an [`AttemptRecord`] to the tracer's
//! [`TraceSink`] when it finishes (or is dropped unfinished: a cancellation).
//!
//! The hot path stays what it was for requests that are not sampled: one random draw at the
//! first pick. A sampled attempt adds a reference-count increment, one relaxed load (the
//! endpoint's calls in flight) and the sink's `record`, which must not block (lbkit-trace's
//! recorder pushes into a bounded lock-free queue and drops the record when it is full).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use lbkit_core::*;
//! use lbkit_core::trace::{AttemptRecord, TraceSink, Tracer};
//!
//! #[derive(Default)]
//! struct Keep(Mutex<Vec<(u64, u32)>>);
//! impl TraceSink for Keep {
//!     fn register(&self, _service: &str, _strategy: &str, _sample_rate: f64) -> u32 { 7 }
//!     fn record(&self, r: AttemptRecord) { self.0.lock().unwrap().push((r.request, r.stream)); }
//! }
//! # struct First; struct FirstPicker(EndpointIdx);
//! # impl Picker for FirstPicker { fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0) } }
//! # impl Strategy for First { type Picker = FirstPicker; fn name(&self) -> &str { "first" }
//! #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> FirstPicker { FirstPicker(s.eligible()[0]) } }
//! let now = Timestamp::from_millis(1_000);
//! let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("a:1")], now));
//! let sink = Arc::new(Keep::default());
//! let balancer = Balancer::new(First, snap, now).with_tracer(sink.clone(), "shop", 1.0);
//! let mut rng = FastRng::seed_from_u64(1);
//! let guard = balancer.pick(&mut PickContext::new(now, &mut rng)).unwrap();
//! assert!(guard.trace_id().is_sampled());
//! guard.finish_at(Outcome::Success, now);
//! assert_eq!(sink.0.lock().unwrap().len(), 1);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::stats::Outcome;
use crate::strategy::PickContext;
use crate::time::Timestamp;
pub use crate::trace_id::TraceId;

/// One finished attempt of a sampled request.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    /// The stream ([`TraceSink::register`]: service and strategy) it belongs to.
    pub stream: u32,
    /// The request's id: every attempt of one request has the same.
    pub request: u64,
    /// The endpoint the attempt went to.
    pub endpoint: Endpoint,
    /// When it was picked.
    pub picked_at: Timestamp,
    /// When it finished.
    pub finished_at: Timestamp,
    /// Calls in flight on the endpoint when it was picked, this one not counted.
    pub in_flight: u32,
    /// 0 for the first attempt; retries count up.
    pub attempt: u32,
    /// Sent while an earlier attempt of the request was still open (a hedge or a fork).
    pub hedge: bool,
    /// Its outcome, as recorded against the endpoint.
    pub outcome: Outcome,
}

/// Where sampled attempts go. `record` is called on the call path: it must not block, lock or
/// do I/O (hand the record to another thread, or drop it).
pub trait TraceSink: Send + Sync + 'static {
    /// A service and the strategy balancing it start recording `sample_rate` of the requests:
    /// the id their records carry. Called once per [`Tracer`], at setup.
    fn register(&self, service: &str, strategy: &str, sample_rate: f64) -> u32;
    /// One finished attempt.
    fn record(&self, record: AttemptRecord);
}

/// Decides which requests are sampled, and taps their attempts' guards. One per balancer.
pub struct Tracer {
    sink: Arc<dyn TraceSink>,
    stream: u32,
    /// A request is sampled when a random `u64` is below this (`u64::MAX`: every request).
    threshold: u64,
}

// === impl Tracer ===

impl Tracer {
    /// Sample `sample_rate` of the requests to `service` (clamped to `0..=1`), balanced by
    /// `strategy`, into `sink`.
    pub fn new(sink: Arc<dyn TraceSink>, service: &str, strategy: &str, sample_rate: f64) -> Self {
        let rate = if sample_rate.is_nan() {
            0.0
        } else {
            sample_rate.clamp(0.0, 1.0)
        };
        let stream = sink.register(service, strategy, rate);
        let threshold = if rate >= 1.0 {
            u64::MAX
        } else {
            (rate * u64::MAX as f64) as u64
        };
        Tracer {
            sink,
            stream,
            threshold,
        }
    }

    /// The stream id its records carry.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The request's decision: the one `cx` carries, else a new one drawn from `cx.rng`
    /// (written back into `cx`).
    #[inline]
    pub(crate) fn decide(&self, cx: &mut PickContext<'_>) -> TraceId {
        if cx.trace == TraceId::UNDECIDED {
            let draw = cx.rng.next_u64();
            cx.trace = if self.threshold == u64::MAX || draw < self.threshold {
                TraceId::sampled(cx.rng.next_u64())
            } else {
                TraceId::OFF
            };
        }
        cx.trace
    }
}

impl fmt::Debug for Tracer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracer")
            .field("stream", &self.stream)
            .field("threshold", &self.threshold)
            .finish_non_exhaustive()
    }
}

/// What a sampled attempt's guard keeps to make its record.
pub(crate) struct Tap {
    pub(crate) tracer: Arc<Tracer>,
    pub(crate) request: u64,
    pub(crate) in_flight: u32,
    pub(crate) attempt: u32,
    pub(crate) hedge: bool,
}

// === impl Tap ===

impl Tap {
    /// Hand the finished attempt to the sink.
    pub(crate) fn record(
        self,
        endpoint: &Endpoint,
        picked_at: Timestamp,
        finished_at: Timestamp,
        outcome: Outcome,
    ) {
        self.tracer.sink.record(AttemptRecord {
            stream: self.tracer.stream,
            request: self.request,
            endpoint: endpoint.clone(),
            picked_at,
            finished_at,
            in_flight: self.in_flight,
            attempt: self.attempt,
            hedge: self.hedge,
            outcome,
        });
    }
}
