//! A size limit in front of any store: a put that would take the store's
//! stored bytes past the quota fails with `no-space`, exactly as a write to
//! a full disk does (ENOSPC), naming the object that did not fit. Set by
//! `roamdisk store init --quota SIZE`; also how the tests make a store run
//! out of space without mounting a small file system.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::{ChunkPrune, ChunkRead, ChunkWrite, DynStore, ObjectParts, PutOutcome, StoreConfig};
use crate::error::err;
use crate::hash::ChunkId;

pub struct QuotaStore {
    inner: DynStore,
    quota: u64,
    used: AtomicU64,
}

impl QuotaStore {
    /// Wrap `inner`, counting what it holds now.
    pub fn new(inner: DynStore, quota: u64) -> Result<QuotaStore> {
        let mut used = 0;
        inner.list_objects(&mut |e| used += e.size)?;
        Ok(QuotaStore {
            inner,
            quota,
            used: AtomicU64::new(used),
        })
    }
}

impl ChunkRead for QuotaStore {
    fn describe(&self) -> String {
        format!(
            "{} (quota {})",
            self.inner.describe(),
            format_size(self.quota)
        )
    }
    fn config(&self) -> &StoreConfig {
        self.inner.config()
    }
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.inner.get(id)
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        self.inner.get_many(ids)
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        self.inner.get_many_within(ids, budget)
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.inner.has_many(ids, touch)
    }
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.inner.ref_get(name)
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        self.inner.ref_list()
    }
}

impl ChunkWrite for QuotaStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        let items: Vec<ObjectParts<'_>> = items.iter().map(|(id, b)| (*id, [*b, &[]])).collect();
        self.put_many_parts(&items)
    }
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        let size = |p: &[&[u8]; 2]| (p[0].len() + p[1].len()) as u64;
        let ids: Vec<ChunkId> = items.iter().map(|(id, _)| *id).collect();
        let have = self.inner.has_many(&ids, true)?;
        let mut out = vec![PutOutcome::Existed; items.len()];
        let mut todo: Vec<ObjectParts<'_>> = Vec::new();
        let mut idx = Vec::new();
        for (i, (item, h)) in items.iter().zip(have).enumerate() {
            if !h {
                let len = size(&item.1);
                let used = self.used.fetch_add(len, Ordering::SeqCst) + len;
                if used > self.quota {
                    self.used.fetch_sub(len, Ordering::SeqCst);
                    for (_, p) in &todo {
                        self.used.fetch_sub(size(p), Ordering::SeqCst);
                    }
                    return Err(err(
                        ErrorKind::NoSpace,
                        Op::Write,
                        format!(
                            "store {} is full: object {} ({} bytes) does not fit in the quota of {} ({} used); free space with `roamdisk rm` + `roamdisk gc`, or raise the quota",
                            self.inner.describe(),
                            item.0,
                            len,
                            format_size(self.quota),
                            format_size(used - len)
                        ),
                    ));
                }
                todo.push(*item);
                idx.push(i);
            }
        }
        let got = self.inner.put_many_parts(&todo)?;
        for (k, o) in idx.into_iter().zip(got) {
            if o == PutOutcome::Existed {
                self.used.fetch_sub(size(&items[k].1), Ordering::SeqCst);
            }
            out[k] = o;
        }
        Ok(out)
    }
    forward_sync_and_leases!();
    fn ref_update(
        &self,
        name: &str,
        expected: Option<ChunkId>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.inner.ref_update(name, expected, new)
    }
}

impl ChunkPrune for QuotaStore {
    forward_prune_listings!();
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        let r = self.inner.remove_if_older(id, cutoff)?;
        if let Some(n) = r {
            self.used
                .fetch_sub(n.min(self.used.load(Ordering::SeqCst)), Ordering::SeqCst);
        }
        Ok(r)
    }
    fn remove_many_if_older(
        &self,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<Vec<Option<u64>>> {
        let r = self.inner.remove_many_if_older(ids, cutoff)?;
        let n: u64 = r.iter().flatten().sum();
        self.used
            .fetch_sub(n.min(self.used.load(Ordering::SeqCst)), Ordering::SeqCst);
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;
    use std::sync::Arc;

    #[test]
    fn a_full_store_fails_with_no_space_naming_the_object() {
        let d = tempfile::tempdir().unwrap();
        let inner: DynStore =
            Arc::new(LocalStore::open(&d.path().join("s"), Some(&StoreConfig::default())).unwrap());
        let q = QuotaStore::new(inner, 1000).unwrap();
        let c = StoreConfig {
            zstd_level: None,
            ..Default::default()
        }
        .codec();
        let a = c.seal(&[1u8; 600], false);
        let b = c.seal(&[2u8; 600], false);
        q.put_many(&[(a.id, &a.object)]).unwrap();
        // Re-putting what exists costs nothing.
        q.put_many(&[(a.id, &a.object)]).unwrap();
        let e = q.put_many(&[(b.id, &b.object)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.to_string().contains(&b.id.to_hex()), "{e}");
    }
}
