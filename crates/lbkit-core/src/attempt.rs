//! [`Attempts`]: the rules of one call's attempts, in one place, for every driver — the tower
//! layer, both engines of the proxy, its TCP relay.
//!
//! A driver does the I/O; this state machine decides. It owns the set of endpoints tried, the
//! attempt count, the idempotency rule, the retry budget (one deposit per call, one withdrawal
//! per retry), the per-attempt deadline inside the call's overall deadline, and the decision
//! after each attempt: retry on an endpoint not tried yet, or answer. It is synchronous, reads
//! the clock only when a decision needs it, and never allocates.
//!
//! ```text
//! let mut call = Attempts::start(policy, budget, idempotent, replayable, now);
//! loop {
//!     let guard = call.pick(&balancer, now, route, rng)?;    // an untried endpoint (route: hash key, tag)
//!     let result = do_io(guard.endpoint(), call.timeout(now)).await;
//!     let c = Observed::from(result).classify();             // the table below
//!     guard.finish(c.outcome);
//!     match call.after(c, budget, &clock) { Next::Retry => continue, Next::Answer(_) => break }
//! }
//! ```
//!
//! # What each result means
//!
//! | what the driver saw ([`Observed`]) | recorded against the endpoint | retried on an untried endpoint when |
//! |---|---|---|
//! | connect refused, unreachable, connect timeout ([`ConnectFailed`](Observed::ConnectFailed)) | `Failure(Connect)` | always (nothing was sent) |
//! | reset, close or malformed answer before any response byte reached the client ([`ResetBeforeResponse`](Observed::ResetBeforeResponse)) | `Failure(Other)` | the request is idempotent |
//! | reset after part of the answer reached the client ([`ResetAfterResponse`](Observed::ResetAfterResponse)) | `Failure(Other)` | never (the client has part of an answer) |
//! | no answer within the attempt's deadline ([`Timeout`](Observed::Timeout)) | `Failure(Timeout)` | idempotent, and the overall deadline has time left |
//! | `502`, `503`, other `5xx` ([`Status`](Observed::Status)) | `Failure(Server)` | idempotent |
//! | `504` | `Failure(Timeout)` (the upstream's own upstream timed out) | idempotent |
//! | `429` | nothing: `Success` (a rate limit may be the client's own; it must not get a healthy endpoint ejected) | never (a retry spends the budget against the same limit; Envoy, gRPC and linkerd do not retry it by default) |
//! | any other status (`1xx`–`4xx`) | `Success` (an answer, not the endpoint's fault) | never |
//! | the client went away or its request broke ([`ClientGone`](Observed::ClientGone)) | `Cancelled` (not the endpoint's failure) | never |
//!
//! Every retry further needs: attempts left (`retries` after the first), a copy of the request
//! (`replayable`), an endpoint not tried yet, time left before the overall deadline (the
//! route's, cut to the caller's own: [`Attempts::limit`]), a pushback it can wait out
//! ([`Attempts::pushed_back`]: the retry waits [`Attempts::retry_wait`] first), and a
//! withdrawal from the retry budget. A pooled connection that the upstream had closed before it
//! accepted the request is a transport matter, not an attempt: drivers send once more on a new
//! connection to the same endpoint without charging it (hyper's client does the same).
//!
//! Typed services (gRPC, RPC clients) classify their own results with
//! [`Classified::answer`] and [`Classified::error`], which follow the same rows.

use std::time::Duration;

use crate::balancer::{Balancer, CallGuard};
use crate::budget::RetryBudget;
use crate::error::PickError;
use crate::rng::FastRng;
use crate::route::Route;
use crate::signal::{Pushback, MAX_RETRY_WAIT};
use crate::stats::{FailureKind, Outcome};
use crate::strategy::{PickContext, Strategy, TriedSet};
use crate::time::{duration_nanos, Clock, Timestamp};
use crate::trace::TraceId;

/// A retry budget as the call path sees it: every call that may be retried deposits once,
/// every retry withdraws.
/// [`RetryBudget`] is lbkit's lock-free one; the tower layer adapts tower's `Budget` trait.
pub trait Budget: Send + Sync {
    /// A call started at `now`.
    fn deposit(&self, now: Timestamp);
    /// Take one retry at `now`; `false` when the budget is spent.
    fn withdraw(&self, now: Timestamp) -> bool;
}

