//! Key → node lookup for the policies.
//!
//! Every policy keeps its entries (resident and ghost) in an arena of
//! nodes addressed by `u32`; a [`KeyIndex`] finds a key's node. Two
//! implementations:
//!
//! - [`HashIndex`]: any `Hash + Eq` key, a hash map with a fast
//!   multiply-fold hasher and room reserved up front, so a policy that
//!   never holds more than its node budget never reallocates (what a
//!   running server's memory cache wants);
//! - [`DenseIndex`]: keys that are small integers (the simulator interns
//!   every ⟨device, block, owner⟩ to a dense `u32`), looked up by plain
//!   array indexing — no hashing at all.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

/// The "no node" value.
pub(crate) const NIL: u32 = u32::MAX;

/// Finds the arena node of a key.
pub trait KeyIndex<K>: Send {
    /// An index that will hold up to `n` keys without growing.
    fn with_capacity(n: usize) -> Self
    where
        Self: Sized;
    fn get(&self, key: &K) -> Option<u32>;
    /// Insert or overwrite.
    fn insert(&mut self, key: K, node: u32);
    fn remove(&mut self, key: &K);
    fn clear(&mut self);
}

/// A fast, non-cryptographic hasher: each word is folded into the state
/// by a 64×64→128-bit multiply whose halves are xored (the "folded
/// multiply" of foldhash/wyhash). Good avalanche in both the low bits
/// (bucket) and the high bits (SwissTable tag), a few cycles per word.
/// Not DoS-resistant: cache keys are block addresses, not attacker input
/// shaped to collide — and a server exposing this to untrusted clients
/// should seed [`FastBuild`] randomly (it has a seed for that).
#[derive(Clone, Copy)]
pub struct FastHasher {
    state: u64,
}

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.state = fold(self.state ^ v, MUL);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// Builds [`FastHasher`]s from a seed.
#[derive(Clone, Copy, Default)]
pub struct FastBuild {
    pub seed: u64,
}

impl BuildHasher for FastBuild {
    type Hasher = FastHasher;
    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher {
            state: self.seed ^ 0x243F_6A88_85A3_08D3,
        }
    }
}

/// A hash map with the fast hasher.
pub type FastMap<K, V> = HashMap<K, V, FastBuild>;

/// [`KeyIndex`] for any hashable key.
pub struct HashIndex<K> {
    map: FastMap<K, u32>,
}

impl<K: Hash + Eq + Send> KeyIndex<K> for HashIndex<K> {
    fn with_capacity(n: usize) -> Self {
        // Twice the budget: deletions leave tombstones, and the table
        // rehashes in place (no allocation) only while it is at most half
        // full, so this keeps the hot path free of allocation.
        HashIndex {
            map: HashMap::with_capacity_and_hasher(
                n.saturating_mul(2).max(16),
                FastBuild::default(),
            ),
        }
    }
    #[inline]
    fn get(&self, key: &K) -> Option<u32> {
        self.map.get(key).copied()
    }
    #[inline]
    fn insert(&mut self, key: K, node: u32) {
        self.map.insert(key, node);
    }
    #[inline]
    fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }
    fn clear(&mut self) {
        self.map.clear();
    }
}

/// A key that is a small non-negative integer.
pub trait DenseKey: Copy + Send {
    fn dense(self) -> usize;
}

impl DenseKey for u32 {
    #[inline]
    fn dense(self) -> usize {
        self as usize
    }
}

impl DenseKey for u64 {
    #[inline]
    fn dense(self) -> usize {
        self as usize
    }
}

impl DenseKey for usize {
    #[inline]
    fn dense(self) -> usize {
        self
    }
}

/// [`KeyIndex`] for dense integer keys: an array indexed by the key. It
/// grows (amortised, once per new largest key) when a key beyond its
/// length is inserted; size it with [`DenseIndex::with_universe`] when the
/// key range is known.
pub struct DenseIndex {
    slots: Vec<u32>,
}

impl DenseIndex {
    /// An index for keys `0..n` that never grows.
    pub fn with_universe(n: usize) -> DenseIndex {
        DenseIndex {
            slots: vec![NIL; n],
        }
    }
}

impl<K: DenseKey> KeyIndex<K> for DenseIndex {
    fn with_capacity(_n: usize) -> Self {
        DenseIndex { slots: Vec::new() }
    }
    #[inline]
    fn get(&self, key: &K) -> Option<u32> {
        match self.slots.get(key.dense()) {
            Some(&v) if v != NIL => Some(v),
            _ => None,
        }
    }
    #[inline]
    fn insert(&mut self, key: K, node: u32) {
        let k = key.dense();
        if k >= self.slots.len() {
            let n = (k + 1).max(self.slots.len() * 2).max(1024);
            self.slots.resize(n, NIL);
        }
        self.slots[k] = node;
    }
    #[inline]
    fn remove(&mut self, key: &K) {
        if let Some(s) = self.slots.get_mut(key.dense()) {
            *s = NIL;
        }
    }
    fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = NIL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_spreads_sequential_keys_over_low_and_high_bits() {
        let b = FastBuild::default();
        let mut low = [0u32; 64];
        let mut high = [0u32; 128];
        for k in 0u64..64 * 1024 {
            let h = b.hash_one(k);
            low[(h & 63) as usize] += 1;
            high[(h >> 57) as usize] += 1;
        }
        // 1024 expected per low bucket, 512 per tag value.
        assert!(low.iter().all(|&c| (800..1250).contains(&c)), "{low:?}");
        assert!(high.iter().all(|&c| (380..650).contains(&c)), "{high:?}");
    }

    #[test]
    fn indexes_agree() {
        let mut h: HashIndex<u32> = KeyIndex::with_capacity(8);
        let mut d: DenseIndex = KeyIndex::<u32>::with_capacity(8);
        for k in [5u32, 7, 5000, 1] {
            h.insert(k, k * 2);
            KeyIndex::<u32>::insert(&mut d, k, k * 2);
        }
        KeyIndex::<u32>::remove(&mut d, &7);
        h.remove(&7);
        for k in [0u32, 1, 5, 7, 5000, 6000] {
            assert_eq!(h.get(&k), KeyIndex::<u32>::get(&d, &k), "key {k}");
        }
    }
}
