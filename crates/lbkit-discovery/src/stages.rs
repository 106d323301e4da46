//! The `stages` table of a service, as lbkit's service config and `lbkit proxy`'s config both
//! write it: which endpoints may serve a request ([`lbkit_core::stage`]).
//!
//! ```toml
//! [service.greeter.stages]
//! overprovisioning = 1.4                                 # Envoy's factor, for tiers and zones
//! subsets = { keys = [["version", "zone"], ["version"]], fallback = "default",
//!             default = { version = "v1" }, headers = { version = "x-version" } }
//! localities = { weights = { "eu-1" = 3, "eu-2" = 1 } } # zones not listed weigh default_weight (1)
//! aperture = { size = 12, mode = "deterministic", client_index = 3, client_count = 100 }
//! ```
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `overprovisioning` | 1.4 | Envoy's overprovisioning factor (1.0 to 100) |
//! | `subsets.keys` | required | metadata key sets, tried in order |
//! | `subsets.fallback` | `any` | `none`, `any` or `default` |
//! | `subsets.default` | none | the default subset's metadata (with `fallback = "default"`) |
//! | `subsets.headers` | each key's own name | the request header carrying each key's value (gRPC metadata is headers) |
//! | `localities.weights` | none | weight per zone |
//! | `localities.default_weight` | 1 | weight of a zone not listed (0 leaves it out) |
//! | `aperture.size` | required | endpoints in this client's aperture |
//! | `aperture.mode` | `deterministic` | `deterministic` (Finagle) or `random` (gRPC A68) |
//! | `aperture.client_index`, `aperture.client_count` | from the registry | this client's place; both or neither. Without them a ZooKeeper source registers the client as a Dubbo consumer and derives them from `/dubbo/<interface>/consumers`; other sources use the whole set |
//! | `aperture.seed` | random per process | random mode's shuffle seed |
//!
//! Priority tiers need no table: they follow the endpoints' `priority` (or `backup`).

use std::collections::BTreeMap;

use lbkit_core::stage::{
    Aperture, ApertureMode, Coordinates, Localities, StageReport, Stages, SubsetChoice,
    SubsetFallback, Subsets, DEFAULT_OVERPROVISIONING, MAX_SUBSET_KEYS,
};
use serde::Deserialize;

/// A service's `stages` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagesConfig {
    /// Envoy's overprovisioning factor.
    pub overprovisioning: Option<f64>,
    /// Metadata subsets.
    pub subsets: Option<SubsetsConfig>,
    /// Locality weights.
    pub localities: Option<LocalitiesConfig>,
    /// An aperture.
    pub aperture: Option<ApertureConfig>,
}

/// `stages.subsets`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsetsConfig {
    /// Key sets, tried in order.
    pub keys: Vec<Vec<String>>,
    /// `none`, `any` (default) or `default`.
    pub fallback: Option<String>,
    /// The default subset.
    #[serde(default)]
    pub default: BTreeMap<String, String>,
    /// Header per key.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `stages.localities`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalitiesConfig {
    /// Weight per zone.
    #[serde(default)]
    pub weights: BTreeMap<String, u32>,
    /// Weight of a zone not listed.
    pub default_weight: Option<u32>,
}

/// `stages.aperture`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApertureConfig {
    /// Endpoints in the aperture.
    pub size: u32,
    /// `deterministic` (default) or `random`.
    pub mode: Option<String>,
    /// This client's index.
    pub client_index: Option<u32>,
    /// How many clients there are.
    pub client_count: Option<u32>,
    /// Random mode's seed.
    pub seed: Option<u64>,
}

impl StagesConfig {
    /// `self`'s tables where set, else `parent`'s (a service's over `[defaults]`).
    pub fn or(&self, parent: &StagesConfig) -> StagesConfig {
        StagesConfig {
            overprovisioning: self.overprovisioning.or(parent.overprovisioning),
            subsets: self.subsets.clone().or_else(|| parent.subsets.clone()),
            localities: self
                .localities
                .clone()
                .or_else(|| parent.localities.clone()),
            aperture: self.aperture.clone().or_else(|| parent.aperture.clone()),
        }
    }

    /// The stages.
    ///
    /// # Errors
    /// The field (relative to the table, such as `subsets.fallback`) and what is wrong.
    pub fn build(&self) -> Result<Stages, (String, String)> {
        let stages = Stages {
            subsets: self
                .subsets
                .as_ref()
                .map(SubsetsConfig::build)
                .transpose()?,
            overprovisioning: self.overprovisioning.unwrap_or(DEFAULT_OVERPROVISIONING),
            localities: self.localities.as_ref().map(|l| Localities {
                weights: l.weights.clone(),
                default_weight: l.default_weight.unwrap_or(1),
            }),
            aperture: self
                .aperture
                .as_ref()
                .map(ApertureConfig::build)
                .transpose()?,
        };
        stages
            .validate()
            .map_err(|why| (field_of(&why).into(), why))?;
        Ok(stages)
    }

