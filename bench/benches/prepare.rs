//! `Strategy::prepare` at 100 000 endpoints (target ≤ 50 ms), and weighted round robin's at
//! 1 000 skewed endpoints, where it builds a table of Σw entries. The snapshot is built once,
//! outside the timed closure; each iteration is one `prepare`, and divan drops the returned
//! picker after the sample, outside the timing.

use std::sync::Arc;

use divan::{black_box, Bencher};
use lbkit_bench::{snapshot, snapshot_with_response_times, Weights, STATS_NOW};
use lbkit_core::{EndpointSpec, Snapshot, Strategy, Timestamp};
use lbkit_strategy::{
    Random, RoundRobin, SmoothWeightedRoundRobin, StickyRoundRobin, WeightedRandom,
    WeightedResponseTime,
};

fn main() {
    divan::main();
}

const N: usize = 100_000;
const W: [Weights; 2] = [Weights::Uniform, Weights::Skewed];

fn bench_prepare<S: Strategy>(
    b: Bencher<'_, '_>,
    strategy: S,
    snap: Arc<Snapshot>,
    now: Timestamp,
) {
    b.bench_local(|| black_box(&strategy).prepare(black_box(&snap), now));
}

#[divan::bench(args = W, sample_count = 30)]
fn random(b: Bencher, w: Weights) {
    bench_prepare(b, Random, snapshot(N, w), Timestamp::ZERO);
}

#[divan::bench(args = W, sample_count = 30)]
fn round_robin(b: Bencher, w: Weights) {
    bench_prepare(b, RoundRobin::new(), snapshot(N, w), Timestamp::ZERO);
}

#[divan::bench(args = W, sample_count = 30)]
fn sticky_round_robin(b: Bencher, w: Weights) {
    bench_prepare(b, StickyRoundRobin::new(3), snapshot(N, w), Timestamp::ZERO);
}

#[divan::bench(args = W, sample_count = 30)]
fn weighted_random(b: Bencher, w: Weights) {
    bench_prepare(b, WeightedRandom, snapshot(N, w), Timestamp::ZERO);
}

#[divan::bench(args = W, sample_count = 30)]
fn weighted_round_robin(b: Bencher, w: Weights) {
    bench_prepare(
        b,
        SmoothWeightedRoundRobin::new(),
        snapshot(N, w),
        Timestamp::ZERO,
    );
}

/// 1 000 endpoints of 997 distinct weights (Σw ≈ 500 000): too many groups for the nginx cycle,
/// so the golden-ratio stride's cycle is stored (`pick::weighted_round_robin_skewed` at 1 000).
#[divan::bench(sample_count = 30)]
fn weighted_round_robin_skewed_1000(b: Bencher) {
    bench_prepare(
        b,
        SmoothWeightedRoundRobin::new(),
        snapshot(1_000, Weights::Skewed),
        Timestamp::ZERO,
    );
}

/// 10 000 endpoints warming up: weights 1 to `top` spread as Dubbo's warm-up spreads them over
/// a fleet that registered within the last `top` × 6 s (5: half a minute, five distinct
/// weights, the nginx cycle; 100: ten minutes, too many groups for it, the golden-ratio
/// stride's cycle). What `lbkit watch` and the proxy rebuild on every publish under churn.
#[divan::bench(args = [5, 100], sample_count = 30)]
fn weighted_round_robin_warming_10000(b: Bencher, top: u32) {
    let specs = (0..10_000)
        .map(|i| {
            let weight = 1 + (i as u32).wrapping_mul(2_654_435_761) % top;
            EndpointSpec::new(lbkit_bench::address(i)).with_weight(weight)
        })
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    bench_prepare(b, SmoothWeightedRoundRobin::new(), snap, Timestamp::ZERO);
}

/// 1 000 endpoints of weights 1 to 80: a cycle of W ≈ 40 500 picks over 80 weight groups,
/// about 3.2 million steps, near `lbkit_strategy::MAX_CYCLE_WORK`: the
/// longest an nginx cycle takes to build.
#[divan::bench(sample_count = 30)]
fn weighted_round_robin_nginx_work_limit(b: Bencher) {
    let specs = (0..1_000)
        .map(|i| {
            let weight = 1 + (i as u32).wrapping_mul(2_654_435_761) % 80;
            EndpointSpec::new(lbkit_bench::address(i)).with_weight(weight)
        })
        .collect();
    let snap = Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO));
    bench_prepare(b, SmoothWeightedRoundRobin::new(), snap, Timestamp::ZERO);
}

