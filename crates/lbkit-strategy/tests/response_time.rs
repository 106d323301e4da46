//! `weighted-response-time` through a balancer in virtual time: round robin until statistics
//! exist, Ribbon's weights after the next refresh tick, and nothing re-prepared in between.

use std::time::Duration;

use lbkit_core::{Availability, Balancer, FastRng, Outcome, PickContext, Strategy, Timestamp};
use lbkit_strategy::WeightedResponseTime;
use lbkit_testkit::dist::assert_fits;

#[test]
fn reweighs_on_the_refresh_tick() {
    let t0 = Timestamp::from_millis(1_000_000);
    let snap = lbkit_testkit::snapshot(&[("fast:1", 100), ("mid:1", 100), ("slow:1", 100)]);
    let strategy = WeightedResponseTime::default();
    assert_eq!(strategy.refresh_interval(), Some(Duration::from_secs(30)));
    let b = Balancer::new(strategy, snap.clone(), t0).with_availability(Availability::OFF);
    let note = |b: &Balancer<WeightedResponseTime>| {
        use lbkit_core::Picker;
        b.current()
            .picker()
            .explain(lbkit_core::EndpointIdx::new(0), Timestamp::ZERO)
            .unwrap()
    };
    assert!(note(&b).contains("round robin"), "{}", note(&b));

    // Traffic arrives over the interval: 10, 30 and 60 ms averages.
    for (e, ms) in snap.endpoints().iter().zip([10u64, 30, 60]) {
        for k in 0..20 {
            e.stats().record(
                Duration::from_millis(ms),
                t0 + Duration::from_millis(k * 1_500),
                Outcome::Success,
            );
        }
    }
    assert!(
        !b.tick(t0 + Duration::from_secs(29)),
        "not due before the interval"
    );
    assert!(b.tick(t0 + Duration::from_secs(30)));
    // Ribbon: Σ = 100 ms → weights 90, 70, 40.
    assert!(
        note(&b).contains("avg 10.000 ms; weight 90000000 (45.00% of picks)"),
        "{}",
        note(&b)
    );

    let mut rng = FastRng::seed_from_u64(5);
    let mut counts = [0u64; 3];
    let now = t0 + Duration::from_secs(30);
    for _ in 0..20_000 {
        let g = b.pick(&mut PickContext::new(now, &mut rng)).unwrap();
        counts[snap.find(g.endpoint().key()).unwrap().get()] += 1;
        g.finish_at(Outcome::Success, now); // zero-latency samples do not matter until the next tick
    }
    assert_fits(
        &counts,
        &[90.0, 70.0, 40.0],
        "weighted-response-time after refresh",
    );
}
