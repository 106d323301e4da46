//! The oracle baseline: **shortest expected delay** (SED). It sees what no real client can know —
//! every server's true number of calls (served plus waiting, over all clients), its worker
//! count, and its current mean service time with slowness, cold start and pauses included — and
//! sends each attempt where it is expected to finish first.
//!
//! With `c` workers, `q` calls on the server and mean service time `m`, a new call starts at once
//! when `q < c`, else after `q - c + 1` departures at rate `c / m`, so its expected delay is
//! `m + max(0, q + 1 - c) · m / c` plus what is left of a pause. A crashed server, or one whose
//! waiting room is full, is never chosen while another is not. For servers that differ in speed
//! SED is the best-known simple policy (join-the-shortest-queue ignores service rates and loses
//! to latency-aware strategies there); reports label it as the best-known baseline, not as an
//! optimum.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

/// Expected delays in ns, written by the engine whenever a server changes, indexed by server.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    pub(crate) delay: Vec<AtomicU64>,
    pub(crate) by_address: HashMap<String, usize>,
}

impl Queues {
    /// No delay yet at any of the servers of `addresses` (in server order).
    pub(crate) fn of(addresses: &[String]) -> Arc<Queues> {
        Arc::new(Queues {
            delay: addresses.iter().map(|_| AtomicU64::new(0)).collect(),
            by_address: addresses
                .iter()
                .enumerate()
                .map(|(i, a)| (a.clone(), i))
                .collect(),
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Oracle(pub(crate) Arc<Queues>);

impl Strategy for Oracle {
    type Picker = OraclePicker;

    fn name(&self) -> &str {
        crate::ORACLE
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> OraclePicker {
        let servers = snapshot
            .eligible()
            .iter()
            .filter_map(|&i| {
                self.0
                    .by_address
                    .get(snapshot.endpoint(i).address())
                    .map(|&s| (i, s))
            })
            .collect();
        OraclePicker {
            queues: self.0.clone(),
            servers,
        }
    }
}

#[derive(Debug)]
pub(crate) struct OraclePicker {
    queues: Arc<Queues>,
    servers: Vec<(EndpointIdx, usize)>,
}

impl Picker for OraclePicker {
    fn pick(&self, cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let n = self.servers.len();
        if n == 0 {
            return Err(PickError::NoEndpoints);
        }
        // The least expected delay; ties broken uniformly at random (reservoir sampling).
        let mut best = (u64::MAX, 0usize);
        let mut ties = 0u64;
        for (k, &(_, s)) in self.servers.iter().enumerate() {
            let d = self.queues.delay[s].load(Relaxed);
            if d < best.0 {
                best = (d, k);
                ties = 1;
            } else if d == best.0 {
                ties += 1;
                if cx.rng.below(ties) == 0 {
                    best.1 = k;
                }
            }
        }
        // A failover attempt whose choice was already tried moves on, one server per probe.
        let k = (best.1 + cx.probe as usize) % n;
        Ok(self.servers[k].0)
    }
}
