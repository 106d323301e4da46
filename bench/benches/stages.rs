//! What each stage in front of a strategy adds to a pick (`lbkit_core::stage`): the same
//! strategy's `Prepared::select` undecorated, then behind one stage at a time and behind all
//! of them, over 1 000 endpoints, in one process run so the differences compare like with like.
//!
//! The endpoints: `version` v1/v2 (subsets), zones a/b/c (localities), a tenth in priority 1
//! (tiers), all healthy. The aperture is Finagle's deterministic one, 12 wide, client 17 of 100
//! (a slice of whole servers), and client 17 of 30 (`aperture_edges`: partly covered servers at
//! both ends, drawn by coverage).

use std::sync::Arc;

use divan::{black_box, Bencher};
use lbkit_core::stage::{
    Aperture, ApertureMode, Attr, Coordinates, Localities, Stages, SubsetFallback, Subsets,
};
use lbkit_core::{
    Availability, Balancer, BoxStrategy, EndpointSpec, FastRng, PickContext, Snapshot, Timestamp,
};
use lbkit_strategy::catalog::{build, Params};

fn main() {
    divan::main();
}

const N: usize = 1_000;
const ATTRS: &[Attr<'static>] = &[(b"version", b"v2")];

/// `tiers`: a tenth of the endpoints in priority 1; `spill`: and a third of priority 0 down, so
/// priority 0's health is ⌊1.4 × 66.7⌋ = 93 and 7 % of the picks spill to priority 1.
fn snapshot(tiers: bool, spill: bool) -> Arc<Snapshot> {
    let specs = (0..N)
        .map(|i| {
            EndpointSpec::new(format!(
                "10.{}.{}.{}:80",
                i / 65_536,
                (i / 256) % 256,
                i % 256
            ))
            .with_meta("version", if i % 2 == 0 { "v1" } else { "v2" })
            .with_zone(["a", "b", "c"][i % 3])
            .with_priority(u32::from(tiers && i % 10 == 9))
            .with_healthy(!(spill && i % 10 != 9 && i % 3 == 1))
        })
        .collect();
    Arc::new(Snapshot::from_specs(specs, Timestamp::ZERO))
}

fn subsets() -> Stages {
    Stages {
        subsets: Some(Subsets::new(
            vec![vec!["version".into()]],
            SubsetFallback::Any,
        )),
        ..Stages::default()
    }
}

fn localities() -> Stages {
    Stages {
        localities: Some(Localities::default()),
        ..Stages::default()
    }
}

fn aperture() -> Stages {
    aperture_of(17, 100)
}

/// Client 17 of 30: its slice, 1/30 of the ring (33⅓ servers), ends inside a server at both
/// edges, which are drawn by their coverage.
fn aperture_edges() -> Stages {
    aperture_of(17, 30)
}

fn aperture_of(index: u32, count: u32) -> Stages {
    Stages {
        aperture: Some(Aperture {
            size: 12,
            mode: ApertureMode::Deterministic,
            coordinates: Some(Coordinates { index, count }),
            seed: 1,
        }),
        ..Stages::default()
    }
}

fn all() -> Stages {
    Stages {
        subsets: subsets().subsets,
        localities: localities().localities,
        aperture: aperture().aperture,
        ..Stages::default()
    }
}

/// One `select` a iteration: the tag check, the stages, the strategy's pick and the filter.
fn bench(b: Bencher<'_, '_>, strategy: &str, stages: Option<Stages>, tiers: bool) {
    bench_on(b, strategy, stages, snapshot(tiers, false));
}

fn bench_on(b: Bencher<'_, '_>, strategy: &str, stages: Option<Stages>, snap: Arc<Snapshot>) {
    let s: BoxStrategy = build(strategy, Params::new()).unwrap();
    let mut lb = Balancer::new(s, snap, Timestamp::ZERO);
    if let Some(stages) = stages {
        lb = lb.with_stages(stages, Timestamp::ZERO);
    }
    let prepared = lb.current();
    let filter = Availability::OFF;
    let mut rng = FastRng::seed_from_u64(1);
    b.bench_local(|| {
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(ATTRS);
        black_box(&prepared).select(&mut cx, &filter)
    });
}

#[divan::bench_group(sample_size = 10_000)]
mod round_robin {
    use super::*;

    #[divan::bench]
    fn plain(b: Bencher) {
        bench(b, "round-robin", None, false);
    }

    #[divan::bench]
    fn subset(b: Bencher) {
        bench(b, "round-robin", Some(subsets()), false);
    }

    #[divan::bench]
    fn tiers(b: Bencher) {
        bench(b, "round-robin", Some(Stages::default()), true);
    }

    #[divan::bench]
    fn tiers_spilling(b: Bencher) {
        bench_on(
            b,
            "round-robin",
            Some(Stages::default()),
            snapshot(true, true),
        );
    }

    #[divan::bench]
    fn localities(b: Bencher) {
        bench(b, "round-robin", Some(super::localities()), false);
    }

    #[divan::bench]
    fn aperture(b: Bencher) {
        bench(b, "round-robin", Some(super::aperture()), false);
    }

    #[divan::bench]
    fn aperture_edges(b: Bencher) {
        bench(b, "round-robin", Some(super::aperture_edges()), false);
    }

    #[divan::bench]
    fn every_stage(b: Bencher) {
        bench(b, "round-robin", Some(all()), true);
    }
}

#[divan::bench_group(sample_size = 10_000)]
mod p2c_ewma {
    use super::*;

    #[divan::bench]
    fn plain(b: Bencher) {
        bench(b, "p2c-ewma", None, false);
    }

    #[divan::bench]
    fn subset(b: Bencher) {
        bench(b, "p2c-ewma", Some(subsets()), false);
    }

    #[divan::bench]
    fn tiers(b: Bencher) {
        bench(b, "p2c-ewma", Some(Stages::default()), true);
    }

    #[divan::bench]
    fn tiers_spilling(b: Bencher) {
        bench_on(b, "p2c-ewma", Some(Stages::default()), snapshot(true, true));
    }

    #[divan::bench]
    fn localities(b: Bencher) {
        bench(b, "p2c-ewma", Some(super::localities()), false);
    }

    #[divan::bench]
    fn aperture(b: Bencher) {
        bench(b, "p2c-ewma", Some(super::aperture()), false);
    }

    #[divan::bench]
    fn aperture_edges(b: Bencher) {
        bench(b, "p2c-ewma", Some(super::aperture_edges()), false);
    }

    #[divan::bench]
    fn every_stage(b: Bencher) {
        bench(b, "p2c-ewma", Some(all()), true);
    }
}
