//! `ketama`: nginx's `hash $key consistent` ring (CRC32, 160 points per unit of weight), bit for
//! bit.
//!
//! * **Algorithm**: every endpoint's address is split into host and port as nginx splits a
//!   `server` name: the digits after the last `:` are the port (`unix:PATH` has no port, nor
//!   has a name that does not end in `:digits`). With `base` = CRC32 state after
//!   `host`, one NUL byte and `port`, the endpoint puts `160 × weight` points on the ring, each
//!   `CRC32(base ‖ prev)` where `prev` is the previous point of the same endpoint as 4
//!   little-endian bytes (0 for the first). Points are sorted and de-duplicated (the endpoint
//!   earlier in source order keeps a shared point). A call goes to the first point at or after
//!   `CRC32(key)`, wrapping to the first point.
//! * **Origin**: nginx `src/http/modules/ngx_http_upstream_hash_module.c`,
//!   `ngx_http_upstream_update_chash` (points: "crc32(HOST \0 PORT PREV_HASH)", `npoints =
//!   peer->weight * 160`, `ngx_qsort` then de-duplication), `ngx_http_upstream_find_chash_point`
//!   (first point ≥ hash) and `ngx_http_upstream_get_chash_peer` (walks `hp->hash++` past down,
//!   failed or tried peers). The key hash is `ngx_crc32_long(key)`. 160 points per unit of weight
//!   is ketama's (libmemcached) and nginx's constant. Checked against a trace that nginx produced,
//!   published by Cloudflare's pingora-ketama crate (`tests/hash_nginx.rs`).
//! * **Complexity**: prepare O(P log P), P = 160 × Σ weights (one CRC32 per point); pick: one
//!   CRC32 of the key and an O(log P) binary search; memory 8 bytes per point. Weights are nginx
//!   weights: lbkit's default weight 100 makes 16 000 points (125 KiB) per endpoint; give
//!   endpoints nginx's weights (default 1) for nginx's ring and a smaller one.
//! * **A change**: patched like `consistent-hash`'s ring while the weights' divisor stays: one
//!   endpoint out and one in among 10 000 at weight 100 (a ring at its 16 777 216-point cap):
//!   2.3–2.8 ms against 635–659 ms from scratch since chunks are spliced (5.7–6.0 against
//!   531–544 ms before, on another machine; BENCHMARKS.md, "What a change costs a strategy").
//!   **Within a rebuild interval** of the last patch, when one is set (`rebuild_interval_ms`;
//!   off by default, in the catalog too) a change is held: the last ring's points are shared, the
//!   points of endpoints gone, down or drained are walked past (nginx's own walk past a down
//!   server's points) and new endpoints wait for the next patch, which the balancer's first
//!   tick after the interval makes with every change since
//!   ([`ConsistentHash::with_rebuild_interval`](super::ConsistentHash::with_rebuild_interval)).
//!   A change held: 0.18 ms against 4.3 ms patched on one machine; ten changes patched at once
//!   cost about ten patches, so under steady churn only a long interval saves work (see
//!   BENCHMARKS.md, "Hash rings under churn: changes held between splices").
//! * **Behaviour under trouble**: blind to load unless `balance_factor` is set (bounds are
//!   weighted). Down and drained endpoints are left off the ring, which equals nginx walking past
//!   their points (within a rebuild interval, their points stay and are walked past until the
//!   next patch); keys of the others never move. A rejected candidate makes the pick walk on to
//!   the next distinct endpoint clockwise, as nginx's retry does. Weights are the configured ones;
//!   warm-up does not reshape the ring (nginx has none).
//! * **Differences from the origin**: nginx builds the ring over all servers and walks past
//!   down ones at each request; lbkit leaves them off when preparing, which differs only when a
//!   down server's point collides exactly with a live one's. nginx breaks ties of colliding
//!   points with `qsort`, whose order among equals depends on the C library (glibc's merge sort
//!   keeps config order, as here). nginx peers that share a `server` name (one name resolving to
//!   several addresses) share its points and take turns by smooth weighted round robin; lbkit
//!   endpoints are distinct. Above [`MAX_RING_POINTS`] points the weights are scaled down (nginx
//!   would allocate them all). Without a key, the low 32 bits of
//!   [`PickContext::hash`](lbkit_core::PickContext::hash) (or of a random draw) are the point.
//!
//! ```
//! use std::sync::Arc;
//! use lbkit_core::{EndpointSpec, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
//! use lbkit_strategy::Ketama;
//! // nginx: `upstream { hash $request_uri consistent; server 10.0.0.1:443; server 10.0.0.2:443 weight=2; }`
//! let snap = Arc::new(Snapshot::from_specs(
//!     vec![
//!         EndpointSpec::new("10.0.0.1:443").with_weight(1),
//!         EndpointSpec::new("10.0.0.2:443").with_weight(2),
//!     ],
//!     Timestamp::ZERO,
//! ));
//! let picker = Ketama::new().prepare(&snap, Timestamp::ZERO);
//! assert_eq!(picker.len(), 480);
//! let mut rng = FastRng::seed_from_u64(1);
//! let mut cx = PickContext::new(Timestamp::ZERO, &mut rng).with_key(b"/index.html");
//! let idx = picker.pick(&mut cx).unwrap();
//! assert!(idx.get() < 2);
//! ```