/// "uniform": no statistics (round-robin fallback); "skewed": one response time per endpoint,
/// 0.5–10.5 ms (weighted path; endpoint weights themselves are uniform).
#[divan::bench(args = W, sample_count = 30)]
fn weighted_response_time(b: Bencher, w: Weights) {
    match w {
        Weights::Uniform => bench_prepare(
            b,
            WeightedResponseTime::default(),
            snapshot(N, w),
            Timestamp::ZERO,
        ),
        Weights::Skewed => bench_prepare(
            b,
            WeightedResponseTime::default(),
            snapshot_with_response_times(N),
            STATS_NOW,
        ),
    }
}

/// Context: building the snapshot itself from 100 000 specs (the specs are cloned outside the
/// timing; the clone's allocation is freed inside `from_specs`).
#[divan::bench(args = W, sample_count = 30)]
fn snapshot_from_specs(b: Bencher, w: Weights) {
    let specs: Vec<EndpointSpec> = (0..N)
        .map(|i| EndpointSpec::new(lbkit_bench::address(i)).with_weight(w.of(i)))
        .collect();
    b.with_inputs(|| specs.clone())
        .bench_local_values(|specs| Snapshot::from_specs(specs, Timestamp::ZERO));
}

/// A change of one endpoint (one gone, one come) in a set of 10 000, the sets in key order as
/// registry sources list them: the next picker prepared from scratch (`scratch`) against
/// `Strategy::prepare_next` from the last picker (`next`), what a `Balancer` publish runs
/// (issue 44: what a change costs). Default weights (100: ketama's ring is then scaled to its
/// 16 777 216-point cap).
mod change {
    use std::borrow::Cow;
    use std::sync::Arc;

    use divan::{black_box, Bencher};
    use lbkit_core::route::TAG_KEY;
    use lbkit_core::stage::{Localities, Stages};
    use lbkit_core::{Balancer, EndpointSpec, Snapshot, SnapshotBuilder, Strategy, Timestamp};
    use lbkit_strategy::{
        ConsistentHash, Ketama, LeastRequest, Maglev, P2cEwma, Rendezvous, RoundRobin,
        SmoothWeightedRoundRobin, WeightedRandom,
    };

    const N: usize = 10_000;
    const HOW: [&str; 2] = ["scratch", "next"];

    /// The last set and the next: the 5 000th endpoint gone, one new (last in key order).
    fn sets() -> (Arc<Snapshot>, Arc<Snapshot>) {
        sets_with(|s, _| s)
    }

    /// A Dubbo fleet's address: its own host, every provider on port 20880 (as
    /// `scripts/bench-scale.py` registers them). Unlike [`lbkit_bench::address`]'s ports of
    /// one to five digits, no two of these with a replica number appended read the same, so
    /// Dubbo's ring has almost no shared points.
    fn fleet_address(i: usize) -> String {
        format!(
            "10.{}.{}.{}:20880",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        )
    }

    /// [`sets`], each endpoint's spec passed through `with` with its third (0, 1 or 2, by
    /// its address).
    fn sets_with(with: fn(EndpointSpec, u32) -> EndpointSpec) -> (Arc<Snapshot>, Arc<Snapshot>) {
        let mut addresses: Vec<String> = (0..N).map(lbkit_bench::address).collect();
        addresses.sort();
        let spec = |a: &String| {
            with(
                EndpointSpec::new(a),
                a.bytes().map(u32::from).sum::<u32>() % 3,
            )
        };
        let specs = |a: &[String]| -> Vec<EndpointSpec> {
            let mut s: Vec<EndpointSpec> = a.iter().map(spec).collect();
            s.sort_by(|x, y| x.key.cmp(&y.key));
            s
        };
        let mut b = SnapshotBuilder::new();
        let last = b.reset_from(specs(&addresses).iter().map(Cow::Borrowed), Timestamp::ZERO);
        addresses.remove(N / 2);
        addresses.push("127.0.200.1:20880".to_owned());
        let next = b.reset_from(specs(&addresses).iter().map(Cow::Borrowed), Timestamp::ZERO);
        assert_eq!(next.len(), N);
        (last, next)
    }

