//! Issue 4: lookup cost of lbkit's consistent-hashing strategies at 10, 1 000 and 10 000
//! endpoints, in the same process run as Cloudflare's `pingora-ketama` `Continuum` and
//! `pingora-load-balancing`'s `LoadBalancer<selection::Consistent>` (= `KetamaHashing`); plus the
//! rebuild (prepare) time of 1 000-endpoint rings and Maglev tables.
//!
//! Inputs built outside the timed closures: snapshot, picker / ring / load balancer, RNG, and
//! 1 024 random 21-byte request keys (`"user-" + 16 hex digits`) that the closure cycles
//! through (`keys[k & 1023]`, one per iteration). An lbkit pick is
//! `PickContext::new(ZERO, &mut rng)` with `cx.key = Some(key)`, then `Picker::pick`.
//!
//! Endpoint addresses are `127.0.0.1:1` … (`lbkit_bench::address`), the same for every
//! implementation. lbkit weights: `consistent-hash` ignores weights (as Dubbo); `ketama_w1` gives
//! every endpoint weight 1 (nginx's and Pingora's default: 160 points each, the same ring as
//! `pingora-ketama`; checked before timing); `ketama_w100` keeps lbkit's default weight 100
//! (16 000 points each; at 10 000 endpoints the ring is capped at 2²⁴ points, so weights are
//! divided by 10: 1 600 points each); Maglev and rendezvous have weight 100 (all equal).
//! Bounded variants use `BalanceFactor::new(1.25)` over idle endpoints (nothing in flight).
//!
//! Lookup groups fix `sample_size = 10_000` (100 samples), except rendezvous (O(n) per pick:
//! `sample_size = 100`); rebuilds are medians of 30 single calls (10 for the 16-million-point
//! ring).

use std::net::SocketAddr;
use std::sync::Arc;

use divan::{black_box, Bencher};
use lbkit_bench::{address, request_keys, snapshot, snapshot_with_weight, Weights, HASH_N, KEYS};
use lbkit_core::{key_hash, FastRng, PickContext, Picker, Snapshot, Strategy, Timestamp};
use lbkit_strategy::{BalanceFactor, ConsistentHash, Ketama, Maglev, Rendezvous};
use pingora_ketama::{Bucket, Continuum};
use pingora_load_balancing::{selection, LoadBalancer};

fn main() {
    divan::main();
}

const MASK: usize = KEYS - 1;
const KEY_SEED: u64 = 7;

fn factor() -> BalanceFactor {
    BalanceFactor::new(1.25).expect("1.25 is a valid balance factor")
}

/// One keyed pick per iteration, keys cycling.
fn bench_keyed<S: Strategy>(b: Bencher<'_, '_>, strategy: S, snap: Arc<Snapshot>) {
    let picker = strategy.prepare(&snap, Timestamp::ZERO);
    let keys = request_keys(KEYS, KEY_SEED);
    let mut rng = FastRng::seed_from_u64(1);
    let mut k = 0usize;
    b.bench_local(|| {
        let key = keys[k & MASK].as_bytes();
        k = k.wrapping_add(1);
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        cx.key = Some(key);
        black_box(&picker).pick(&mut cx)
    });
}

/// One pick per iteration with a precomputed 64-bit hash (`cx.hash`, no key): the lookup
/// without the strategy's own key hash (low 32 bits = ring point; `hash mod M` = Maglev entry).
fn bench_prehashed<S: Strategy>(b: Bencher<'_, '_>, strategy: S, snap: Arc<Snapshot>) {
    let picker = strategy.prepare(&snap, Timestamp::ZERO);
    let hashes: Vec<u64> = request_keys(KEYS, KEY_SEED)
        .iter()
        .map(|k| key_hash(k.as_bytes()))
        .collect();
    let mut rng = FastRng::seed_from_u64(1);
    let mut k = 0usize;
    b.bench_local(|| {
        let h = hashes[k & MASK];
        k = k.wrapping_add(1);
        let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
        cx.hash = Some(h);
        black_box(&picker).pick(&mut cx)
    });
}

fn buckets(n: usize) -> Vec<Bucket> {
    (0..n)
        .map(|i| Bucket::new(address(i).parse::<SocketAddr>().expect("valid address"), 1))
        .collect()
}

/// lbkit `ketama` at weight 1 and `pingora-ketama` must build the same nginx ring: compare the
/// endpoint each implementation picks for every key (not timed). Returns the number that differ.
fn ketama_disagreements(n: usize) -> usize {
    let picker = Ketama::new().prepare(&snapshot_with_weight(n, 1), Timestamp::ZERO);
    let ring = Continuum::new(&buckets(n));
    let mut rng = FastRng::seed_from_u64(1);
    request_keys(KEYS, KEY_SEED)
        .iter()
        .filter(|key| {
            let mut cx = PickContext::new(Timestamp::ZERO, &mut rng);
            cx.key = Some(key.as_bytes());
            let ours = picker.pick(&mut cx).expect("non-empty ring").get();
            let theirs = ring.node(key.as_bytes()).expect("non-empty ring");
            address(ours).parse::<SocketAddr>().expect("valid address") != theirs
        })
        .count()
}

