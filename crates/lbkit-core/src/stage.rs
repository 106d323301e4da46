//! Which endpoints may serve a request, before a strategy chooses one of them: metadata
//! subsets, priority tiers, locality weights and an aperture. Each is a stage prepared once per
//! snapshot change in front of *any* strategy (Envoy's subset → priority → locality → host
//! order; Finagle's aperture in front of its P2C), so a pick walks a few prepared tables and
//! then runs the strategy's picker prepared for the set it reached: O(1) stages, no
//! allocation, no lock. The strategy never knows which stages ran.
//!
//! The order, after Dubbo's tag routing ([`route`](crate::route)) when the endpoints carry tags:
//!
//! 1. **Subset** ([`Subsets`], Envoy's subset load balancer): the service names the metadata
//!    key sets it routes on, tried in order; a request's attributes ([`Attr`]: headers or gRPC
//!    metadata, `--attr K=V`) pick the subset whose endpoints carry exactly those values. The
//!    first key set, in order, whose keys the request all carries and whose subset for those
//!    values has an eligible endpoint serves it. Otherwise the [`SubsetFallback`] applies —
//!    `none` (no endpoint: [`PickError::NoSubset`](crate::PickError::NoSubset) or
//!    [`PickError::SubsetUnavailable`](crate::PickError::SubsetUnavailable)),
//!    `any` (every endpoint) or `default` (the [`Subsets::default`] subset) — both when no
//!    subset matches and when the matching one has no eligible endpoint (down, ejected or
//!    drained), which Envoy users ask for (envoy#34798).
//! 2. **Priority tiers** ([`EndpointSpec::priority`](crate::EndpointSpec::priority), Envoy's
//!    priority levels; `backup` in nginx and HAProxy is tier 1): each tier's health is
//!    `min(100, ⌊overprovisioning × 100 × healthy / endpoints⌋)` (endpoints that carry weight:
//!    drained ones count in neither); tiers take load in order,
//!    each as much as its health, until 100 % is given; when the health of all tiers adds up
//!    to less than 100, each tier's load is its share of that sum (rounded to whole percents
//!    by largest remainder, so 25 %, 25 %, 20 % healthy give 36, 36 and 28, as Envoy's
//!    documentation tabulates them with panic aside). While the total is under 100, a tier whose healthy share
//!    is under the panic threshold ([`SnapshotPolicy::panic_threshold`](crate::SnapshotPolicy))
//!    balances over all of its endpoints that carry weight, down ones included; when every tier
//!    is in panic (the three tiers above, at Envoy's default 50 %), load follows the tiers'
//!    endpoint counts. This replaces the snapshot-wide
//!    panic threshold for the endpoints the stages route.
//! 3. **Localities** ([`Localities`], Envoy's `locality_weighted_lb_config`): inside a tier,
//!    each zone takes traffic in proportion to its weight × `min(1, overprovisioning × healthy
//!    share)`; when every zone's is 0, or the tier is in panic, the whole tier is picked from.
//! 4. **Aperture** ([`Aperture`]): inside the set reached, a client talks only to its slice of
//!    the set's ring (ordered by endpoint key, so clients that see the same endpoints serving
//!    see the same ring). In
//!    Finagle's *deterministic* mode the client at `index` of `count` takes the servers that
//!    overlap `[index / count, index / count + width)` with `width = ⌈size · count / servers⌉
//!    / count`, so every server is in the aperture of about `size · count / servers` clients.
//!    A server the slice covers only partly is drawn in proportion to its coverage (Finagle's
//!    `Ring.pick2`; [`Snapshot::coverage`](crate::Snapshot::coverage)) by p2c, weighted round
//!    robin, weighted random and least-request, so over all clients every server takes the
//!    same load. Unweighted round robin and random count it as a whole member; least-active,
//!    shortest-response and best-available weigh it only between ties; the hashing strategies
//!    and `adaptive` place by their own weights;
//!    in gRPC's A68 *random* mode it takes the first `size` of the ring shuffled with its own
//!    seed. The ring holds the set's endpoints that serve, so the clients spread evenly over
//!    them; a health change moves the slices (each client's connections stay bounded by its
//!    aperture). The aperture applies inside each set the earlier stages reach: with three
//!    zones, an aperture of 4 is 4 per zone.
//!
//! Requests with a consistent-hash key draw the tier and the zone from the key's hash (as
//! Envoy's `choosePriority` does), so a key keeps its endpoint while the tiers are stable.
//!
//! What a pick costs: stages that send every request of the whole snapshot to one set
//! (healthy tiers, where tier 0 takes all; an aperture without subsets or zones) are folded
//! in at prepare time, so the set's picker *is* the main picker and a pick costs what an
//! undecorated one does. Otherwise a request without a hash key reaches its leaf with one
//! draw over the leaves' combined shares (tier share × zone share, flattened once per
//! snapshot change), and a subset lookup compares keys and values of up to 16 bytes stored
//! inline; about 6 ns over the undecorated pick (BENCHMARKS.md, issue 42).
//!
//! Within a tag's set (Dubbo tag routing first), tiers and zones count the set's members that
//! do not serve too (the endpoints that carry the tag and rule groups of one of its members),
//! so a tag's tier spills gradually as the whole snapshot's does; the tag table's sets beyond
//! [`MAX_TAG_SETS`](crate::route::MAX_TAG_SETS) skip the stages.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::stage::{Stages, Subsets, SubsetFallback};
//! use lbkit_core::{Balancer, BoxStrategy, EndpointSpec, FastRng, PickContext, Snapshot, Timestamp};
//! # use lbkit_core::{EndpointIdx, PickError, Picker, Strategy};
//! # struct First; struct P(Vec<EndpointIdx>);
//! # impl Picker for P { fn pick(&self, _: &mut PickContext<'_>) -> Result<EndpointIdx, PickError> { Ok(self.0[0]) } }
//! # impl Strategy for First { type Picker = P; fn name(&self) -> &str { "first" }
//! #   fn prepare(&self, s: &Arc<Snapshot>, _: Timestamp) -> P { P(s.eligible().to_vec()) } }
//! let snap = Arc::new(Snapshot::from_specs(vec![
//!     EndpointSpec::new("a:1").with_meta("version", "v1"),
//!     EndpointSpec::new("b:1").with_meta("version", "v2"),
//!     EndpointSpec::new("c:1").with_meta("version", "v2").with_priority(1),
//! ], Timestamp::ZERO));
//! let stages = Stages {
//!     subsets: Some(Subsets::new(vec![vec!["version".into()]], SubsetFallback::None)),
//!     ..Stages::default()
//! };
//! let lb = Balancer::new(First, snap, Timestamp::ZERO).with_stages(stages, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let attrs: &[(&[u8], &[u8])] = &[(b"version", b"v2")];
//! let g = lb.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(attrs)).unwrap();
//! assert_eq!(g.endpoint().address(), "b:1", "v2's tier 0 is healthy: all its traffic");
//! let none: &[(&[u8], &[u8])] = &[(b"version", b"v3")];
//! assert!(lb.pick(&mut PickContext::new(Timestamp::ZERO, &mut rng).with_attrs(none)).is_err());
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

