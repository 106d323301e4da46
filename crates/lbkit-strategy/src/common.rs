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
    match coverage.filter(|&c| c > 0) {
        // The product stopped at u32::MAX: the effective weight is not the quotient.
        Some(c) if c > 1 && weight == u64::from(u32::MAX) => {
            text += &format!(" (saturated: effective weight × aperture coverage {c})");
        }
        Some(c) => {
            let base = weight / u64::from(c);
            text += &format!(" = effective weight {base} × aperture coverage {c}");
        }
        None => {}
    }
    if total > 0 {
        text += &format!(" ({:.2}% of picks)", weight as f64 * 100.0 / total as f64);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::share;

    /// `--explain`'s weight text: plain, under an aperture's coverage, and saturated (where
    /// the quotient is not the effective weight, so none is claimed).
    #[test]
    fn share_names_the_coverage_and_no_quotient_when_saturated() {
        assert_eq!(share(100, 400, None), "weight 100 (25.00% of picks)");
        assert_eq!(share(7, 0, None), "weight 7");
        assert_eq!(
            share(700, 2800, Some(7)),
            "weight 700 = effective weight 100 × aperture coverage 7 (25.00% of picks)"
        );
        let max = u64::from(u32::MAX);
        assert_eq!(
            share(max, 0, Some(3)),
            format!("weight {max} (saturated: effective weight × aperture coverage 3)")
        );
        // A weight of u32::MAX at coverage 1 is exact, not saturated.
        assert_eq!(
            share(max, 0, Some(1)),
            format!("weight {max} = effective weight {max} × aperture coverage 1")
        );
        assert_eq!(share(100, 0, Some(0)), "weight 100");
    }
}
