//! Consistent-hashing strategies: calls with the same key go to the same endpoint, and a change
//! of the endpoint set moves as few keys as possible (sticky sessions, caches, sharded state).
//!
//! | name (`lbkit pick --strategy`) | type | origin | pick |
//! |---|---|---|---|
//! | `consistent-hash` | [`ConsistentHash`] | Dubbo `ConsistentHashLoadBalance`, bit-compatible | MD5 of the key + O(log P) |
//! | `ketama` | [`Ketama`] | nginx `hash $key consistent`, bit-compatible | CRC32 of the key + O(log P) |
//! | `maglev` | [`Maglev`] | Maglev (NSDI 2016) with Envoy's weighted table | O(1) |
//! | `rendezvous` | [`Rendezvous`] | highest random weight (Thaler & Ravishankar 1998), weighted | O(n) |
//!
//! Every one of them takes the parameter `balance_factor` ([`BalanceFactor`], consistent hashing
//! with bounded loads) and walks on deterministically when an endpoint cannot take the call.
//!
//! # Keys
//! A pick hashes [`PickContext::key`](lbkit_core::PickContext::key) the way its origin does
//! (Dubbo: MD5, nginx: CRC32, Envoy's Maglev: xxHash64), so an lbkit client and a Dubbo consumer,
//! an nginx tier or an Envoy sidecar agree on where a key goes. Without a key the pick uses
//! [`PickContext::hash`](lbkit_core::PickContext::hash) (lbkit's SipHash of a key, or any 64-bit
//! hash the caller chose); without either it draws a random position from the caller's RNG, so a
//! keyless call is spread like a random pick instead of piling onto one endpoint.
//! [`KeyExtractor`] turns a request (header, cookie, path, query, source IP, RPC argument) into a key.
//!
//! # Trouble: walking on
//! * **Down or drained endpoints** are passed over deterministically. The rings are built over
//!   the eligible endpoints only, which is the same as walking past the points of ineligible
//!   ones; Maglev keeps one table over every endpoint with weight > 0 and resolves an entry of an
//!   ineligible endpoint to the next eligible entry; rendezvous ranks the eligible endpoints only.
//!   Either way a key whose endpoint stays healthy never moves when another endpoint fails.
//! * **Rejected candidates** (already tried by this call, circuit tripped): the balancer asks
//!   again with [`PickContext::probe`](lbkit_core::PickContext::probe) + 1, and the picker returns
//!   the `probe`-th distinct acceptable endpoint after the key's position (next points of the
//!   ring, next table entries, next preference). The same key and probe always give the same
//!   endpoint.
//! * **Overloaded endpoints** (with `balance_factor`): passed over the same way; see
//!   [`BalanceFactor`].
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{Balancer, EndpointSpec, FastRng, PickContext, Snapshot, Timestamp};
//! use lbkit_strategy::catalog::{build, Params};
//! let snap = Arc::new(Snapshot::from_specs(
//!     ["10.0.0.1:20880", "10.0.0.2:20880", "10.0.0.3:20880"].map(EndpointSpec::new).to_vec(),
//!     Timestamp::ZERO,
//! ));
//! let strategy = build("consistent-hash", Params::from_pairs([("balance_factor", "1.25")])).unwrap();
//! let balancer = Balancer::new(strategy, snap, Timestamp::ZERO);
//! let mut rng = FastRng::seed_from_u64(1);
//! let mut pick = |key: &str| {
//!     let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(key.as_bytes());
//!     balancer.pick(&mut cx).unwrap().endpoint().address().to_owned()
//! };
//! assert_eq!(pick("user-42"), pick("user-42"));
//! ```

pub mod bounded;
pub mod consistent;
pub mod ketama;
pub mod key;
pub mod maglev;
pub mod rendezvous;
mod ring;
mod walk;

#[cfg(test)]
mod tests;

use std::time::Duration;

use lbkit_core::{BoxStrategy, PickContext};

use crate::catalog::{invalid, Family, ParamError, ParamInfo, Params, StrategyInfo};

pub use bounded::BalanceFactor;
pub use consistent::{ConsistentHash, DEFAULT_NODES, MAX_NODES};
pub use ketama::{Ketama, MAX_RING_POINTS, POINTS_PER_WEIGHT};
pub use key::{split_target, KeyExtractor, KeyExtractorError, KeySource};
pub use maglev::{
    Maglev, MaglevPicker, TableSizeError, DEFAULT_TABLE_SIZE, MAX_TABLE_SIZE,
    TICKED_REBUILD_INTERVAL,
};
pub use rendezvous::{Rendezvous, RendezvousPicker};
pub use ring::RingPicker;

pub(crate) const FAMILY: Family = Family {
    infos: INFOS,
    build,
};

const BALANCE_FACTOR: ParamInfo = ParamInfo {
    name: "balance_factor",
    default: "off",
    doc: "bounded loads: pass over endpoints whose in-flight calls would exceed ceil(factor x weighted average); a number >= 1.0 (e.g. 1.25), or off",
    tune: &["off", "1.1", "1.25", "1.5", "2.0"],
};

const RING_REBUILD_INTERVAL: ParamInfo = ParamInfo {
    name: "rebuild_interval_ms",
    default: "0",
    doc: "while changes come faster, patch the ring at most this often (at the balancer's ticks); between, the points of endpoints gone are walked past and new endpoints wait; 0..=60000, 0: every change at once (as Dubbo and nginx)",
    tune: &[],
};

