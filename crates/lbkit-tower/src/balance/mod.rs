//! [`Balance`], the tower `Service` over a [`Pool`], and its cluster modes.

mod attempt;
mod cluster;
mod failback;
mod future;
mod hedge;
mod layer;

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use lbkit_core::{AttemptPolicy, Attempts, BoxStrategy, FastRng, RetryBudget, Strategy, Timestamp};
use tower::retry::budget::Budget;
use tower::Service;

use crate::error::BoxError;
use crate::policy::{RequestPolicy, ResponsePolicy};
use crate::pool::Pool;

pub use failback::FailbackConfig;
pub use future::ResponseFuture;
pub use layer::BalanceLayer;

/// How a call uses the endpoints (Dubbo's cluster modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Retry failures on other endpoints (Dubbo's default, `retries = 2`).
    Failover {
        /// Attempts after the first.
        retries: u32,
    },
    /// One attempt.
    Failfast,
    /// One attempt; errors become the fallback response.
    Failsafe,
    /// One attempt; on error return the fallback and retry in the background.
    Failback(FailbackConfig),
    /// Send to `forks` endpoints at once; the first success wins (Dubbo `forks = 2`).
    Forking {
        /// Endpoints called per request.
        forks: u32,
    },
    /// Send to every eligible endpoint.
    Broadcast,
}

impl Default for Mode {
    fn default() -> Self {
        Mode::Failover { retries: 2 }
    }
}

/// What failsafe and failback return instead of an error.
pub trait Fallback<O>: Send + Sync + 'static {
    /// The response standing in for the call that failed with `err`, or `None` to return the
    /// error after all.
    fn fallback(&self, err: &BoxError) -> Option<O>;
}

/// No fallback: errors are returned as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFallback;

impl<O> Fallback<O> for NoFallback {
    fn fallback(&self, _: &BoxError) -> Option<O> {
        None
    }
}

impl<O, F> Fallback<O> for F
where
    F: Fn(&BoxError) -> O + Send + Sync + 'static,
{
    fn fallback(&self, err: &BoxError) -> Option<O> {
        Some(self(err))
    }
}

/// The default retry budget: lbkit's lock-free [`RetryBudget`] over 10 s, at least 10 retries
/// per second, plus 20 % of requests (linkerd's defaults). tower's `TpsBudget` (or any
/// [`Budget`]) can be set instead with [`BalanceLayer::retry_budget`](crate::BalanceLayer::retry_budget).
pub fn default_budget() -> Arc<dyn Budget + Send + Sync> {
    Arc::new(AtomicBudget::new(RetryBudget::default()))
}

/// lbkit's lock-free [`RetryBudget`] as a tower [`Budget`]: no mutex per request (tower's
/// `TpsBudget` takes one on every deposit and withdrawal). Reads the system clock, as
/// `TpsBudget` does.
#[derive(Debug)]
pub struct AtomicBudget {
    budget: RetryBudget,
    clock: lbkit_core::Clock,
}

impl AtomicBudget {
    /// Wrap `budget`, reading time from the system clock.
    pub fn new(budget: RetryBudget) -> Self {
        AtomicBudget {
            budget,
            clock: lbkit_core::Clock::System,
        }
    }
}

impl Budget for AtomicBudget {
    fn deposit(&self) {
        self.budget.deposit(self.clock.now());
    }

    fn withdraw(&self) -> bool {
        self.budget.withdraw(self.clock.now())
    }
}

/// A tower [`Budget`] as lbkit's call path sees it (tower's trait reads no time: `now` is
/// ignored).
pub(crate) struct TowerBudget(pub(crate) Arc<dyn Budget + Send + Sync>);

impl lbkit_core::Budget for TowerBudget {
    fn deposit(&self, _: Timestamp) {
        self.0.deposit();
    }

    fn withdraw(&self, _: Timestamp) -> bool {
        self.0.withdraw()
    }
}

/// State shared by the clones of a [`Balance`] and its background failback tasks.
pub(crate) struct Shared<Svc, Q, R, S: Strategy, F> {
    pub(crate) pool: Pool<Svc, S>,
    pub(crate) requests: Q,
    pub(crate) responses: R,
    pub(crate) fallback: F,
    pub(crate) mode: Mode,
    /// Per-attempt and overall limits, and the retries of failover.
    pub(crate) policy: AttemptPolicy,
    pub(crate) budget: Arc<dyn lbkit_core::Budget>,
    pub(crate) failback_pending: AtomicUsize,
    seeds: AtomicU64,
    /// Hedging of idempotent requests under failover, if configured.
    pub(crate) hedge: Option<lbkit_core::HedgeTimer>,
}

