//! Changes that wait for the next splice. A ring is spliced when it is built, or patched with
//! every change since the last one (`patch.rs`); a change within the rebuild interval of the
//! last splice ([`Next::interval`]) makes a ring that shares the last spliced one's points
//! whole (three reference counts) and a slot table of its own, O(n):
//!
//! * the points of an endpoint gone, down or drained to weight 0 stay, their slot marked dead,
//!   and a pick walks past them to the next live point, as nginx walks past a down server's
//!   points (a key of theirs lands where a rebuild without the new endpoints would send it,
//!   except where a dead point shadowed another endpoint's at the same hash; the other keys
//!   stay until the splice gives the new endpoints theirs);
//! * an endpoint that changed (same key) keeps its points until the splice (a new weight
//!   reshapes them then);
//! * an endpoint new to the set has no points until the splice;
//! * an endpoint that was in the last spliced snapshot but off its ring (down, or of weight 0)
//!   and is back, or new endpoints of more than a tenth of the ones kept, make the change
//!   splice at once, so keys come back at once and a scale-out is not held.
//!
//! The ring then asks to be spliced at the interval's end ([`Picker::refresh_at`]), which the
//! balancer's next tick makes, from the last spliced ring and its snapshot: every change since
//! in one patch. When nothing waits (an endpoint down and back within the interval), the ring
//! is the spliced one's, renumbered, and asks for nothing.
//!
//! [`Picker::refresh_at`]: lbkit_core::Picker::refresh_at

use std::sync::Arc;
use std::time::Duration;

use lbkit_core::{diff, Endpoint, EndpointIdx, Snapshot, Timestamp};

use super::patch::Put;
use super::{dead, RingPicker, Slot, Splice, NO_SLOT};
use crate::hash::bounded::{BalanceFactor, Bound};

/// What a load bound weighs an endpoint by.
pub(crate) type Weigh = fn(&Endpoint) -> u64;

/// What a ring strategy gives its last ring to make the next snapshot's.
pub(crate) struct Next<'a> {
    /// Puts an endpoint's points.
    pub(crate) put: Put<'a>,
    /// Whether an endpoint that changed (the same key) puts the points it put before.
    pub(crate) same_points: fn(&Endpoint, &Endpoint) -> bool,
    /// The load bound's factor, if any, and what it weighs an endpoint by.
    pub(crate) balance: Option<(BalanceFactor, Weigh)>,
    /// Changes within this long of the last splice wait for the next one; zero: none waits.
    pub(crate) interval: Duration,
    /// The time of the change.
    pub(crate) now: Timestamp,
}

/// The last ring spliced and the snapshot it was made for: what the rings of the changes
/// that wait share, and where the next splice starts from.
#[derive(Debug)]
pub(super) struct Spliced {
    ring: RingPicker,
    snapshot: Arc<Snapshot>,
}

/// The slot table of a ring whose changes wait.
struct Held {
    endpoint: Vec<EndpointIdx>,
    slot: Vec<Slot>,
    live: usize,
    distinct: u32,
    /// Whether any change waits (a dead slot, an endpoint new, or changed so that its points
    /// are not the ones it put before).
    waiting: bool,
}

// === impl Held ===

impl Held {
    /// `base`'s slots (spliced for `from`, `from` endpoints) renumbered for `snapshot` by key
    /// (`d`, the diff between the two): an endpoint paired with an eligible one keeps its
    /// slot, the others' slots die. `None` when the change must be spliced now: an endpoint of
    /// `from` off `base` is eligible in `snapshot`, the new endpoints are more than a tenth of
    /// the ones kept, or no live point is left. `same_points` says whether an endpoint that
    /// changed puts the same points.
    fn of(
        base: &RingPicker,
        (d, from): (&diff::Diff, &Snapshot),
        snapshot: &Snapshot,
        same_points: fn(&Endpoint, &Endpoint) -> bool,
    ) -> Option<Held> {
        let now = by_key(d, from.len(), snapshot.len());
        let mut endpoint = base.endpoint.to_vec();
        let mut slot = vec![NO_SLOT; snapshot.len()];
        let (mut live, mut distinct, mut kept, mut gone) = (base.stored, 0, 0, false);
        for (&s, n) in base.slot.iter().zip(now) {
            let n = n.map(EndpointIdx::new).filter(|&n| snapshot.is_eligible(n));
            let count = |s: Slot| base.counts[s as usize];
            match (s, n) {
                (NO_SLOT, None) => {}
                (NO_SLOT, Some(_)) => return None,
                (s, Some(n)) => {
                    endpoint[s as usize] = n;
                    slot[n.get()] = s;
                    kept += 1;
                    distinct += u32::from(count(s) > 0);
                }
                (s, None) => {
                    debug_assert!(count(s) as usize <= live, "a slot's points are on the ring");
                    endpoint[s as usize] = dead();
                    live -= count(s) as usize;
                    gone = true;
                }
            }
        }
        let fresh = snapshot
            .eligible()
            .iter()
            .filter(|e| slot[e.get()] == NO_SLOT);
        let fresh = fresh.count();
        if live == 0 || fresh.saturating_mul(10) > kept {
            return None;
        }
        let changed = || reshaped(base, (d, from), snapshot, same_points);
        Some(Held {
            endpoint,
            slot,
            live,
            distinct,
            waiting: gone || fresh > 0 || changed(),
        })
    }
}

