//! Garbage collection in an S3 store: the listing of every object with
//! its reference time (its container's time or its touch marker's),
//! removal of a container behind a trash marker (a commit that touches it
//! afterwards sees the marker; one that touched it before keeps it), the
//! rewrite of a pack without its dead objects, and the recovery of what a
//! dead gc or commit left (markers, clock probes, superseded catalog
//! updates). Protocol: `docs/formats/cas-s3.md`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use roamdisk_blockdev::{Op, Result};

use super::bridge::{is_not_found, random_hex};
use super::pack_writer::S3Group;
use super::refs;
use super::store::S3Store;
use super::table::{Table, Where};
use crate::error::not_found;
use crate::hash::ChunkId;
use crate::store::api::{ChunkPrune, Freed, ObjectEntry};
use crate::store::pack::Entry;

impl S3Store {
    /// The reference time of a container: its own time or its touch
    /// marker's, whichever is later (`None`: it is gone).
    async fn reference_time(&self, rel: &str) -> Result<Option<(SystemTime, u64)>> {
        let touch_rel = format!("touch/{rel}");
        let (own, touch) = futures::try_join!(self.time_of(rel), self.time_of(&touch_rel))?;
        Ok(own.map(|(t, size)| (touch.map_or(t, |(u, _)| t.max(u)), size)))
    }

    /// gc's removal of a container unless referenced at or after
    /// `cutoff`: write the trash marker, read the touch marker again, then
    /// delete. Returns its size if removed.
    async fn remove_container(&self, rel: &str, cutoff: SystemTime) -> Result<Option<u64>> {
        let trash = format!("trash/{rel}");
        self.put(&trash, Vec::new()).await?;
        let r = match self.reference_time(rel).await? {
            Some((t, size)) if t < cutoff => {
                self.delete(rel).await?;
                self.delete(&format!("touch/{rel}")).await?;
                Some(size)
            }
            _ => None,
        };
        self.delete(&trash).await?;
        Ok(r)
    }

    /// gc: rewrite pack `n` without `dead` (see the local store's
    /// `repack_without`): the live objects, each verified, go to a new
    /// pack first; then the old pack is removed unless touched. Returns
    /// the objects removed and their sizes.
    async fn repack_without(
        &self,
        n: u32,
        dead: &HashSet<ChunkId>,
        cutoff: SystemTime,
    ) -> Result<Vec<(ChunkId, u64)>> {
        let (name, entries) = {
            let t = self.table.read();
            (t.names[n as usize].clone(), t.entries[n as usize].clone())
        };
        let rel = format!("packs/{name}");
        match self.reference_time(&rel).await? {
            Some((t, _)) if t < cutoff => {}
            _ => return Ok(Vec::new()),
        }
        let (gone, live): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| dead.contains(&e.id));
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        if !live.is_empty() {
            let ranges: Vec<std::ops::Range<u64>> = live
                .iter()
                .map(|e| e.offset..e.offset + e.len as u64)
                .collect();
            let bufs = match self.os.get_ranges(&self.key(&rel), &ranges).await {
                Ok(b) => b,
                Err(e) if is_not_found(&e) => return Ok(Vec::new()),
                Err(e) => return Err(self.fail(e, Op::Read, &format!("pack {name}"))),
            };
            let codec = self.config.codec();
            let mut group = S3Group::new(self);
            for (e, b) in live.iter().zip(&bufs) {
                if let Err(bad) = codec.verify(&e.id, b) {
                    tracing::warn!(pack = %name, error = %bad, "a pack holds a damaged object: gc keeps the whole pack");
                    return Ok(Vec::new());
                }
                group.add(&e.id, [b, &[]]);
            }
            group.upload().await?;
        }
        match self.remove_container(&rel, cutoff).await? {
            Some(_) => {
                self.table.write().forget_pack(n);
                self.index_cache.remove(&name);
                Ok(gone.iter().map(|e| (e.id, e.len as u64)).collect())
            }
            None => Ok(Vec::new()),
        }
    }
}