impl<Svc, Q, R, S: Strategy, F> Shared<Svc, Q, R, S, F> {
    /// The clock of the pool's balancer.
    pub(crate) fn clock(&self) -> &lbkit_core::Clock {
        self.pool.inner.balancer.clock()
    }

    /// The attempts' policy of one request under this balance's mode: the configured limits,
    /// and the retries of failover (or the extra forks of forking).
    pub(crate) fn attempt_policy(&self) -> AttemptPolicy {
        let mut policy = self.policy;
        policy.retries = match self.mode {
            Mode::Failover { retries } => retries,
            // Forks are extra attempts sent early: they deposit and withdraw like retries.
            Mode::Forking { forks } => forks.saturating_sub(1),
            _ => 0,
        };
        policy
    }

    /// A fresh seed per clone and per background task (splitmix64 step over a counter).
    pub(crate) fn next_seed(&self) -> u64 {
        let mut z = self.seeds.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The tower `Service` that picks an endpoint of a [`Pool`] per request and calls it under one
/// of Dubbo's cluster modes; built by [`BalanceLayer`]. Cheap to clone: each clone has its own
/// random source.
///
/// # Per request
/// 1. One clock read; the request's hash key (if any) goes to the strategy.
/// 2. A pick ([`Pool`]'s balancer); an endpoint whose service is not ready at once is passed
///    over for another (bounded), and when none is ready the call waits on the first picked.
/// 3. The call, under the per-attempt timeout; the [`ResponsePolicy`] classifies the answer and
///    ends the call now or at the end of the response body; errors come back as [`BoxError`]
///    holding an [`Error`](crate::Error) that names the endpoint.
///
/// `poll_ready` is always ready: readiness is decided per endpoint inside the call (step 2),
/// so one slow endpoint never holds the others back.
///
/// # Cluster modes ([`Mode`], after Dubbo's `cluster=`)
/// | mode | behaviour |
/// |---|---|
/// | `failover` (default, 2 retries) | on failure, retry on an endpoint not yet tried, if the request is idempotent or certainly never reached the server, the request can be replayed, and the retry budget allows |
/// | `failfast` | one attempt |
/// | `failsafe` | one attempt; an error becomes the configured fallback response |
/// | `failback` | one attempt; on error the fallback is returned and the request is retried in the background, bounded |
/// | `forking` (2) | send to K endpoints at once; the first success wins, the others are cancelled |
/// | `broadcast` | send to every eligible endpoint; an error if any fails, else the last response |
///
/// # Retry budget
/// Every request deposits into the budget once and every retry or extra fork withdraws from it
/// (lbkit-core's `Attempts`, the rule every lbkit driver follows; default: lbkit's lock-free
/// [`RetryBudget`], 20 % of the requests of the last 10 s plus 10 retries per second,
/// linkerd's and Finagle's numbers; any tower [`Budget`] fits). An empty budget ends failover with
/// [`ErrorKind::BudgetExhausted`](crate::ErrorKind::BudgetExhausted) and counts
/// `lbkit_retry_budget_exhausted_total`.
///
/// # Signals on the wire
/// * **Deadlines**: the request policy's [`RequestPolicy::deadline`] (for HTTP and gRPC,
///   `grpc-timeout` or a configured header of milliseconds:
///   [`HttpRequests::deadline_header`](crate::http::HttpRequests::deadline_header)) cuts the
///   call's deadline; each attempt tells the endpoint the time left
///   ([`RequestPolicy::tell_deadline`]); a deadline already spent fails the call at once with
///   [`ErrorKind::DeadlineExceeded`](crate::ErrorKind::DeadlineExceeded).
/// * **Pushback and load reports**: [`ResponsePolicy::signals`] notes every answer's load report
///   and pushback (`429`/`503` with `Retry-After`, `grpc-retry-pushback-ms`) against its
///   endpoint, which picks then pass over for the time asked; a failover retry waits it out.
/// * **Hedging** ([`BalanceLayer::hedge`]): under failover, an idempotent request whose first
///   attempt has no answer after the hedge delay is raced by a second attempt on another
///   endpoint; the first answer that is no failure wins, the other is cancelled.
pub struct Balance<Svc, Q, R, S: Strategy = BoxStrategy, F = NoFallback> {
    shared: Arc<Shared<Svc, Q, R, S, F>>,
    rng: FastRng,
}

// === impl Balance ===

impl<Svc, Q, R, S: Strategy, F> Balance<Svc, Q, R, S, F> {
    pub(crate) fn from_shared(shared: Arc<Shared<Svc, Q, R, S, F>>) -> Self {
        let rng = FastRng::seed_from_u64(shared.next_seed());
        Balance { shared, rng }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<Svc, S> {
        &self.shared.pool
    }

    /// The cluster mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode
    }

    /// Failback retries waiting in the background.
    pub fn failback_pending(&self) -> usize {
        self.shared.failback_pending.load(Relaxed)
    }
}

impl<Svc, Q, R, S: Strategy, F> Clone for Balance<Svc, Q, R, S, F> {
    fn clone(&self) -> Self {
        Balance::from_shared(self.shared.clone())
    }
}

impl<Svc, Q, R, S: Strategy, F> fmt::Debug for Balance<Svc, Q, R, S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance")
            .field("pool", &self.shared.pool)
            .field("mode", &self.shared.mode)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

/// The answer to a request whose deadline had passed before an attempt could start.
fn expired<O: Send + 'static>() -> future::BoxResponse<O> {
    let e: BoxError = Box::new(crate::error::Error::new(crate::ErrorKind::DeadlineExceeded));
    Box::pin(std::future::ready(Err(e)))
}

impl<Req, Svc, Q, R, S, F> Service<Req> for Balance<Svc, Q, R, S, F>
where
    Req: Send + 'static,
    Svc: Service<Req> + Clone + Send + Sync + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send,
    Svc::Response: Send,
    Q: RequestPolicy<Req>,
    R: ResponsePolicy<Svc::Response>,
    S: Strategy,
    F: Fallback<R::Output>,
{
    type Response = R::Output;
    type Error = BoxError;
    type Future = ResponseFuture<Req, Svc, Q, R, S, F>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let shared = self.shared.clone();
        let now = shared.clock().now();
        let deadline = shared.requests.deadline(&req);
        if deadline.is_some_and(|d| d.is_zero()) {
            return ResponseFuture::boxed(expired());
        }
        if shared.mode == Mode::Broadcast {
            let call = cluster::broadcast(shared, req, now, deadline);
            return ResponseFuture::boxed(Box::pin(call));
        }
        let policy = match deadline {
            Some(d) => shared.attempt_policy().cut_to(d),
            None => shared.attempt_policy(),
        };
        // A copy for a retry, and whether it may be sent after reaching a server, only when a
        // retry is possible at all.
        let single = policy.retries == 0;
        let (idempotent, spare) = if single {
            (false, None)
        } else {
            (
                shared.requests.is_idempotent(&req),
                shared.requests.replay(&req),
            )
        };
        Attempts::deposit(&policy, &*shared.budget, now);
        if matches!(shared.mode, Mode::Failback(_)) {
            // Failback may retry any call in the background: it deposits as failover does.
            shared.budget.deposit(now);
        }
        let rng = &mut self.rng;
        let first = shared.requests.with_route(&req, |route| {
            shared
                .pool
                .select(&crate::pool::PickInput::first(now, route), rng)
        });
        // Hedging waits on a timer beside the first attempt: the boxed path.
        let hedging = shared.hedge.is_some() && idempotent && spare.is_some();
        match (first, shared.mode) {
            // The fast path: the endpoint is ready, so dispatch now (as tower expects right
            // after readiness) into a future that needs no box. A single attempt has nothing
            // to decide after it; failover builds the attempts' state only if its first
            // attempt fails.
            (Ok(sel), Mode::Failover { .. } | Mode::Failfast) if sel.ready && !hedging => {
                let crate::pool::Selected { call, mut svc, .. } = sel;
                let (pool, strategy) = shared.names();
                let span = attempt::start(&call, &shared.pool.inner.metrics, pool, strategy);
                let timeout = policy.first_timeout();
                if let Some(left) = timeout {
                    shared.requests.tell_deadline(&mut req, left);
                }
                let response = {
                    let _entered = span.enter();
                    svc.call(req)
                };
                let retry = (!single).then_some(future::Retry {
                    idempotent,
                    started: now,
                    deadline,
                });
                ResponseFuture::once(shared, call, response, span, timeout, spare, retry)
            }
            (first, _) => {
                let mut attempts = Attempts::resume(policy, idempotent, spare.is_some(), now);
                if let Ok(sel) = &first {
                    attempts = attempts.with_trace(sel.call.trace_id());
                    attempts.begin(sel.call.endpoint());
                }
                ResponseFuture::boxed(Box::pin(cluster::dispatch(
                    shared, first, req, spare, attempts,
                )))
            }
        }
    }
}
