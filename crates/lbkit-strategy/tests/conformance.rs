//! Every built-in strategy passes the shared conformance suite.

use lbkit_strategy::catalog::{build, Params};
use lbkit_strategy::*;
use lbkit_testkit::alloc::CountingAlloc;
use lbkit_testkit::conformance::{check, Shares};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn random() {
    check(|| Random, Shares::Uniform);
}

#[test]
fn round_robin() {
    check(RoundRobin::new, Shares::Uniform);
}

#[test]
fn sticky_round_robin() {
    check(|| StickyRoundRobin::new(3), Shares::Uniform);
}

#[test]
fn weighted_random() {
    check(|| WeightedRandom, Shares::Weighted);
}

#[test]
fn weighted_round_robin() {
    check(SmoothWeightedRoundRobin::new, Shares::Weighted);
}

#[test]
fn weighted_response_time_without_statistics_is_round_robin() {
    check(WeightedResponseTime::default, Shares::Uniform);
}

#[test]
fn least_active_idle_ties_by_weight() {
    check(|| LeastActive, Shares::Weighted);
}

#[test]
fn least_request_idle_follows_weights() {
    check(LeastRequest::default, Shares::Weighted);
}

#[test]
fn p2c_least_loaded_idle_is_uniform() {
    check(|| P2cLeastLoaded, Shares::Uniform);
}

#[test]
fn p2c_ewma() {
    check(P2cEwma::default, Shares::Any);
}

#[test]
fn shortest_response_idle_ties_by_weight() {
    check(ShortestResponse::default, Shares::Weighted);
}

#[test]
fn best_available() {
    check(BestAvailable::default, Shares::Any);
}

// Without reports, the default choice is p2c-ewma (equal weights).
#[test]
fn adaptive_without_reports_is_p2c_ewma() {
    check(Adaptive::default, Shares::Any);
}

#[test]
fn adaptive_wrr_without_reports_is_round_robin() {
    check(
        || {
            Adaptive::new(AdaptiveConfig {
                choice: AdaptiveChoice::Wrr,
                ..AdaptiveConfig::default()
            })
        },
        Shares::Uniform,
    );
}

#[test]
fn zone_aware_without_zones_spills_to_the_inner_strategy() {
    check(
        || ZoneAware::new(RoundRobin::new(), "eu-1"),
        Shares::Uniform,
    );
}

#[test]
fn every_catalog_entry_through_the_boxed_strategy() {
    for info in catalog::strategies() {
        check(|| build(info.name, Params::new()).unwrap(), Shares::Any);
    }
}

#[test]
fn the_allocation_counter_counts() {
    let (v, n) = lbkit_testkit::alloc::allocations_in(|| Box::new(7u64));
    assert_eq!(
        (*v, n),
        (7, 1),
        "without a working counter the zero-allocation check proves nothing"
    );
}
