//! `consistent-hash`: Dubbo's MD5 ring with virtual nodes, bit for bit.
//!
//! * **Algorithm**: every endpoint puts `nodes` virtual nodes on a 32-bit ring. For
//!   `i in 0..nodes/4` it takes `d = MD5(address + i)` (the address text `host:port` followed by
//!   `i` in decimal, UTF-8) and cuts the 16-byte digest into four little-endian `u32` points,
//!   `d[4h] | d[4h+1] << 8 | d[4h+2] << 16 | d[4h+3] << 24` for `h in 0..4`. A point that two
//!   endpoints share goes to the endpoint put on the ring last. A call hashes its key the same way
//!   (`MD5(key)`, first four bytes little-endian) and goes to the first point at or after it,
//!   wrapping to the first point.
//! * **Origin**: Apache Dubbo `org.apache.dubbo.rpc.cluster.loadbalance.ConsistentHashLoadBalance`
//!   (`ConsistentHashSelector`: `replicaNumber = hash.nodes`, default 160; `md5(address + i)`;
//!   `hash(digest, number)`; `virtualInvokers.put`, a `TreeMap`, so a later invoker overwrites a
//!   colliding point; `select` = `md5(toKey(args))`, `hash(digest, 0)`, `ceilingEntry` else
//!   `firstEntry`). The address is `invoker.getUrl().getAddress()`, i.e. `host:port`. The layout
//!   is the same in Dubbo 2.6, 2.7 and 3.x.
//! * **Complexity**: prepare O(P log P) with P = `nodes` × endpoints (one MD5 per 4 points); pick:
//!   one MD5 of the key (≈ 100–200 ns for short keys) plus an O(log P) binary search; memory 8
//!   bytes per point (160 points: 1.25 KiB per endpoint), and about one more per point for the
//!   chunks and groups a patch shares (a group's fixed tables hold 32 chunks; a rebuild fills 16).
//! * **A change**: patched, not rebuilt (`Strategy::prepare_next`): only the endpoints that came or
//!   went are hashed, only the ring's chunks their points land in are merged again, and only the
//!   groups of chunks those lie in are made again; the rest is shared (see `ring.rs`). One
//!   endpoint out and one in among 10 000: 0.46 ms against 81 ms from scratch (BENCHMARKS.md,
//!   "What a change costs a strategy"); with the chunks in groups, 0.50 against 0.77 ms in the
//!   same runs, and 6.0 % of a core against 10.5 % following 10 000 ZooKeeper providers at
//!   1 %/s ("Hash rings under churn: chunks in groups"). Within a rebuild interval of the last
//!   patch, when one is set (`rebuild_interval_ms`, off by default), a change is held instead:
//!   see [`ConsistentHash::with_rebuild_interval`].
//! * **Behaviour under trouble**: blind to load unless `balance_factor` is set. The ring holds
//!   the eligible endpoints only (within a rebuild interval, the points of those gone stay and
//!   are walked past), so a key of a down or drained endpoint goes to the next point,
//!   and keys of the others never move. A rejected candidate (already tried, circuit tripped)
//!   makes the balancer ask again, and the pick walks on to the next distinct endpoint clockwise.
//!   A warming endpoint gets its full share at once (weights are ignored, as in Dubbo).
//! * **Differences from the origin**: weights are ignored, as in Dubbo. Dubbo's key is the
//!   configured RPC arguments concatenated as text (`hash.arguments`, default the first); here it
//!   is [`PickContext::key`](lbkit_core::PickContext::key) (`lbkit pick --key`), which a layer
//!   fills with those arguments, e.g. through [`KeyExtractor`](super::KeyExtractor). The ring is
//!   rebuilt per snapshot instead of being cached per `identityHashCode` of the invoker list.
//!   When Dubbo reselects after a failure it rebuilds a ring over the remaining invokers; lbkit
//!   walks on along the same ring, which sends the key where the smaller ring would, except
//!   where two endpoints' points collide. Without a key, the low 32 bits of
//!   [`PickContext::hash`](lbkit_core::PickContext::hash) (or of a random draw) are the point.
//!   Optional bounded loads (Dubbo has none).
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::ConsistentHash;
//! let snap = Arc::new(Snapshot::from_specs(
//!     ["10.0.0.1:20880", "10.0.0.2:20880"].map(EndpointSpec::new).to_vec(),
//!     Timestamp::ZERO,
//! ));
//! let picker = ConsistentHash::new().prepare(&snap, Timestamp::ZERO);
//! assert_eq!(picker.len(), 320);
//! let mut rng = FastRng::seed_from_u64(1);
//! let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(b"user-42");
//! let first = picker.pick(&mut cx).unwrap();
//! assert_eq!(picker.pick(&mut cx).unwrap(), first);
//! ```

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{Endpoint, EndpointIdx, Snapshot, Strategy, Timestamp};
use md5::{Digest, Md5};