const INFOS: &[StrategyInfo] = &[
    StrategyInfo {
        name: "consistent-hash",
        summary: "MD5 ring with virtual nodes, bit-compatible with Dubbo ConsistentHashLoadBalance (weights ignored, as Dubbo)",
        params: &[
            ParamInfo {
                name: "nodes",
                default: "160",
                doc: "virtual nodes per endpoint (Dubbo hash.nodes), rounded down to a multiple of 4; 4..=65536",
                tune: &[],
            },
            RING_REBUILD_INTERVAL,
            BALANCE_FACTOR,
        ],
    },
    StrategyInfo {
        name: "ketama",
        summary: "CRC32 ring, 160 points per unit of weight, bit-compatible with nginx `hash $key consistent`",
        params: &[RING_REBUILD_INTERVAL, BALANCE_FACTOR],
    },
    StrategyInfo {
        name: "maglev",
        summary: "Maglev lookup table (NSDI 2016), weighted as Envoy, O(1) per pick",
        params: &[
            ParamInfo {
                name: "table_size",
                default: "65537",
                doc: "lookup table entries; a prime up to 5000011, ideally > 100 x endpoints",
                tune: &[],
            },
            ParamInfo {
                name: "rebuild_interval_ms",
                default: "100",
                doc: "while changes come faster, build the table at most this often (at the balancer's ticks) and patch it between (new endpoints wait for the build); 0: build on every change, as Envoy",
                tune: &[],
            },
            BALANCE_FACTOR,
        ],
    },
    StrategyInfo {
        name: "rendezvous",
        summary: "highest random weight hashing, weighted (score -w/ln h); O(n) per pick",
        params: &[BALANCE_FACTOR],
    },
];

fn build(name: &str, params: &Params) -> Option<Result<BoxStrategy, ParamError>> {
    let built = match name {
        "consistent-hash" => build_consistent(name, params),
        "ketama" => build_ketama(name, params),
        "maglev" => build_maglev(name, params),
        "rendezvous" => balance_factor(name, params)
            .map(|f| BoxStrategy::new(Rendezvous::new().with_balance_factor_opt(f))),
        _ => return None,
    };
    Some(built)
}

fn build_consistent(name: &str, params: &Params) -> Result<BoxStrategy, ParamError> {
    let nodes = params.u32_in(name, "nodes", 4..=MAX_NODES, DEFAULT_NODES)?;
    let rebuild = rebuild_interval(name, params, Duration::ZERO)?;
    let factor = balance_factor(name, params)?;
    Ok(BoxStrategy::new(
        ConsistentHash::with_nodes(nodes)
            .with_rebuild_interval(rebuild)
            .with_balance_factor_opt(factor),
    ))
}

fn build_ketama(name: &str, params: &Params) -> Result<BoxStrategy, ParamError> {
    let rebuild = rebuild_interval(name, params, Duration::ZERO)?;
    let factor = balance_factor(name, params)?;
    Ok(BoxStrategy::new(
        Ketama::new()
            .with_rebuild_interval(rebuild)
            .with_balance_factor_opt(factor),
    ))
}

fn build_maglev(name: &str, params: &Params) -> Result<BoxStrategy, ParamError> {
    let size = params.u32_in(name, "table_size", 2..=MAX_TABLE_SIZE, DEFAULT_TABLE_SIZE)?;
    let maglev = Maglev::try_with_table_size(size)
        .map_err(|e| invalid(name, "table_size", &size.to_string(), &e.to_string()))?;
    let maglev =
        maglev.with_rebuild_interval(rebuild_interval(name, params, TICKED_REBUILD_INTERVAL)?);
    let factor = balance_factor(name, params)?;
    Ok(BoxStrategy::new(maglev.with_balance_factor_opt(factor)))
}

/// The `rebuild_interval_ms` parameter, `default` when absent: [`TICKED_REBUILD_INTERVAL`] for
/// `maglev`, zero for the rings (held changes save a ring little under steady churn at this
/// interval; see [`ConsistentHash::with_rebuild_interval`]).
fn rebuild_interval(
    name: &str,
    params: &Params,
    default: Duration,
) -> Result<Duration, ParamError> {
    let default = u32::try_from(default.as_millis()).unwrap_or(u32::MAX);
    let rebuild = params.u32_in(name, "rebuild_interval_ms", 0..=60_000, default)?;
    Ok(Duration::from_millis(u64::from(rebuild)))
}

/// The `balance_factor` parameter: absent or `off` = no bound.
fn balance_factor(name: &str, params: &Params) -> Result<Option<BalanceFactor>, ParamError> {
    let Some(text) = params.parse::<String>(name, "balance_factor")? else {
        return Ok(None);
    };
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let value: f64 = text.parse().map_err(|e: std::num::ParseFloatError| {
        invalid(name, "balance_factor", &text, &e.to_string())
    })?;
    BalanceFactor::new(value).map(Some).ok_or_else(|| {
        invalid(
            name,
            "balance_factor",
            &text,
            "must be a finite number >= 1.0 (e.g. 1.25), or off",
        )
    })
}

/// The 64-bit position of a call without a key of the strategy's own kind: the caller's hash,
/// else a random draw (keyless calls are spread like random picks).
#[inline]
pub(crate) fn fallback_hash(cx: &mut PickContext<'_>) -> u64 {
    match cx.hash {
        Some(h) => h,
        None => cx.rng.next_u64(),
    }
}
