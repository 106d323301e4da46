//! A user-defined strategy, written outside the library crates with only the public API: the
//! seed framework's Ribbon rule "each server gets 3 calls, then switch to the next".
//!
//! The original kept its call count and position in plain fields, so concurrent callers
//! corrupted them. Here the count is one atomic counter shared by every prepared picker: any
//! number of threads can pick at once, and the rule holds exactly.
//!
//! Run it with `cargo run -p lbkit --example custom_strategy`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lbkit::{
    Balancer, EndpointIdx, EndpointSpec, FastRng, Outcome, PickContext, PickError, Picker,
    Snapshot, Strategy, Timestamp,
};

/// Each eligible endpoint gets `calls` consecutive calls, then the next one takes over.
pub struct CallsThenSwitch {
    calls: u64,
    counter: Arc<AtomicU64>,
}

impl CallsThenSwitch {
    /// The seed rule: 3 calls, then switch.
    pub fn new(calls: u64) -> Self {
        CallsThenSwitch {
            calls: calls.max(1),
            counter: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// The prepared picker: the eligible endpoints of one snapshot plus the shared counter.
pub struct CallsThenSwitchPicker {
    eligible: Vec<EndpointIdx>,
    calls: u64,
    counter: Arc<AtomicU64>,
}

impl Strategy for CallsThenSwitch {
    type Picker = CallsThenSwitchPicker;

    fn name(&self) -> &str {
        "calls-then-switch"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, _now: Timestamp) -> CallsThenSwitchPicker {
        CallsThenSwitchPicker {
            eligible: snapshot.eligible().to_vec(),
            calls: self.calls,
            counter: self.counter.clone(),
        }
    }
}

impl Picker for CallsThenSwitchPicker {
    fn pick(&self, _cx: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> {
        if self.eligible.is_empty() {
            return Err(PickError::NoEndpoints);
        }
        // One atomic step decides both "which endpoint" and "how many calls it had".
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        Ok(self.eligible[((n / self.calls) % self.eligible.len() as u64) as usize])
    }
}

/// Pick `count` times from three servers and return the addresses, in order.
pub fn demo(count: usize) -> Vec<String> {
    let now = Timestamp::ZERO;
    let servers = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"];
    let snapshot = Arc::new(Snapshot::from_specs(
        servers.iter().map(|a| EndpointSpec::new(*a)).collect(),
        now,
    ));
    let balancer = Balancer::new(CallsThenSwitch::new(3), snapshot, now);
    let mut rng = FastRng::seed_from_u64(1);
    (0..count)
        .map(|_| {
            let guard = balancer
                .pick(&mut PickContext::new(now, &mut rng))
                .expect("three healthy servers");
            let address = guard.endpoint().address().to_owned();
            guard.finish_at(Outcome::Success, now);
            address
        })
        .collect()
}

#[allow(dead_code)] // also compiled as a module of the tests, which call `demo` instead
fn main() {
    for address in demo(10) {
        println!("{address}");
    }
}