    /// What every publish costs before any strategy: the Controller's `SnapshotBuilder::patch`
    /// of one endpoint (alternately gone and back, last in key order) in a set of 10 000,
    /// building the next snapshot and dropping the last (the copies by reference, the
    /// policy's per-endpoint arrays).
    #[divan::bench(sample_count = 30)]
    fn snapshot_patch(b: Bencher) {
        let mut addresses: Vec<String> = (0..N).map(lbkit_bench::address).collect();
        addresses.sort();
        let specs: Vec<EndpointSpec> = addresses.iter().map(EndpointSpec::new).collect();
        let mut builder = SnapshotBuilder::new();
        let mut last = builder.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
        let extra = EndpointSpec::new("127.0.200.1:20880");
        let mut present = false;
        b.bench_local(|| {
            let spec = (!present).then_some(Cow::Borrowed(&extra));
            present = !present;
            last = builder.patch(vec![(extra.key.clone(), spec)], Timestamp::ZERO);
            black_box(last.len())
        });
    }

    fn bench_change<S: Strategy>(b: Bencher<'_, '_>, strategy: S, how: &str) {
        let (last, next) = sets();
        let picker = strategy.prepare(&last, Timestamp::ZERO);
        if how == "scratch" {
            b.bench_local(|| black_box(&strategy).prepare(black_box(&next), Timestamp::ZERO));
        } else {
            b.bench_local(|| {
                black_box(&strategy).prepare_next(&last, &picker, black_box(&next), Timestamp::ZERO)
            });
        }
    }

    #[divan::bench(args = HOW, sample_count = 20)]
    fn consistent_hash(b: Bencher, how: &str) {
        bench_change(b, ConsistentHash::new(), how);
    }

    /// Publishes in a row, as under churn: the last set and the next in turn (an endpoint gone,
    /// then back), each ring patched from the last one and the last one dropped, as the
    /// proxy's Controller does. Unlike `next`, which patches the same warm ring every time,
    /// this counts what sharing and dropping the ring's pieces costs.
    #[divan::bench(sample_count = 20)]
    fn consistent_hash_chain(b: Bencher) {
        bench_chain(b, sets());
    }

    /// The same over a Dubbo fleet's addresses ([`fleet_address`]), the next set patched from
    /// the last as the Controller patches it (the two share their unchanged parts, so the
    /// snapshot diff is the live one): the ring of `scripts/bench-scale.py`'s churn, where few
    /// chunks hold a shared point.
    #[divan::bench(sample_count = 20)]
    fn consistent_hash_chain_fleet(b: Bencher) {
        let mut addresses: Vec<String> = (0..N).map(fleet_address).collect();
        addresses.sort();
        let specs: Vec<EndpointSpec> = addresses.iter().map(EndpointSpec::new).collect();
        let mut builder = SnapshotBuilder::new();
        let last = builder.reset_from(specs.iter().map(Cow::Borrowed), Timestamp::ZERO);
        let extra = EndpointSpec::new("10.255.0.1:20880");
        let edits = vec![
            (specs[N / 2].key.clone(), None),
            (extra.key.clone(), Some(Cow::Borrowed(&extra))),
        ];
        let next = builder.patch(edits, Timestamp::ZERO);
        assert_eq!(next.len(), N);
        bench_chain(b, (last, next));
    }

    fn bench_chain(b: Bencher<'_, '_>, (last, next): (Arc<Snapshot>, Arc<Snapshot>)) {
        let strategy = ConsistentHash::new();
        let sets = [last, next];
        let mut picker = strategy.prepare(&sets[0], Timestamp::ZERO);
        let mut at = 0;
        b.bench_local(|| {
            let (from, to) = (&sets[at], &sets[1 - at]);
            picker = black_box(&strategy).prepare_next(from, &picker, to, Timestamp::ZERO);
            at = 1 - at;
        });
    }

    /// A balancer's publishes in a row (an endpoint gone, then back) when the endpoints carry
    /// tags (a third `blue`, a third `green`, the rest none): the whole set's ring and one ring for each of the three subsets (`blue`, `green`,
    /// the untagged), each old snapshot and its rings dropped, as the proxy's Controller does.
    #[divan::bench(sample_count = 10)]
    fn consistent_hash_tagged_publish(b: Bencher) {
        let (last, next) = sets_with(|s, third| match third {
            0 => s.with_meta(TAG_KEY, "blue"),
            1 => s.with_meta(TAG_KEY, "green"),
            _ => s,
        });
        let no_stages = Stages::default();
        bench_publish(b, last, next, no_stages, |lb| {
            assert_eq!(lb.current().tag_sets(), 3)
        });
    }