/// Keyed lookups, lbkit.
#[divan::bench_group(sample_size = 10_000)]
mod lookup {
    use super::*;

    /// Dubbo ring: MD5 of the key, binary search over 160 points per endpoint.
    #[divan::bench(args = HASH_N)]
    fn consistent_hash(b: Bencher, n: usize) {
        bench_keyed(b, ConsistentHash::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N)]
    fn consistent_hash_bounded(b: Bencher, n: usize) {
        bench_keyed(
            b,
            ConsistentHash::new().with_balance_factor(factor()),
            snapshot(n, Weights::Uniform),
        );
    }

    /// nginx ring, weight 1 (160 points per endpoint; the same ring as pingora-ketama).
    #[divan::bench(args = HASH_N)]
    fn ketama_w1(b: Bencher, n: usize) {
        let bad = ketama_disagreements(n);
        eprintln!(
            "# ketama weight 1 vs pingora-ketama, n = {n}: {bad} of {KEYS} keys picked differently"
        );
        bench_keyed(b, Ketama::new(), snapshot_with_weight(n, 1));
    }

    #[divan::bench(args = HASH_N)]
    fn ketama_w1_bounded(b: Bencher, n: usize) {
        bench_keyed(
            b,
            Ketama::new().with_balance_factor(factor()),
            snapshot_with_weight(n, 1),
        );
    }

    /// nginx ring at lbkit's default weight 100 (16 000 points per endpoint; 1 600 at n = 10 000,
    /// where the 2²⁴-point cap divides the weights by 10).
    #[divan::bench(args = HASH_N)]
    fn ketama_w100(b: Bencher, n: usize) {
        bench_keyed(b, Ketama::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N)]
    fn ketama_w100_bounded(b: Bencher, n: usize) {
        bench_keyed(
            b,
            Ketama::new().with_balance_factor(factor()),
            snapshot(n, Weights::Uniform),
        );
    }

    /// xxHash64 of the key, `% 65 537`, one table read.
    #[divan::bench(args = HASH_N)]
    fn maglev(b: Bencher, n: usize) {
        bench_keyed(b, Maglev::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N)]
    fn maglev_bounded(b: Bencher, n: usize) {
        bench_keyed(
            b,
            Maglev::new().with_balance_factor(factor()),
            snapshot(n, Weights::Uniform),
        );
    }

    /// SipHash of the key, then one mix per endpoint (O(n)).
    #[divan::bench(args = HASH_N, sample_size = 100)]
    fn rendezvous(b: Bencher, n: usize) {
        bench_keyed(b, Rendezvous::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N, sample_size = 100)]
    fn rendezvous_bounded(b: Bencher, n: usize) {
        bench_keyed(
            b,
            Rendezvous::new().with_balance_factor(factor()),
            snapshot(n, Weights::Uniform),
        );
    }
}

/// Lookups with a precomputed hash instead of a key: the search / table read alone.
#[divan::bench_group(sample_size = 10_000)]
mod prehashed {
    use super::*;

    #[divan::bench(args = HASH_N)]
    fn consistent_hash(b: Bencher, n: usize) {
        bench_prehashed(b, ConsistentHash::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N)]
    fn ketama_w1(b: Bencher, n: usize) {
        bench_prehashed(b, Ketama::new(), snapshot_with_weight(n, 1));
    }

    #[divan::bench(args = HASH_N)]
    fn ketama_w100(b: Bencher, n: usize) {
        bench_prehashed(b, Ketama::new(), snapshot(n, Weights::Uniform));
    }

    #[divan::bench(args = HASH_N)]
    fn maglev(b: Bencher, n: usize) {
        bench_prehashed(b, Maglev::new(), snapshot(n, Weights::Uniform));
    }
}

/// Reference crates, same process run, same keys and addresses, all weights 1.
#[divan::bench_group(sample_size = 10_000)]
mod reference {
    use super::*;

    /// `pingora_ketama::Continuum::node(key)`: CRC32 of the key, binary search over 8-byte
    /// points, the `SocketAddr` copied out.
    #[divan::bench(args = HASH_N)]
    fn pingora_ketama(b: Bencher, n: usize) {
        let ring = Continuum::new(&buckets(n));
        let keys = request_keys(KEYS, KEY_SEED);
        let mut k = 0usize;
        b.bench_local(|| {
            let key = keys[k & MASK].as_bytes();
            k = k.wrapping_add(1);
            black_box(&ring).node(key)
        });
    }

