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

/// Each endpoint's aperture coverage (by index), when `snapshot` was cut by an aperture that
/// covers some of its members partly ([`Snapshot::coverage`]): kept by a picker for
/// `--explain`, since the weight it draws by is then the effective weight times it.
pub(crate) fn coverage_of(snapshot: &Snapshot) -> Option<Box<[u32]>> {
    snapshot.coverage().map(Box::from)
}

/// Format a weight share for `--explain`; `coverage`: the endpoint's aperture coverage, when
/// the weight includes one ([`coverage_of`]).
pub(crate) fn share(weight: u64, total: u64, coverage: Option<u32>) -> String {
    let mut text = format!("weight {weight}");
    if let Some(c) = coverage.filter(|&c| c > 0) {
        let saturated = if weight == u64::from(u32::MAX) {
            ", saturated"
        } else {
            ""
        };
        let base = weight / u64::from(c);
        text += &format!(" = effective weight {base} × aperture coverage {c}{saturated}");
    }
    if total > 0 {
        text += &format!(" ({:.2}% of picks)", weight as f64 * 100.0 / total as f64);
    }
    text
}