use super::bounded::{BalanceFactor, Bound};
use super::ring::{Collision, KeyPoint, Next, RingPicker};

/// Dubbo's default number of virtual nodes per endpoint (`hash.nodes`).
pub const DEFAULT_NODES: u32 = 160;

/// Most virtual nodes per endpoint (512 KiB of points per endpoint; 410 × Dubbo's default).
pub const MAX_NODES: u32 = 65_536;

/// Dubbo's consistent-hash ring (`consistent-hash`).
#[derive(Debug, Clone, Copy)]
pub struct ConsistentHash {
    nodes: u32,
    balance: Option<BalanceFactor>,
    rebuild: Duration,
}

impl Default for ConsistentHash {
    fn default() -> Self {
        ConsistentHash::new()
    }
}

// === impl ConsistentHash ===

impl ConsistentHash {
    /// [`DEFAULT_NODES`] virtual nodes per endpoint, no load bound.
    pub fn new() -> Self {
        ConsistentHash::with_nodes(DEFAULT_NODES)
    }

    /// `nodes` virtual nodes per endpoint (Dubbo's `hash.nodes`). As in Dubbo, `nodes / 4` digests
    /// are taken, so the count is rounded down to a multiple of 4; it is clamped to
    /// `4..=`[`MAX_NODES`] (with fewer than 4, Dubbo would build an empty ring and fail).
    pub fn with_nodes(nodes: u32) -> Self {
        ConsistentHash {
            nodes: nodes.clamp(4, MAX_NODES),
            balance: None,
            rebuild: Duration::ZERO,
        }
    }

    /// Hold changes that come within `every` of the last one applied in full (a splice: a
    /// build, or a patch with every change since) for the next splice, which the balancer's
    /// first tick or publish from the interval's end makes
    /// ([`Picker::refresh_at`](lbkit_core::Picker::refresh_at)). Meanwhile the ring keeps the
    /// last splice's points: picks walk past the points of endpoints gone, down or drained (as
    /// nginx walks past a down server's points), and new endpoints take no keys; a changed
    /// endpoint keeps its points (a new weight reshapes them at the splice). The splice then
    /// moves keys to the new endpoints' points as a rebuild would. An endpoint back from down
    /// or weight 0, or new endpoints more than a tenth in number of those kept, splice at
    /// once. A change held costs O(n), one slot table, instead of a patch of every chunk its
    /// points land in; a splice of k changes costs about k patches while they share few
    /// chunks, so it saves work under steady churn only with a long interval (ketama at
    /// 10 000 endpoints and weight 100, 100 changes a second: 0.96× the CPU at 100 ms, 0.68×
    /// at 250 ms; BENCHMARKS.md, "Hash rings under churn: changes held between splices").
    ///
    /// Zero (the default, and the catalog's `consistent-hash` and `ketama` unless their
    /// `rebuild_interval_ms` says otherwise): every change applied at once. A balancer with an
    /// interval must be ticked (`lbkit proxy`, the tower `Pool` and the simulator tick theirs;
    /// a `Controller` ticks with `ControllerConfig::refresh`): one that is not keeps a change
    /// waiting until the next publish after the interval.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_strategy::ConsistentHash;
    /// let coalescing = ConsistentHash::new().with_rebuild_interval(Duration::from_millis(100));
    /// assert_eq!(coalescing.rebuild_interval(), Duration::from_millis(100));
    /// assert_eq!(ConsistentHash::new().rebuild_interval(), Duration::ZERO);
    /// ```
    pub fn with_rebuild_interval(mut self, every: Duration) -> Self {
        self.rebuild = every;
        self
    }

    /// See [`with_rebuild_interval`](Self::with_rebuild_interval).
    pub fn rebuild_interval(&self) -> Duration {
        self.rebuild
    }

    /// Bound every endpoint's load (see [`BalanceFactor`]).
    pub fn with_balance_factor(self, factor: BalanceFactor) -> Self {
        self.with_balance_factor_opt(Some(factor))
    }

    pub(crate) fn with_balance_factor_opt(mut self, factor: Option<BalanceFactor>) -> Self {
        self.balance = factor;
        self
    }