    /// `LoadBalancer<selection::Consistent>::select(key, 256)` (`Consistent` = `KetamaHashing`):
    /// ArcSwap load, `UniqueIterator` (a `HashSet`), `OwnedNodeIterator` (`Arc` clone), the
    /// ring lookup, a `HashMap<SocketAddr, Backend>` lookup, the health lookup, and the returned
    /// `Backend` clone dropped inside the timed closure.
    #[divan::bench(args = HASH_N)]
    fn pingora_consistent(b: Bencher, n: usize) {
        let addrs: Vec<String> = (0..n).map(address).collect();
        let lb: LoadBalancer<selection::Consistent> =
            LoadBalancer::try_from_iter(addrs.iter().map(String::as_str)).expect("static backends");
        let keys = request_keys(KEYS, KEY_SEED);
        let mut k = 0usize;
        b.bench_local(|| {
            let key = keys[k & MASK].as_bytes();
            k = k.wrapping_add(1);
            lb.select(black_box(key), 256).map(|be| be.weight)
        });
    }
}

/// The key hashes alone, on the same cycling keys (what each lookup pays before searching).
#[divan::bench_group(sample_size = 10_000)]
mod key_hash_floor {
    use super::*;

    fn bench_hash<O>(b: Bencher<'_, '_>, f: impl Fn(&[u8]) -> O) {
        let keys = request_keys(KEYS, KEY_SEED);
        let mut k = 0usize;
        b.bench_local(|| {
            let key = keys[k & MASK].as_bytes();
            k = k.wrapping_add(1);
            f(black_box(key))
        });
    }

    /// Only the key cycling (`keys[k & 1023]`): the harness overhead of every keyed row.
    #[divan::bench]
    fn cycle_only(b: Bencher) {
        bench_hash(b, |key| key.len());
    }

    /// `MD5(key)`, first 4 bytes little-endian (Dubbo; `consistent-hash`).
    #[divan::bench]
    fn md5(b: Bencher) {
        use md5::{Digest, Md5};
        bench_hash(b, |key| {
            let d: [u8; 16] = Md5::digest(key).into();
            u32::from_le_bytes([d[0], d[1], d[2], d[3]])
        });
    }

    /// `crc32fast::hash(key)` (nginx; `ketama`, pingora-ketama).
    #[divan::bench]
    fn crc32(b: Bencher) {
        bench_hash(b, crc32fast::hash);
    }

    /// `xxh64(key, 0)` (Envoy; `maglev`).
    #[divan::bench]
    fn xxh64(b: Bencher) {
        bench_hash(b, |key| xxhash_rust::xxh64::xxh64(key, 0));
    }

    /// `lbkit_core::key_hash` (SipHash-2-4; `rendezvous`).
    #[divan::bench]
    fn siphash(b: Bencher) {
        bench_hash(b, key_hash);
    }
}

/// Rebuild: one `prepare` (or `Continuum::new`) per iteration over a snapshot (or bucket list)
/// built outside the timing; the result is dropped by divan outside the timing.
mod rebuild {
    use super::*;

    const N: usize = 1_000;

    fn bench_prepare<S: Strategy>(b: Bencher<'_, '_>, strategy: S, snap: Arc<Snapshot>) {
        b.bench_local(|| black_box(&strategy).prepare(black_box(&snap), Timestamp::ZERO));
    }

    /// 160 000 points: 40 000 MD5 digests, sort, de-duplicate.
    #[divan::bench(sample_count = 30)]
    fn consistent_hash_1000(b: Bencher) {
        bench_prepare(b, ConsistentHash::new(), snapshot(N, Weights::Uniform));
    }

    /// 160 000 points (weight 1): 160 000 chained CRC32s, sort, de-duplicate.
    #[divan::bench(sample_count = 30)]
    fn ketama_w1_1000(b: Bencher) {
        bench_prepare(b, Ketama::new(), snapshot_with_weight(N, 1));
    }

    /// 16 000 000 points (weight 100).
    #[divan::bench(sample_count = 10)]
    fn ketama_w100_1000(b: Bencher) {
        bench_prepare(b, Ketama::new(), snapshot(N, Weights::Uniform));
    }

    /// `Continuum::new` of 1 000 weight-1 buckets (160 000 points).
    #[divan::bench(sample_count = 30)]
    fn pingora_ketama_1000(b: Bencher) {
        let buckets = buckets(N);
        b.bench_local(|| Continuum::new(black_box(&buckets)));
    }

    /// 65 537-entry table, 1 000 equal weights.
    #[divan::bench(sample_count = 30)]
    fn maglev_1000(b: Bencher) {
        bench_prepare(b, Maglev::new(), snapshot(N, Weights::Uniform));
    }

    /// 65 537-entry table, 1 000 skewed weights (1…997).
    #[divan::bench(sample_count = 30)]
    fn maglev_1000_skewed(b: Bencher) {
        bench_prepare(b, Maglev::new(), snapshot(N, Weights::Skewed));
    }

    /// Context: the Maglev table at 10 and 10 000 endpoints.
    #[divan::bench(args = [10, 10_000], sample_count = 30)]
    fn maglev(b: Bencher, n: usize) {
        bench_prepare(b, Maglev::new(), snapshot(n, Weights::Uniform));
    }

    /// One SipHash per endpoint.
    #[divan::bench(sample_count = 30)]
    fn rendezvous_1000(b: Bencher) {
        bench_prepare(b, Rendezvous::new(), snapshot(N, Weights::Uniform));
    }
}