mod aperture;
mod report;
mod tiers;
mod tree;

pub use aperture::{aperture_coverage, aperture_slice, random_slice};
pub use report::{LocalityReport, StageReport, SubsetChoice, TierReport};
pub use tiers::{priority_loads, tier_health};
pub(crate) use tree::{Last, Leaf, Staged};

/// One request attribute, a key and its value (a header, a gRPC metadata entry): what subsets
/// match on.
pub type Attr<'a> = (&'a [u8], &'a [u8]);

/// Envoy's default overprovisioning factor.
pub const DEFAULT_OVERPROVISIONING: f64 = 1.4;

/// Most keys in one subset key set.
pub const MAX_SUBSET_KEYS: usize = 8;

/// Most sets the stages prepare a picker for, per snapshot: sets beyond it (a subset key with
/// a value per endpoint, say) pick at random among their members, so memory follows the
/// endpoints, not endpoints × sets.
pub const MAX_STAGE_SETS: usize = 256;

/// The stages a service runs in front of its strategy. The default runs none but priority
/// tiers, which apply as soon as the endpoints carry more than one priority.
#[derive(Clone, Debug, PartialEq)]
pub struct Stages {
    /// Metadata subsets.
    pub subsets: Option<Subsets>,
    /// Envoy's overprovisioning factor for tiers and localities (1.4: a tier keeps all of its
    /// traffic while at least 1/1.4 ≈ 71.4 % of it is healthy).
    pub overprovisioning: f64,
    /// Locality-weighted balancing.
    pub localities: Option<Localities>,
    /// An aperture.
    pub aperture: Option<Aperture>,
}

impl Default for Stages {
    fn default() -> Self {
        Stages {
            subsets: None,
            overprovisioning: DEFAULT_OVERPROVISIONING,
            localities: None,
            aperture: None,
        }
    }
}

impl Stages {
    /// Whether the stages would only route priority tiers (nothing configured).
    pub fn is_default(&self) -> bool {
        self.subsets.is_none() && self.localities.is_none() && self.aperture.is_none()
    }

    /// Check the stages.
    ///
    /// # Errors
    /// The first problem, naming the field: an overprovisioning factor under 1 or not finite,
    /// an empty or oversized key set, a `default` fallback without a default subset, an
    /// aperture of 0, a client index outside its count.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.overprovisioning.is_finite() && (1.0..=100.0).contains(&self.overprovisioning)) {
            return Err(format!(
                "overprovisioning = {} is out of range (expected 1.0 to 100)",
                self.overprovisioning
            ));
        }
        if let Some(s) = &self.subsets {
            s.validate()?;
        }
        if let Some(a) = &self.aperture {
            a.validate()?;
        }
        Ok(())
    }
}