impl Budget for RetryBudget {
    #[inline]
    fn deposit(&self, now: Timestamp) {
        RetryBudget::deposit(self, now);
    }

    #[inline]
    fn withdraw(&self, now: Timestamp) -> bool {
        RetryBudget::withdraw(self, now)
    }
}

/// [`Attempts::pushback_ms`]: no pushback (a zero wait is none).
const NO_PUSHBACK: u32 = 0;
/// [`Attempts::pushback_ms`]: the answer asked for no retry.
const STOP_PUSHBACK: u32 = u32::MAX;

/// How many attempts a call may make and how long each may take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttemptPolicy {
    /// Attempts after the first (Dubbo's `retries`, Envoy's `num_retries`).
    pub retries: u32,
    /// Longest wait for one attempt's answer (Envoy's `per_try_timeout`); `None`: only the
    /// overall deadline.
    pub per_try: Option<Duration>,
    /// Longest wait for the whole call, retries included (Envoy's route `timeout`); `None`:
    /// no overall deadline.
    pub overall: Option<Duration>,
}

impl AttemptPolicy {
    /// The policy with its overall deadline cut to `deadline` when that is sooner (the
    /// caller's own: [`Attempts::limit`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::AttemptPolicy;
    /// let p = AttemptPolicy { retries: 1, per_try: None, overall: Some(Duration::from_secs(5)) };
    /// assert_eq!(p.cut_to(Duration::from_secs(1)).overall, Some(Duration::from_secs(1)));
    /// assert_eq!(p.cut_to(Duration::from_secs(9)).overall, Some(Duration::from_secs(5)));
    /// ```
    pub fn cut_to(mut self, deadline: Duration) -> Self {
        let overall = self.overall.map_or(deadline, |o| o.min(deadline));
        self.overall = Some(overall);
        self
    }

    /// The first attempt's limit: the shorter of `per_try` and `overall` (what
    /// [`Attempts::timeout`] gives at the start).
    pub fn first_timeout(&self) -> Option<Duration> {
        match (self.per_try, self.overall) {
            (Some(p), Some(o)) => Some(p.min(o)),
            (p, o) => p.or(o),
        }
    }
}

/// Most retries a call may make: every attempt goes to an endpoint not tried yet, and a call
/// remembers 16 of them ([`TriedSet::CAPACITY`](crate::TriedSet::CAPACITY)). Every config
/// (the service config's `call.retries`, `lbkit proxy`'s `retries`) holds to it.
pub const MAX_RETRIES: u32 = crate::TriedSet::CAPACITY as u32 - 1;

/// A service's call settings as configured: each one unset leaves the driver's own. What
/// `lbkit::config` resolves a service's `call` table to, and what lbkit-tower's
/// `BalanceLayer::call_policy` applies (`lbkit proxy` has the same settings in its own file).
///
/// ```
/// use std::time::Duration;
/// use lbkit_core::{CallPolicy, HedgeDelay};
/// let p = CallPolicy {
///     retries: Some(1),
///     overall: Some(Duration::from_millis(800)),
///     hedge: HedgeDelay::parse("p95"),
///     ..CallPolicy::default()
/// };
/// assert_eq!(p.per_try, None);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallPolicy {
    /// Attempts after the first ([`AttemptPolicy::retries`]).
    pub retries: Option<u32>,
    /// One attempt's limit ([`AttemptPolicy::per_try`]).
    pub per_try: Option<Duration>,
    /// The whole call's limit, retries and hedges included ([`AttemptPolicy::overall`]).
    pub overall: Option<Duration>,
    /// When to hedge idempotent calls ([`HedgeDelay`](crate::HedgeDelay)).
    pub hedge: Option<crate::HedgeDelay>,
    /// The request header carrying the caller's deadline in whole milliseconds (HTTP;
    /// `grpc-timeout` is always read).
    pub deadline_header: Option<String>,
}

/// When a failed attempt may be sent again elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryWhen {
    /// Never (an answer, or nothing left to retry).
    Never,
    /// When the request is idempotent (it may have reached the server).
    Idempotent,
    /// Always: the request certainly never reached the server.
    Always,
}

