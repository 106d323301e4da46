//! Exact integer alias table (Walker 1977, Vose 1991): O(n) build, O(1) weighted draw.
//!
//! Probabilities are kept as integers over the weight total, so every endpoint is drawn with
//! probability exactly `wᵢ / Σw` (no floating-point rounding, zero weights never drawn).

use lbkit_core::{EndpointIdx, FastRng};

/// One column: keep `own` when the draw is below `threshold`, else take `alias`.
#[derive(Clone, Copy, Debug)]
struct Column {
    threshold: u64,
    own: EndpointIdx,
    alias: EndpointIdx,
}

/// A weighted sampler over endpoints.
#[derive(Clone, Debug)]
pub(crate) struct AliasTable {
    columns: Box<[Column]>,
    total: u64,
}

impl AliasTable {
    /// Build from `(endpoint, weight)` pairs. Returns `None` when every weight is zero or the
    /// list is empty. O(n); in 64-bit arithmetic when `n · Σw` fits (weights of 32 bits up to
    /// about 4 · 10⁹ endpoints), else in 128-bit.
    pub(crate) fn new(items: &[(EndpointIdx, u64)]) -> Option<Self> {
        let total: u64 = items.iter().map(|&(_, w)| w).sum();
        if total == 0 {
            return None;
        }
        let columns = match total.checked_mul(items.len() as u64) {
            Some(_) => columns::<u64>(items, total),
            None => columns::<u128>(items, total),
        };
        Some(AliasTable { columns, total })
    }

    /// Draw one endpoint.
    #[inline]
    pub(crate) fn sample(&self, rng: &mut FastRng) -> EndpointIdx {
        let c = &self.columns[rng.index(self.columns.len())];
        if rng.below(self.total) < c.threshold {
            c.own
        } else {
            c.alias
        }
    }

    /// Draw one endpoint with one 64-bit random number: its low half picks the column
    /// (multiply-shift), its high half, scaled to the weight total, decides between the
    /// column's own endpoint and its alias. Each endpoint's probability is within 2⁻³² of its
    /// share; one draw where [`sample`](Self::sample) takes two (behind an aperture's edges,
    /// p2c-ewma through every stage cost 17.4 ns a pick this way, 19.4 with `sample`:
    /// BENCHMARKS.md, "Third round: a quiet machine, and aperture edges").
    #[inline]
    pub(crate) fn sample_one_draw(&self, rng: &mut FastRng) -> EndpointIdx {
        let r = rng.next_u64();
        let col = ((r & 0xFFFF_FFFF) * self.columns.len() as u64) >> 32;
        let c = &self.columns[col as usize];
        let x = (u128::from(r >> 32) * u128::from(self.total)) >> 32;
        if x < u128::from(c.threshold) {
            c.own
        } else {
            c.alias
        }
    }

    /// Two endpoints, each drawn with `draw`; a repeat is drawn once more (a second repeat
    /// compares an endpoint with itself): the two candidates of a power-of-two choice.
    #[inline]
    pub(crate) fn two(
        &self,
        rng: &mut FastRng,
        draw: fn(&AliasTable, &mut FastRng) -> EndpointIdx,
    ) -> (EndpointIdx, EndpointIdx) {
        let a = draw(self, rng);
        let mut b = draw(self, rng);
        if b == a {
            b = draw(self, rng);
        }
        (a, b)
    }

    /// Sum of the weights.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

/// Vose's pairing in integers of type `T`, wide enough for `n · Σw`: each weight scaled by n
/// is compared against the total, a column is "full" at the total.
fn columns<T>(items: &[(EndpointIdx, u64)], total: u64) -> Box<[Column]>
where
    T: Copy + Ord + From<u64> + TryInto<u64>,
    T: std::ops::Mul<Output = T> + std::ops::Sub<Output = T> + std::ops::SubAssign,
{
    let (n, t) = (T::from(items.len() as u64), T::from(total));
    let mut scaled: Vec<T> = items.iter().map(|&(_, w)| T::from(w) * n).collect();
    // Sized once: grown push by push they were copied over again (3 % of a churn's samples).
    let (mut small, mut large) = (
        Vec::with_capacity(items.len()),
        Vec::with_capacity(items.len()),
    );
    for (i, &w) in (0u32..).zip(&scaled) {
        if w < t {
            small.push(i)
        } else {
            large.push(i)
        }
    }
    let mut columns: Vec<Column> = (items.iter())
        .map(|&(idx, _)| Column {
            threshold: total,
            own: idx,
            alias: idx,
        })
        .collect();
    while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
        let (s, l) = (s as usize, l as usize);
        // Below t, itself a u64.
        columns[s].threshold = scaled[s].try_into().unwrap_or(total);
        columns[s].alias = items[l].0;
        let gap = t - scaled[s];
        scaled[l] -= gap;
        if scaled[l] < t {
            large.pop();
            small.push(l as u32);
        }
    }
    // Leftovers are full columns (exact arithmetic leaves none short).
    columns.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Exact probability mass of each endpoint, as a numerator over `total · n`.
    fn mass(t: &AliasTable, n: usize) -> Vec<u128> {
        let mut m = vec![0u128; n];
        for c in t.columns.iter() {
            m[c.own.get()] += u128::from(c.threshold);
            m[c.alias.get()] += u128::from(t.total - c.threshold);
        }
        m
    }

    /// Every endpoint's probability mass is exactly its weight's share.
    fn exact(weights: &[u64]) -> Result<(), TestCaseError> {
        let items: Vec<_> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (EndpointIdx::new(i), w))
            .collect();
        match AliasTable::new(&items) {
            None => prop_assert!(weights.iter().all(|&w| w == 0)),
            Some(t) => {
                let m = mass(&t, weights.len());
                for (i, &w) in weights.iter().enumerate() {
                    // P(i) = m[i] / (n · total) must equal w / total.
                    prop_assert_eq!(m[i], u128::from(w) * weights.len() as u128);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(44),
            ..ProptestConfig::default()
        })]
        /// Weights of 32 bits: built in 64-bit arithmetic.
        #[test]
        fn probabilities_are_exact(weights in proptest::collection::vec(0u64..=u64::from(u32::MAX), 1..64)) {
            exact(&weights)?;
        }

        /// Weights so large that `n · Σw` needs 128 bits.
        #[test]
        fn probabilities_are_exact_in_128_bits(weights in proptest::collection::vec(0u64..=(u64::MAX >> 7), 2..64)) {
            let total: u64 = weights.iter().sum();
            prop_assume!(total.checked_mul(weights.len() as u64).is_none());
            exact(&weights)?;
        }
    }

    #[test]
    fn one_draw_samples_follow_the_weights() {
        let weights = [5u64, 10, 10, 5, 1];
        let items: Vec<_> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| (EndpointIdx::new(i), w))
            .collect();
        let t = AliasTable::new(&items).unwrap();
        let mut rng = FastRng::seed_from_u64(7);
        let mut seen = [0u64; 5];
        let draws = 310_000;
        for _ in 0..draws {
            seen[t.sample_one_draw(&mut rng).get()] += 1;
        }
        for (i, &w) in weights.iter().enumerate() {
            let want = draws as f64 * w as f64 / 31.0;
            let off = (seen[i] as f64 - want).abs() / want;
            assert!(off < 0.03, "endpoint {i}: {} against {want}", seen[i]);
        }
    }
}
