//! Build strategies by name with string parameters, as configuration files and the CLI do.
//!
//! Every strategy and parameter is listed in [`STRATEGIES`] with its default, so `lbkit pick
//! --list` and error messages stay in step with what [`build`] accepts.

use std::fmt;
use std::time::Duration;

use lbkit_core::BoxStrategy;

use crate::{
    Random, RoundRobin, SmoothWeightedRoundRobin, StickyRoundRobin, WeightedRandom,
    WeightedResponseTime,
};

/// One parameter a strategy accepts.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    /// Name, as in `--param NAME=VALUE`.
    pub name: &'static str,
    /// Default value, as text.
    pub default: &'static str,
    /// What it means, with its unit.
    pub doc: &'static str,
}

/// One built-in strategy.
#[derive(Debug, Clone, Copy)]
pub struct StrategyInfo {
    /// Name, as in `--strategy NAME`.
    pub name: &'static str,
    /// One line: what it does and where it comes from.
    pub summary: &'static str,
    /// Parameters it accepts.
    pub params: &'static [ParamInfo],
}

/// Every built-in strategy.
pub const STRATEGIES: &[StrategyInfo] = &[
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
            ParamInfo { name: "interval_ms", default: "30000", doc: "how often weights are recomputed, ms" },
            ParamInfo { name: "window_ms", default: "30000", doc: "response-time averaging window, ms (at most 60000)" },
        ],
    },
    StrategyInfo {
        name: "sticky-round-robin",
        summary: "each endpoint gets n consecutive calls, then the next (the seed framework's custom rule, thread-safe)",
        params: &[ParamInfo { name: "n", default: "3", doc: "consecutive calls per endpoint (>= 1)" }],
    },
];

/// Parameters given to a strategy, as name/value text pairs in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    pairs: Vec<(String, String)>,
}

// === impl Params ===

impl Params {
    /// No parameters.
    pub fn new() -> Self {
        Params::default()
    }

    /// Parameters from pairs.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Params {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// Add one parameter (a later value for the same name wins).
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.pairs.push((name.into(), value.into()));
    }

    /// Parse `NAME=VALUE`.
    ///
    /// # Errors
    /// When there is no `=` or the name is empty.
    pub fn parse_pair(text: &str) -> Result<(String, String), ParamError> {
        match text.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(ParamError::Malformed {
                text: text.to_owned(),
            }),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn parse<T: std::str::FromStr>(
        &self,
        strategy: &str,
        name: &str,
    ) -> Result<Option<T>, ParamError>
    where
        T::Err: fmt::Display,
    {
        self.get(name)
            .map(|v| {
                v.parse::<T>().map_err(|e| ParamError::Invalid {
                    strategy: strategy.to_owned(),
                    param: name.to_owned(),
                    value: v.to_owned(),
                    reason: e.to_string(),
                })
            })
            .transpose()
    }
}

/// A strategy name or parameter that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// No strategy has this name.
    #[error("unknown strategy \"{name}\" (known: {known})")]
    UnknownStrategy {
        /// The name given.
        name: String,
        /// The names accepted, comma-separated.
        known: String,
    },
    /// The strategy takes no parameter of this name.
    #[error("strategy \"{strategy}\" has no parameter \"{param}\" (it accepts: {accepted})")]
    UnknownParam {
        /// The strategy.
        strategy: String,
        /// The parameter given.
        param: String,
        /// The parameters accepted, comma-separated, or "none".
        accepted: String,
    },
    /// A parameter's value does not parse or is out of range.
    #[error("strategy \"{strategy}\": parameter {param}={value:?} is invalid: {reason}")]
    Invalid {
        /// The strategy.
        strategy: String,
        /// The parameter.
        param: String,
        /// The value given.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// Not `NAME=VALUE`.
    #[error("parameter {text:?} is not NAME=VALUE")]
    Malformed {
        /// The text given.
        text: String,
    },
}

/// The description of the strategy called `name`.
pub fn info(name: &str) -> Option<&'static StrategyInfo> {
    STRATEGIES.iter().find(|s| s.name == name)
}

/// Build the strategy called `name` with `params`.
///
/// # Errors
/// An unknown name or parameter, or a value that does not parse or is out of range.
pub fn build(name: &str, params: Params) -> Result<BoxStrategy, ParamError> {
    let info = info(name).ok_or_else(|| ParamError::UnknownStrategy {
        name: name.to_owned(),
        known: STRATEGIES
            .iter()
            .map(|s| s.name)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    check_names(info, &params)?;
    let ms = |p: &str, default: Duration| -> Result<Duration, ParamError> {
        Ok(params
            .parse::<u64>(name, p)?
            .map_or(default, Duration::from_millis))
    };
    Ok(match name {
        "random" => BoxStrategy::new(Random),
        "round-robin" => BoxStrategy::new(RoundRobin::new()),
        "weighted-random" => BoxStrategy::new(WeightedRandom),
        "weighted-round-robin" => BoxStrategy::new(SmoothWeightedRoundRobin::new()),
        "weighted-response-time" => {
            let interval = ms("interval_ms", crate::DEFAULT_INTERVAL)?;
            let window = ms("window_ms", crate::DEFAULT_WINDOW)?;
            positive(name, "interval_ms", interval)?;
            positive(name, "window_ms", window)?;
            BoxStrategy::new(WeightedResponseTime::new(interval, window))
        }
        "sticky-round-robin" => {
            let n = params
                .parse::<u32>(name, "n")?
                .unwrap_or(crate::DEFAULT_STICKY_RUN);
            if n == 0 {
                return Err(invalid(name, "n", "0", "must be at least 1"));
            }
            BoxStrategy::new(StickyRoundRobin::new(n))
        }
        other => unreachable!("catalog entry {other} without a constructor"),
    })
}

fn check_names(info: &StrategyInfo, params: &Params) -> Result<(), ParamError> {
    for (k, _) in &params.pairs {
        if !info.params.iter().any(|p| p.name == k) {
            let accepted = if info.params.is_empty() {
                "none".to_owned()
            } else {
                info.params
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ParamError::UnknownParam {
                strategy: info.name.to_owned(),
                param: k.clone(),
                accepted,
            });
        }
    }
    Ok(())
}

fn positive(strategy: &str, param: &str, d: Duration) -> Result<(), ParamError> {
    if d.is_zero() {
        Err(invalid(strategy, param, "0", "must be positive"))
    } else {
        Ok(())
    }
}

fn invalid(strategy: &str, param: &str, value: &str, reason: &str) -> ParamError {
    ParamError::Invalid {
        strategy: strategy.to_owned(),
        param: param.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::Strategy;

    #[test]
    fn every_listed_strategy_builds_with_defaults() {
        for s in STRATEGIES {
            let built = build(s.name, Params::new()).unwrap();
            assert_eq!(built.name(), s.name);
            let defaults = Params::from_pairs(s.params.iter().map(|p| (p.name, p.default)));
            build(s.name, defaults).unwrap();
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let e = build("fastest", Params::new()).unwrap_err().to_string();
        assert!(
            e.contains("unknown strategy \"fastest\"") && e.contains("round-robin"),
            "{e}"
        );
        let e = build("random", Params::from_pairs([("n", "2")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "strategy \"random\" has no parameter \"n\" (it accepts: none)"
        );
        let e = build("sticky-round-robin", Params::from_pairs([("n", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("n=\"x\" is invalid"), "{e}");
        let e = build("sticky-round-robin", Params::from_pairs([("n", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1"), "{e}");
        assert!(matches!(
            Params::parse_pair("novalue"),
            Err(ParamError::Malformed { .. })
        ));
    }
}