/// What one attempt's result means: what the endpoint's statistics record, and whether it may
/// be retried. Made by [`Observed::classify`] (the table in the module docs of
/// `crates/lbkit-core/src/attempt.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    /// Recorded against the endpoint (`guard.finish(outcome)`).
    pub outcome: Outcome,
    /// Whether another endpoint may get the request.
    pub retry: RetryWhen,
}

// === impl Classified ===

impl Classified {
    /// An answer classified by its protocol as `outcome` (a gRPC status, an RPC result): a
    /// failure is retried when the request is idempotent, anything else is final.
    pub const fn answer(outcome: Outcome) -> Self {
        let retry = match outcome {
            Outcome::Failure(_) => RetryWhen::Idempotent,
            _ => RetryWhen::Never,
        };
        Classified { outcome, retry }
    }

    /// An error classified as `outcome`; `reached`: whether the request may have reached the
    /// server (`Some(false)` only when it certainly did not, e.g. a refused connection).
    pub const fn error(outcome: Outcome, reached: Option<bool>) -> Self {
        let retry = match (outcome, reached) {
            (Outcome::Failure(_), Some(false)) => RetryWhen::Always,
            (Outcome::Failure(_), _) => RetryWhen::Idempotent,
            _ => RetryWhen::Never,
        };
        Classified { outcome, retry }
    }

    /// Whether the endpoint is charged with a failure.
    pub const fn is_failure(&self) -> bool {
        matches!(self.outcome, Outcome::Failure(_))
    }
}

/// What a driver saw of one attempt; [`classify`](Observed::classify) gives its meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The connection could not be made (refused, unreachable, connect timeout): nothing was
    /// sent.
    ConnectFailed,
    /// The connection was reset or closed, or the answer was malformed, before any byte of a
    /// response reached the client.
    ResetBeforeResponse,
    /// The connection broke after part of the answer had reached the client.
    ResetAfterResponse,
    /// No answer within the attempt's deadline.
    Timeout,
    /// An HTTP answer with this status code.
    Status(u16),
    /// A call without status codes (a TCP relay) ended normally.
    Done,
    /// The client went away, or its request (an upload) broke: not the endpoint's doing.
    ClientGone,
}

// === impl Observed ===

impl Observed {
    /// The table of the module docs (`crates/lbkit-core/src/attempt.rs`): what the endpoint is
    /// charged with, and when the request may go to another endpoint.
    pub const fn classify(self) -> Classified {
        use RetryWhen::*;
        let (outcome, retry) = match self {
            Observed::ConnectFailed => (Outcome::Failure(FailureKind::Connect), Always),
            Observed::ResetBeforeResponse => (Outcome::Failure(FailureKind::Other), Idempotent),
            Observed::ResetAfterResponse => (Outcome::Failure(FailureKind::Other), Never),
            Observed::Timeout => (Outcome::Failure(FailureKind::Timeout), Idempotent),
            Observed::Status(code) => match status_failure(code) {
                Some(kind) => (Outcome::Failure(kind), Idempotent),
                None => (Outcome::Success, Never),
            },
            Observed::Done => (Outcome::Success, Never),
            Observed::ClientGone => (Outcome::Cancelled, Never),
        };
        Classified { outcome, retry }
    }
}

/// The failure an HTTP status stands for: `504` a timeout, any other `5xx` a server failure,
/// everything else (`429` included) none.
pub const fn status_failure(code: u16) -> Option<FailureKind> {
    match code {
        504 => Some(FailureKind::Timeout),
        500..=599 => Some(FailureKind::Server),
        _ => None,
    }
}

