//! Envoy's priority arithmetic: each tier's health, the load each tier takes, and which tiers
//! are in panic. Pure functions over counts, run once per snapshot change.

/// A tier's health, Envoy's `min(100, ⌊overprovisioning × 100 × healthy / endpoints⌋)`
/// (0 for an empty tier).
///
/// ```
/// use lbkit_core::stage::tier_health;
/// assert_eq!(tier_health(71, 100, 1.4), 99);
/// assert_eq!(tier_health(72, 100, 1.4), 100);
/// ```
pub fn tier_health(healthy: u32, endpoints: u32, overprovisioning: f64) -> u32 {
    if endpoints == 0 {
        return 0;
    }
    // The factor in whole percent, as Envoy keeps it (140).
    let factor = (overprovisioning * 100.0).round().clamp(100.0, 10_000.0) as u64;
    let h = factor * u64::from(healthy.min(endpoints)) / u64::from(endpoints);
    u32::try_from(h.min(100)).unwrap_or(100)
}

/// The load (percent, adding up to 100) each tier takes, from the tiers' health in priority
/// order: as much as its health, in order, until 100 is given; when the health adds up to less
/// than 100, each tier's share of that sum, rounded by largest remainder (ties to the higher
/// tier). All zeros when no tier has health.
///
/// ```
/// use lbkit_core::stage::priority_loads;
/// assert_eq!(priority_loads(&[70, 100]), vec![70, 30]);
/// assert_eq!(priority_loads(&[35, 35, 28]), vec![36, 36, 28]);
/// ```
pub fn priority_loads(health: &[u32]) -> Vec<u32> {
    let sum: u64 = health.iter().map(|&h| u64::from(h)).sum();
    if sum >= 100 {
        let mut left = 100u32;
        return health
            .iter()
            .map(|&h| {
                let take = h.min(left);
                left -= take;
                take
            })
            .collect();
    }
    shares(health)
}

/// `values` as whole percents of their sum, adding up to 100 by largest remainder (ties to the
/// earlier value); all zeros when the sum is 0.
pub(crate) fn shares(values: &[u32]) -> Vec<u32> {
    let sum: u64 = values.iter().map(|&v| u64::from(v)).sum();
    if sum == 0 {
        return vec![0; values.len()];
    }
    let exact: Vec<u64> = values.iter().map(|&v| u64::from(v) * 100).collect();
    let mut out: Vec<u32> = exact
        .iter()
        .map(|&e| u32::try_from(e / sum).unwrap_or(100))
        .collect();
    let given: u32 = out.iter().sum();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(exact[i] % sum), i));
    for &i in order.iter().take(100u32.saturating_sub(given) as usize) {
        out[i] += 1;
    }
    out
}

/// One tier's counts: endpoints, healthy ones (up, weighted, not ejected).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct TierCounts {
    pub(crate) endpoints: u32,
    pub(crate) healthy: u32,
}

/// What a snapshot change decides for its tiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TierPlan {
    pub(crate) health: Vec<u32>,
    pub(crate) load: Vec<u32>,
    pub(crate) panic: Vec<bool>,
}

/// Envoy's `recalculatePerPriorityState` and `recalculatePerPriorityPanic`: loads from health;
/// while the total health is under 100, a tier whose healthy share is under `panic_threshold`
/// (a fraction; 0 turns panic off) is in panic; when all are, loads follow endpoint counts.
pub(crate) fn plan(tiers: &[TierCounts], overprovisioning: f64, panic_threshold: f64) -> TierPlan {
    let health: Vec<u32> = tiers
        .iter()
        .map(|t| tier_health(t.healthy, t.endpoints, overprovisioning))
        .collect();
    let total = health.iter().sum::<u32>().min(100);
    if panic_threshold <= 0.0 && total == 0 {
        let mut load = vec![0; tiers.len()];
        if let Some(first) = load.first_mut() {
            *first = 100;
        }
        return TierPlan {
            panic: vec![false; tiers.len()],
            health,
            load,
        };
    }
    let panic: Vec<bool> = tiers
        .iter()
        .map(|t| {
            total < 100
                && panic_threshold > 0.0
                && f64::from(t.healthy) < panic_threshold * f64::from(t.endpoints)
        })
        .collect();
    let load = if !panic.is_empty() && panic.iter().all(|&p| p) {
        shares(&tiers.iter().map(|t| t.endpoints).collect::<Vec<_>>())
    } else {
        priority_loads(&health)
    };
    TierPlan {
        health,
        load,
        panic,
    }
}
