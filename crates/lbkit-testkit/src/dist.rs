//! Distribution checks with a stated tolerance.

/// Pearson's chi-square statistic of `observed` counts against `expected` probabilities
/// (categories with zero expectation must have zero observations, else the result is infinite).
pub fn chi_square(observed: &[u64], expected: &[f64]) -> f64 {
    let n: u64 = observed.iter().sum();
    let total_p: f64 = expected.iter().sum();
    observed
        .iter()
        .zip(expected)
        .map(|(&o, &p)| {
            let e = n as f64 * p / total_p;
            if e == 0.0 {
                if o == 0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (o as f64 - e).powi(2) / e
            }
        })
        .sum()
}

/// Critical value of the chi-square distribution with `df` degrees of freedom at the upper
/// tail probability 0.001 (z = 3.09), by the Wilson–Hilferty approximation (accurate to ~1 %
/// for df ≥ 2).
pub fn chi_square_critical_001(df: usize) -> f64 {
    let df = df.max(1) as f64;
    let z = 3.090_232;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Assert that `observed` fits `expected` probabilities at p = 0.001.
///
/// # Panics
/// When the statistic exceeds the critical value; the message shows both and the counts.
pub fn assert_fits(observed: &[u64], expected: &[f64], what: &str) {
    let nonzero = expected.iter().filter(|&&p| p > 0.0).count();
    let stat = chi_square(observed, expected);
    let crit = chi_square_critical_001(nonzero.saturating_sub(1));
    assert!(
        stat <= crit,
        "{what}: chi-square {stat:.2} > critical {crit:.2} (p = 0.001, df = {}); observed {observed:?}, expected shares {expected:?}",
        nonzero.saturating_sub(1)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_values_match_tables() {
        // Published table values at p = 0.001: df 1 → 10.83, 5 → 20.52, 10 → 29.59.
        assert!((chi_square_critical_001(5) - 20.52).abs() < 0.3);
        assert!((chi_square_critical_001(10) - 29.59).abs() < 0.3);
    }

    #[test]
    fn statistic() {
        assert_eq!(chi_square(&[50, 50], &[1.0, 1.0]), 0.0);
        assert!((chi_square(&[60, 40], &[1.0, 1.0]) - 4.0).abs() < 1e-9);
        assert!(chi_square(&[1, 99], &[0.0, 1.0]).is_infinite());
    }
}