/// An HTTP answer classified by its `status`, else by the failure a `grpc-status` in it
/// stands for (`grpc`, asked only when the status is no failure: a trailers-only gRPC or
/// grpc-web answer, or the trailers of a streamed one), which makes an HTTP 200 a failure when
/// its code is one (`UNAVAILABLE`, ...). Such a failure is retried only for an idempotent
/// request, as a 5xx is. The one rule for the tower layer and both engines of the proxy.
///
/// ```
/// use lbkit_core::{classify_answer, FailureKind, Outcome};
/// let c = classify_answer(200, || Some(FailureKind::Server));
/// assert_eq!(c.outcome, Outcome::Failure(FailureKind::Server));
/// assert_eq!(classify_answer(503, || None).outcome, Outcome::Failure(FailureKind::Server));
/// assert!(!classify_answer(404, || None).is_failure());
/// ```
pub fn classify_answer(status: u16, grpc: impl FnOnce() -> Option<FailureKind>) -> Classified {
    let by_status = Observed::Status(status).classify();
    if by_status.is_failure() {
        return by_status;
    }
    match grpc() {
        Some(kind) => Classified::answer(Outcome::Failure(kind)),
        None => by_status,
    }
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Pick an endpoint not tried yet and send the request again (a retry was withdrawn from
    /// the budget).
    Retry,
    /// Give the client this attempt's result.
    Answer(Stop),
}

/// Why a call answers with its last attempt's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The result is final: a success, an answer, or a failure that must not be retried (not
    /// idempotent, or the client already has part of the answer).
    Final,
    /// No attempts left.
    NoAttemptsLeft,
    /// No copy of the request to send again (a streamed body).
    NotReplayable,
    /// The overall deadline has passed.
    DeadlinePassed,
    /// The retry budget is spent.
    BudgetExhausted,
    /// A retry was allowed, but every eligible endpoint was tried already
    /// ([`Attempts::retry`]).
    AllTried,
    /// The answer asked for no retry (a negative or malformed `grpc-retry-pushback-ms`), or
    /// for a wait longer than the call can give: past its deadline, or beyond
    /// [`MAX_RETRY_WAIT`](crate::signal::MAX_RETRY_WAIT) when it has none
    /// ([`Attempts::pushed_back`]).
    PushedBack,
}

/// The attempts of one call. Made per call by the driver, moved along with it; see the
/// module docs (`crates/lbkit-core/src/attempt.rs`).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lbkit_core::*;
///
/// # use lbkit_core::{Picker, PickError, EndpointIdx};
/// # struct Rr; struct RrPicker(Arc<Snapshot>);
/// # impl Picker for RrPicker { fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
/// #     let e = self.0.eligible(); Ok(e[cx.attempt as usize % e.len()]) } }
/// # impl Strategy for Rr { type Picker = RrPicker; fn name(&self) -> &str { "rr" }
/// #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> RrPicker { RrPicker(s.clone()) } }
/// let clock = Clock::System;
/// let now = clock.now();
/// let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], now));
/// let balancer = Balancer::new(Rr, snap, now);
/// let budget = RetryBudget::default();
/// let policy = AttemptPolicy { retries: 2, per_try: Some(Duration::from_secs(1)), overall: None };
/// let mut call = Attempts::start(policy, &budget, true, true, now);
/// let mut rng = FastRng::seed_from_u64(7);
///
/// let first = call.pick(&balancer, now, Route::default(), &mut rng).unwrap();
/// let c = Observed::Status(503).classify();
/// first.finish_at(c.outcome, now);
/// assert_eq!(call.after(c, &budget, &clock), Next::Retry);
///
/// let second = call.pick(&balancer, now, Route::default(), &mut rng).unwrap();
/// assert_ne!(second.endpoint().key(), balancer.snapshot().endpoints()[0].key());
/// let c = Observed::Status(200).classify();
/// second.finish_at(c.outcome, now);
/// assert_eq!(call.after(c, &budget, &clock), Next::Answer(Stop::Final));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Attempts {
    policy: AttemptPolicy,
    tried: TriedSet,
    /// Attempts begun so far.
    begun: u32,
    idempotent: bool,
    replayable: bool,
    started: Timestamp,
    /// The request's tracing decision, from its first attempt's guard.
    trace: TraceId,
    /// What the last attempt's answer asked for before a retry, in milliseconds (4 bytes that
    /// fit the state's padding): [`NO_PUSHBACK`], [`STOP_PUSHBACK`] or the wait.
    pushback_ms: u32,
}

// === impl Attempts ===

