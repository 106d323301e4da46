use super::*;
use lbkit_core::Strategy;
use lbkit_core::{EndpointSpec, FastRng};
use proptest::prelude::*;

/// nginx's algorithm as published, O(n) per pick: the reference the cycle must equal.
fn nginx_reference(weights: &[u64], picks: usize) -> Vec<usize> {
    let total: i128 = weights.iter().map(|&w| i128::from(w)).sum();
    let mut current = vec![0i128; weights.len()];
    (0..picks)
        .map(|_| {
            let mut best = 0;
            for (i, &w) in weights.iter().enumerate() {
                current[i] += i128::from(w);
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            best
        })
        .collect()
}

fn picker(weights: &[u64]) -> SmoothWeightedPicker {
    let specs = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| EndpointSpec::new(format!("10.0.0.{i}:80")).with_weight(w as u32))
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    SmoothWeightedRoundRobin::new().prepare(&snap, Timestamp::ZERO)
}

fn picks(p: &SmoothWeightedPicker, n: usize) -> Vec<usize> {
    let mut rng = FastRng::seed_from_u64(0);
    (0..n)
        .map(|_| {
            p.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng))
                .unwrap()
                .get()
        })
        .collect()
}

#[test]
fn nginx_commit_sequence() {
    // nginx commit "Upstream: smooth weighted round-robin balancing" (2012): {5,1,1} → a a b a c a a.
    assert_eq!(
        picks(&picker(&[5, 1, 1]), 14),
        [0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0]
    );
}

#[test]
fn dubbo_documented_table() {
    // Dubbo's RoundRobinLoadBalance docs, weights A:3 B:2 C:1 → A B A C B A.
    assert_eq!(picks(&picker(&[3, 2, 1]), 6), [0, 1, 0, 2, 1, 0]);
}

#[test]
fn equal_weights_are_plain_round_robin() {
    assert_eq!(picks(&picker(&[100, 100, 100]), 6), [0, 1, 2, 0, 1, 2]);
}

#[test]
fn zero_weights_never_picked() {
    let p = picker(&[0, 2, 0, 1]);
    assert_eq!(picks(&p, 6), [1, 3, 1, 1, 3, 1]);
}

