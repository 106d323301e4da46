//! The `fleet` scenario: full mesh, random subsetting (A68) and deterministic aperture
//! (Finagle) over 100 clients and 60 servers in three weighted zones, with the stages every
//! client runs; and the zone failure the locality stage answers.

use lbkit_sim::{run, Report, RunOptions, Scenario};

fn report(scenario: &Scenario, requests: u64) -> Report {
    let opts = RunOptions {
        requests: Some(requests),
        skip_oracle: true,
        ..RunOptions::default()
    };
    run(scenario, &opts, &mut |_, _| {}).unwrap()
}

fn by_label<'r>(r: &'r Report, label: &str) -> &'r lbkit_sim::StrategyResult {
    r.results.iter().find(|x| x.strategy == label).unwrap()
}

/// The fleet without its zone failure: connections as the subsetting schemes promise.
#[test]
fn calm_fleet_connections_and_spread() {
    let mut s = Scenario::named("fleet").unwrap();
    s.events.clear();
    let r = report(&s, 40_000);
    let mesh = by_label(&r, "p2c-ewma");
    let random = by_label(&r, "p2c-ewma+subset=4");
    let aperture = by_label(&r, "p2c-ewma+aperture=4");
    assert!(
        mesh.connections_mean > 90.0,
        "full mesh: {}",
        mesh.connections_mean
    );
    // Finagle's coverage: 4 · 100 / 20 = 20 clients a server, 24 with the slices' partial
    // edges, and the same for every server.
    assert!(
        aperture.connections_max <= 25 && aperture.connections_mean >= 20.0,
        "deterministic: max {} mean {}",
        aperture.connections_max,
        aperture.connections_mean
    );
    assert!(
        random.connections_max > aperture.connections_max,
        "random subsets are uneven: max {} against {}",
        random.connections_max,
        aperture.connections_max
    );
    assert!(
        aperture.load_spread < random.load_spread,
        "spread: deterministic {} random {}",
        aperture.load_spread,
        random.load_spread
    );
    assert!(r.to_table().contains("fleet: connections per server"));
}

/// Zone c loses 8 of its 20 servers for 6 of the 20 s: the locality stage gives it
/// min(1, 1.4 × 0.6) / (2 + 0.84) ≈ 29.6 % while it lasts, a third before and after.
#[test]
fn the_failing_zone_loses_share_by_its_health() {
    let s = Scenario::named("fleet").unwrap();
    let r = report(&s, 120_000);
    for x in &r.results {
        let zone = |z: &str| -> f64 {
            let names = &r.zones[z];
            x.servers
                .iter()
                .filter(|s| names.contains(&s.name))
                .map(|s| s.share)
                .sum()
        };
        // 14 s at 1/3, 6 s at 0.296: 0.322 over the run.
        let c = zone("c");
        assert!((c - 0.322).abs() < 0.01, "{}: zone c {c}", x.strategy);
        assert!(x.error_rate + x.timeout_rate < 0.01, "{}", x.strategy);
    }
}

/// 49 servers under an aperture of 3 for 100 clients: most slices end inside a server, so
/// counting members alone loads some servers more (round-robin, unweighted: 1.17–1.18 of the
/// mean at the busiest); drawing edge servers by their coverage (Finagle's `Ring.pick2`)
/// evens it out (weighted round robin: 1.01–1.02; BENCHMARKS.md, "Aperture edges").
#[test]
fn an_aperture_draws_its_edges_by_coverage() {
    let s = Scenario::named("aperture-edges").unwrap();
    let r = report(&s, 200_000);
    let weighted = by_label(&r, "weighted-round-robin+aperture=3");
    let members = by_label(&r, "round-robin+aperture=3");
    assert!(
        weighted.load_spread <= 1.06,
        "by coverage: {}",
        weighted.load_spread
    );
    assert!(
        members.load_spread >= 1.12,
        "by membership: {}",
        members.load_spread
    );
    assert_eq!(weighted.connections_max, members.connections_max);
}
