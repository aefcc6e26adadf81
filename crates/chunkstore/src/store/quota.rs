//! A size limit in front of any store: a put that would take the store's
//! stored bytes past the quota fails with `no-space`, exactly as a write to
//! a full disk does (ENOSPC), naming the object that did not fit. Set by
//! `roamdisk store init --quota SIZE`; also how the tests make a store run
//! out of space without mounting a small file system.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use parking_lot::Mutex;

use super::api::{
    ChunkPrune, ChunkRead, ChunkWrite, DynStore, Freed, LeaseStore, ObjectParts, PutGroup,
    PutOutcome, RefStore, Store, StoreLayer,
};
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

    /// Count `len` more bytes for object `id`, or fail with `no-space`
    /// (nothing counted) if they do not fit.
    fn reserve(&self, id: &ChunkId, len: u64) -> Result<()> {
        let used = self.used.fetch_add(len, Ordering::SeqCst) + len;
        if used <= self.quota {
            return Ok(());
        }
        self.used.fetch_sub(len, Ordering::SeqCst);
        Err(err(
            ErrorKind::NoSpace,
            Op::Write,
            format!(
                "store {} is full: object {} ({} bytes) does not fit in the quota of {} ({} used); free space with `roamdisk rm` + `roamdisk gc`, or raise the quota",
                self.inner.describe(),
                id,
                len,
                format_size(self.quota),
                format_size(used - len)
            ),
        ))
    }

    fn release(&self, len: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| Some(u - len.min(u)));
    }
}

fn size(p: &[&[u8]; 2]) -> u64 {
    (p[0].len() + p[1].len()) as u64
}

impl StoreLayer for QuotaStore {
    fn describe(&self) -> String {
        format!(
            "{} (quota {})",
            self.inner.describe(),
            format_size(self.quota)
        )
    }
    fn next(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

impl ChunkRead for QuotaStore {}

impl ChunkWrite for QuotaStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        let items: Vec<ObjectParts<'_>> = items.iter().map(|(id, b)| (*id, [*b, &[]])).collect();
        self.put_many_parts(&items)
    }
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        let ids: Vec<ChunkId> = items.iter().map(|(id, _)| *id).collect();
        let have = self.inner.has_many(&ids, true)?;
        let mut out = vec![PutOutcome::Existed; items.len()];
        let mut todo: Vec<ObjectParts<'_>> = Vec::new();
        let mut idx = Vec::new();
        for (i, (item, h)) in items.iter().zip(have).enumerate() {
            if !h {
                if let Err(e) = self.reserve(&item.0, size(&item.1)) {
                    todo.iter().for_each(|(_, p)| self.release(size(p)));
                    return Err(e);
                }
                todo.push(*item);
                idx.push(i);
            }
        }
        let got = self.inner.put_many_parts(&todo)?;
        for (k, o) in idx.into_iter().zip(got) {
            if o == PutOutcome::Existed {
                self.release(size(&items[k].1));
            }
            out[k] = o;
        }
        Ok(out)
    }
    /// The inner store's group (a local store's packs). Like `put_many`,
    /// it stores only what the store lacks (a local lookup: quotas are for
    /// local stores), counting each object as it is handed over.
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        Box::new(QuotaGroup {
            store: self,
            inner: Some(self.inner.put_group()),
            handed: Mutex::new(Vec::new()),
        })
    }
}

/// A put group under a quota ([`QuotaStore::put_group`]).
struct QuotaGroup<'a> {
    store: &'a QuotaStore,
    inner: Option<Box<dyn PutGroup + 'a>>,
    /// Every object handed over, in order, with the bytes counted for it
    /// (`None`: the store had it, it was not passed on).
    handed: Mutex<Vec<(ChunkId, Option<u64>)>>,
}

