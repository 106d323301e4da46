//! Load-aware strategies: least active, least request, power of two choices (least loaded and
//! peak EWMA), shortest response, best available, adaptive (server-reported load); and the
//! zone-preference decorator.

mod adaptive;
mod best_available;
mod choose;
mod least_active;
mod least_request;
mod p2c;
mod shortest_response;
mod zone;

pub use adaptive::{Adaptive, AdaptiveChoice, AdaptiveConfig, AdaptivePicker};
pub use best_available::{BestAvailable, BestAvailablePicker};
pub use least_active::{LeastActive, LeastActivePicker};
pub use least_request::{LeastRequest, LeastRequestPicker};
pub use p2c::{P2cEwma, P2cLeastLoaded, P2cPicker, DEFAULT_RTT};
pub use shortest_response::{ShortestResponse, ShortestResponsePicker, DEFAULT_SLIDE_WINDOW};
pub use zone::{ZoneAware, ZonePicker};

use std::time::Duration;

use lbkit_core::{BoxStrategy, DEFAULT_EWMA_DECAY};

use crate::catalog::{Family, ParamError, ParamInfo, Params, StrategyInfo};

pub(crate) const FAMILY: Family = Family {
    infos: INFOS,
    build,
};

const INFOS: &[StrategyInfo] = &[
    StrategyInfo {
        name: "least-active",
        summary: "fewest calls in flight, ties by weighted random (Dubbo LeastActiveLoadBalance)",
        params: &[],
    },
    StrategyInfo {
        name: "least-request",
        summary: "Envoy least request: best of N choices; with weights, weight / (in_flight + 1)^bias",
        params: &[
            ParamInfo { name: "choice_count", default: "2", doc: "random candidates compared when weights are equal (1-100)", tune: &["2", "3", "5"] },
            ParamInfo { name: "active_request_bias", default: "1.0", doc: "exponent of (in_flight + 1) with unequal weights (0-10; 0 = weighted round robin)", tune: &["0.5", "1.0", "2.0"] },
        ],
    },
    StrategyInfo {
        name: "p2c-least-loaded",
        summary: "power of two choices on calls in flight (Finagle, tower)",
        params: &[],
    },
    StrategyInfo {
        name: "p2c-ewma",
        summary: "power of two choices on peak-EWMA latency x (in_flight + 1) (Finagle, linkerd)",
        params: &[
            ParamInfo { name: "default_rtt_ms", default: "30", doc: "cost of an endpoint without latency samples, ms", tune: &["1", "30", "100"] },
            ParamInfo { name: "decay_ms", default: "10000", doc: "time constant of the endpoints' peak EWMA, ms (linkerd's decay)", tune: &["1000", "3000", "10000", "30000"] },
        ],
    },
    StrategyInfo {
        name: "shortest-response",
        summary: "lowest average response x (in_flight + 1), ties by weight (Dubbo ShortestResponseLoadBalance)",
        params: &[ParamInfo { name: "window_ms", default: "30000", doc: "sliding window of response times, ms (at most 60000)", tune: &["1000", "5000", "30000"] }],
    },
    StrategyInfo {
        name: "best-available",
        summary: "fewest calls in flight among endpoints whose circuit is not tripped (Ribbon BestAvailableRule)",
        params: &[],
    },
    StrategyInfo {
        name: "adaptive",
        summary: "weights from server-reported load, qps / (utilization + eps/qps x penalty) (gRPC WRR / ORCA), picked by two choices on latency / weight",
        params: &[
            ParamInfo { name: "blackout_ms", default: "10000", doc: "reports count after flowing this long, ms", tune: &["1000", "10000"] },
            ParamInfo { name: "expiry_ms", default: "180000", doc: "reports older than this are ignored, ms", tune: &[] },
            ParamInfo { name: "penalty", default: "1.0", doc: "error utilization penalty (0-100)", tune: &["0.5", "1.0", "2.0"] },
            ParamInfo { name: "period_ms", default: "1000", doc: "weight recomputation period, ms", tune: &[] },
            ParamInfo { name: "choice", default: "p2c", doc: "p2c: two choices on peak EWMA x in flight / weight; wrr: gRPC's weighted round robin", tune: &["p2c", "wrr"] },
        ],
    },
];

fn build(name: &str, p: &Params) -> Option<Result<BoxStrategy, ParamError>> {
    let built = || -> Result<BoxStrategy, ParamError> {
        Ok(match name {
            "least-active" => BoxStrategy::new(LeastActive),
            "least-request" => BoxStrategy::new(LeastRequest::new(
                p.u32_in(name, "choice_count", 1..=100, 2)?,
                p.f64_in(name, "active_request_bias", 0.0..=10.0, 1.0)?,
            )),
            "p2c-least-loaded" => BoxStrategy::new(P2cLeastLoaded),
            "p2c-ewma" => {
                let s = P2cEwma::new(p.ms(name, "default_rtt_ms", DEFAULT_RTT)?);
                // Given only when set: else the statistics keep their own (the same 10 s unless
                // a SnapshotBuilder says otherwise).
                BoxStrategy::new(match p.get("decay_ms") {
                    Some(_) => s.with_decay(p.ms(name, "decay_ms", DEFAULT_EWMA_DECAY)?),
                    None => s,
                })
            }
            "shortest-response" => BoxStrategy::new(ShortestResponse::new(p.ms(
                name,
                "window_ms",
                DEFAULT_SLIDE_WINDOW,
            )?)),
            "best-available" => BoxStrategy::new(BestAvailable::default()),
            "adaptive" => {
                let d = AdaptiveConfig::default();
                BoxStrategy::new(Adaptive::new(AdaptiveConfig {
                    blackout: p
                        .parse::<u64>(name, "blackout_ms")?
                        .map_or(d.blackout, Duration::from_millis),
                    expiry: p.ms(name, "expiry_ms", d.expiry)?,
                    penalty: p.f64_in(name, "penalty", 0.0..=100.0, d.penalty)?,
                    period: p.ms(name, "period_ms", d.period)?,
                    choice: p.parse(name, "choice")?.unwrap_or(d.choice),
                }))
            }
            _ => {
                return Err(ParamError::Malformed {
                    text: String::new(),
                })
            }
        })
    };
    INFOS.iter().any(|i| i.name == name).then(built)
}

#[cfg(test)]
mod tests;