    /// The same with two priority tiers instead of tags (two thirds in tier 0, healthy: every
    /// request reaches tier 0's ring; a third in the standby tier 1).
    #[divan::bench(sample_count = 10)]
    fn consistent_hash_tiered_publish(b: Bencher) {
        let (last, next) = sets_with(|s, third| s.with_priority(u32::from(third == 2)));
        let no_stages = Stages::default();
        bench_publish(b, last, next, no_stages, |lb| {
            assert!(lb.current().is_staged())
        });
    }

    /// The same with three zones (a third each) under locality-weighted balancing: a ring for
    /// each zone.
    #[divan::bench(sample_count = 10)]
    fn consistent_hash_zoned_publish(b: Bencher) {
        let (last, next) = sets_with(|s, third| s.with_zone(["x", "y", "z"][third as usize]));
        let stages = Stages {
            localities: Some(Localities::default()),
            ..Stages::default()
        };
        bench_publish(b, last, next, stages, |lb| {
            assert!(lb.current().is_staged())
        });
    }

    /// Tags and zones together: a third `blue`, a third `green`, the rest none (by address),
    /// and two zones (by the address's last digit) under locality-weighted balancing: a ring
    /// for each zone of the whole set and of each tag set.
    #[divan::bench(sample_count = 10)]
    fn consistent_hash_tagged_zoned_publish(b: Bencher) {
        let (last, next) = sets_with(|s, third| {
            let zone = ["x", "y"][usize::from(s.address.as_bytes()[s.address.len() - 1] % 2)];
            let s = s.with_zone(zone);
            match third {
                0 => s.with_meta(TAG_KEY, "blue"),
                1 => s.with_meta(TAG_KEY, "green"),
                _ => s,
            }
        });
        let stages = Stages {
            localities: Some(Localities::default()),
            ..Stages::default()
        };
        bench_publish(b, last, next, stages, |lb| {
            assert!(lb.current().is_staged());
            assert_eq!(lb.current().tag_sets(), 3);
        });
    }

    /// Metadata subsets: a third each of `version` v0, v1 and v2 (by address), subsets by
    /// `version`: the whole set's ring, its every-member leaf's and one for each version.
    #[divan::bench(sample_count = 10)]
    fn consistent_hash_subset_publish(b: Bencher) {
        use lbkit_core::stage::{SubsetFallback, Subsets};
        let (last, next) =
            sets_with(|s, third| s.with_meta("version", ["v0", "v1", "v2"][third as usize]));
        let stages = Stages {
            subsets: Some(Subsets::new(
                vec![vec!["version".into()]],
                SubsetFallback::Any,
            )),
            ..Stages::default()
        };
        bench_publish(b, last, next, stages, |lb| {
            assert!(lb.current().is_staged())
        });
    }

    /// A consistent-hash balancer on `last` under `stages`, publishing `next` and `last` in
    /// turn.
    fn bench_publish(
        b: Bencher<'_, '_>,
        last: Arc<Snapshot>,
        next: Arc<Snapshot>,
        stages: Stages,
        check: fn(&Balancer<ConsistentHash>),
    ) {
        let lb = Balancer::new(ConsistentHash::new(), last.clone(), Timestamp::ZERO)
            .with_stages(stages, Timestamp::ZERO);
        check(&lb);
        let sets = [last, next];
        let mut at = 1;
        b.bench_local(|| {
            lb.publish(black_box(sets[at].clone()), Timestamp::ZERO);
            at = 1 - at;
        });
    }

    #[divan::bench(args = HOW, sample_count = 10)]
    fn ketama(b: Bencher, how: &str) {
        bench_change(b, Ketama::new(), how);
    }

    /// Ketama's ring within the rebuild interval of the last splice: the last ring's points
    /// shared, the gone endpoint's slot dead, the new one waiting (`held`); and the splice at
    /// the interval's end of `k` changes in one (`k` out and `k` in, the last ring patched
    /// with all of them), against `k` patches of one change each in `change::ketama`.
    #[divan::bench(sample_count = 20)]
    fn ketama_held(b: Bencher) {
        use lbkit_core::Picker;
        let (last, next) = sets();
        let strategy = Ketama::new().with_rebuild_interval(lbkit_strategy::TICKED_REBUILD_INTERVAL);
        let ring = strategy.prepare(&last, Timestamp::ZERO);
        let at = Timestamp::from_millis(10);
        let held = strategy.prepare_next(&last, &ring, &next, at);
        assert!(held.refresh_at().is_some(), "held, not spliced");
        b.bench_local(|| black_box(&strategy).prepare_next(&last, &ring, black_box(&next), at));
    }

