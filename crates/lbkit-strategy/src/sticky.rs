//! `sticky-round-robin`: each endpoint receives `n` consecutive calls, then the next one.
//!
//! * **Algorithm**: a shared counter; index = (counter / n) mod endpoints.
//! * **Origin**: the custom Ribbon rule of the RPC framework lbkit replaces ("3 calls, then
//!   switch"), which kept its count in unsynchronised fields and broke under concurrency.
//! * **Complexity**: prepare O(n); pick O(1), one atomic add.
//! * **A change**: as round robin's: the eligible list copied again, O(n); the counter keeps its
//!   place.
//! * **Behaviour under trouble**: like round robin; useful to keep short bursts of related calls
//!   on one connection.
//! * **Differences from the origin**: thread-safe by construction (one atomic counter, no
//!   read-modify-write races), and the run length is a parameter (`n`, default 3).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::StickyRoundRobin;
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![EndpointSpec::new("a:1"), EndpointSpec::new("b:1")], Timestamp::ZERO));
//! let picker = StickyRoundRobin::new(2).prepare(&snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let picks: Vec<usize> = (0..5)
//!     .map(|_| picker.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng)).unwrap().get())
//!     .collect();
//! assert_eq!(picks, [0, 0, 1, 1, 0]);
//! ```

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lbkit_core::{EndpointIdx, PickContext, PickError, Picker, Snapshot, Strategy, Timestamp};

use crate::round_robin::{Counters, SharedCounter};

/// Default run length (the seed rule's 3 calls).
pub const DEFAULT_STICKY_RUN: u32 = 3;

/// `n` consecutive calls per endpoint, in turn.
#[derive(Debug, Clone)]
pub struct StickyRoundRobin {
    run: u64,
    counter: Counters,
}

impl Default for StickyRoundRobin {
    fn default() -> Self {
        StickyRoundRobin::new(DEFAULT_STICKY_RUN)
    }
}

// === impl StickyRoundRobin ===

impl StickyRoundRobin {
    /// `run` consecutive calls per endpoint (a run of 0 counts as 1).
    pub fn new(run: u32) -> Self {
        StickyRoundRobin {
            run: u64::from(run.max(1)),
            counter: Counters::new(0),
        }
    }
}

impl Strategy for StickyRoundRobin {
    type Picker = StickyPicker;

    fn name(&self) -> &str {
        "sticky-round-robin"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> StickyPicker {
        StickyPicker {
            eligible: snapshot.eligible().into(),
            run: self.run,
            counter: self.counter.of(snapshot),
        }
    }
}

/// Prepared [`StickyRoundRobin`].
#[derive(Debug)]
pub struct StickyPicker {
    eligible: Box<[EndpointIdx]>,
    run: u64,
    counter: SharedCounter,
}

impl Picker for StickyPicker {
    #[inline]
    fn pick(&self, _cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        let n = self.eligible.len() as u64;
        if n == 0 {
            return Err(PickError::NoEndpoints);
        }
        let c = self.counter.fetch_add(1, Relaxed);
        Ok(self.eligible[((c / self.run) % n) as usize])
    }

    fn explain(&self, _idx: EndpointIdx, _now: Timestamp) -> Option<String> {
        Some(format!("{} consecutive calls in turn", self.run))
    }
}