impl Attempts {
    /// A call starting at `now` under `policy`; deposits into `budget` when the policy allows
    /// retries (every call that may be retried does, once: the budget is a share of them).
    /// `idempotent`: the request may be sent again after it reached a server; `replayable`: the
    /// driver holds a copy to send again.
    #[inline]
    pub fn start<B: Budget + ?Sized>(
        policy: AttemptPolicy,
        budget: &B,
        idempotent: bool,
        replayable: bool,
        now: Timestamp,
    ) -> Self {
        Attempts::deposit(&policy, budget, now);
        Attempts::resume(policy, idempotent, replayable, now)
    }

    /// The deposit [`start`](Self::start) makes: once per call, when `policy` allows retries.
    #[inline]
    pub fn deposit<B: Budget + ?Sized>(policy: &AttemptPolicy, budget: &B, now: Timestamp) {
        if policy.retries > 0 {
            budget.deposit(now);
        }
    }

    /// The state of a call that started at `started` and already made its
    /// [`deposit`](Self::deposit), built only once it is needed: a driver whose first attempt
    /// usually succeeds need not carry it (the tower layer's success path).
    #[inline]
    pub fn resume(
        policy: AttemptPolicy,
        idempotent: bool,
        replayable: bool,
        started: Timestamp,
    ) -> Self {
        Attempts {
            policy,
            tried: TriedSet::new(),
            begun: 0,
            idempotent,
            replayable,
            started,
            trace: TraceId::UNDECIDED,
            pushback_ms: NO_PUSHBACK,
        }
    }

    /// Cut the call's overall deadline to `deadline` from its start when that is sooner: the
    /// caller's own (`grpc-timeout`, a deadline header: [`crate::signal`]). Every attempt's
    /// [`timeout`](Self::timeout) is then at most what is left of it, and no retry starts
    /// past it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::{AttemptPolicy, Attempts, Timestamp};
    /// let policy = AttemptPolicy { retries: 1, per_try: None, overall: Some(Duration::from_secs(5)) };
    /// let mut call = Attempts::resume(policy, true, true, Timestamp::ZERO);
    /// call.limit(Duration::from_millis(300));
    /// assert_eq!(call.timeout(Timestamp::from_millis(100)), Some(Duration::from_millis(200)));
    /// call.limit(Duration::from_secs(9)); // a longer one changes nothing
    /// assert_eq!(call.policy().overall, Some(Duration::from_millis(300)));
    /// ```
    #[inline]
    pub fn limit(&mut self, deadline: Duration) {
        self.policy = self.policy.cut_to(deadline);
    }

    /// The last attempt's answer pushed back ([`crate::signal::pushback`]): a retry waits
    /// [`retry_wait`](Self::retry_wait) before it is sent, and none is made when the answer
    /// asked for none or for a wait the call cannot give ([`Stop::PushedBack`], or
    /// [`Stop::DeadlinePassed`] when the wait outlasts the deadline). Several answers before the
    /// next retry (both attempts of a hedged race failed): the strongest holds — "no retry",
    /// else the longest wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::signal::Pushback;
    /// use lbkit_core::{AttemptPolicy, Attempts, RetryBudget, Timestamp};
    /// let policy = AttemptPolicy { retries: 2, per_try: None, overall: None };
    /// let mut a = Attempts::start(policy, &RetryBudget::default(), true, true, Timestamp::ZERO);
    /// a.pushed_back(Pushback::Wait(Duration::from_millis(300)));
    /// a.pushed_back(Pushback::Wait(Duration::from_millis(100)));
    /// assert_eq!(a.retry_wait(), Duration::from_millis(300));
    /// a.waited();
    /// assert_eq!(a.retry_wait(), Duration::ZERO);
    /// ```
    #[inline]
    pub fn pushed_back(&mut self, pushback: Pushback) {
        let ms = match pushback {
            Pushback::Stop => STOP_PUSHBACK,
            Pushback::Wait(w) => {
                let ms = w.as_nanos().div_ceil(1_000_000);
                u32::try_from(ms).map_or(STOP_PUSHBACK - 1, |ms| ms.min(STOP_PUSHBACK - 1))
            }
        };
        self.pushback_ms = self.pushback_ms.max(ms);
    }

    fn pushback(&self) -> Option<Pushback> {
        match self.pushback_ms {
            NO_PUSHBACK => None,
            STOP_PUSHBACK => Some(Pushback::Stop),
            ms => Some(Pushback::Wait(Duration::from_millis(u64::from(ms)))),
        }
    }

