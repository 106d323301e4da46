//! [`FastRng`]: the seedable random source a caller owns and passes to every pick.

/// A small, fast, seedable random number generator (wyrand, through the `fastrand` crate).
///
/// Owned by the caller (one per task or per service clone), never global, so picks are
/// reproducible for a seed and never contend on shared RNG state.
///
/// ```
/// use lbkit_core::FastRng;
/// let mut a = FastRng::seed_from_u64(7);
/// let mut b = FastRng::seed_from_u64(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Clone, Debug)]
pub struct FastRng(fastrand::Rng);

// === impl FastRng ===

impl FastRng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn seed_from_u64(seed: u64) -> Self {
        FastRng(fastrand::Rng::with_seed(seed))
    }

    /// A generator seeded from the thread's entropy (for services, where reproducibility is not
    /// wanted).
    pub fn from_entropy() -> Self {
        FastRng(fastrand::Rng::new())
    }

    /// A uniformly random `u64`.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// A uniform value in `0..n` (unbiased). Returns 0 when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.u64(..n)
        }
    }

    /// A uniform index in `0..len` (unbiased). Returns 0 when `len == 0`.
    #[inline]
    pub fn index(&mut self, len: usize) -> usize {
        if len == 0 {
            0
        } else {
            self.0.usize(..len)
        }
    }

    /// A uniform `f64` in `[0, 1)`.
    #[inline]
    pub fn unit_f64(&mut self) -> f64 {
        self.0.f64()
    }
}

impl Default for FastRng {
    fn default() -> Self {
        FastRng::from_entropy()
    }
}
