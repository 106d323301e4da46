//! What the stages decide for a request, for `lbkit pick --explain` and `/endpoints`.

use super::tree::{Entry, LeafInfo, Node, Tree};
use super::{Attr, SubsetFallback};
use crate::error::PickError;

/// The stages a request passes: which subset serves it, and the tiers, zones and aperture
/// inside that subset.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    /// Which subset serves the request.
    pub subset: SubsetChoice,
    /// Endpoints in that subset, and how many of them serve (up, weighted, not ejected).
    pub endpoints: u32,
    /// Serving endpoints in that subset.
    pub serving: u32,
    /// Its tiers, in priority order.
    pub tiers: Vec<TierReport>,
}

/// Which subset serves a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubsetChoice {
    /// No subsets are configured: every endpoint of the routed set.
    All,
    /// The subset of key set `key_set` (0-based, in the configured order) for `values`.
    Matched {
        /// The key set's position.
        key_set: usize,
        /// Its keys and the request's values.
        values: Vec<(String, String)>,
    },
    /// No subset serves it; the fallback does.
    Fallback {
        /// The policy.
        policy: SubsetFallback,
        /// Whether some subset matched but had no serving endpoint.
        matched_empty: bool,
    },
}

/// One priority tier.
#[derive(Clone, Debug, PartialEq)]
pub struct TierReport {
    /// The priority (0 the highest).
    pub priority: u32,
    /// Its endpoints.
    pub endpoints: u32,
    /// Of which serving.
    pub healthy: u32,
    /// Envoy's health, 0..=100 (overprovisioned).
    pub health: u32,
    /// Percent of the traffic it takes.
    pub load_percent: u32,
    /// Whether it balances over its down endpoints too (panic).
    pub panic: bool,
    /// Its zones, when locality weighting splits it.
    pub localities: Vec<LocalityReport>,
    /// Endpoints its picks choose from (after the aperture), when not split by zone.
    pub picks_from: u32,
    /// Endpoints admitted before the aperture.
    pub candidates: u32,
    /// Whether an aperture narrowed it.
    pub aperture: bool,
    /// Of its picks' endpoints, how many the deterministic aperture covers only partly: a
    /// strategy that draws by weight, or p2c, draws them in proportion to their coverage
    /// ([`Snapshot::coverage`](crate::Snapshot::coverage)).
    pub edges: u32,
}

/// One zone of a tier.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalityReport {
    /// The zone (`""` for endpoints without one).
    pub zone: String,
    /// Its endpoints.
    pub endpoints: u32,
    /// Of which serving.
    pub healthy: u32,
    /// Configured weight.
    pub weight: u32,
    /// Weight × min(1, overprovisioning × healthy share).
    pub effective_weight: f64,
    /// Percent of the tier's traffic.
    pub share_percent: f64,
    /// Endpoints its picks choose from (after the aperture).
    pub picks_from: u32,
    /// Endpoints admitted before the aperture.
    pub candidates: u32,
    /// Whether an aperture narrowed it.
    pub aperture: bool,
    /// Of its picks' endpoints, how many the deterministic aperture covers only partly: a
    /// strategy that draws by weight, or p2c, draws them in proportion to their coverage
    /// ([`Snapshot::coverage`](crate::Snapshot::coverage)).
    pub edges: u32,
}

impl Tree {
    /// The report for a request carrying `attrs`.
    pub(crate) fn report(&self, attrs: &[Attr<'_>]) -> Result<StageReport, PickError> {
        let entry = self.route(attrs)?;
        let subset = match (self.subsets.as_ref(), self.matched(attrs)) {
            (None, _) => SubsetChoice::All,
            (Some(ix), Some((key_set, _))) => SubsetChoice::Matched {
                key_set,
                values: ix.key_sets[key_set]
                    .keys
                    .iter()
                    .map(|k| {
                        let v = attrs
                            .iter()
                            .find(|(n, _)| *n == k.bytes())
                            .map_or(&[][..], |a| a.1);
                        (lossy(k.bytes()), lossy(v))
                    })
                    .collect(),
            },
            (Some(ix), None) => SubsetChoice::Fallback {
                policy: ix.fallback,
                matched_empty: ix.key_sets.iter().any(|ks| ks.find(attrs).is_some()),
            },
        };
        Ok(StageReport {
            subset,
            endpoints: entry.endpoints,
            serving: entry.serving,
            tiers: tiers(entry),
        })
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tiers(entry: &Entry) -> Vec<TierReport> {
    // A tier choice has a child per tier; else the node is the one tier with any load.
    let children: Vec<Option<&Node>> = match &entry.node {
        Node::Tiers(_, children) => children.iter().map(Some).collect(),
        only => entry
            .tiers
            .iter()
            .map(|t| (t.load == 100 || entry.tiers.len() == 1).then_some(only))
            .collect(),
    };
    entry
        .tiers
        .iter()
        .zip(children)
        .map(|(t, child)| {
            let mut r = TierReport {
                priority: t.priority,
                endpoints: t.counts.endpoints,
                healthy: t.counts.healthy,
                health: t.health,
                load_percent: t.load,
                panic: t.panic,
                localities: Vec::new(),
                picks_from: 0,
                candidates: 0,
                aperture: false,
                edges: 0,
            };
            match child {
                Some(Node::Leaf(_, leaf)) => fill(&mut r, leaf),
                Some(Node::Zones(_, leaves, zones)) => r.localities = localities(leaves, zones),
                Some(Node::Tiers(..)) | None => {}
            }
            r
        })
        .collect()
}

fn fill(r: &mut TierReport, leaf: &LeafInfo) {
    r.picks_from = leaf.picks_from;
    r.candidates = leaf.candidates;
    r.aperture = leaf.aperture;
    r.edges = leaf.edges;
}

fn localities(leaves: &[Node], zones: &[super::tree::ZoneInfo]) -> Vec<LocalityReport> {
    let total: f64 = zones.iter().map(|z| z.effective).sum();
    zones
        .iter()
        .zip(leaves)
        .map(|(z, leaf)| {
            let (picks_from, candidates, aperture, edges) = match leaf {
                Node::Leaf(_, l) => (l.picks_from, l.candidates, l.aperture, l.edges),
                _ => (0, 0, false, 0),
            };
            LocalityReport {
                zone: z.zone.to_string(),
                endpoints: z.counts.endpoints,
                healthy: z.counts.healthy,
                weight: z.weight,
                effective_weight: z.effective,
                share_percent: if total > 0.0 {
                    100.0 * z.effective / total
                } else {
                    0.0
                },
                picks_from,
                candidates,
                aperture,
                edges,
            }
        })
        .collect()
}
