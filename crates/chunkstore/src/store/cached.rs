//! A memory cache of stored objects in front of a remote store: what
//! `roamdisk store serve` keeps of an S3 bucket it fronts, so objects many
//! clients read (a golden image's chunks) cross the object store once.
//! Objects never change under their names, so a cached copy is never
//! stale; only objects that verify against their name are kept, and gc's
//! removals drop them. Everything but reads passes through.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use super::api::{
    ChunkPrune, ChunkRead, ChunkWrite, DynStore, Freed, LeaseStore, RefStore, Store, StoreLayer,
};
use crate::hash::ChunkId;
use roamdisk_blockdev::Result;

/// Objects in the cache and their bytes.
struct Lru {
    map: lru::LruCache<ChunkId, Arc<Vec<u8>>>,
    bytes: u64,
}

/// A store with a byte-bounded LRU cache of objects in memory.
pub struct CachedStore {
    inner: DynStore,
    capacity: u64,
    lru: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl CachedStore {
    /// `inner` with a cache of at most `capacity` bytes of objects.
    pub fn new(inner: DynStore, capacity: u64) -> CachedStore {
        CachedStore {
            inner,
            capacity,
            lru: Mutex::new(Lru {
                map: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    fn lookup(&self, id: &ChunkId) -> Option<Vec<u8>> {
        let mut l = self.lru.lock();
        let hit = l.map.get(id).map(|b| b.to_vec());
        drop(l);
        let c = if hit.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        c.fetch_add(1, Ordering::Relaxed);
        hit
    }

    fn keep(&self, id: &ChunkId, bytes: &[u8]) {
        let len = bytes.len() as u64;
        if len > self.capacity / 4 || self.inner.config().codec().verify(id, bytes).is_err() {
            return;
        }
        let mut l = self.lru.lock();
        if l.map.contains(id) {
            return;
        }
        while l.bytes + len > self.capacity {
            match l.map.pop_lru() {
                Some((_, b)) => l.bytes -= b.len() as u64,
                None => break,
            }
        }
        l.map.put(*id, Arc::new(bytes.to_vec()));
        l.bytes += len;
    }

    fn drop_cached(&self, id: &ChunkId) {
        let mut l = self.lru.lock();
        if let Some(b) = l.map.pop(id) {
            l.bytes -= b.len() as u64;
        }
    }
}

impl StoreLayer for CachedStore {
    fn next(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

impl ChunkRead for CachedStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        if let Some(b) = self.lookup(id) {
            return Ok(b);
        }
        let b = self.inner.get(id)?;
        self.keep(id, &b);
        Ok(b)
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        let mut out: Vec<Option<Result<Vec<u8>>>> =
            ids.iter().map(|id| self.lookup(id).map(Ok)).collect();
        let missing: Vec<usize> = (0..ids.len()).filter(|&k| out[k].is_none()).collect();
        if !missing.is_empty() {
            let want: Vec<ChunkId> = missing.iter().map(|&k| ids[k]).collect();
            for (k, r) in missing.into_iter().zip(self.inner.get_many(&want)) {
                if let Ok(b) = &r {
                    self.keep(&ids[k], b);
                }
                out[k] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.expect("every object answered"))
            .collect()
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        // Cached objects up to the first miss; the rest from the store
        // within what is left of the budget.
        let mut out: Vec<Option<Result<Vec<u8>>>> = Vec::with_capacity(ids.len());
        let mut used = 0u64;
        for id in ids {
            match self.lookup(id) {
                Some(b) if b.len() as u64 <= budget - used => {
                    used += b.len() as u64;
                    out.push(Some(Ok(b)));
                }
                Some(_) => {
                    out.resize_with(ids.len(), || None);
                    return out;
                }
                None => break,
            }
        }
        let rest = &ids[out.len()..];
        if !rest.is_empty() {
            for (id, r) in rest
                .iter()
                .zip(self.inner.get_many_within(rest, budget - used))
            {
                if let Some(Ok(b)) = &r {
                    self.keep(id, b);
                }
                out.push(r);
            }
        }
        out
    }
}

impl ChunkWrite for CachedStore {}

impl ChunkPrune for CachedStore {
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        let r = self.inner.remove_many_if_older(ids, cutoff)?;
        for (id, x) in ids.iter().zip(&r) {
            if x.is_some() {
                self.drop_cached(id);
            }
        }
        Ok(r)
    }
}

impl RefStore for CachedStore {}

impl LeaseStore for CachedStore {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::testing::store;

    #[test]
    fn reads_are_served_from_memory_within_the_capacity_and_gc_drops_them() {
        let (_d, s) = store();
        let inner: DynStore = Arc::new(s);
        let codec = inner.config().codec();
        let objs: Vec<_> = (0..8u8).map(|k| codec.seal(&[k; 4000], false)).collect();
        let items: Vec<(ChunkId, &[u8])> = objs.iter().map(|o| (o.id, &o.object[..])).collect();
        inner.put_many(&items).unwrap();
        let size = objs[0].object.len() as u64;
        let c = CachedStore::new(inner.clone(), 4 * size);
        for o in &objs {
            assert_eq!(c.get(&o.id).unwrap(), o.object);
        }
        assert_eq!(c.stats(), (0, 8));
        // The last four are cached; the first four were evicted.
        let ids: Vec<ChunkId> = objs.iter().map(|o| o.id).collect();
        for (r, o) in c.get_many(&ids).into_iter().zip(&objs) {
            assert_eq!(r.unwrap(), o.object);
        }
        assert_eq!(c.stats().0, 4, "{:?}", c.stats());
        // gc removes an object: it is no longer served from memory.
        let later = SystemTime::now() + std::time::Duration::from_secs(3600);
        let last = objs[7].id;
        assert!(c.remove_if_older(&last, later).unwrap().is_some());
        assert!(c.get(&last).is_err());
    }
}