/// Envoy's subset load balancer: key sets to route on, and what happens when none serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subsets {
    /// Metadata key sets, tried in order (`[["version", "zone"], ["version"]]`).
    pub key_sets: Vec<Vec<String>>,
    /// What a request no subset serves gets.
    pub fallback: SubsetFallback,
    /// The default subset's metadata (`fallback = default`): endpoints carrying all of these.
    pub default: Vec<(String, String)>,
}

impl Subsets {
    /// Key sets with a fallback and no default subset.
    pub fn new(key_sets: Vec<Vec<String>>, fallback: SubsetFallback) -> Self {
        Subsets {
            key_sets,
            fallback,
            default: Vec::new(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        for (i, ks) in self.key_sets.iter().enumerate() {
            if ks.is_empty() || ks.iter().any(String::is_empty) {
                return Err(format!(
                    "subset key set #{} is empty or has an empty key",
                    i + 1
                ));
            }
            if ks.len() > MAX_SUBSET_KEYS {
                return Err(format!(
                    "subset key set #{} has {} keys (at most {MAX_SUBSET_KEYS})",
                    i + 1,
                    ks.len()
                ));
            }
        }
        match (self.fallback, self.default.is_empty()) {
            (SubsetFallback::Default, true) => {
                Err("subset fallback = default needs a default subset (K=V pairs)".into())
            }
            (f, false) if f != SubsetFallback::Default => Err(format!(
                "a default subset is given, but the subset fallback is {f} (expected default)"
            )),
            _ => Ok(()),
        }
    }
}

/// What a request gets when no subset serves it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SubsetFallback {
    /// No endpoint: the pick fails (503 in the proxy).
    None,
    /// Every endpoint.
    #[default]
    Any,
    /// The default subset.
    Default,
}

impl FromStr for SubsetFallback {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(SubsetFallback::None),
            "any" => Ok(SubsetFallback::Any),
            "default" => Ok(SubsetFallback::Default),
            _ => Err(format!(
                "unknown subset fallback {s:?} (expected none, any or default)"
            )),
        }
    }
}

impl fmt::Display for SubsetFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubsetFallback::None => "none",
            SubsetFallback::Any => "any",
            SubsetFallback::Default => "default",
        })
    }
}

/// Locality (zone) weights. Endpoints without a zone form the locality `""`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Localities {
    /// Weight per zone.
    pub weights: BTreeMap<String, u32>,
    /// Weight of a zone not in `weights` (0 leaves it out, as Envoy leaves out a locality
    /// without weight).
    pub default_weight: u32,
}

impl Default for Localities {
    /// Every zone weighs 1.
    fn default() -> Self {
        Localities {
            weights: BTreeMap::new(),
            default_weight: 1,
        }
    }
}

impl Localities {
    /// The weight of `zone`.
    pub fn weight(&self, zone: &str) -> u32 {
        self.weights
            .get(zone)
            .copied()
            .unwrap_or(self.default_weight)
    }
}

/// A client's aperture: how many endpoints it talks to and how its slice is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aperture {
    /// Endpoints in the aperture (Finagle's aperture; A68's `subset_size`).
    pub size: u32,
    /// How the slice is chosen.
    pub mode: ApertureMode,
    /// This client's place among the clients: from config, or from the registry's consumer
    /// nodes. Deterministic mode without it uses the whole set (until the registry says).
    pub coordinates: Option<Coordinates>,
    /// Random mode's shuffle seed (A68: one per client); with coordinates, their index is
    /// mixed in so clients configured alike still shuffle apart.
    pub seed: u64,
}

impl Aperture {
    fn validate(&self) -> Result<(), String> {
        if self.size == 0 {
            return Err("aperture = 0 (expected 1 or more endpoints)".into());
        }
        match self.coordinates {
            Some(c) if c.count == 0 || c.index >= c.count => Err(format!(
                "client index {} is outside the client count {} (expected 0 to count - 1)",
                c.index, c.count
            )),
            _ => Ok(()),
        }
    }
}

/// How an aperture's slice is chosen.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum ApertureMode {
    /// Finagle's deterministic aperture: ring coordinates from the client's index and count.
    #[default]
    Deterministic,
    /// gRPC's A68 random subsetting: a seeded shuffle.
    Random,
}

impl FromStr for ApertureMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "deterministic" => Ok(ApertureMode::Deterministic),
            "random" => Ok(ApertureMode::Random),
            _ => Err(format!(
                "unknown aperture mode {s:?} (expected deterministic or random)"
            )),
        }
    }
}

impl fmt::Display for ApertureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ApertureMode::Deterministic => "deterministic",
            ApertureMode::Random => "random",
        })
    }
}

/// A client's place among `count` clients (0-based `index`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coordinates {
    /// This client's position.
    pub index: u32,
    /// How many clients there are.
    pub count: u32,
}

#[cfg(test)]
mod tests;