    /// The (subset key, header) pairs a request's attributes are read from: each key of the
    /// key sets, from `subsets.headers` or its own name.
    pub fn attr_headers(&self) -> Vec<(String, String)> {
        let Some(s) = &self.subsets else {
            return Vec::new();
        };
        let mut keys: Vec<&String> = s.keys.iter().flatten().collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .map(|k| {
                (
                    k.clone(),
                    s.headers.get(k).unwrap_or(k).to_ascii_lowercase(),
                )
            })
            .collect()
    }

    /// Whether the aperture waits for its coordinates from the registry.
    pub fn aperture_from_registry(&self) -> bool {
        self.aperture
            .as_ref()
            .is_some_and(|a| a.client_index.is_none() && a.client_count.is_none())
    }
}

/// The field a validation message concerns.
fn field_of(why: &str) -> &'static str {
    if why.starts_with("overprovisioning") {
        "overprovisioning"
    } else if why.contains("subset") {
        "subsets"
    } else {
        "aperture"
    }
}

impl SubsetsConfig {
    fn build(&self) -> Result<Subsets, (String, String)> {
        let fallback = match &self.fallback {
            None => SubsetFallback::Any,
            Some(f) => f
                .parse()
                .map_err(|why| ("subsets.fallback".to_owned(), why))?,
        };
        let known: Vec<&String> = self.keys.iter().flatten().collect();
        if known.len() > 16 {
            let why = format!("{} keys in all (at most 16 headers are read)", known.len());
            return Err(("subsets.keys".into(), why));
        }
        if self.keys.iter().any(|k| k.len() > MAX_SUBSET_KEYS) {
            let why = format!("a key set has more than {MAX_SUBSET_KEYS} keys");
            return Err(("subsets.keys".into(), why));
        }
        if let Some(k) = self.headers.keys().find(|k| !known.contains(k)) {
            let why = format!("{k:?} is in no key set");
            return Err((format!("subsets.headers.{k}"), why));
        }
        if let Some((k, h)) = self.headers.iter().find(|(_, h)| !is_header_name(h)) {
            return Err((
                format!("subsets.headers.{k}"),
                format!("{h:?} is not a header name"),
            ));
        }
        Ok(Subsets {
            key_sets: self.keys.clone(),
            fallback,
            default: self
                .default
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }
}

fn is_header_name(h: &str) -> bool {
    !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl ApertureConfig {
    fn build(&self) -> Result<Aperture, (String, String)> {
        let mode: ApertureMode = match &self.mode {
            None => ApertureMode::Deterministic,
            Some(m) => m.parse().map_err(|why| ("aperture.mode".to_owned(), why))?,
        };
        let coordinates = match (self.client_index, self.client_count) {
            (Some(index), Some(count)) => Some(Coordinates { index, count }),
            (None, None) => None,
            _ => {
                let why = "give both client_index and client_count, or neither (from the registry)";
                return Err(("aperture".into(), why.into()));
            }
        };
        Ok(Aperture {
            size: self.size,
            mode,
            coordinates,
            seed: self
                .seed
                .unwrap_or_else(|| lbkit_core::FastRng::from_entropy().next_u64()),
        })
    }
}

/// A stage report as JSON (`lbkit pick --explain --format json`, the proxy's `/endpoints`).
pub fn report_json(r: &StageReport) -> serde_json::Value {
    use serde_json::json;
    let subset = match &r.subset {
        SubsetChoice::All => json!({ "kind": "all" }),
        SubsetChoice::Matched { key_set, values } => json!({
            "kind": "matched",
            "key_set": key_set,
            "values": values.iter().cloned().collect::<BTreeMap<_, _>>(),
        }),
        SubsetChoice::Fallback {
            policy,
            matched_empty,
        } => json!({
            "kind": "fallback",
            "fallback": policy.to_string(),
            "matched_subset_had_no_eligible_endpoint": matched_empty,
        }),
    };
    let tiers: Vec<serde_json::Value> = r
        .tiers
        .iter()
        .map(|t| {
            let zones: Vec<serde_json::Value> = t
                .localities
                .iter()
                .map(|z| {
                    json!({
                        "zone": z.zone, "endpoints": z.endpoints, "healthy": z.healthy,
                        "weight": z.weight, "effective_weight": z.effective_weight,
                        "share_percent": z.share_percent, "picks_from": z.picks_from,
                        "candidates": z.candidates, "aperture": z.aperture,
                        "aperture_edges": z.edges,
                    })
                })
                .collect();
            json!({
                "priority": t.priority, "endpoints": t.endpoints, "healthy": t.healthy,
                "health": t.health, "load_percent": t.load_percent, "panic": t.panic,
                "picks_from": t.picks_from, "candidates": t.candidates,
                "aperture": t.aperture, "aperture_edges": t.edges, "localities": zones,
            })
        })
        .collect();
    json!({ "subset": subset, "endpoints": r.endpoints, "serving": r.serving, "tiers": tiers })
}

/// A stage report as text lines (`lbkit pick --explain`).
pub fn report_lines(r: &StageReport) -> Vec<String> {
    let subset = match &r.subset {
        SubsetChoice::All => "no subsets: every endpoint".to_owned(),
        SubsetChoice::Matched { key_set, values } => {
            let v: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("subset {} (key set #{})", v.join(","), key_set + 1)
        }
        SubsetChoice::Fallback {
            policy,
            matched_empty,
        } => {
            let why = if *matched_empty {
                "the matching subset has no eligible endpoint"
            } else {
                "no subset matches the request's attributes"
            };
            format!("fallback {policy} ({why})")
        }
    };
    let mut lines = vec![format!(
        "stages: {subset}: {} endpoints, {} serving",
        r.endpoints, r.serving
    )];
    for t in &r.tiers {
        let panic = if t.panic { ", PANIC: all weighted" } else { "" };
        let mut line = format!(
            "  tier P{}: {} of {} healthy, health {}, load {} %{panic}",
            t.priority, t.healthy, t.endpoints, t.health, t.load_percent
        );
        if t.localities.is_empty() {
            line += &aperture_note(t.picks_from, t.candidates, t.aperture, t.edges);
        }
        lines.push(line);
        for z in &t.localities {
            lines.push(format!(
                "    zone {:?}: {} of {} healthy, weight {} -> effective {:.3}, {:.1} % of the tier{}",
                z.zone,
                z.healthy,
                z.endpoints,
                z.weight,
                z.effective_weight,
                z.share_percent,
                aperture_note(z.picks_from, z.candidates, z.aperture, z.edges)
            ));
        }
    }
    lines
}

fn aperture_note(picks_from: u32, candidates: u32, aperture: bool, edges: u32) -> String {
    if aperture && edges > 0 {
        format!("; aperture: {picks_from} of {candidates}, {edges} at its edges drawn by coverage")
    } else if aperture {
        format!("; aperture: {picks_from} of {candidates}")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Stages, (String, String)> {
        toml::from_str::<StagesConfig>(text)
            .map_err(|e| (String::new(), e.to_string()))?
            .build()
    }

    #[test]
    fn builds_every_stage() {
        let s = parse(
            "overprovisioning = 1.2\n\
             subsets = { keys = [[\"version\"]], fallback = \"default\", default = { version = \"v1\" } }\n\
             localities = { weights = { a = 3 }, default_weight = 0 }\n\
             aperture = { size = 4, mode = \"random\", client_index = 1, client_count = 3, seed = 9 }\n",
        )
        .unwrap();
        assert_eq!(s.overprovisioning, 1.2);
        assert_eq!(s.subsets.unwrap().fallback, SubsetFallback::Default);
        assert_eq!(s.localities.unwrap().weight("b"), 0);
        let a = s.aperture.unwrap();
        assert_eq!((a.mode, a.seed), (ApertureMode::Random, 9));
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse("subsets = { keys = [[\"v\"]], fallback = \"some\" }").unwrap_err();
        assert_eq!(e.0, "subsets.fallback");
        let e = parse("subsets = { keys = [[\"v\"]], fallback = \"default\" }").unwrap_err();
        assert_eq!(e.0, "subsets");
        let e = parse("subsets = { keys = [[\"v\"]], headers = { w = \"x\" } }").unwrap_err();
        assert_eq!(e.0, "subsets.headers.w");
        let e = parse("aperture = { size = 3, client_index = 1 }").unwrap_err();
        assert_eq!(e.0, "aperture");
        let e = parse("aperture = { size = 3, client_index = 3, client_count = 3 }").unwrap_err();
        assert_eq!(e.0, "aperture");
        let e = parse("overprovisioning = 0.9").unwrap_err();
        assert_eq!(e.0, "overprovisioning");
    }

    #[test]
    fn attributes_come_from_the_named_headers() {
        let c: StagesConfig = toml::from_str(
            "subsets = { keys = [[\"version\", \"zone\"], [\"version\"]], headers = { version = \"X-Version\" } }",
        )
        .unwrap();
        assert_eq!(
            c.attr_headers(),
            vec![
                ("version".to_owned(), "x-version".to_owned()),
                ("zone".to_owned(), "zone".to_owned())
            ]
        );
    }
}