    /// See [`ketama_held`]: `k` changes spliced at once.
    #[divan::bench(args = [1, 10, 25], sample_count = 10)]
    fn ketama_splice(b: Bencher, k: usize) {
        let mut addresses: Vec<String> = (0..N).map(lbkit_bench::address).collect();
        addresses.sort();
        let specs = |a: &[String]| -> Vec<EndpointSpec> {
            let mut s: Vec<EndpointSpec> = a.iter().map(EndpointSpec::new).collect();
            s.sort_by(|x, y| x.key.cmp(&y.key));
            s
        };
        let mut builder = SnapshotBuilder::new();
        let last = builder.reset_from(specs(&addresses).iter().map(Cow::Borrowed), Timestamp::ZERO);
        for i in 0..k {
            addresses.remove(N / (k + 1) * (i + 1) - i);
            addresses.push(format!("127.0.200.{}:20880", i + 1));
        }
        let next = builder.reset_from(specs(&addresses).iter().map(Cow::Borrowed), Timestamp::ZERO);
        let strategy = Ketama::new().with_rebuild_interval(lbkit_strategy::TICKED_REBUILD_INTERVAL);
        let ring = strategy.prepare(&last, Timestamp::ZERO);
        let due = Timestamp::from_millis(100);
        b.bench_local(|| black_box(&strategy).prepare_next(&last, &ring, black_box(&next), due));
    }

    /// The table built (`scratch`, `next`: no rebuild interval, as every change past it).
    #[divan::bench(args = HOW, sample_count = 20)]
    fn maglev(b: Bencher, how: &str) {
        bench_change(b, Maglev::new(), how);
    }

    /// The last table patched: a change within the rebuild interval of the last build.
    #[divan::bench(sample_count = 20)]
    fn maglev_patch(b: Bencher) {
        use lbkit_core::Picker;
        let (last, next) = sets();
        let strategy = Maglev::new().with_rebuild_interval(lbkit_strategy::TICKED_REBUILD_INTERVAL);
        let picker = strategy.prepare(&last, Timestamp::ZERO);
        let patched = strategy.prepare_next(&last, &picker, &next, Timestamp::ZERO);
        assert!(patched.refresh_at().is_some(), "a patch, not a build");
        b.bench_local(|| {
            black_box(&strategy).prepare_next(&last, &picker, black_box(&next), Timestamp::ZERO)
        });
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn round_robin(b: Bencher, how: &str) {
        bench_change(b, RoundRobin::new(), how);
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn weighted_round_robin(b: Bencher, how: &str) {
        bench_change(b, SmoothWeightedRoundRobin::new(), how);
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn weighted_random(b: Bencher, how: &str) {
        bench_change(b, WeightedRandom, how);
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn rendezvous(b: Bencher, how: &str) {
        bench_change(b, Rendezvous::new(), how);
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn least_request(b: Bencher, how: &str) {
        bench_change(b, LeastRequest::default(), how);
    }

    #[divan::bench(args = HOW, sample_count = 30)]
    fn p2c_ewma(b: Bencher, how: &str) {
        bench_change(b, P2cEwma::default(), how);
    }

    /// 10 000 endpoints of weight 100 in Dubbo's 10-minute warm-up, registered 30 ms apart
    /// (a fleet started at once), at 5 minutes: every weight differs and is computed again at
    /// each preparation.
    fn warming() -> (Arc<Snapshot>, Timestamp) {
        let mut addresses: Vec<String> = (0..N).map(lbkit_bench::address).collect();
        addresses.sort();
        let specs = (addresses.iter().enumerate()).map(|(i, a)| {
            let at = Timestamp::from_millis(i as u64 * 30);
            Cow::Owned(EndpointSpec::new(a).with_weight(100).with_registered_at(at))
        });
        let snap = SnapshotBuilder::new().reset_from(specs, Timestamp::ZERO);
        (snap, Timestamp::from_millis(300_000))
    }

    fn bench_warming<S: Strategy>(b: Bencher<'_, '_>, strategy: S) {
        let (snap, now) = warming();
        b.bench_local(|| black_box(&strategy).prepare(black_box(&snap), now));
    }

    #[divan::bench(sample_count = 30)]
    fn weighted_random_warming(b: Bencher) {
        bench_warming(b, WeightedRandom);
    }

    #[divan::bench(sample_count = 30)]
    fn least_request_warming(b: Bencher) {
        bench_warming(b, LeastRequest::default());
    }
}