use std::sync::Arc;
use std::time::Duration;

use crc32fast::Hasher;
use lbkit_core::{Endpoint, EndpointIdx, Snapshot, Strategy, Timestamp};

use super::bounded::{BalanceFactor, Bound};
use super::ring::{Collision, KeyPoint, Next, RingPicker};

/// Points per unit of weight (nginx's and libmemcached ketama's constant).
pub const POINTS_PER_WEIGHT: u64 = 160;

/// Most points a ring holds (128 MiB of points): beyond it every weight is divided by the
/// smallest factor that fits (at least 1 each), which keeps shares close but leaves nginx's
/// layout. 1 000 endpoints at lbkit's default weight 100 still fit (16 000 000 points).
pub const MAX_RING_POINTS: u64 = 1 << 24;

/// nginx's consistent-hash ring (`ketama`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ketama {
    balance: Option<BalanceFactor>,
    rebuild: Duration,
}

// === impl Ketama ===

impl Ketama {
    /// nginx's ring, no load bound, every change applied at once.
    pub fn new() -> Self {
        Ketama::default()
    }

    /// Hold changes that come within `every` of the last one applied in full for the next
    /// one: meanwhile picks walk past the points of endpoints gone, and new endpoints take
    /// none; zero (the default): every change at once (see [`ConsistentHash::with_rebuild_interval`](super::ConsistentHash::with_rebuild_interval),
    /// the same ring).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lbkit_strategy::Ketama;
    /// let coalescing = Ketama::new().with_rebuild_interval(Duration::from_millis(100));
    /// assert_eq!(coalescing.rebuild_interval(), Duration::from_millis(100));
    /// ```
    pub fn with_rebuild_interval(mut self, every: Duration) -> Self {
        self.rebuild = every;
        self
    }

    /// See [`with_rebuild_interval`](Self::with_rebuild_interval).
    pub fn rebuild_interval(&self) -> Duration {
        self.rebuild
    }

    /// Bound every endpoint's load, in proportion to its weight (see [`BalanceFactor`]).
    pub fn with_balance_factor(self, factor: BalanceFactor) -> Self {
        self.with_balance_factor_opt(Some(factor))
    }

    pub(crate) fn with_balance_factor_opt(mut self, factor: Option<BalanceFactor>) -> Self {
        self.balance = factor;
        self
    }
}

impl Strategy for Ketama {
    type Picker = RingPicker;

    fn name(&self) -> &str {
        "ketama"
    }

    fn prepare(&self, snapshot: &Arc<Snapshot>, now: Timestamp) -> RingPicker {
        let divisor = divisor(snapshot);
        let mut points = Vec::new();
        for &idx in snapshot.eligible() {
            put(snapshot, idx, divisor, &mut points);
        }
        let bound = self.balance.map(|f| Bound::new(f, snapshot, weight));
        let layout = (Collision::KeepFirst, KeyPoint::Crc32);
        RingPicker::new(points, layout, bound, snapshot, now)
    }

    /// Patched from the last ring spliced while the weights' divisor stays (it moves only when
    /// the ring crosses [`MAX_RING_POINTS`]): only the endpoints that came or went are hashed,
    /// and only the chunks of the ring their points land in are copied. Within the
    /// [rebuild interval](Ketama::with_rebuild_interval) of the last splice, the last ring's
    /// points shared whole instead.
    fn prepare_next(
        &self,
        last_snapshot: &Arc<Snapshot>,
        last: &RingPicker,
        snapshot: &Arc<Snapshot>,
        now: Timestamp,
    ) -> RingPicker {
        let divisor = divisor(snapshot);
        if divisor != self::divisor(last.spliced(last_snapshot).1) {
            return self.prepare(snapshot, now);
        }
        let put = |s: &Snapshot, idx, out: &mut Vec<_>| put(s, idx, divisor, out);
        let next = Next {
            put: &put,
            same_points,
            balance: self.balance.map(|f| (f, weight as fn(&Endpoint) -> u64)),
            interval: self.rebuild,
            now,
        };
        last.next(last_snapshot, snapshot, &next)
            .unwrap_or_else(|| self.prepare(snapshot, now))
    }
}

