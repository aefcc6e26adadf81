//! What the unit tests share.

/// Knuth's MMIX linear congruential generator: a cheap, reproducible
/// stream of pseudo-random keys. Use the high bits (`next() >> 33`).
pub(crate) struct Lcg(pub u64);

impl Lcg {
    /// Advance and return the new state.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }
}