/// For each endpoint of the last set (`from` of them), its index in the next (of `next`) by
/// key, from their diff `d`: the same object, or a changed endpoint of the same key.
fn by_key(d: &diff::Diff, from: usize, next: usize) -> Vec<Option<usize>> {
    let mut now: Vec<Option<usize>> = d.pairs(from, next).collect();
    for &(at, was) in &d.changed {
        if let Some(was) = was {
            now[was] = Some(at);
        }
    }
    now
}

/// Whether an endpoint on `base` (spliced for `from`) changed (`d`) so that it puts in
/// `snapshot` points other than the ones it put (`same_points` says).
fn reshaped(
    base: &RingPicker,
    (d, from): (&diff::Diff, &Snapshot),
    snapshot: &Snapshot,
    same_points: fn(&Endpoint, &Endpoint) -> bool,
) -> bool {
    d.changed.iter().any(|&(at, was)| {
        let on_ring = was.filter(|&w| base.slot.get(w).is_some_and(|&s| s != NO_SLOT));
        let was = on_ring.and_then(|w| from.endpoints().get(w));
        let now = snapshot.endpoints().get(at);
        was.zip(now)
            .is_some_and(|(was, now)| !same_points(was, now))
    })
}

// === impl RingPicker ===

impl RingPicker {
    /// The ring of `snapshot` from this one, made for `last` with the same strategy: within
    /// `next.interval` of the last splice a ring whose changes wait (see the module), else
    /// the last spliced ring patched with every change since. `None` when it must be rebuilt
    /// (see [`patch`](Self::patch)).
    pub(crate) fn next(
        &self,
        last: &Arc<Snapshot>,
        snapshot: &Arc<Snapshot>,
        next: &Next<'_>,
    ) -> Option<RingPicker> {
        let (base, from) = self.spliced(last);
        let due = base.splice.at.saturating_add(next.interval);
        if !next.interval.is_zero() && next.now < due {
            if let Some(held) = self.hold(last, snapshot, next, due) {
                return Some(held);
            }
        }
        let bound = next
            .balance
            .map(|(f, weigh)| Bound::new(f, snapshot, weigh));
        let mut ring = base.patch(from, snapshot, next.put, bound)?;
        ring.splice.at = next.now;
        Some(ring)
    }

    /// The last ring spliced and its snapshot: this ring, made for `last`, or the one its
    /// changes wait on.
    pub(crate) fn spliced<'a>(
        &'a self,
        last: &'a Arc<Snapshot>,
    ) -> (&'a RingPicker, &'a Arc<Snapshot>) {
        match &self.splice.last {
            Some(s) => (&s.ring, &s.snapshot),
            None => (self, last),
        }
    }

    /// The ring of `snapshot` sharing the last spliced one's points, asking to be spliced at
    /// `due` unless nothing waits; `None` when it must be spliced now ([`Held::of`]).
    fn hold(
        &self,
        last: &Arc<Snapshot>,
        snapshot: &Arc<Snapshot>,
        next: &Next<'_>,
        due: Timestamp,
    ) -> Option<RingPicker> {
        let (base, from) = self.spliced(last);
        if base.is_empty() || base.slot.len() != from.len() {
            return None;
        }
        let d = diff::between(from.endpoints(), snapshot.endpoints(), None)?;
        let held = Held::of(base, (&d, from), snapshot, next.same_points)?;
        // An endpoint waiting to join the ring (no slot) takes no load.
        let holds = held.slot.iter().map(|&s| s != NO_SLOT);
        let bound = (next.balance).map(|(f, weigh)| Bound::holding(f, snapshot, weigh, holds));
        // Nothing waits: the spliced ring, renumbered, asking for nothing.
        let last = held.waiting.then(|| {
            let spliced = || {
                Arc::new(Spliced {
                    ring: self.share(),
                    snapshot: last.clone(),
                })
            };
            self.splice.last.clone().unwrap_or_else(spliced)
        });
        let splice = Splice {
            due: last.as_ref().map(|_| due),
            last,
            ..base.splice
        };
        let (free, counts) = match splice.last {
            Some(_) => (Box::default(), Box::default()),
            None => (base.free.clone(), base.counts.clone()),
        };
        Some(RingPicker {
            firsts: base.firsts.clone(),
            groups: base.groups.clone(),
            chunks: base.chunks,
            endpoint: held.endpoint.into(),
            slot: held.slot.into(),
            free,
            counts,
            stored: base.stored,
            live: held.live,
            distinct: held.distinct,
            splice,
            collision: base.collision,
            key_point: base.key_point,
            bound,
            empty: snapshot.empty_error(),
        })
    }

    /// This spliced ring, its points shared and its tables copied, without a load bound:
    /// what the rings of the changes that wait keep.
    fn share(&self) -> RingPicker {
        RingPicker {
            firsts: self.firsts.clone(),
            groups: self.groups.clone(),
            endpoint: self.endpoint.clone(),
            slot: self.slot.clone(),
            free: self.free.clone(),
            counts: self.counts.clone(),
            splice: self.splice.clone(),
            bound: None,
            ..*self
        }
    }
}