/// Whether two endpoints of one key put the same points: the same address and weight.
fn same_points(a: &Endpoint, b: &Endpoint) -> bool {
    a.address() == b.address() && a.weight() == b.weight()
}

/// What a load bound weighs an endpoint by: its weight.
fn weight(e: &Endpoint) -> u64 {
    u64::from(e.weight())
}

/// What every weight is divided by so the ring holds at most [`MAX_RING_POINTS`]. Read from
/// the snapshot's dense weights, not its endpoints (two of these a change were the most of a
/// change held within the rebuild interval).
fn divisor(snapshot: &Snapshot) -> u64 {
    let total = snapshot
        .eligible_weight_total()
        .saturating_mul(POINTS_PER_WEIGHT);
    total.div_ceil(MAX_RING_POINTS).max(1)
}

/// Put `idx`'s points: 160 per unit of its weight over `divisor` (at least one unit).
fn put(snapshot: &Snapshot, idx: EndpointIdx, divisor: u64, points: &mut Vec<(u32, EndpointIdx)>) {
    let endpoint = snapshot.endpoint(idx);
    let scaled = (u64::from(endpoint.weight()) / divisor).max(1);
    points.extend(server_points(endpoint.address(), scaled * POINTS_PER_WEIGHT).map(|h| (h, idx)));
}

/// nginx's split of a `server` name into host and port (`ngx_http_upstream_update_chash`).
pub(crate) fn split_host_port(server: &str) -> (&[u8], &[u8]) {
    let bytes = server.as_bytes();
    if bytes.len() >= 5 && bytes[..5].eq_ignore_ascii_case(b"unix:") {
        return (&bytes[5..], b"");
    }
    for (j, &c) in bytes.iter().rev().enumerate() {
        if c == b':' {
            let colon = bytes.len() - j - 1;
            return (&bytes[..colon], &bytes[colon + 1..]);
        }
        if !c.is_ascii_digit() {
            break;
        }
    }
    (bytes, b"")
}

/// The `npoints` chained points of one server: `crc32(HOST \0 PORT PREV_HASH)`.
fn server_points(server: &str, npoints: u64) -> impl Iterator<Item = u32> {
    let (host, port) = split_host_port(server);
    let mut base = Hasher::new();
    base.update(host);
    base.update(&[0]);
    base.update(port);
    let mut prev: u32 = 0;
    (0..npoints).map(move |_| {
        let mut h = base.clone();
        h.update(&prev.to_le_bytes());
        prev = h.finalize();
        prev
    })
}

/// The ring point of a request key: `ngx_crc32_long(key)`.
#[inline]
pub(crate) fn key_point(key: &[u8]) -> u32 {
    crc32fast::hash(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_nginx() {
        let split = |s| {
            let (h, p) = split_host_port(s);
            (
                std::str::from_utf8(h).unwrap(),
                std::str::from_utf8(p).unwrap(),
            )
        };
        assert_eq!(split("10.0.0.1:443"), ("10.0.0.1", "443"));
        assert_eq!(split("[::1]:8080"), ("[::1]", "8080"));
        assert_eq!(split("backend.example"), ("backend.example", ""));
        assert_eq!(split("host:http"), ("host:http", ""));
        assert_eq!(split("UNIX:/tmp/sock"), ("/tmp/sock", ""));
        assert_eq!(split("host:"), ("host", ""));
    }

    #[test]
    fn points_chain_previous_hash_little_endian() {
        let mut expected = Vec::new();
        let mut prev = 0u32;
        for _ in 0..3 {
            let mut input = b"10.0.0.1\x00443".to_vec();
            input.extend_from_slice(&prev.to_le_bytes());
            prev = crc32fast::hash(&input);
            expected.push(prev);
        }
        assert_eq!(
            server_points("10.0.0.1:443", 3).collect::<Vec<_>>(),
            expected
        );
    }

    #[test]
    fn weights_scale_points_and_oversized_rings_are_capped() {
        let snap = lbkit_testkit::snapshot(&[("a:1", 1), ("b:1", 3)]);
        assert_eq!(Ketama::new().prepare(&snap, Timestamp::ZERO).len(), 640);
        let huge = lbkit_testkit::snapshot(&[("a:1", 200_000), ("b:1", 1)]);
        let ring = Ketama::new().prepare(&huge, Timestamp::ZERO);
        assert!(ring.len() as u64 <= MAX_RING_POINTS);
        assert!(
            ring.points().any(|(_, o)| o.get() == 1),
            "light endpoint kept"
        );
    }
}