    /// Virtual nodes per endpoint, as configured.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
}

impl Strategy for ConsistentHash {
    type Picker = RingPicker;

    fn name(&self) -> &str {
        "consistent-hash"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> RingPicker {
        let mut points = Vec::with_capacity(snapshot.eligible().len() * self.nodes as usize);
        for &idx in snapshot.eligible() {
            self.put(snapshot, idx, &mut points);
        }
        let bound = self.balance.map(|f| Bound::new(f, snapshot, one));
        let layout = (Collision::KeepLast, KeyPoint::Md5);
        RingPicker::new(points, layout, bound, snapshot, now)
    }

    /// Patched from the last ring spliced: only the endpoints that came or went are hashed
    /// (`nodes / 4` MD5s each), and only the chunks of the ring their points land in are
    /// copied. Within the [rebuild interval](ConsistentHash::with_rebuild_interval) of the
    /// last splice, the last ring's points shared whole instead.
    fn prepare_next(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &RingPicker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> RingPicker {
        let put = |s: &Snapshot, idx, out: &mut Vec<_>| self.put(s, idx, out);
        let next = Next {
            put: &put,
            same_points: same_address,
            balance: self.balance.map(|f| (f, one as fn(&Endpoint) -> u64)),
            interval: self.rebuild,
            now,
        };
        last.next(last_snapshot, snapshot, &next)
            .unwrap_or_else(|| self.prepare(snapshot, now))
    }
}

impl ConsistentHash {
    /// Put `idx`'s virtual nodes: four points per `MD5(address + i)`.
    fn put(&self, snapshot: &Snapshot, idx: EndpointIdx, points: &mut Vec<(u32, EndpointIdx)>) {
        let address = snapshot.endpoint(idx).address();
        for i in 0..self.nodes / 4 {
            let digest = node_digest(address, i);
            points.extend((0..4).map(|h| (digest_point(&digest, h), idx)));
        }
    }
}

/// Whether two endpoints of one key put the same points: the same address.
fn same_address(a: &Endpoint, b: &Endpoint) -> bool {
    a.address() == b.address()
}

/// What a load bound weighs an endpoint by: the same for all (weights are ignored).
fn one(_: &Endpoint) -> u64 {
    1
}

/// `MD5(address + i)`, with `i` in decimal as Java's string concatenation writes it.
fn node_digest(address: &str, i: u32) -> [u8; 16] {
    let mut md5 = Md5::new();
    md5.update(address.as_bytes());
    md5.update(i.to_string().as_bytes());
    md5.finalize().into()
}

/// Dubbo's `hash(digest, number)`: bytes `4n..4n+4` of the digest, little-endian.
fn digest_point(digest: &[u8; 16], number: usize) -> u32 {
    let b = number * 4;
    u32::from_le_bytes([digest[b], digest[b + 1], digest[b + 2], digest[b + 3]])
}

/// The ring point of a request key: `hash(md5(key), 0)`.
#[inline]
pub(crate) fn key_point(key: &[u8]) -> u32 {
    let digest: [u8; 16] = Md5::digest(key).into();
    digest_point(&digest, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lbkit_core::EndpointIdx;

    #[test]
    fn digest_points_follow_dubbo_byte_order() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e: Dubbo's hash(digest, 0) reads d4 1d 8c d9
        // as the low-to-high bytes of the point.
        assert_eq!(key_point(b""), 0xd98c_1dd4);
        let digest: [u8; 16] = Md5::digest(b"").into();
        assert_eq!(digest_point(&digest, 3), 0x7e42_f8ec);
    }

    #[test]
    fn node_count_rounds_like_dubbo() {
        let snap = lbkit_testkit::snapshot(&[("a:1", 1)]);
        let ring = |n| {
            ConsistentHash::with_nodes(n)
                .prepare(&snap, Timestamp::ZERO)
                .len()
        };
        assert_eq!(ring(160), 160);
        assert_eq!(ring(163), 160);
        assert_eq!(ring(1), 4);
    }

    #[test]
    fn ignores_weights_and_skips_ineligible() {
        let snap = lbkit_testkit::snapshot(&[("a:1", 1), ("b:1", 500), ("c:1", 0)]);
        let picker = ConsistentHash::new().prepare(&snap, Timestamp::ZERO);
        let count = |i| {
            picker
                .points()
                .filter(|&(_, o)| o == EndpointIdx::new(i))
                .count()
        };
        assert_eq!((count(0), count(1), count(2)), (160, 160, 0));
    }
}
