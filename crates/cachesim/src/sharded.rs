//! The cache engine: a [`Policy`] cut into shards, each behind its own
//! lock. One engine for `roamdisk sim --shards N` and for the `cache`
//! layer, so a simulation with the layer's policy, size, block size and
//! shard count counts exactly the layer's hits and misses.
//!
//! A block goes to the shard chosen by a hash of its *address* (device,
//! block number: [`shard_hint`]), not of its key, because the simulator's
//! keys are interned ids while the layer's are block numbers; both see the
//! same address. Each shard is an independent policy of `capacity /
//! shards` blocks (the first `capacity % shards` shards get one more), so
//! threads touching different shards never wait for each other.
//!
//! The engine holds the policy side only (which keys are resident, which
//! one an admission evicts). Whoever owns the cached data keeps it in the
//! shard's `data` field of type `S`, under the same lock (the layer: a map
//! block → bytes; the simulator: nothing). A single-threaded owner (the
//! simulator) reaches the shards through `&mut self` and never locks.

use parking_lot::{Mutex, MutexGuard};

use crate::index::KeyIndex;
use crate::policy::{Outcome, Policy, PolicySpec};

/// Counters of an engine, summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineCounts {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Keys forgotten by [`Shard::remove`] while resident.
    pub removed: u64,
}

/// One shard: a policy, its counters and the owner's data.
pub struct Shard<K, S> {
    policy: Box<dyn Policy<K>>,
    counts: EngineCounts,
    /// The owner's state for the keys of this shard.
    pub data: S,
}

impl<K, S> Shard<K, S> {
    /// Reference `key` (counted as a hit or a miss, and an eviction).
    #[inline]
    pub fn access(&mut self, key: K) -> Outcome<K> {
        let o = self.policy.access(key);
        match &o {
            Outcome::Hit => self.counts.hits += 1,
            Outcome::Miss { evicted } => {
                self.counts.misses += 1;
                if evicted.is_some() {
                    self.counts.evictions += 1;
                }
            }
        }
        o
    }

    /// Forget `key`; whether it was resident.
    pub fn remove(&mut self, key: &K) -> bool {
        let was = self.policy.remove(key);
        if was {
            self.counts.removed += 1;
        }
        was
    }

    /// Whether `key` is resident.
    pub fn contains(&self, key: &K) -> bool {
        self.policy.contains(key)
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.policy.len()
    }

    /// Capacity of this shard in blocks.
    pub fn capacity(&self) -> usize {
        self.policy.capacity()
    }

    pub fn is_empty(&self) -> bool {
        self.policy.is_empty()
    }
}

/// The hash of a block address that picks its shard. Device 0's hint is
/// the block number itself, so a layer (one device) and a simulation of a
/// one-device trace agree.
#[inline]
pub fn shard_hint(device: u32, block: u64) -> u64 {
    block ^ (device as u64).rotate_right(20)
}

/// splitmix64's finalizer: every bit of the hint reaches the top bits the
/// shard is taken from.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A policy of `capacity` blocks in `shards` independent, locked parts.
pub struct ShardedCache<K, S = ()> {
    shards: Box<[Mutex<Shard<K, S>>]>,
    capacity: usize,
    name: String,
}

impl<K, S> ShardedCache<K, S>
where
    K: Copy + Send + 'static,
    S: Default,
{
    /// `capacity` blocks under `spec`, cut into `shards` (1 = one policy,
    /// exactly the unsharded one). Every shard gets at least one block.
    pub fn new<I: KeyIndex<K> + 'static>(
        spec: &PolicySpec,
        capacity: usize,
        shards: usize,
    ) -> Result<Self, crate::policy::SpecError> {
        if shards == 0 || shards > capacity {
            return Err(crate::policy::SpecError(format!(
                "{shards} shards for a cache of {capacity} blocks: give between 1 and {capacity} shards \
                 (or a larger cache)"
            )));
        }
        let (each, extra) = (capacity / shards, capacity % shards);
        let shards: Box<[_]> = (0..shards)
            .map(|i| {
                Mutex::new(Shard {
                    policy: spec.build::<K, I>(each + usize::from(i < extra)),
                    counts: EngineCounts::default(),
                    data: S::default(),
                })
            })
            .collect();
        let name = if shards.len() == 1 {
            spec.label()
        } else {
            format!("{} x{} shards", spec.label(), shards.len())
        };
        Ok(ShardedCache {
            shards,
            capacity,
            name,
        })
    }
}