impl PutGroup for QuotaGroup<'_> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        if self.store.inner.has_many(&[*id], true)? == [true] {
            self.handed.lock().push((*id, None));
            return Ok(());
        }
        let len = size(&parts);
        self.store.reserve(id, len)?;
        self.handed.lock().push((*id, Some(len)));
        self.inner.as_ref().expect("group open").write(id, parts)
    }
    fn finish(mut self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let inner = self.inner.take().expect("group open");
        let handed = std::mem::take(&mut *self.handed.lock());
        let counted = |o: &Option<u64>| o.unwrap_or(0);
        let stored = match inner.finish() {
            Ok(o) => o,
            Err(e) => {
                self.store
                    .release(handed.iter().map(|(_, n)| counted(n)).sum());
                return Err(e);
            }
        };
        // The inner outcomes are those of the objects passed on, in the
        // order the inner group saw them (threads may interleave): matched
        // by id.
        let mut by_id: std::collections::HashMap<ChunkId, std::collections::VecDeque<PutOutcome>> =
            std::collections::HashMap::new();
        for (id, o) in stored {
            by_id.entry(id).or_default().push_back(o);
        }
        let mut out = Vec::with_capacity(handed.len());
        for (id, n) in handed {
            let o = match n {
                None => PutOutcome::Existed,
                Some(n) => {
                    let o = by_id
                        .get_mut(&id)
                        .and_then(|q| q.pop_front())
                        .unwrap_or(PutOutcome::Stored);
                    if o == PutOutcome::Existed {
                        self.store.release(n);
                    }
                    o
                }
            };
            out.push((id, o));
        }
        Ok(out)
    }
}

impl Drop for QuotaGroup<'_> {
    /// Abandoned before `finish`: nothing it counted was stored.
    fn drop(&mut self) {
        if self.inner.is_some() {
            let n: u64 = self.handed.lock().iter().filter_map(|(_, n)| *n).sum();
            self.store.release(n);
        }
    }
}

impl ChunkPrune for QuotaStore {
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        let r = self.inner.remove_many_if_older(ids, cutoff)?;
        self.release(r.iter().flatten().sum());
        Ok(r)
    }
}

impl RefStore for QuotaStore {}

impl LeaseStore for QuotaStore {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkCodec;
    use crate::store::config::StoreConfig;
    use crate::store::local::testing::store;
    use std::sync::Arc;

    /// A quota of `limit` bytes over a new local store, and a codec that
    /// does not compress (an object's size is its data's).
    fn quota(limit: u64) -> (tempfile::TempDir, QuotaStore, ChunkCodec) {
        let (d, s) = store();
        let q = QuotaStore::new(Arc::new(s), limit).unwrap();
        let c = StoreConfig {
            zstd_level: None,
            ..Default::default()
        }
        .codec();
        (d, q, c)
    }

    #[test]
    fn a_full_store_fails_with_no_space_naming_the_object() {
        let (_d, q, c) = quota(1000);
        let a = c.seal(&[1u8; 600], false);
        let b = c.seal(&[2u8; 600], false);
        q.put_many(&[(a.id, &a.object)]).unwrap();
        // Re-putting what exists costs nothing.
        q.put_many(&[(a.id, &a.object)]).unwrap();
        let e = q.put_many(&[(b.id, &b.object)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert!(e.to_string().contains(&b.id.to_hex()), "{e}");
    }

    /// The quota passes the inner store's fast paths through: a group is
    /// written as the local store's pack (one file, not one per object),
    /// lookups stay cheap, and what the group stores is counted.
    #[test]
    fn a_quota_keeps_the_stores_grouped_writes_and_counts_them() {
        let (d, q, c) = quota(10_000);
        assert!(q.cheap_lookups(), "a local store's lookups are cheap");
        let objs: Vec<_> = (0..8u8).map(|k| c.seal(&[k; 1000], false)).collect();
        let g = q.put_group();
        for o in &objs {
            g.write(&o.id, [&o.object, &[]]).unwrap();
        }
        let out = g.finish().unwrap();
        assert!(out.iter().all(|(_, o)| *o == PutOutcome::Stored));
        q.sync().unwrap();
        let packs = std::fs::read_dir(d.path().join("s/packs")).unwrap().count();
        assert_eq!(packs, 1, "one pack, as without a quota");
        let used = q.used.load(Ordering::SeqCst);
        assert_eq!(
            used,
            objs.iter().map(|o| o.object.len() as u64).sum::<u64>()
        );
        // The same objects again cost nothing; two new ones do not fit.
        let g = q.put_group();
        for o in &objs {
            g.write(&o.id, [&o.object, &[]]).unwrap();
        }
        let again = g.finish().unwrap();
        assert!(again.iter().all(|(_, o)| *o == PutOutcome::Existed));
        assert_eq!(q.used.load(Ordering::SeqCst), used);
        let big: Vec<_> = (100..102u8).map(|k| c.seal(&[k; 1000], false)).collect();
        let g = q.put_group();
        g.write(&big[0].id, [&big[0].object, &[]]).unwrap();
        let e = g.write(&big[1].id, [&big[1].object, &[]]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        drop(g);
        assert_eq!(
            q.used.load(Ordering::SeqCst),
            used,
            "an abandoned group counts nothing"
        );
    }
}