    /// The driver waited out the pushback ([`retry_wait`](Self::retry_wait)): it no longer
    /// counts against the retry that follows (whose deadline check reads the clock after the
    /// wait).
    #[inline]
    pub fn waited(&mut self) {
        if self.pushback_ms != STOP_PUSHBACK {
            self.pushback_ms = NO_PUSHBACK;
        }
    }

    /// How long a retry of this call waits before it is picked and sent: the last answer's
    /// pushback, zero when none. Ask only once [`may_retry`](Self::may_retry) allows one.
    #[inline]
    pub fn retry_wait(&self) -> Duration {
        match self.pushback() {
            Some(Pushback::Wait(w)) => w,
            _ => Duration::ZERO,
        }
    }

    /// Carry the tracing decision of the request's first attempt (a driver that made that
    /// attempt before building this state: [`resume`](Self::resume)).
    #[inline]
    pub fn with_trace(mut self, trace: TraceId) -> Self {
        self.trace = trace;
        self
    }

    /// The request's tracing decision.
    pub fn trace(&self) -> TraceId {
        self.trace
    }

    /// The policy.
    pub fn policy(&self) -> &AttemptPolicy {
        &self.policy
    }

    /// When the call started.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The index of the attempt to make next (0 before the first), as
    /// [`PickContext::attempt`] expects it.
    #[inline]
    pub fn next_attempt(&self) -> u32 {
        self.begun
    }

    /// Attempts begun so far.
    pub fn begun(&self) -> u32 {
        self.begun
    }

    /// Whether the request may be sent again after it reached a server.
    pub fn is_idempotent(&self) -> bool {
        self.idempotent
    }

    /// Endpoints tried so far.
    pub fn tried(&self) -> &TriedSet {
        &self.tried
    }

    /// Whether the driver still holds a copy of the request to send again.
    pub fn set_replayable(&mut self, replayable: bool) {
        self.replayable = replayable;
    }

    /// A pick context for the next attempt: its index and the endpoints to avoid.
    #[inline]
    pub fn context<'a>(&'a self, now: Timestamp, rng: &'a mut FastRng) -> PickContext<'a> {
        PickContext::new(now, rng)
            .with_tried(self.begun, &self.tried)
            .with_trace(self.trace)
    }

    /// Record that the next attempt goes to `endpoint` (after a pick made with
    /// [`context`](Self::context)).
    #[inline]
    pub fn begin(&mut self, endpoint: &crate::Endpoint) {
        self.tried.insert(endpoint);
        self.begun += 1;
        self.pushback_ms = NO_PUSHBACK;
    }

