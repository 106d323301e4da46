//! Helpers shared by the weighted strategies.

use lbkit_core::{EndpointIdx, Snapshot, Timestamp};

/// Effective (warm-up) weights of the eligible endpoints at `now`, in eligible order.
pub(crate) fn effective_weights(snapshot: &Snapshot, now: Timestamp) -> Vec<(EndpointIdx, u64)> {
    (snapshot.eligible_weights(now).into_iter())
        .map(|(i, w)| (i, u64::from(w)))
        .collect()
}

/// Whether every weight is the same (the uniform fast path applies).
pub(crate) fn all_equal(weights: &[(EndpointIdx, u64)]) -> bool {
    weights.windows(2).all(|w| w[0].1 == w[1].1)
}

/// Format a weight share for `--explain`.
pub(crate) fn share(weight: u64, total: u64) -> String {
    if total == 0 {
        format!("weight {weight}")
    } else {
        format!(
            "weight {weight} ({:.2}% of picks)",
            weight as f64 * 100.0 / total as f64
        )
    }
}
