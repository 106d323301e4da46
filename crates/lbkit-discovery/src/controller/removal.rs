//! **Mass-removal protection**: a change that would remove more than a share of the endpoints
//! within a short window is held back, and the endpoints it removes stay served until each one
//! is confirmed gone.
//!
//! Why: when many providers leave the registry at once while their servers still run — their
//! ZooKeeper sessions expire together (a leader election, a partition between providers and the
//! registry), an operator's script deletes the wrong nodes — the survivors would take all the
//! traffic. Eureka's answer is self-preservation (it stops expiring instances when renewals
//! drop below a threshold); Dubbo's empty-push protection is the 100 % case of the same idea,
//! and stays as it was ([`ControllerConfig::empty_protection`](super::ControllerConfig)).
//!
//! The rule, per batch of updates: let `peak` be the most endpoints the source listed at any
//! time within [`RemovalProtection::window`] before the batch, and `after` how many it lists
//! after it. When the set shrank by more than `max_share × peak` (and by more than one
//! endpoint: a lone endpoint replaced goes through), the batch's removals and the window's
//! earlier ones are **held**: they stay in the serving set (their statistics and health as they
//! were), while additions and changes apply at once. Additions count: a blue/green switch that
//! replaces every address at once, or a rolling restart onto new addresses, does not shrink the
//! set and holds nothing (the old endpoints are gone on purpose; holding them would send
//! traffic to dead servers until each was confirmed gone). A held endpoint leaves when it is
//! confirmed gone:
//!
//! * its active health check fails ([`Controller::set_health`](super::Controller::set_health));
//! * the outlier detector ejects it (the next outlier tick);
//! * it stays removed for [`RemovalProtection::confirm_after`];
//! * or the source lists it again, and it is simply back.
//!
//! Each hold is logged (`mass removal held`), counted
//! ([`ControllerMetrics::removals_held`](super::ControllerMetrics::removals_held)) and told to
//! the [`Target`](super::Target) (`lbkit watch` prints a line; the proxy's and a tower pool's
//! `/metrics` show the counters).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use lbkit_core::{EndpointKey, Timestamp};

use super::{Spec, Touched};

/// When removals are held back, and for how long (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemovalProtection {
    /// A set that shrinks by more than this share of its largest size within `window` has its
    /// removals held. Default 0.5 ("more than half"), above 0, at most 1.
    pub max_share: f64,
    /// How far back the set's largest size counts. Default 10 s: sessions that expire
    /// together go within a few seconds of each other, while a rolling deploy replaces a few
    /// endpoints at a time (and its replacements keep the set's size).
    pub window: Duration,
    /// How long a held endpoint is served at most when neither a health check nor the outlier
    /// detector confirms it gone. Default 120 s: long enough for a registry partition or a
    /// ZooKeeper election to heal (providers register again on reconnection), short enough that
    /// a deliberate scale-down without health checks is followed within minutes.
    pub confirm_after: Duration,
}

impl Default for RemovalProtection {
    fn default() -> Self {
        RemovalProtection {
            max_share: 0.5,
            window: Duration::from_secs(10),
            confirm_after: Duration::from_secs(120),
        }
    }
}

impl RemovalProtection {
    /// Whether a set that listed `peak` endpoints at most within the window and lists `after`
    /// now shrank enough to be a mass removal this protection holds (the rule of the module
    /// docs; `lbkit watch` says so with the same rule).
    pub fn holds(&self, peak: usize, after: usize) -> bool {
        let shrink = peak.saturating_sub(after);
        // One endpoint alone is never a mass removal: a lone endpoint replaced goes through.
        shrink >= 2 && shrink as f64 > self.max_share * peak as f64
    }
}

/// How a held endpoint was confirmed gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmed {
    /// Its active health check failed.
    HealthCheck,
    /// The outlier detector ejected it.
    Ejected,
    /// It stayed removed for [`RemovalProtection::confirm_after`].
    Time,
}

impl std::fmt::Display for Confirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Confirmed::HealthCheck => "its health check failed",
            Confirmed::Ejected => "outlier detection ejected it",
            Confirmed::Time => "it stayed removed for the confirmation time",
        })
    }
}

