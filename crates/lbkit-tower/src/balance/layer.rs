//! [`BalanceLayer`]: the settings of a [`Balance`], as a tower [`Layer`] over a [`Pool`].

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{FastRng, HedgeDelay, Strategy};
use tower::retry::budget::Budget;
use tower::Layer;

use super::{Balance, FailbackConfig, Mode, NoFallback, Shared, TowerBudget};
use crate::policy::{AnyResponse, NoReplay};
use crate::pool::Pool;

/// Settings of a [`Balance`]; a tower [`Layer`] over a [`Pool`].
///
/// ```no_run
/// # async fn doc() {
/// use lbkit_core::EndpointSpec;
/// use lbkit_tower::{BalanceLayer, PoolBuilder};
/// use std::time::Duration;
/// use tower::{Layer, ServiceExt};
///
/// let pool = PoolBuilder::default().name("echo").spawn_static(
///     vec![EndpointSpec::new("10.0.0.1:80"), EndpointSpec::new("10.0.0.2:80")],
///     |_ep: &lbkit_core::Endpoint| tower::service_fn(|req: String| async move {
///         Ok::<_, std::convert::Infallible>(req)
///     }),
/// );
/// let balance = BalanceLayer::new()
///     .requests(lbkit_tower::CloneRequests::idempotent())
///     .failover(2)
///     .timeout(Duration::from_secs(1))
///     .layer(pool);
/// let reply = balance.oneshot("hello".to_owned()).await.unwrap();
/// # }
/// ```
#[derive(Clone)]
pub struct BalanceLayer<Q = NoReplay, R = AnyResponse, F = NoFallback> {
    requests: Q,
    responses: R,
    fallback: F,
    mode: Mode,
    timeout: Option<Duration>,
    deadline: Option<Duration>,
    budget: Arc<dyn lbkit_core::Budget>,
    seed: Option<u64>,
    hedge: Option<HedgeDelay>,
}

impl Default for BalanceLayer {
    fn default() -> Self {
        BalanceLayer::new()
    }
}

// === impl BalanceLayer ===

impl BalanceLayer {
    /// Typed requests that are never replayed ([`NoReplay`]), every response a success
    /// ([`AnyResponse`]); failover with 2 retries, no timeout, the [`default_budget`](crate::balance::default_budget).
    pub fn new() -> Self {
        BalanceLayer {
            requests: NoReplay,
            responses: AnyResponse,
            fallback: NoFallback,
            mode: Mode::default(),
            timeout: None,
            deadline: None,
            budget: Arc::new(lbkit_core::RetryBudget::default()),
            seed: None,
            hedge: None,
        }
    }
}

#[cfg(feature = "http")]
impl BalanceLayer<crate::http::HttpRequests, crate::http::HttpResponses> {
    /// For `http::Request`/`http::Response` (hyper, tonic): [`HttpRequests`](crate::http::HttpRequests)
    /// and [`HttpResponses`](crate::http::HttpResponses), otherwise as [`BalanceLayer::new`].
    pub fn http() -> Self {
        BalanceLayer::new()
            .requests(crate::http::HttpRequests::new())
            .responses(crate::http::HttpResponses::new())
    }
}

impl<Q, R, F> BalanceLayer<Q, R, F> {
    /// Use `requests` as the request policy.
    pub fn requests<Q2>(self, requests: Q2) -> BalanceLayer<Q2, R, F> {
        BalanceLayer {
            requests,
            responses: self.responses,
            fallback: self.fallback,
            mode: self.mode,
            timeout: self.timeout,
            deadline: self.deadline,
            budget: self.budget,
            seed: self.seed,
            hedge: self.hedge,
        }
    }

    /// Use `responses` as the response policy.
    pub fn responses<R2>(self, responses: R2) -> BalanceLayer<Q, R2, F> {
        BalanceLayer {
            requests: self.requests,
            responses,
            fallback: self.fallback,
            mode: self.mode,
            timeout: self.timeout,
            deadline: self.deadline,
            budget: self.budget,
            seed: self.seed,
            hedge: self.hedge,
        }
    }

    /// Return `fallback` instead of errors in the failsafe and failback modes.
    pub fn fallback<F2>(self, fallback: F2) -> BalanceLayer<Q, R, F2> {
        BalanceLayer {
            requests: self.requests,
            responses: self.responses,
            fallback,
            mode: self.mode,
            timeout: self.timeout,
            deadline: self.deadline,
            budget: self.budget,
            seed: self.seed,
            hedge: self.hedge,
        }
    }

    /// Use `mode`.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Failover with `retries` attempts after the first.
    pub fn failover(self, retries: u32) -> Self {
        self.mode(Mode::Failover { retries })
    }

    /// One attempt per request.
    pub fn failfast(self) -> Self {
        self.mode(Mode::Failfast)
    }

    /// One attempt; errors become `fallback(&error)`.
    pub fn failsafe<F2>(self, fallback: F2) -> BalanceLayer<Q, R, F2> {
        self.mode(Mode::Failsafe).fallback(fallback)
    }

    /// One attempt; on error return `fallback(&error)` and retry in the background.
    pub fn failback<F2>(self, config: FailbackConfig, fallback: F2) -> BalanceLayer<Q, R, F2> {
        self.mode(Mode::Failback(config)).fallback(fallback)
    }

