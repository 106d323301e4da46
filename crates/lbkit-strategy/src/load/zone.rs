//! Zone preference: prefer the caller's zone, spill to the others when it is unhealthy or loaded.
//!
//! [`ZoneAware`] wraps any strategy. At each prepare (and every `refresh`, default 1 s) it looks
//! at the caller's zone:
//! * **healthy share**: eligible local endpoints ÷ local endpoints with weight > 0. Below
//!   `min_healthy` (default 0.7) the local zone is considered degraded;
//! * **load**: mean calls in flight per eligible local endpoint versus per eligible remote one.
//!   When the local mean exceeds `max_load_ratio` (default 2.0) × max(remote mean, 1), the local
//!   zone is considered overloaded (the floor of 1 keeps a few calls on an idle fleet from
//!   spilling).
//!
//! If the local zone has eligible endpoints and is neither degraded nor overloaded, the inner
//! strategy is prepared over the local endpoints only; otherwise over every eligible endpoint
//! (the spill). Endpoints without a zone count as remote.
//!
//! * **Origin**: Ribbon `ZoneAvoidanceRule` (avoid a zone whose servers are tripped or whose
//!   load per server crosses a threshold) and Envoy zone-aware routing (prefer the local zone
//!   while it is healthy enough).
//! * **Complexity**: O(n) per prepare; the pick is the inner strategy's.
//! * **A change**: the zones are assessed again, O(n), and the inner strategy is prepared from
//!   scratch for the zone's endpoints (a hash ring inside a zone filter is rebuilt, not patched).
//! * **Differences from the origin**: Envoy sends a computed fraction of traffic across zones to
//!   match capacity; here it is all-local or all-zones, re-decided every refresh. Ribbon's
//!   thresholds are per-server loads (0.2 active requests); here the comparison is relative to the
//!   other zones, which needs no tuning per service.

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

/// Zone preference around an inner strategy.
#[derive(Debug, Clone)]
pub struct ZoneAware<S> {
    inner: S,
    local: Arc<str>,
    min_healthy: f64,
    max_load_ratio: f64,
    refresh: Duration,
}

impl<S: Strategy> ZoneAware<S> {
    /// Prefer zone `local` with the default thresholds (healthy share 0.7, load ratio 2.0,
    /// refresh 1 s).
    pub fn new(inner: S, local: impl Into<Arc<str>>) -> Self {
        ZoneAware {
            inner,
            local: local.into(),
            min_healthy: 0.7,
            max_load_ratio: 2.0,
            refresh: Duration::from_secs(1),
        }
    }

    /// Spill when fewer than this share of local endpoints are eligible.
    pub fn with_min_healthy(mut self, share: f64) -> Self {
        self.min_healthy = share;
        self
    }

    /// Spill when the local mean in-flight exceeds this multiple of the remote mean.
    pub fn with_max_load_ratio(mut self, ratio: f64) -> Self {
        self.max_load_ratio = ratio;
        self
    }

    fn assess(&self, snapshot: &Snapshot) -> ZoneState {
        let is_local = |i: EndpointIdx| snapshot.endpoint(i).zone() == Some(&*self.local);
        let local_total = (0..snapshot.len())
            .map(EndpointIdx::new)
            .filter(|&i| is_local(i) && snapshot.endpoint(i).weight() > 0)
            .count();
        let (mut local, mut remote) = ((0usize, 0u64), (0usize, 0u64));
        for &i in snapshot.eligible() {
            let load = u64::from(snapshot.endpoint(i).stats().in_flight());
            let side = if is_local(i) { &mut local } else { &mut remote };
            side.0 += 1;
            side.1 += load;
        }
        let mean = |(n, sum): (usize, u64)| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        let healthy = if local_total == 0 {
            0.0
        } else {
            local.0 as f64 / local_total as f64
        };
        let (local_load, remote_load) = (mean(local), mean(remote));
        let reason = if local.0 == 0 {
            Some("no eligible endpoint in the local zone")
        } else if healthy < self.min_healthy {
            Some("local zone degraded")
        } else if remote.0 > 0 && local_load > self.max_load_ratio * remote_load.max(1.0) {
            Some("local zone overloaded")
        } else {
            None
        };
        ZoneState {
            healthy,
            local_load,
            remote_load,
            spill: reason,
        }
    }
}

impl<S: Strategy> Strategy for ZoneAware<S> {
    type Picker = ZonePicker<S::Picker>;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn ewma_decay(&self) -> Option<Duration> {
        self.inner.ewma_decay()
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> ZonePicker<S::Picker> {
        let state = self.assess(snapshot);
        let picker = match state.spill {
            Some(_) => self.inner.prepare(snapshot, now),
            None => {
                let local =
                    snapshot.restrict(|i| snapshot.endpoint(i).zone() == Some(&*self.local));
                self.inner.prepare(&Arc::new(local), now)
            }
        };
        ZonePicker {
            picker,
            state,
            local: self.local.clone(),
            snapshot: snapshot.clone(),
        }
    }

    fn refresh_interval(&self) -> Option<Duration> {
        Some(
            self.inner
                .refresh_interval()
                .map_or(self.refresh, |d| d.min(self.refresh)),
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct ZoneState {
    healthy: f64,
    local_load: f64,
    remote_load: f64,
    spill: Option<&'static str>,
}

/// Prepared [`ZoneAware`].
#[derive(Debug)]
pub struct ZonePicker<P> {
    picker: P,
    state: ZoneState,
    local: Arc<str>,
    snapshot: Arc<Snapshot>,
}

impl<P> ZonePicker<P> {
    /// Whether picks spill over every zone (rather than staying local).
    pub fn spills(&self) -> bool {
        self.state.spill.is_some()
    }
}

impl<P: Picker> Picker for ZonePicker<P> {
    #[inline]
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        self.picker.pick(cx)
    }

    fn refresh_at(&self) -> Option<Timestamp> {
        self.picker.refresh_at()
    }

    fn explain(&self, idx: EndpointIdx, now: Timestamp) -> Option<String> {
        let s = &self.state;
        let local = self.snapshot.endpoint(idx).zone() == Some(&*self.local);
        let zone = match (s.spill, local) {
            (None, true) => format!("local zone {} preferred", self.local),
            (None, false) => format!("remote: local zone {} preferred", self.local),
            (Some(why), _) => format!("all zones ({why})"),
        };
        let inputs = format!(
            "local healthy {:.0}%, in flight per endpoint local {:.2} / remote {:.2}",
            s.healthy * 100.0,
            s.local_load,
            s.remote_load
        );
        let inner = match (s.spill, local) {
            (None, false) => None,
            _ => self.picker.explain(idx, now),
        };
        Some(match inner {
            Some(i) => format!("{zone}; {inputs}; {i}"),
            None => format!("{zone}; {inputs}"),
        })
    }
}