#[test]
fn large_fleets_with_many_weights_use_the_stride_with_exact_shares() {
    let weights: Vec<u64> = (0..5_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let p = picker(&weights);
    assert!(!p.is_exact_nginx_order());
    let total: u64 = weights.iter().sum();
    let mut counts = vec![0u64; weights.len()];
    for i in picks(&p, total as usize) {
        counts[i] += 1;
    }
    assert_eq!(
        counts, weights,
        "one span of Σw picks holds exactly wᵢ of each"
    );
}

#[test]
fn many_distinct_weights_in_a_short_cycle_get_the_golden_stride_unrolled() {
    // 1 000 endpoints, 997 distinct weights, Σw ≈ 500 000: the nginx cycle would take
    // 500 000 × 997 steps to build, so the stride's order is stored instead.
    let weights: Vec<u64> = (0..1_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let p = picker(&weights);
    assert!(matches!(p.order, Order::Golden(_)), "{:?}", p.order);
    assert!(!p.is_exact_nginx_order());
    let total: u64 = weights.iter().sum();
    // Any span of Σw picks (here from pick 12 345 on) holds exactly wᵢ of each.
    let seq = picks(&p, 12_345 + total as usize);
    let mut counts = vec![0u64; weights.len()];
    for &i in &seq[12_345..] {
        counts[i] += 1;
    }
    assert_eq!(counts, weights);
    // The same order the stride computes per pick.
    let items: Vec<(EndpointIdx, u64)> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| (EndpointIdx::new(i), w))
        .collect();
    let s = GoldenStride::new(&items);
    for (k, &i) in seq.iter().take(20_000).enumerate() {
        assert_eq!(
            i,
            s.owner((k as u64).wrapping_mul(s.step)).get(),
            "pick {k}"
        );
    }
    let explained = p.explain(EndpointIdx::new(0), Timestamp::ZERO).unwrap();
    assert!(explained.ends_with("golden stride cycle"), "{explained}");
}

#[test]
fn load_driven_schedulers_compute_the_stride_per_pick() {
    // The same weights as above through the static scheduler of adaptive / least-request:
    // no table of Σw entries rebuilt every period, the same order.
    let items: Vec<(EndpointIdx, u64)> = (0..1_000u64)
        .map(|i| (EndpointIdx::new(i as usize), 1 + (i * 7919) % 997))
        .collect();
    let scheduler = SmoothWeightedPicker::from_weights(items.clone(), counter(0));
    assert!(matches!(scheduler.order, Order::Stride(_)));
    let unrolled = SmoothWeightedPicker::build(items, counter(0), Unroll::Yes);
    assert_eq!(picks(&scheduler, 5_000), picks(&unrolled, 5_000));
}

#[test]
fn inverse_mod_inverts() {
    for m in [1u64, 2, 3, 10, 997, 1 << 20, (1 << 20) - 3] {
        for a in [1u64, 3, 7, 618_034, 999_983] {
            if gcd(a, m) != 1 {
                continue;
            }
            let inv = inverse_mod(a, m);
            assert!(inv < m.max(1));
            assert_eq!(
                u128::from(a) * u128::from(inv) % u128::from(m),
                1 % u128::from(m)
            );
        }
    }
}

#[test]
fn a_hundred_thousand_equal_endpoints_keep_the_exact_cycle() {
    let p = picker(&vec![100; 100_000]);
    assert!(p.is_exact_nginx_order());
    assert_eq!(picks(&p, 3), [0, 1, 2]);
}

proptest! {
    #[test]
    fn cycle_equals_nginx_reference(weights in proptest::collection::vec(0u64..20, 1..12)) {
        prop_assume!(weights.iter().any(|&w| w > 0));
        let total: u64 = weights.iter().sum();
        let n = 2 * total as usize + 3;
        prop_assert_eq!(picks(&picker(&weights), n), nginx_reference(&weights, n));
    }

    #[test]
    fn every_window_holds_exact_shares_with_bounded_gaps(weights in proptest::collection::vec(1u64..50, 1..10)) {
        let g = weights.iter().fold(0, |g, &w| gcd(g, w));
        let w: Vec<u64> = weights.iter().map(|&x| x / g).collect();
        let cycle: u64 = w.iter().sum();
        let seq = picks(&picker(&weights), 3 * cycle as usize);
        for start in [0usize, 1, cycle as usize / 2, cycle as usize] {
            let mut counts = vec![0u64; w.len()];
            for &i in &seq[start..start + cycle as usize] {
                counts[i] += 1;
            }
            prop_assert_eq!(&counts, &w);
        }
        // Smoothness: nginx keeps every current weight inside (−T, T), so the pick count lags
        // the ideal t·wᵢ/T by less than 1 and two picks of i are under 2T/wᵢ + 1 apart.
        for (i, &wi) in w.iter().enumerate() {
            let pos: Vec<usize> = seq.iter().enumerate().filter(|&(_, &x)| x == i).map(|(p, _)| p).collect();
            let bound = (2 * cycle).div_ceil(wi) as usize + 1;
            prop_assert!(pos.windows(2).all(|p| p[1] - p[0] <= bound), "gap over {bound} for {i}");
        }
    }

    #[test]
    fn golden_stride_spans_hold_exact_shares(weights in proptest::collection::vec(0u64..1000, 1..40), offset in 0u64..10_000) {
        let items: Vec<(EndpointIdx, u64)> = weights.iter().enumerate().filter(|&(_, &w)| w > 0).map(|(i, &w)| (EndpointIdx::new(i), w)).collect();
        prop_assume!(!items.is_empty());
        let s = GoldenStride::new(&items);
        let total: u64 = items.iter().map(|&(_, w)| w).sum();
        let mut counts = vec![0u64; weights.len()];
        // As the picker drives it: the counter advances by the step.
        for k in offset..offset + total {
            counts[s.owner(k.wrapping_mul(s.step)).get()] += 1;
        }
        prop_assert_eq!(counts, weights);
    }

    /// The unrolled cycle is the stride's order from counter 0, whatever the weights' common
    /// divisor (the cycle is over the divided weights, so its picks repeat every Σw / gcd).
    #[test]
    fn golden_cycle_is_the_stride_order(
        weights in proptest::collection::vec(1u64..1000, 1..40),
        factor in 1u64..4,
    ) {
        let items: Vec<(EndpointIdx, u64)> = weights.iter().enumerate().map(|(i, &w)| (EndpointIdx::new(i * 2), w * factor)).collect();
        let g = items.iter().fold(0, |g, &(_, w)| gcd(g, w));
        let cycle = golden_cycle(&items, g);
        let reduced: Vec<(EndpointIdx, u64)> = items.iter().map(|&(i, w)| (i, w / g)).collect();
        let s = GoldenStride::new(&reduced);
        prop_assert_eq!(cycle.len() as u64, s.total);
        for (k, &i) in cycle.iter().enumerate() {
            prop_assert_eq!(i, s.owner((k as u64).wrapping_mul(s.step)), "entry {}", k);
        }
    }

    /// The fast paths (a Barrett remainder, multiply-shift buckets, packed entries, the first-entry
    /// word) pick exactly the endpoint that owns point `counter mod total`, computed the slow
    /// way, for totals on both sides of 2³² and counters anywhere in the 64-bit range.
    #[test]
    fn golden_stride_owns_the_reference_point(
        weights in proptest::collection::vec(1u64..u64::from(u32::MAX), 1..60),
        scale in prop_oneof![Just(1u64), Just(1_000), Just(1u64 << 20)],
        ks in proptest::collection::vec(any::<u64>(), 1..50),
        spread in 1usize..3,
    ) {
        // spread 1: entry j is endpoint j (no index array); 2: every other endpoint.
        let items: Vec<(EndpointIdx, u64)> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (EndpointIdx::new(i * spread), (w / scale).max(1)))
            .collect();
        let s = GoldenStride::new(&items);
        let ends: Vec<u64> = items.iter().scan(0, |a, &(_, w)| { *a += w; Some(*a) }).collect();
        let total = *ends.last().unwrap();
        for c in ks.into_iter().chain([0, 1, total - 1, total, u64::MAX]) {
            let point = c % total;
            let owner = ends.partition_point(|&e| e <= point);
            prop_assert_eq!(s.owner(c).get(), owner * spread, "counter {} point {} total {}", c, point, total);
        }
    }
}

#[test]
fn barrett_matches_the_remainder() {
    for d in [
        1u64,
        2,
        3,
        7,
        1000,
        65_537,
        (1 << 32) - 5,
        u64::MAX / 3,
        u64::MAX,
    ] {
        let m = u64::MAX / d;
        for x in [
            0u64,
            1,
            d - 1,
            d,
            d.saturating_add(1),
            d.min(u64::MAX / 2) * 2,
            u64::MAX - 1,
            u64::MAX,
            0x1234_5678_9abc_def0,
        ] {
            assert_eq!(barrett(x, d, m), x % d, "{x} mod {d}");
        }
    }
}