    /// Send each request to `forks` endpoints at once (at least 1).
    pub fn forking(self, forks: u32) -> Self {
        self.mode(Mode::Forking {
            forks: forks.max(1),
        })
    }

    /// Send each request to every eligible endpoint.
    pub fn broadcast(self) -> Self {
        self.mode(Mode::Broadcast)
    }

    /// Give each attempt at most `timeout` (from the pick to the response head).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Give the whole call, retries included, at most `deadline`: an attempt's timeout is cut to
    /// what is left of it, and no retry starts after it (Envoy's route timeout around its
    /// `per_try_timeout`).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Use tower's `budget` for retries and extra forks (shared by every balance built from this
    /// layer). The default is lbkit's lock-free [`RetryBudget`](lbkit_core::RetryBudget), which
    /// reads the call's own clock reading instead of the system clock.
    pub fn retry_budget(mut self, budget: Arc<dyn Budget + Send + Sync>) -> Self {
        self.budget = Arc::new(TowerBudget(budget));
        self
    }

    /// Use lbkit's `budget` (or any [`lbkit_core::Budget`]) for retries and extra forks.
    pub fn budget(mut self, budget: Arc<dyn lbkit_core::Budget>) -> Self {
        self.budget = budget;
        self
    }

    /// Hedge idempotent requests under failover ([`lbkit_core::HedgeDelay`]: "The Tail at
    /// Scale"): when the first attempt has no answer after `delay` — fixed, or a quantile of
    /// the pool's recent latencies (`HedgeDelay::parse("p95")`) — a second attempt goes to an
    /// endpoint not tried yet; the first answer wins and the other attempt is cancelled, which
    /// is not its endpoint's failure. A hedge is an attempt of the call: it needs a retry left
    /// (`failover(n)`, n ≥ 1), a copy of the request, time before the deadline, and a
    /// withdrawal from the retry budget, so hedging never sends more than the budget's share
    /// twice. Counted with the retries (`lbkit_retries_total`: attempts after the first) and on
    /// its own (`lbkit_hedges_total`).
    ///
    /// ```
    /// use lbkit_core::HedgeDelay;
    /// use lbkit_tower::BalanceLayer;
    /// let layer = BalanceLayer::http().failover(1).hedge(HedgeDelay::parse("p95").unwrap());
    /// # let _ = layer;
    /// ```
    pub fn hedge(mut self, delay: HedgeDelay) -> Self {
        self.hedge = Some(delay);
        self
    }

    /// Apply a service's configured call settings (`lbkit::config`'s `call` table): each one
    /// set replaces this layer's — `retries` as [`failover`](Self::failover)'s count (only in
    /// failover mode, the default: a failsafe, failback, forking or broadcast layer keeps its
    /// mode), `per_try` as [`timeout`](Self::timeout), `overall` as
    /// [`deadline`](Self::deadline), `hedge` as [`hedge`](Self::hedge). The deadline header is
    /// the request policy's
    /// ([`HttpRequests::deadline_header`](crate::http::HttpRequests::deadline_header)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_core::{CallPolicy, HedgeDelay};
    /// use lbkit_tower::BalanceLayer;
    /// let call = CallPolicy { retries: Some(1), hedge: HedgeDelay::parse("p95"), ..CallPolicy::default() };
    /// let layer = BalanceLayer::http().call_policy(&call);
    /// assert!(format!("{layer:?}").contains("Failover { retries: 1 }"));
    /// ```
    pub fn call_policy(mut self, call: &lbkit_core::CallPolicy) -> Self {
        if let (Some(retries), Mode::Failover { .. }) = (call.retries, self.mode) {
            self = self.failover(retries);
        }
        self.timeout = call.per_try.or(self.timeout);
        self.deadline = call.overall.or(self.deadline);
        self.hedge = call.hedge.or(self.hedge);
        self
    }

    /// Seed the balance's random source (deterministic picks in tests).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

impl<Q, R, F> fmt::Debug for BalanceLayer<Q, R, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalanceLayer")
            .field("mode", &self.mode)
            .field("timeout", &self.timeout)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, Q, R, F> Layer<Pool<Svc, S>> for BalanceLayer<Q, R, F>
where
    S: Strategy,
    Q: Clone,
    R: Clone,
    F: Clone,
{
    type Service = Balance<Svc, Q, R, S, F>;

    fn layer(&self, pool: Pool<Svc, S>) -> Self::Service {
        let seed = self
            .seed
            .unwrap_or_else(|| FastRng::from_entropy().next_u64());
        let shared = Arc::new(Shared {
            pool,
            requests: self.requests.clone(),
            responses: self.responses.clone(),
            fallback: self.fallback.clone(),
            mode: self.mode,
            policy: lbkit_core::AttemptPolicy {
                retries: match self.mode {
                    Mode::Failover { retries } => retries,
                    _ => 0,
                },
                per_try: self.timeout,
                overall: self.deadline,
            },
            budget: self.budget.clone(),
            failback_pending: AtomicUsize::new(0),
            seeds: AtomicU64::new(seed),
            hedge: self.hedge.map(lbkit_core::HedgeTimer::new),
        });
        Balance::from_shared(shared)
    }
}
