//! Build strategies by name with string parameters, as configuration files and the CLI do.
//!
//! Every strategy and parameter is listed by [`strategies`] with its default, so `lbkit pick
//! --list` and error messages stay in step with what [`build`] accepts. Each family of
//! strategies (basic, load-aware, hashing) keeps its own entries beside its code.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use lbkit_core::BoxStrategy;

/// One parameter a strategy accepts.
#[derive(Debug, Clone, Copy)]
pub struct ParamInfo {
    /// Name, as in `--param NAME=VALUE`.
    pub name: &'static str,
    /// Default value, as text.
    pub default: &'static str,
    /// What it means, with its unit.
    pub doc: &'static str,
    /// Values `lbkit tune` tries for it, the default among them; empty when searching it
    /// cannot lower latency or errors (a table size, an expiry).
    pub tune: &'static [&'static str],
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

/// A family of strategies: their descriptions and a constructor by name.
#[derive(Debug)]
pub(crate) struct Family {
    pub(crate) infos: &'static [StrategyInfo],
    /// `None` when the name is not in this family.
    pub(crate) build: fn(&str, &Params) -> Option<Result<BoxStrategy, ParamError>>,
}

const FAMILIES: &[&Family] = &[
    &crate::basic::FAMILY,
    &crate::load::FAMILY,
    &crate::hash::FAMILY,
];

/// Every built-in strategy, in `lbkit pick --list` order.
pub fn strategies() -> impl Iterator<Item = &'static StrategyInfo> {
    FAMILIES.iter().flat_map(|f| f.infos.iter())
}

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

    /// Every pair, in the order given.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The value given for `name` (the last one given), if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name` parsed as `T`, if given.
    pub(crate) fn parse<T: std::str::FromStr>(
        &self,
        strategy: &str,
        name: &str,
    ) -> Result<Option<T>, ParamError>
    where
        T::Err: fmt::Display,
    {
        self.get(name)
            .map(|v| {
                v.parse::<T>()
                    .map_err(|e| invalid(strategy, name, v, &e.to_string()))
            })
            .transpose()
    }

    /// A positive duration given in milliseconds, or `default`.
    pub(crate) fn ms(
        &self,
        strategy: &str,
        name: &str,
        default: Duration,
    ) -> Result<Duration, ParamError> {
        match self.parse::<u64>(strategy, name)? {
            None => Ok(default),
            Some(0) => Err(invalid(strategy, name, "0", "must be positive")),
            Some(ms) => Ok(Duration::from_millis(ms)),
        }
    }

    /// A finite number within `range`, or `default`.
    pub(crate) fn f64_in(
        &self,
        strategy: &str,
        name: &str,
        range: RangeInclusive<f64>,
        default: f64,
    ) -> Result<f64, ParamError> {
        match self.parse::<f64>(strategy, name)? {
            None => Ok(default),
            Some(v) if range.contains(&v) => Ok(v),
            Some(v) => Err(out_of_range(strategy, name, v, &range)),
        }
    }

    /// An integer within `range`, or `default`.
    pub(crate) fn u32_in(
        &self,
        strategy: &str,
        name: &str,
        range: RangeInclusive<u32>,
        default: u32,
    ) -> Result<u32, ParamError> {
        match self.parse::<u32>(strategy, name)? {
            None => Ok(default),
            Some(v) if range.contains(&v) => Ok(v),
            Some(v) => Err(out_of_range(strategy, name, v, &range)),
        }
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
    strategies().find(|s| s.name == name)
}

/// Whether the strategy called `name` routes by request key (the consistent-hashing family):
/// a service that needs key affinity can only switch among these.
pub fn is_keyed(name: &str) -> bool {
    crate::hash::FAMILY.infos.iter().any(|s| s.name == name)
}

/// Build the strategy called `name` with `params`.
///
/// # Errors
/// An unknown name or parameter, or a value that does not parse or is out of range.
pub fn build(name: &str, params: Params) -> Result<BoxStrategy, ParamError> {
    let info = info(name).ok_or_else(|| ParamError::UnknownStrategy {
        name: name.to_owned(),
        known: strategies().map(|s| s.name).collect::<Vec<_>>().join(", "),
    })?;
    check_names(info, &params)?;
    FAMILIES
        .iter()
        .find_map(|f| (f.build)(name, &params))
        .unwrap_or_else(|| {
            Err(invalid(
                name,
                "-",
                "-",
                "listed in the catalog without a constructor",
            ))
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

/// The error for a rejected parameter value.
pub(crate) fn invalid(strategy: &str, param: &str, value: &str, reason: &str) -> ParamError {
    ParamError::Invalid {
        strategy: strategy.to_owned(),
        param: param.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

fn out_of_range<T: fmt::Display>(
    strategy: &str,
    param: &str,
    v: T,
    range: &RangeInclusive<T>,
) -> ParamError {
    invalid(
        strategy,
        param,
        &v.to_string(),
        &format!("must be within {}..={}", range.start(), range.end()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::Strategy;

    #[test]
    fn every_listed_strategy_builds_with_defaults_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for s in strategies() {
            assert!(names.insert(s.name), "{} listed twice", s.name);
            let built = build(s.name, Params::new()).unwrap();
            assert_eq!(built.name(), s.name);
            let defaults = Params::from_pairs(s.params.iter().map(|p| (p.name, p.default)));
            build(s.name, defaults)
                .unwrap_or_else(|e| panic!("{}: documented defaults rejected: {e}", s.name));
        }
    }

    #[test]
    fn every_tuning_value_builds_and_the_default_is_among_them() {
        for s in strategies() {
            for p in s.params.iter().filter(|p| !p.tune.is_empty()) {
                assert!(
                    p.tune.contains(&p.default),
                    "{}.{}: tune values {:?} leave out the default {}",
                    s.name,
                    p.name,
                    p.tune,
                    p.default
                );
                for v in p.tune {
                    build(s.name, Params::from_pairs([(p.name, *v)]))
                        .unwrap_or_else(|e| panic!("{}.{}={v}: {e}", s.name, p.name));
                }
            }
        }
        assert!(is_keyed("ketama") && is_keyed("maglev") && !is_keyed("p2c-ewma"));
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
        let e = build(
            "weighted-response-time",
            Params::from_pairs([("interval_ms", "0")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("must be positive"), "{e}");
        assert!(matches!(
            Params::parse_pair("novalue"),
            Err(ParamError::Malformed { .. })
        ));
    }
}