impl<K, S> ShardedCache<K, S> {
    /// Capacity in blocks, over all shards.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The policy's label, with the shard count when more than one.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shard of a block whose [`shard_hint`] is `hint`.
    #[inline]
    pub fn shard_of(&self, hint: u64) -> usize {
        let n = self.shards.len();
        if n == 1 {
            return 0;
        }
        ((mix(hint) as u128 * n as u128) >> 64) as usize
    }

    /// Lock a shard. A panic in another thread while it held the lock
    /// leaves the policy consistent (every policy operation completes
    /// before the owner touches its data), so a poisoned lock is taken
    /// over rather than spread.
    #[inline]
    pub fn lock(&self, shard: usize) -> MutexGuard<'_, Shard<K, S>> {
        self.shards[shard].lock()
    }

    /// A shard, without locking (single-threaded owners).
    #[inline]
    pub fn shard_mut(&mut self, shard: usize) -> &mut Shard<K, S> {
        self.shards[shard].get_mut()
    }

    /// Reference `key`, whose address hashes to `hint`, without locking.
    #[inline]
    pub fn access_mut(&mut self, hint: u64, key: K) -> Outcome<K> {
        let s = self.shard_of(hint);
        self.shard_mut(s).access(key)
    }

    /// Counters summed over the shards.
    pub fn counts(&self) -> EngineCounts {
        let mut c = EngineCounts::default();
        for i in 0..self.shards.len() {
            let s = self.lock(i).counts;
            c.hits += s.hits;
            c.misses += s.misses;
            c.evictions += s.evictions;
            c.removed += s.removed;
        }
        c
    }

    /// Resident keys over all shards.
    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{DenseIndex, HashIndex};
    use crate::testkit::Lcg;

    #[test]
    fn one_shard_is_the_plain_policy() {
        for name in ["lru", "fmpq", "2q", "arc", "s3fifo", "fbr", "mq"] {
            let spec = PolicySpec::parse(name).unwrap();
            let mut plain = spec.build::<u32, DenseIndex>(50);
            let mut eng = ShardedCache::<u32>::new::<HashIndex<u32>>(&spec, 50, 1).unwrap();
            let mut rng = Lcg(7);
            for _ in 0..20_000 {
                let k = ((rng.next() >> 33) % 200) as u32;
                assert_eq!(plain.access(k), eng.access_mut(k as u64, k), "{name}");
            }
        }
    }

    #[test]
    fn shards_split_the_capacity_and_spread_the_keys() {
        let spec = PolicySpec::parse("lru").unwrap();
        let mut eng = ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 10, 4).unwrap();
        let caps: Vec<usize> = (0..4).map(|i| eng.lock(i).policy.capacity()).collect();
        assert_eq!(caps, [3, 3, 2, 2]);
        let mut used = [0usize; 4];
        for k in 0..1000u64 {
            used[eng.shard_of(shard_hint(0, k))] += 1;
            eng.access_mut(k, k);
        }
        assert!(used.iter().all(|&n| n > 180), "{used:?}");
        let c = eng.counts();
        assert_eq!((c.hits, c.misses, c.evictions), (0, 1000, 990));
        assert_eq!(eng.len(), 10);
        assert!(ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 3, 4).is_err());
        assert!(ShardedCache::<u64>::new::<HashIndex<u64>>(&spec, 3, 0).is_err());
    }
}
