use super::*;
use crate::round_robin::counter;
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

/// `weights` as the (index, weight) list the pickers are built from, endpoint i at index i.
fn indexed(weights: &[u64]) -> Vec<(EndpointIdx, u64)> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| (EndpointIdx::new(i), w))
        .collect()
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
fn large_fleets_with_many_weights_use_the_folded_cycle_with_exact_shares() {
    // Σw ≈ 2.5 million > MAX_CYCLE: the table holds the golden cycle of ⌊wᵢ / 3⌋.
    let weights: Vec<u64> = (0..5_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let p = picker(&weights);
    assert!(matches!(p.order, Order::Folded(_)), "{:?}", p.order);
    assert!(!p.is_exact_nginx_order());
    let total: u64 = weights.iter().sum();
    let seq = picks(&p, 777 + total as usize);
    for start in [0, 777] {
        let mut counts = vec![0u64; weights.len()];
        for &i in &seq[start..start + total as usize] {
            counts[i] += 1;
        }
        assert_eq!(
            counts, weights,
            "the span of Σw picks from {start} holds exactly wᵢ of each"
        );
    }
    let explained = p.explain(EndpointIdx::new(0), Timestamp::ZERO).unwrap();
    assert!(
        explained.ends_with("folded golden stride cycle"),
        "{explained}"
    );
}

/// The most picks any endpoint runs ahead of or behind its ideal share `t · wᵢ / W` over the
/// first period, and its longest wait in units of its ideal interval `W / wᵢ`.
fn spread(order: impl Iterator<Item = usize>, weights: &[u64]) -> (f64, f64) {
    let total: u64 = weights.iter().sum();
    let mut counts = vec![0u64; weights.len()];
    let mut last = vec![None; weights.len()];
    let (mut lead, mut wait) = (0f64, 0f64);
    for (t, i) in order.take(total as usize).enumerate() {
        let ideal = |t: usize| t as f64 * weights[i] as f64 / total as f64;
        lead = lead.max(ideal(t) - counts[i] as f64);
        counts[i] += 1;
        lead = lead.max(counts[i] as f64 - ideal(t + 1));
        if let Some(l) = last[i] {
            wait = wait.max((t - l) as f64 * weights[i] as f64 / total as f64);
        }
        last[i] = Some(t);
    }
    (lead, wait)
}

#[test]
fn folded_cycles_spread_each_endpoint_evenly() {
    // Measured (lead, longest wait): 4.3 and 2.4 for 5 000 endpoints (D = 3); 4.2–4.6 and
    // 2.2–2.3 for 1 000 folded into 19 494 or 1 500 entries (2.4 % or 25 % leftover picks);
    // 4.8–5.1 and 2.5 for the benchmark's 100 000. With the first coprime step above W/φ
    // (partial quotients up to 46) the 5 000 case had an endpoint 11.4 picks behind.
    for (n, limit) in [
        (5_000, folded_limit(5_000)),
        (1_000, 20_000),
        (1_000, 2_000),
    ] {
        let weights: Vec<u64> = (0..n).map(|i| 1 + (i * 7919) % 997).collect();
        let items = indexed(&weights);
        let f = Folded::new(&items, 1, limit).unwrap();
        let (lead, wait) = spread(
            (0u64..).map(|c| f.pick(c.wrapping_mul(f.step)).get()),
            &weights,
        );
        assert!(lead < 6.0, "n {n} limit {limit}: lead {lead}");
        assert!(wait < 3.0, "n {n} limit {limit}: wait {wait}");
    }
}

#[test]
fn golden_steps_avoid_large_partial_quotients() {
    // The first coprime steps above W/φ had partial quotients of 106, 46 and 11.
    for total in [
        49_902_999u64,
        830_163,
        1_511_230,
        2_495_503,
        498_405,
        (1 << 32) - 1,
    ] {
        let step = golden_step(total);
        assert_eq!(gcd(step, total), 1);
        let largest = largest_partial_quotient(step, total);
        assert!(
            largest <= 6,
            "{total}: step {step}, partial quotient {largest}"
        );
        assert!(step.abs_diff((total as f64 / 1.618_033_988_749_895) as u64) < 64);
    }
    assert_eq!(golden_step(1), 1);
    assert_eq!(golden_step(2), 1);
    assert_eq!(largest_partial_quotient(8, 13), 2);
}

#[test]
fn many_distinct_weights_in_a_short_cycle_get_the_golden_stride_unrolled() {
    // 1 000 endpoints, 997 distinct weights, Σw ≈ 500 000: the nginx cycle would take
    // 500 000 × 997 steps to build, so the stride's order is stored instead.
    let weights: Vec<u64> = (0..1_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let p = picker(&weights);
    assert!(
        matches!(p.order, Order::Cycle(_, CycleKind::Golden)),
        "{:?}",
        p.order
    );
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
    let items = indexed(&weights);
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

    /// Fleets warming up: many endpoints sharing a few weights, so each weight group's cursor
    /// wraps many times a cycle, and ties between groups are common.
    #[test]
    fn warming_fleets_cycle_as_the_nginx_reference(
        weights in proptest::collection::vec(1u64..6, 1..80),
        scale in 1u64..4,
    ) {
        let weights: Vec<u64> = weights.iter().map(|w| w * scale).collect();
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

    /// Any span of W picks of a folded cycle holds exactly wᵢ of each endpoint, however small
    /// the table (up to every pick a leftover), and whatever the weights' common divisor.
    #[test]
    fn folded_cycles_hold_exact_shares_in_any_span(
        weights in proptest::collection::vec(0u64..3000, 1..40),
        factor in 1u64..4,
        limit in 1u64..300,
        offset in 0u64..20_000,
        phase in any::<u64>(),
    ) {
        let items: Vec<(EndpointIdx, u64)> = weights.iter().enumerate().filter(|&(_, &w)| w > 0).map(|(i, &w)| (EndpointIdx::new(i), w * factor)).collect();
        prop_assume!(!items.is_empty());
        let g = items.iter().fold(0, |g, &(_, w)| gcd(g, w));
        let total: u64 = items.iter().map(|&(_, w)| w / g).sum();
        let Some(f) = Folded::new(&items, g, limit) else {
            // Only when more than half the picks would be leftovers.
            let d = total.div_ceil(limit);
            prop_assert!(items.iter().map(|&(_, w)| w / g % d).sum::<u64>() > total / 2);
            return Ok(());
        };
        // Memory: the table and a stored leftover order each within the limit.
        prop_assert!(f.table.len() as u64 <= limit);
        if let Rest::Cycle(rest) = &f.rest {
            prop_assert!(rest.len() as u64 <= limit);
        }
        let expected: Vec<u64> = weights.iter().map(|&w| w * factor / g).collect();
        // From counter 0 on, and from any value the shared counter may hold (another
        // snapshot's picker advanced it): the counter is a phase, and a span of W steps holds
        // each endpoint's share unless k·ε/2⁶⁴ crosses an integer inside it, about once per
        // 2⁶⁴ / W² spans.
        for start in [offset.wrapping_mul(f.step), phase] {
            let mut counts = vec![0u64; weights.len()];
            for k in 0..total {
                counts[f.pick(start.wrapping_add(k.wrapping_mul(f.step))).get()] += 1;
            }
            prop_assert_eq!(&counts, &expected, "from phase {}", start);
        }
    }

    /// `bresenham` is exact division for any total below 2³², against `u128` arithmetic.
    #[test]
    fn bresenham_counts_leftovers_exactly(
        total in 1u64..(1 << 32),
        leftover_frac in 0f64..1.0,
        cs in proptest::collection::vec(any::<u64>(), 1..40),
    ) {
        let r = ((total as f64 * leftover_frac) as u64).min(total - 1);
        let rate = u64::try_from((u128::from(r) << 64).div_ceil(u128::from(total))).unwrap();
        for c in cs.into_iter().map(|c| c % total).chain([0, total - 1]) {
            let exact = |c: u64| u128::from(c) * u128::from(r) / u128::from(total);
            let (before, leftover) = bresenham(c, rate);
            prop_assert_eq!(u128::from(before), exact(c), "c {} R {} W {}", c, r, total);
            prop_assert_eq!(leftover, exact(c + 1) > exact(c), "c {} R {} W {}", c, r, total);
        }
    }

    #[test]
    fn lemire_mod_matches_the_remainder(a in 0u64..(1 << 32), d in 1u64..(1 << 32)) {
        let m = (u64::MAX / d).wrapping_add(1);
        prop_assert_eq!(lemire_mod(a, m, d), a % d);
        prop_assert_eq!(lemire_mod(d - 1, m, d), d - 1);
        prop_assert_eq!(lemire_mod(d, m, d), 0);
    }

    /// One correction suffices, for any divisor and any 64-bit value.
    #[test]
    fn barrett_matches_the_remainder_anywhere(
        x in any::<u64>(),
        d in prop_oneof![1u64..1000, 1u64..(1 << 32), 1u64..=u64::MAX],
    ) {
        prop_assert_eq!(barrett(x, d, u64::MAX / d), x % d);
        prop_assert_eq!(barrett(u64::MAX - x % 7, d, u64::MAX / d), (u64::MAX - x % 7) % d);
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

#[test]
fn folded_leftovers_keep_exact_shares_in_every_kind_of_order() {
    let cases: [(&str, u64, Vec<u64>); 5] = [
        ("none", 100, vec![1_000, 3_000]),
        ("cycle", 192, vec![2_667, 2_990]),
        (
            "stride",
            55,
            vec![
                668, 2155, 1444, 350, 497, 2375, 278, 417, 1333, 1862, 86, 2961, 2537, 1471, 1479,
                2386, 1287, 1558, 1268, 2801, 2497, 844, 949, 310,
            ],
        ),
        (
            "stride",
            21,
            vec![
                1345, 1586, 2491, 2089, 1958, 1942, 2677, 943, 2175, 856, 512, 1242, 1602, 325,
                2546, 1899, 2900, 2739, 2611, 2251, 973, 446, 1445,
            ],
        ),
        (
            "no fold",
            6,
            vec![
                980, 2143, 451, 2932, 838, 122, 2553, 38, 1200, 1124, 950, 2464, 578, 466,
            ],
        ),
    ];
    for (kind, limit, weights) in cases {
        let items = indexed(&weights);
        let Some(f) = Folded::new(&items, 1, limit) else {
            assert_eq!(kind, "no fold");
            continue;
        };
        let found = match f.rest {
            Rest::None => "none",
            Rest::Cycle(_) => "cycle",
            Rest::Stride(_) => "stride",
        };
        assert_eq!(found, kind, "{weights:?}");
        let total: u64 = weights.iter().sum();
        for start in [0, 12_345] {
            let mut counts = vec![0u64; weights.len()];
            for k in start..start + total {
                counts[f.pick(k.wrapping_mul(f.step)).get()] += 1;
            }
            assert_eq!(counts, weights, "{kind} from {start}");
        }
    }
}

/// Folded::pick at position c computed with exact division, the reference for the fixed-point
/// Bresenham step and Lemire's remainder.
fn folded_reference(f: &Folded, c: u64) -> EndpointIdx {
    let leftovers = match &f.rest {
        Rest::None => 0,
        Rest::Cycle(rest) => rest.len() as u64,
        Rest::Stride(stride) => stride.total,
    };
    let exact = |c: u64| (u128::from(c) * u128::from(leftovers) / u128::from(f.total)) as u64;
    let before = exact(c);
    if exact(c + 1) > before {
        return match &f.rest {
            Rest::Cycle(rest) => rest[before as usize],
            Rest::Stride(stride) => stride.owner(before * stride.step),
            Rest::None => unreachable!(),
        };
    }
    f.table[((c - before) % f.table.len() as u64) as usize]
}

#[test]
fn the_phase_is_the_pick_count_mod_w_until_it_drifts_by_one() {
    // floor(k·step·W / 2⁶⁴) = k mod W while k·ε < 2⁶⁴ (ε = step·W − 2⁶⁴ < W, so past 2³²
    // picks), and one position ahead at the first k past that; a power-of-two W never drifts.
    let mut rng = FastRng::seed_from_u64(18);
    let mut totals = vec![
        (1u64 << 20) + 1,
        (1 << 32) - 1,
        (1 << 32) - 5,
        3 << 30,
        1 << 31,
        (1 << 31) + 1,
        49_902_999,
    ];
    totals.extend((0..500).map(|_| (1 << 20) + rng.index((1 << 32) - (1 << 20)) as u64));
    let c = |phase: u64, w: u64| ((u128::from(phase) * u128::from(w)) >> 64) as u64;
    for w in totals {
        let step = phase_step(w);
        let eps = u128::from(step) * u128::from(w) - (1u128 << 64);
        assert!(eps < u128::from(w));
        if eps == 0 {
            for k in [0u64, 1, w - 1, w, 1 << 40, u64::MAX] {
                assert_eq!(c(k.wrapping_mul(step), w), k % w);
            }
            continue;
        }
        let first_off = ((1u128 << 64).div_ceil(eps)) as u64;
        assert!(first_off > 1 << 32, "W {w}");
        let some = rng.index(first_off as usize) as u64;
        for k in [
            0,
            1,
            w - 1,
            w,
            w + 1,
            first_off / 2,
            first_off - 2,
            first_off - 1,
            some,
        ] {
            assert_eq!(c(k.wrapping_mul(step), w), k % w, "W {w} k {k}");
        }
        assert_eq!(
            c(first_off.wrapping_mul(step), w),
            (first_off + 1) % w,
            "W {w}"
        );
    }
}

#[test]
fn totals_near_two_to_the_32_fold_and_pick_what_exact_division_picks() {
    for weights in [
        vec![1u64 << 31, (1 << 31) - 1],
        vec![4_000_000_000, 294_967_295],
        vec![3, u64::from(u32::MAX) - 3],
        vec![(1 << 20) + 7, 1, 2, 3],
    ] {
        let items = indexed(&weights);
        let p = SmoothWeightedPicker::build(items, counter(0), Unroll::Yes);
        let Order::Folded(f) = &p.order else {
            panic!("{weights:?}: {:?}", p.order)
        };
        let mut rng = FastRng::seed_from_u64(32);
        let positions = (0..20_000).map(|_| rng.index(f.total as usize) as u64);
        for c in positions.chain([0, 1, f.total - 2, f.total - 1]) {
            assert_eq!(
                f.pick(c.wrapping_mul(f.step)),
                folded_reference(f, c),
                "{weights:?} at {c}"
            );
        }
    }
}

#[test]
fn fleets_too_large_for_sixteen_entries_each_keep_the_stride() {
    // 300 000 endpoints of 997 distinct weights: a table of 16 entries each would exceed
    // MAX_FOLDED, and the leftovers would grow with n.
    let weights: Vec<u64> = (0..300_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let items = indexed(&weights);
    let p = SmoothWeightedPicker::build(items.clone(), counter(0), Unroll::Yes);
    assert!(matches!(p.order, Order::Stride(_)));
    let fewer = SmoothWeightedPicker::build(items[..262_144].to_vec(), counter(0), Unroll::Yes);
    assert!(matches!(fewer.order, Order::Folded(_)));
}

/// The figures BENCHMARKS.md quotes for the benchmark's 100 000 skewed weights: the folded
/// cycle's sizes, and each order's lead and longest wait over one period (`spread`), for the
/// stride with the step this module searches for, with the first coprime step above W/φ (the
/// step before the search), and for the folded cycle. A measurement, not a check:
/// `cargo test --release -p lbkit-strategy measure_the_bench_weights -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_the_bench_weights() {
    let weights: Vec<u64> = (0..100_000u64).map(|i| 1 + (i * 7919) % 997).collect();
    let items = indexed(&weights);
    let f = Folded::new(&items, 1, folded_limit(items.len())).unwrap();
    let stored = match &f.rest {
        Rest::Cycle(rest) => rest.len(),
        _ => 0,
    };
    println!(
        "W {} D {} table {} stored leftovers {}",
        f.total,
        f.total.div_ceil(folded_limit(items.len())),
        f.table.len(),
        stored
    );
    let s = GoldenStride::new(&items);
    let mut first = (s.total as f64 / 1.618_033_988_749_895) as u64;
    while gcd(first, s.total) != 1 {
        first += 1;
    }
    for (name, step) in [("searched", s.step), ("first coprime", first)] {
        let order = (0u64..).map(|k| s.owner(k.wrapping_mul(step)).get());
        let (lead, wait) = spread(order, &weights);
        let largest = largest_partial_quotient(step, s.total);
        println!(
            "stride, {name} step {step} (largest partial quotient {largest}): \
             lead {lead:.2}, wait {wait:.2}"
        );
    }
    let (lead, wait) = spread(
        (0u64..).map(|k| f.pick(k.wrapping_mul(f.step)).get()),
        &weights,
    );
    println!("folded: lead {lead:.2}, wait {wait:.2}");
}