impl ChunkPrune for S3Store {
    fn now(&self) -> Result<SystemTime> {
        let rel = format!("clock/{}", random_hex(8)?);
        self.block(async {
            self.put(&rel, Vec::new()).await?;
            let t = self.time_of(&rel).await?;
            self.delete(&rel).await?;
            t.map(|(t, _)| t)
                .ok_or_else(|| not_found(format!("{rel} vanished as it was written")))
        })
    }
    fn min_margin(&self) -> Duration {
        self.margin
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        *self.table.write() = Table::default();
        let touches = self.block(async {
            self.scan().await?;
            self.list("touch").await
        })?;
        let touch: HashMap<String, SystemTime> = touches
            .into_iter()
            .filter_map(|(rel, _, m)| Some((rel.strip_prefix("touch/")?.to_string(), m)))
            .collect();
        let t = self.table.read();
        for (n, name) in t.names.iter().enumerate() {
            if t.gone.contains(&(n as u32)) {
                continue;
            }
            let mut m = t.modified[n];
            if let Some(u) = touch.get(&format!("packs/{name}")) {
                m = m.max(*u);
            }
            for e in &t.entries[n] {
                f(ObjectEntry {
                    id: e.id,
                    mtime: m,
                    size: e.len as u64,
                });
            }
        }
        for (id, w) in &t.objects {
            if let Where::Loose { len } = w {
                let mut m = t
                    .loose_modified
                    .get(id)
                    .copied()
                    .unwrap_or(SystemTime::now());
                if let Some(u) = touch.get(&format!("objects/{}", id.to_hex())) {
                    m = m.max(*u);
                }
                f(ObjectEntry {
                    id: *id,
                    mtime: m,
                    size: *len,
                });
            }
        }
        Ok(())
    }
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        self.ensure_scanned()?;
        let mut out = vec![None; ids.len()];
        let mut by_pack: HashMap<u32, HashSet<ChunkId>> = HashMap::new();
        let mut loose: Vec<usize> = Vec::new();
        let mut at: HashMap<ChunkId, usize> = HashMap::new();
        for (k, id) in ids.iter().enumerate() {
            at.insert(*id, k);
            match self.locate(id) {
                Some(Where::Packed { pack, .. }) => {
                    by_pack.entry(pack).or_default().insert(*id);
                }
                Some(Where::Loose { .. }) => loose.push(k),
                None => {}
            }
        }
        let removed: Vec<Result<Vec<(ChunkId, u64)>>> = self.block(async {
            let packs = futures::stream::iter(by_pack)
                .map(|(n, dead)| async move { self.repack_without(n, &dead, cutoff).await })
                .buffer_unordered(4);
            let singles = futures::stream::iter(loose)
                .map(|k| async move {
                    let id = ids[k];
                    let r = self
                        .remove_container(&format!("objects/{}", id.to_hex()), cutoff)
                        .await?;
                    Ok(r.map(|n| vec![(id, n)]).unwrap_or_default())
                })
                .buffer_unordered(self.loc.parallel);
            packs.chain(singles).collect().await
        });
        for r in removed {
            for (id, n) in r? {
                if let Some(&k) = at.get(&id) {
                    out[k] = Some(n);
                    let mut t = self.table.write();
                    if matches!(t.objects.get(&id), Some(Where::Loose { .. })) {
                        t.objects.remove(&id);
                    }
                }
            }
        }
        Ok(out)
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        self.block(async {
            let mut restored = 0;
            let mut removed = 0;
            // Trash markers of a gc that died (older than the lease
            // timeout: a running gc's are recent).
            for (rel, _, m) in self.list("trash").await? {
                if m < cutoff {
                    self.delete(&rel).await?;
                    restored += 1;
                }
            }
            for (rel, _, m) in self.list("clock").await? {
                if m < cutoff {
                    self.delete(&rel).await?;
                    removed += 1;
                }
            }
            // Catalog updates superseded by one older than the cutoff.
            let (by_name, at_copies) = refs::group(self.list("refs").await?);
            for (name, objs) in &by_name {
                let settled = objs
                    .iter()
                    .filter(|o| o.modified < cutoff)
                    .map(|o| o.generation)
                    .max();
                if let Some(g) = settled {
                    for o in objs.iter().filter(|o| o.generation < g) {
                        self.delete(&format!("refs/{name}/{}", o.name)).await?;
                        removed += 1;
                    }
                    for (rel, at) in at_copies.get(name).into_iter().flatten() {
                        if *at < g {
                            self.delete(rel).await?;
                            removed += 1;
                        }
                    }
                }
            }
            Ok((restored, removed))
        })
    }
}
