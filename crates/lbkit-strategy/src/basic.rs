//! Catalog entries of the basic strategies: Ribbon's and Dubbo's load-blind rules.

use lbkit_core::BoxStrategy;

use crate::catalog::{invalid, Family, ParamError, ParamInfo, Params, StrategyInfo};
use crate::{
    Random, RoundRobin, SmoothWeightedRoundRobin, StickyRoundRobin, WeightedRandom,
    WeightedResponseTime,
};

pub(crate) const FAMILY: Family = Family {
    infos: INFOS,
    build,
};

const INFOS: &[StrategyInfo] = &[
    StrategyInfo {
        name: "random",
        summary: "uniformly random eligible endpoint (Ribbon RandomRule)",
        params: &[],
    },
    StrategyInfo {
        name: "round-robin",
        summary: "each eligible endpoint in turn (Ribbon RoundRobinRule)",
        params: &[],
    },
    StrategyInfo {
        name: "weighted-random",
        summary: "random, proportional to warm-up weight; O(1) alias table (Dubbo RandomLoadBalance)",
        params: &[],
    },
    StrategyInfo {
        name: "weighted-round-robin",
        summary: "smooth weighted round robin in nginx's order, O(1) per pick (nginx, Dubbo >= 2.6.5)",
        params: &[],
    },
    StrategyInfo {
        name: "weighted-response-time",
        summary: "weight = sum of averages - own average response time (Ribbon WeightedResponseTimeRule, degenerate cases fixed)",
        params: &[
            ParamInfo { name: "interval_ms", default: "30000", doc: "how often weights are recomputed, ms", tune: &["1000", "5000", "30000"] },
            ParamInfo { name: "window_ms", default: "30000", doc: "response-time averaging window, ms (at most 60000)", tune: &["5000", "30000"] },
        ],
    },
    StrategyInfo {
        name: "sticky-round-robin",
        summary: "each endpoint gets n consecutive calls, then the next (the seed framework's custom rule, thread-safe)",
        params: &[ParamInfo { name: "n", default: "3", doc: "consecutive calls per endpoint (>= 1)", tune: &[] }],
    },
];

fn build(name: &str, params: &Params) -> Option<Result<BoxStrategy, ParamError>> {
    Some(Ok(match name {
        "random" => BoxStrategy::new(Random),
        "round-robin" => BoxStrategy::new(RoundRobin::new()),
        "weighted-random" => BoxStrategy::new(WeightedRandom),
        "weighted-round-robin" => BoxStrategy::new(SmoothWeightedRoundRobin::new()),
        "weighted-response-time" => {
            let interval = match params.ms(name, "interval_ms", crate::DEFAULT_INTERVAL) {
                Ok(d) => d,
                Err(e) => return Some(Err(e)),
            };
            match params.ms(name, "window_ms", crate::DEFAULT_WINDOW) {
                Ok(window) => BoxStrategy::new(WeightedResponseTime::new(interval, window)),
                Err(e) => return Some(Err(e)),
            }
        }
        "sticky-round-robin" => match params.parse::<u32>(name, "n") {
            Ok(Some(0)) => return Some(Err(invalid(name, "n", "0", "must be at least 1"))),
            Ok(n) => BoxStrategy::new(StickyRoundRobin::new(
                n.unwrap_or(crate::DEFAULT_STICKY_RUN),
            )),
            Err(e) => return Some(Err(e)),
        },
        _ => return None,
    }))
}
