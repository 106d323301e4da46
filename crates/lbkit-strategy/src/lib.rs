//! # lbkit-strategy
//!
//! The built-in strategies of lbkit, each in its own module whose docs give the algorithm, its
//! origin, its complexity and its behaviour under trouble:
//!
//! | name (`lbkit pick --strategy`) | type | origin |
//! |---|---|---|
//! | `random` | [`Random`] | Ribbon `RandomRule` |
//! | `round-robin` | [`RoundRobin`] | Ribbon `RoundRobinRule` |
//! | `weighted-random` | [`WeightedRandom`] | Dubbo `RandomLoadBalance` (alias table, O(1)) |
//! | `weighted-round-robin` | [`SmoothWeightedRoundRobin`] | nginx smooth WRR / Dubbo ≥ 2.6.5 (O(1)) |
//! | `weighted-response-time` | [`WeightedResponseTime`] | Ribbon `WeightedResponseTimeRule` |
//! | `sticky-round-robin` | [`StickyRoundRobin`] | the seed framework's "n calls, then switch" rule |
//! | `least-active` | [`LeastActive`] | Dubbo `LeastActiveLoadBalance` |
//! | `least-request` | [`LeastRequest`] | Envoy `LEAST_REQUEST` |
//! | `p2c-least-loaded` | [`P2cLeastLoaded`] | Finagle / tower power of two choices |
//! | `p2c-ewma` | [`P2cEwma`] | Finagle / linkerd peak EWMA |
//! | `shortest-response` | [`ShortestResponse`] | Dubbo `ShortestResponseLoadBalance` |
//! | `best-available` | [`BestAvailable`] | Ribbon `BestAvailableRule` |
//! | `adaptive` | [`Adaptive`] | gRPC weighted round robin over ORCA load reports; by default picked by two choices on latency scaled by them |
//! | `consistent-hash` | [`ConsistentHash`] | Dubbo `ConsistentHashLoadBalance` (bit-compatible MD5 ring) |
//! | `ketama` | [`Ketama`] | nginx `hash $key consistent` (bit-compatible CRC32 ring) |
//! | `maglev` | [`Maglev`] | Maglev lookup table (Eisenbud et al., NSDI 2016; Envoy) |
//! | `rendezvous` | [`Rendezvous`] | weighted highest-random-weight hashing |
//!
//! Every hash strategy takes `balance_factor` for bounded loads (Mirrokni et al.; Envoy
//! `hash_balance_factor`), and [`KeyExtractor`] takes keys from requests for the layers above.
//!
//! [`ZoneAware`] wraps any of them with zone preference (Ribbon `ZoneAvoidanceRule`, Envoy
//! zone-aware routing).
//!
//! [`catalog`] builds any of them by name with string parameters, as configuration files and
//! the CLI do.
//!
//! ```
//! use lbkit_strategy::catalog::{build, Params};
//! let strategy = build("sticky-round-robin", Params::from_pairs([("n", "5")])).unwrap();
//! assert_eq!(lbkit_core::Strategy::name(&strategy), "sticky-round-robin");
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod alias;
pub mod attrs;
mod basic;
pub mod catalog;
mod common;
pub mod hash;
pub mod load;
mod random;
mod response_time;
mod round_robin;
mod smooth_weighted;
mod sticky;
pub mod tag;
mod weighted_random;

pub use attrs::{AttrHeaders, OwnedAttrs};
pub use hash::split_target;
pub use hash::{
    BalanceFactor, ConsistentHash, Ketama, KeyExtractor, KeySource, Maglev, MaglevPicker,
    Rendezvous, RendezvousPicker, RingPicker, TICKED_REBUILD_INTERVAL,
};
pub use load::{
    Adaptive, AdaptiveChoice, AdaptiveConfig, BestAvailable, LeastActive, LeastRequest, P2cEwma,
    P2cLeastLoaded, ShortestResponse, ZoneAware,
};
pub use random::{Random, RandomPicker};
pub use response_time::{
    ResponseTimePicker, WeightedResponseTime, DEFAULT_INTERVAL, DEFAULT_WINDOW, MIN_WEIGHT_PERCENT,
};
pub use round_robin::{RoundRobin, RoundRobinPicker};
pub use smooth_weighted::{
    SmoothWeightedPicker, SmoothWeightedRoundRobin, MAX_CYCLE, MAX_CYCLE_WORK, MAX_FOLDED,
};
pub use sticky::{StickyPicker, StickyRoundRobin, DEFAULT_STICKY_RUN};
pub use tag::TagHeaders;
pub use weighted_random::{WeightedRandom, WeightedRandomPicker};