/// The endpoints held back, and the removals of the window. Owned by the controller.
#[derive(Debug, Default)]
pub(crate) struct Held {
    config: Option<RemovalProtection>,
    /// Removed by the source and still served: each one's spec and when it was held.
    pending: BTreeMap<EndpointKey, (Spec, Timestamp)>,
    /// Removals let through within the window, oldest first, each with its key's hash.
    recent: VecDeque<Recent>,
    /// The size of the source's set before each batch within the window, oldest first.
    sizes: VecDeque<(Timestamp, usize)>,
}

/// A removal let through within the window.
#[derive(Debug)]
struct Recent {
    at: Timestamp,
    /// [`key_hash`] of the spec's key: a batch that lists keys again compares hashes with the
    /// window's hundreds of removals, not keys.
    hash: u64,
    spec: Spec,
}

/// A hash of `key`, the same in every run.
fn key_hash(key: &EndpointKey) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(key)
}

impl Held {
    pub(crate) fn new(config: Option<RemovalProtection>) -> Self {
        Held {
            config,
            ..Held::default()
        }
    }

    /// Whether removals are watched at all.
    pub(crate) fn on(&self) -> bool {
        self.config.is_some()
    }

    /// Endpoints held now.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Forget everything held (an empty push holds the whole set instead).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.recent.clear();
        self.sizes.clear();
    }

    /// Judge one batch at `now`: `removed` are the specs it removed from the source's set,
    /// which listed `before` endpoints before it and `after` after it; `touched` are the keys
    /// it may have listed again, `is_listed` tells whether a key is in the set after it, and
    /// `confirmed` whether a key is already known to be gone (down, ejected). Returns the keys
    /// newly held.
    pub(crate) fn judge(
        &mut self,
        removed: Vec<Spec>,
        (before, after): (usize, usize),
        touched: &Touched,
        is_listed: &dyn Fn(&EndpointKey) -> bool,
        confirmed: impl Fn(&EndpointKey) -> bool,
        now: Timestamp,
    ) -> Vec<EndpointKey> {
        let Some(config) = self.config else {
            return Vec::new();
        };
        self.drop_listed_again(touched, is_listed);
        let since = now.saturating_sub(config.window);
        while self.recent.front().is_some_and(|r| r.at < since) {
            self.recent.pop_front();
        }
        while self.sizes.front().is_some_and(|(t, _)| *t < since) {
            self.sizes.pop_front();
        }
        self.sizes.push_back((now, before));
        let removed: Vec<_> = removed.into_iter().filter(|s| !is_listed(&s.key)).collect();
        if removed.is_empty() {
            return Vec::new();
        }
        let peak = self.sizes.iter().map(|(_, n)| *n).max().unwrap_or(before);
        if !config.holds(peak, after) {
            let recent = removed.into_iter().map(|spec| Recent {
                at: now,
                hash: key_hash(&spec.key),
                spec,
            });
            self.recent.extend(recent);
            return Vec::new();
        }
        let window = std::mem::take(&mut self.recent).into_iter().map(|r| r.spec);
        let mut held = Vec::new();
        for spec in window.chain(removed) {
            if !confirmed(&spec.key) && !self.pending.contains_key(&spec.key) {
                held.push(spec.key.clone());
                self.pending.insert(spec.key.clone(), (spec, now));
            }
        }
        held
    }

    /// The held endpoints and the window's removals that the batch listed again: simply back.
    /// Of the keys it touched (a few, in churn), those listed now are looked for among the
    /// window's removals by hash; a batch that touched all keys looks each removal up.
    fn drop_listed_again(&mut self, touched: &Touched, is_listed: &dyn Fn(&EndpointKey) -> bool) {
        let Touched::Keys(keys) = touched else {
            self.pending.retain(|key, _| !is_listed(key));
            self.recent.retain(|r| !is_listed(&r.spec.key));
            return;
        };
        if self.pending.is_empty() && self.recent.is_empty() {
            return;
        }
        let back: HashSet<&EndpointKey> = keys.iter().filter(|k| is_listed(k)).collect();
        for key in &back {
            self.pending.remove(*key);
        }
        let hashes: HashSet<u64> = back.iter().map(|k| key_hash(k)).collect();
        if !hashes.is_empty() {
            // The stored hash first (no key hashed for the removals not listed), then the key
            // itself: O(1) a removal however many keys came back.
            let listed = |r: &Recent| hashes.contains(&r.hash) && back.contains(&r.spec.key);
            self.recent.retain(|r| !listed(r));
        }
    }

    /// `key` is confirmed gone: whether it was held (it leaves the serving set).
    pub(crate) fn confirm(&mut self, key: &EndpointKey) -> bool {
        self.pending.remove(key).is_some()
    }

    /// Let go of the endpoints held for `confirm_after` by `now`; returns their keys.
    pub(crate) fn expire(&mut self, now: Timestamp) -> Vec<EndpointKey> {
        let Some(config) = self.config else {
            return Vec::new();
        };
        let due: Vec<EndpointKey> = self
            .pending
            .iter()
            .filter(|(_, (_, since))| now.saturating_duration_since(*since) >= config.confirm_after)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &due {
            self.pending.remove(key);
        }
        due
    }

    /// When the next held endpoint is due to be let go.
    pub(crate) fn next_expiry(&self) -> Option<Timestamp> {
        let after = self.config?.confirm_after;
        let first = self.pending.values().map(|(_, since)| *since).min()?;
        Some(first.saturating_add(after))
    }

    /// The keys held now.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &EndpointKey> {
        self.pending.keys()
    }

    /// The serving set: `listed` (the source's set) and the held specs, in key order when
    /// `listed` is; `None` when nothing is held.
    pub(crate) fn serving(&self, listed: &[Spec], ordered: bool) -> Option<Vec<Spec>> {
        if self.pending.is_empty() {
            return None;
        }
        let held = self.pending.values().map(|(s, _)| s.clone());
        let mut out = Vec::with_capacity(listed.len() + self.pending.len());
        if !ordered {
            out.extend_from_slice(listed);
            out.extend(held);
            return Some(out);
        }
        let mut held = held.peekable();
        for spec in listed {
            while let Some(h) = held.next_if(|h| h.key < spec.key) {
                out.push(h);
            }
            out.push(spec.clone());
        }
        out.extend(held);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use lbkit_core::EndpointSpec;

    fn specs(keys: &[&str]) -> Vec<Spec> {
        keys.iter()
            .map(|k| Box::new(EndpointSpec::new(*k)))
            .collect()
    }

    fn t(s: u64) -> Timestamp {
        Timestamp::from_millis(s * 1000)
    }

    fn listed(keys: &'static [&'static str]) -> impl Fn(&EndpointKey) -> bool {
        move |k: &EndpointKey| keys.contains(&k.as_str())
    }

    #[test]
    fn a_shrink_of_more_than_half_within_the_window_is_held_with_the_window_s_earlier_removals() {
        let mut h = Held::new(Some(RemovalProtection::default()));
        // 3 → 2: let through.
        let held = h.judge(
            specs(&["a:1"]),
            (3, 2),
            &Touched::All,
            &listed(&["b:1", "c:1"]),
            |_| false,
            t(0),
        );
        assert!(held.is_empty());
        // 2 → 1 within 10 s: down by 2 from the peak of 3 — both held, the earlier one back in.
        let held = h.judge(
            specs(&["b:1"]),
            (2, 1),
            &Touched::All,
            &listed(&["c:1"]),
            |_| false,
            t(5),
        );
        assert_eq!(held.len(), 2);
        let serving = h.serving(&specs(&["c:1"]), true).expect("held");
        let keys: Vec<_> = serving.iter().map(|s| s.key.as_str().to_owned()).collect();
        assert_eq!(keys, ["a:1", "b:1", "c:1"]);
        // Confirmed by a health check; the other by time.
        assert!(h.confirm(&EndpointKey::from("a:1")));
        assert_eq!(h.next_expiry(), Some(t(125)));
        assert!(h.expire(t(124)).is_empty());
        assert_eq!(h.expire(t(125)), vec![EndpointKey::from("b:1")]);
        assert!(h.serving(&specs(&["c:1"]), true).is_none());
    }

    #[test]
    fn replacements_rolling_removals_and_known_dead_ones_are_let_through() {
        let mut h = Held::new(Some(RemovalProtection::default()));
        let none = |_: &EndpointKey| false;
        // Blue/green: all ten replaced at once, the set as large as before.
        let ten: Vec<String> = (0..10).map(|i| format!("old{i}:1")).collect();
        let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
        assert!(h
            .judge(specs(&ten), (10, 10), &Touched::All, &none, |_| false, t(0))
            .is_empty());
        // A rolling restart of two onto new addresses within the window: 2 → 3 → 2 → 3 → 2.
        assert!(h
            .judge(Vec::new(), (2, 3), &Touched::All, &none, |_| false, t(20))
            .is_empty());
        assert!(h
            .judge(
                specs(&["r1:1"]),
                (3, 2),
                &Touched::All,
                &none,
                |_| false,
                t(21)
            )
            .is_empty());
        assert!(h
            .judge(Vec::new(), (2, 3), &Touched::All, &none, |_| false, t(22))
            .is_empty());
        assert!(h
            .judge(
                specs(&["r2:1"]),
                (3, 2),
                &Touched::All,
                &none,
                |_| false,
                t(23)
            )
            .is_empty());
        // One of ten every 4 s, not replaced: never down by more than half within 10 s.
        for i in 0..5u64 {
            let gone = format!("x{i}:1");
            let n = 10 - i as usize;
            assert!(h
                .judge(
                    specs(&[&gone]),
                    (n, n - 1),
                    &Touched::All,
                    &none,
                    |_| false,
                    t(100 + 4 * i)
                )
                .is_empty());
        }
        // Six of ten at once, but already known down: nothing to hold.
        let six = specs(&["a:1", "b:1", "c:1", "d:1", "e:1", "f:1"]);
        assert!(h
            .judge(six, (10, 4), &Touched::All, &none, |_| true, t(200))
            .is_empty());
    }

    fn touched(keys: &[&str]) -> Touched {
        Touched::Keys(keys.iter().map(|k| EndpointKey::from(*k)).collect())
    }

    /// A batch that touched a few keys brings back those of them listed again, held or in
    /// the window, by hash; a key listed but not touched by the batch is not looked at.
    #[test]
    fn the_keys_a_batch_touched_come_back_from_the_window_and_the_held() {
        let mut h = Held::new(Some(RemovalProtection::default()));
        let never = |_: &EndpointKey| false;
        // 10 → 9 → 8: let through, in the window.
        for (i, gone) in ["w1:1", "w2:1"].into_iter().enumerate() {
            let sizes = (10 - i, 9 - i);
            let held = h.judge(
                specs(&[gone]),
                sizes,
                &touched(&[gone]),
                &never,
                never,
                t(0),
            );
            assert!(held.is_empty());
        }
        // w1 is listed again (touched), w2 is listed but not touched: w1 leaves the window.
        let listed = |k: &EndpointKey| ["w1:1", "w2:1"].contains(&k.as_str());
        let sizes = (8, 9);
        let held = h.judge(
            Vec::new(),
            sizes,
            &touched(&["w1:1", "n:1"]),
            &listed,
            never,
            t(1),
        );
        assert!(held.is_empty());
        // 9 → 4 is a mass removal: it holds its own and the window's w2, not w1.
        let five = specs(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
        let held = h.judge(five, (9, 4), &touched(&["a:1"]), &never, never, t(2));
        let mut held: Vec<&str> = held.iter().map(EndpointKey::as_str).collect();
        held.sort_unstable();
        assert_eq!(held, ["a:1", "b:1", "c:1", "d:1", "e:1", "w2:1"]);
        // Of the held, the touched c and e are listed again; d is listed but not touched.
        let listed = |k: &EndpointKey| ["c:1", "d:1", "e:1"].contains(&k.as_str());
        let batch = touched(&["c:1", "e:1"]);
        assert!(h
            .judge(Vec::new(), (4, 6), &batch, &listed, never, t(3))
            .is_empty());
        let keys: Vec<&str> = h.keys().map(EndpointKey::as_str).collect();
        assert_eq!(keys, ["a:1", "b:1", "d:1", "w2:1"]);
    }

    #[test]
    fn an_endpoint_listed_again_is_no_longer_held_and_off_means_nothing_is() {
        let mut h = Held::new(Some(RemovalProtection::default()));
        let none = |_: &EndpointKey| false;
        assert_eq!(
            h.judge(
                specs(&["a:1", "b:1"]),
                (3, 1),
                &Touched::All,
                &none,
                |_| false,
                t(0)
            )
            .len(),
            2
        );
        let back = |k: &EndpointKey| k.as_str() == "a:1";
        assert!(h
            .judge(Vec::new(), (1, 2), &Touched::All, &back, |_| false, t(1))
            .is_empty());
        assert_eq!(
            h.keys().map(EndpointKey::as_str).collect::<Vec<_>>(),
            ["b:1"]
        );
        let mut off = Held::new(None);
        assert!(off
            .judge(
                specs(&["a:1", "b:1"]),
                (2, 0),
                &Touched::All,
                &none,
                |_| false,
                t(0)
            )
            .is_empty());
        assert!(off.serving(&[], true).is_none());
    }
}
