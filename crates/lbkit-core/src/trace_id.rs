//! [`TraceId`]: a request's tracing decision, a leaf module (the pick context carries it, the
//! tracer makes it; re-exported as `lbkit_core::trace::TraceId`).

/// A request's tracing decision: not made yet, not sampled, or sampled with a request id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TraceId(u64);

// === impl TraceId ===

impl TraceId {
    /// No decision yet (a first attempt).
    pub const UNDECIDED: TraceId = TraceId(0);
    /// Decided: the request is not sampled.
    pub const OFF: TraceId = TraceId(1);

    /// A sampled request's id (made odd-free of the two reserved values).
    pub fn sampled(request: u64) -> TraceId {
        TraceId(request.max(2))
    }

    /// Whether the request is sampled.
    #[inline]
    pub fn is_sampled(self) -> bool {
        self.0 > 1
    }

    /// The request id, when sampled.
    pub fn request(self) -> Option<u64> {
        self.is_sampled().then_some(self.0)
    }
}
