//! The oracle baseline: join the shortest queue, seeing every server's true queue length
//! (served plus waiting, over all clients) — what no real client can know. Reports show how
//! close each strategy comes to it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

/// True queue lengths, written by the engine, indexed by server.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    pub(crate) len: Vec<AtomicU32>,
    pub(crate) by_address: HashMap<String, usize>,
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
        // Start the scan at a random offset so ties spread evenly.
        let start = cx.rng.index(n);
        let probe = cx.probe as usize;
        (0..n)
            .map(|k| self.servers[(start + k) % n])
            .min_by_key(|&(_, s)| self.queues.len[s].load(Relaxed))
            .map(|(i, _)| {
                if probe == 0 {
                    i
                } else {
                    self.servers[(start + probe) % n].0
                }
            })
            .ok_or(PickError::NoEndpoints)
    }
}