    /// Pick the next attempt's endpoint with `balancer` (an endpoint not tried yet) and begin
    /// the attempt; `route` has the request's hash key and tag.
    ///
    /// # Errors
    /// The balancer's [`PickError`]; [`PickError::AllTried`] when only tried endpoints are left.
    #[inline]
    pub fn pick<S: Strategy>(
        &mut self,
        balancer: &Balancer<S>,
        now: Timestamp,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<CallGuard, PickError> {
        let guard = {
            let mut cx = self.context(now, rng).with_route(route);
            balancer.pick_untried(&mut cx)?
        };
        self.trace = guard.trace_id();
        self.begin(guard.endpoint());
        Ok(guard)
    }

    /// How long the attempt starting at `now` may wait for its answer: the per-attempt limit,
    /// cut to what is left of the overall deadline; `None` when neither is set. Zero when the
    /// overall deadline has passed.
    #[inline]
    pub fn timeout(&self, now: Timestamp) -> Option<Duration> {
        let left = self.policy.overall.map(|o| {
            let elapsed = now.saturating_duration_since(self.started);
            o.saturating_sub(elapsed)
        });
        match (self.policy.per_try, left) {
            (Some(p), Some(l)) => Some(p.min(l)),
            (p, l) => p.or(l),
        }
    }

    /// Whether the overall deadline has passed at `now`.
    #[inline]
    pub fn deadline_passed(&self, now: Timestamp) -> bool {
        self.policy.overall.is_some_and(|o| {
            now.as_nanos() >= self.started.as_nanos().saturating_add(duration_nanos(o))
        })
    }

    /// Decide after an attempt classified as `c`: retry elsewhere (withdrawing from `budget`)
    /// or answer. Reads `clock` only when a retry is considered.
    ///
    /// A driver that first saw an answer's head and then its body break before anything
    /// reached the client may call this again for the same attempt with the later result.
    ///
    /// The budget is withdrawn before the next endpoint is picked: a driver whose pick may
    /// find nowhere to go uses [`retry`](Self::retry), or [`may_retry`](Self::may_retry), its
    /// own pick and then [`grant`](Self::grant), so that a retry never sent costs no budget.
    pub fn after<B: Budget + ?Sized>(&mut self, c: Classified, budget: &B, clock: &Clock) -> Next {
        match self
            .may_retry(c, clock)
            .and_then(|now| Attempts::grant(budget, now))
        {
            Ok(()) => Next::Retry,
            Err(stop) => Next::Answer(stop),
        }
    }

    /// [`after`](Self::after), and when it says retry, the pick of the next attempt's endpoint
    /// (one not tried yet) at the moment the decision read: what a driver that picks
    /// synchronously does after every attempt, in one call. `Ok` has the next attempt's guard
    /// and that moment (finish the failed attempt's guard at it); `Err` says why the call
    /// answers with this attempt's result ([`Stop::AllTried`] when no untried endpoint is left).
    /// The budget is withdrawn only once the retry has its endpoint: a retry that is not sent
    /// costs none.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # use lbkit_core::*;
    /// # struct Rr; struct RrPicker(Arc<Snapshot>);
    /// # impl Picker for RrPicker { fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
    /// #     let e = self.0.eligible(); Ok(e[cx.attempt as usize % e.len()]) } }
    /// # impl Strategy for Rr { type Picker = RrPicker; fn name(&self) -> &str { "rr" }
    /// #     fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> RrPicker { RrPicker(s.clone()) } }
    /// let clock = Clock::System;
    /// let now = clock.now();
    /// let snap = Arc::new(Snapshot::from_specs(vec![EndpointSpec::new("a:1")], now));
    /// let balancer = Balancer::new(Rr, snap, now);
    /// let budget = RetryBudget::default();
    /// let policy = AttemptPolicy { retries: 2, per_try: None, overall: None };
    /// let mut call = Attempts::start(policy, &budget, true, true, now);
    /// let mut rng = FastRng::seed_from_u64(7);
    /// let first = call.pick(&balancer, now, Route::default(), &mut rng).unwrap();
    /// let c = Observed::ConnectFailed.classify();
    /// // One endpoint only: the retry has nowhere to go.
    /// let next = call.retry(c, &budget, &balancer, &clock, Route::default(), &mut rng);
    /// assert_eq!(next.err(), Some(Stop::AllTried));
    /// first.finish(c.outcome);
    /// ```
    ///
    /// # Errors
    /// Why there is no retry.
    #[inline]
    pub fn retry<S: Strategy, B: Budget + ?Sized>(
        &mut self,
        c: Classified,
        budget: &B,
        balancer: &Balancer<S>,
        clock: &Clock,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<(CallGuard, Timestamp), Stop> {
        let now = self.may_retry(c, clock)?;
        let guard = {
            let mut cx = self.context(now, rng).with_route(route);
            let endpoint = balancer
                .select_untried(&mut cx)
                .map_err(|_| Stop::AllTried)?;
            Attempts::grant(budget, now)?;
            balancer.start_call(endpoint, &mut cx)
        };
        self.trace = guard.trace_id();
        self.begin(guard.endpoint());
        Ok((guard, now))
    }

    /// The rule of [`after`](Self::after) without the budget: `Ok` with the moment a retry
    /// was found allowed. For drivers that pick the retry's endpoint themselves: pick, then
    /// [`grant`](Self::grant), so that a retry with nowhere to go spends no budget.
    ///
    /// A pushback ([`pushed_back`](Self::pushed_back)) must fit: the retry is found allowed
    /// only when its wait ends before the overall deadline (or, without one, is at most
    /// [`MAX_RETRY_WAIT`](crate::signal::MAX_RETRY_WAIT)).
    ///
    /// # Errors
    /// Why there is no retry (never [`Stop::BudgetExhausted`] or [`Stop::AllTried`]).
    pub fn may_retry(&self, c: Classified, clock: &Clock) -> Result<Timestamp, Stop> {
        let allowed = match c.retry {
            RetryWhen::Never => false,
            RetryWhen::Idempotent => self.idempotent,
            RetryWhen::Always => true,
        };
        if !allowed {
            return Err(Stop::Final);
        }
        if self.begun > self.policy.retries {
            return Err(Stop::NoAttemptsLeft);
        }
        if !self.replayable {
            return Err(Stop::NotReplayable);
        }
        let now = clock.now();
        if self.deadline_passed(now) {
            return Err(Stop::DeadlinePassed);
        }
        self.pushback_fits(now)?;
        Ok(now)
    }

    /// Whether the last answer's pushback lets a retry start after its wait.
    fn pushback_fits(&self, now: Timestamp) -> Result<(), Stop> {
        let wait = match self.pushback() {
            None => return Ok(()),
            Some(Pushback::Stop) => return Err(Stop::PushedBack),
            Some(Pushback::Wait(w)) => w,
        };
        match self.policy.overall {
            Some(_) if self.deadline_passed(now.saturating_add(wait)) => Err(Stop::DeadlinePassed),
            None if wait > MAX_RETRY_WAIT => Err(Stop::PushedBack),
            _ => Ok(()),
        }
    }

    /// Whether a hedge of this call may go out at `now` (its first attempt still open):
    /// the request may be sent again after it reached a server and is held for that, an
    /// attempt is left, and the overall deadline has time. The budget is asked by
    /// [`hedge`](Self::hedge), once the hedge has an endpoint.
    #[inline]
    pub fn may_hedge(&self, now: Timestamp) -> bool {
        self.idempotent
            && self.replayable
            && self.begun <= self.policy.retries
            && !self.deadline_passed(now)
    }

    /// Send a hedge at `now` (its delay: [`HedgeTimer`](crate::HedgeTimer)): pick an endpoint
    /// not tried yet (the pick is marked as a hedge for strategies and traces), withdraw one
    /// retry from `budget` once it has one, and begin the attempt. The driver then waits for whichever attempt answers
    /// first and cancels the other (`CallGuard::finish(Outcome::Cancelled)`: not a failure).
    ///
    /// # Errors
    /// Why no hedge is sent: [`Stop::Final`] for a request that may not be sent twice,
    /// [`Stop::NoAttemptsLeft`], [`Stop::DeadlinePassed`], [`Stop::AllTried`],
    /// [`Stop::BudgetExhausted`].
    pub fn hedge<S: Strategy, B: Budget + ?Sized>(
        &mut self,
        budget: &B,
        balancer: &Balancer<S>,
        now: Timestamp,
        route: Route<'_>,
        rng: &mut FastRng,
    ) -> Result<CallGuard, Stop> {
        if !self.may_hedge(now) {
            return Err(match () {
                () if !self.idempotent || !self.replayable => Stop::Final,
                () if self.begun > self.policy.retries => Stop::NoAttemptsLeft,
                () => Stop::DeadlinePassed,
            });
        }
        let guard = {
            let mut cx = self.context(now, rng).with_route(route).as_hedge();
            let endpoint = balancer
                .select_untried(&mut cx)
                .map_err(|_| Stop::AllTried)?;
            Attempts::grant(budget, now)?;
            balancer.start_call(endpoint, &mut cx)
        };
        self.begin(guard.endpoint());
        Ok(guard)
    }

    /// Withdraw one retry from `budget` at `now`, once the retry has an endpoint to go to.
    ///
    /// # Errors
    /// [`Stop::BudgetExhausted`] when the budget is spent.
    #[inline]
    pub fn grant<B: Budget + ?Sized>(budget: &B, now: Timestamp) -> Result<(), Stop> {
        if budget.withdraw(now) {
            Ok(())
        } else {
            Err(Stop::BudgetExhausted)
        }
    }

    /// Take one extra concurrent attempt (a fork) from `budget`: forks are retries sent early.
    pub fn withdraw_fork<B: Budget + ?Sized>(&mut self, budget: &B, now: Timestamp) -> bool {
        budget.withdraw(now)
    }
}

#[cfg(test)]
mod tests;
