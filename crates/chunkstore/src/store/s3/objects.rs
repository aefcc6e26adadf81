//! Objects of an S3 store: where the table says each is (in a pack, or a
//! loose object of its own), reading them (objects of one pack fetched
//! together with ranged GETs; a listing again, with growing waits, before
//! an object is called missing), looking them up and touching their
//! containers for a commit, and writing them (a group as one pack, a
//! single put gathered with others by `batch.rs`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::pack_writer::{S3Group, SharedGroup};
use super::store::S3Store;
use super::table::Where;
use crate::error::{err, not_found};
use crate::hash::ChunkId;
use crate::store::api::{ChunkRead, ChunkWrite, PutGroup, PutOutcome};

/// How many times a reader lists the packs again, with growing waits,
/// before it calls an object missing (a listing may lag a new pack).
const RESCANS: u32 = 3;

impl S3Store {
    /// Where the table says object `id` is.
    pub(super) fn locate(&self, id: &ChunkId) -> Option<Where> {
        self.table.read().objects.get(id).copied()
    }

    /// The name of pack number `n`.
    fn pack_name(&self, n: u32) -> String {
        self.table.read().names[n as usize].clone()
    }

    /// The container (`packs/NAME` or `objects/HEX`) of a known object.
    fn container(&self, id: &ChunkId, w: Where) -> String {
        match w {
            Where::Packed { pack, .. } => format!("packs/{}", self.pack_name(pack)),
            Where::Loose { .. } => format!("objects/{}", id.to_hex()),
        }
    }

    /// The stored bytes of `id`, read where `w` says.
    async fn read_where(&self, id: &ChunkId, w: Where) -> Result<Vec<u8>> {
        let what = format!("object {id}");
        match w {
            Where::Packed { pack, offset, len } => Ok(self
                .os
                .get_range(
                    &self.key(&format!("packs/{}", self.pack_name(pack))),
                    offset..offset + len as u64,
                )
                .await
                .map_err(|e| self.fail(e, Op::Read, &what))?
                .to_vec()),
            Where::Loose { .. } => {
                self.get_bytes(&format!("objects/{}", id.to_hex()), &what)
                    .await
            }
        }
    }

    /// A pack or loose object was not where the table says: forget it.
    fn forget(&self, id: &ChunkId, w: Where) {
        let mut t = self.table.write();
        match w {
            Where::Packed { pack, .. } => t.forget_pack(pack),
            Where::Loose { .. } => {
                t.objects.remove(id);
            }
        }
    }

    /// Touch `rel` (a pack or loose object) for a commit: write its touch
    /// marker, then check that no gc has marked it for removal and that it
    /// is still there. False: treat its objects as missing.
    async fn touch(&self, rel: &str) -> Result<bool> {
        self.put(&format!("touch/{rel}"), Vec::new()).await?;
        if self.time_of(&format!("trash/{rel}")).await?.is_some() {
            return Ok(false);
        }
        Ok(self.time_of(rel).await?.is_some())
    }

    /// Store one object; gathered with others put at the same moment
    /// (`batch.rs`): one alone is a loose object, several a pack.
    fn put_single(&self, id: ChunkId, bytes: &[u8]) -> Result<()> {
        self.batcher.put(id, bytes, |items| {
            if items.len() == 1 {
                let (id, bytes) = &items[0];
                self.block(self.put(&format!("objects/{}", id.to_hex()), bytes.clone()))
                    .map(|()| {
                        let mut t = self.table.write();
                        t.objects.entry(*id).or_insert(Where::Loose {
                            len: bytes.len() as u64,
                        });
                    })
            } else {
                let mut g = S3Group::new(self);
                for (id, bytes) in items {
                    g.add(id, [bytes, &[]]);
                }
                self.block(g.upload()).map(|_| ())
            }
        })
    }
}

impl ChunkRead for S3Store {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.ensure_scanned()?;
        // After an object was found missing, others are given one more
        // listing, not the patient retries: a checkout of a version whose
        // pack is gone fails at once, not after seconds per chunk.
        let patient = self
            .last_missing
            .lock()
            .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let rescans = if patient { RESCANS } else { 1 };
        for attempt in 0..=rescans {
            if let Some(w) = self.locate(id) {
                match self.block(self.read_where(id, w)) {
                    Ok(b) => return Ok(b),
                    Err(e) if e.kind() == ErrorKind::NotFound => self.forget(id, w),
                    Err(e) => return Err(e),
                }
            }
            if attempt < rescans {
                if attempt > 0 {
                    std::thread::sleep(Duration::from_millis(250 << attempt));
                }
                self.block(self.scan())?;
            }
        }
        *self.last_missing.lock() = Some(Instant::now());
        Err(not_found(format!(
            "object {id} is missing from store {}",
            self.loc.describe()
        )))
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        if let Err(e) = self.ensure_scanned() {
            return ids
                .iter()
                .map(|_| Err(err(e.kind(), Op::Read, e.to_string())))
                .collect();
        }
        // Objects of one pack are fetched together (ranges close to each
        // other are merged into one request).
        let mut by_pack: HashMap<u32, Vec<usize>> = HashMap::new();
        let mut single: Vec<usize> = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            match self.locate(id) {
                Some(Where::Packed { pack, .. }) => by_pack.entry(pack).or_default().push(k),
                _ => single.push(k),
            }
        }
        let mut out: Vec<Option<Result<Vec<u8>>>> = ids.iter().map(|_| None).collect();
        // (positions in `ids`, their bytes if the pack answered)
        type Fetched = (Vec<usize>, Option<Vec<Vec<u8>>>);
        let fetched: Vec<Fetched> = self.block(async {
            futures::stream::iter(by_pack.into_values())
                .map(|ks| async move {
                    let mut name = None;
                    let ranges: Vec<std::ops::Range<u64>> = ks
                        .iter()
                        .filter_map(|&k| match self.locate(&ids[k]) {
                            Some(Where::Packed { pack, offset, len }) => {
                                name.get_or_insert(pack);
                                Some(offset..offset + len as u64)
                            }
                            _ => None,
                        })
                        .collect();
                    let (Some(pack), true) = (name, ranges.len() == ks.len()) else {
                        return (ks, None);
                    };
                    let rel = format!("packs/{}", self.pack_name(pack));
                    match self.os.get_ranges(&self.key(&rel), &ranges).await {
                        Ok(b) => (ks, Some(b.into_iter().map(|x| x.to_vec()).collect())),
                        // Each is read alone (and reported) below.
                        Err(_) => (ks, None),
                    }
                })
                .buffer_unordered(self.loc.parallel)
                .collect()
                .await
        });
        for (ks, bufs) in fetched {
            match bufs {
                Some(bufs) => {
                    for (k, b) in ks.into_iter().zip(bufs) {
                        out[k] = Some(Ok(b));
                    }
                }
                None => single.extend(ks),
            }
        }
        for k in single {
            out[k] = Some(self.get(&ids[k]));
        }
        out.into_iter()
            .map(|r| r.expect("every object answered"))
            .collect()
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        // The sizes are known from the indexes: one get_many of the prefix
        // that fits (the default reads in growing groups, one round trip
        // each).
        if self.ensure_scanned().is_err() {
            return self.get_many(ids).into_iter().map(Some).collect();
        }
        let mut used = 0u64;
        let mut take = 0;
        for id in ids {
            let len = match self.locate(id) {
                Some(Where::Packed { len, .. }) => len as u64,
                Some(Where::Loose { len }) => len,
                None => 0,
            };
            if len > budget - used {
                break;
            }
            used += len;
            take += 1;
        }
        let mut out: Vec<Option<Result<Vec<u8>>>> =
            self.get_many(&ids[..take]).into_iter().map(Some).collect();
        out.resize_with(ids.len(), || None);
        out
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.ensure_scanned()?;
        let mut have: Vec<bool> = Vec::with_capacity(ids.len());
        let mut to_touch: HashMap<String, Vec<usize>> = HashMap::new();
        let epoch = *self.epoch.lock();
        for (k, id) in ids.iter().enumerate() {
            match self.locate(id) {
                None => have.push(false),
                Some(w) => {
                    have.push(true);
                    if touch {
                        let c = self.container(id, w);
                        let fresh = self.touched.lock().get(&c).is_some_and(|t| *t > epoch);
                        if !fresh {
                            to_touch.entry(c).or_default().push(k);
                        }
                    }
                }
            }
        }
        if to_touch.is_empty() {
            return Ok(have);
        }
        let results: Vec<(String, Vec<usize>, Result<bool>)> = self.block(
            futures::stream::iter(to_touch)
                .map(|(c, ks)| async move {
                    let r = self.touch(&c).await;
                    (c, ks, r)
                })
                .buffer_unordered(self.loc.parallel)
                .collect(),
        );
        for (c, ks, r) in results {
            if r? {
                self.touched.lock().insert(c, Instant::now());
            } else {
                // Being removed by a gc (or gone): the commit writes these
                // objects again.
                for k in ks {
                    have[k] = false;
                    if let Some(w) = self.locate(&ids[k]) {
                        self.forget(&ids[k], w);
                    }
                }
            }
        }
        Ok(have)
    }
}

impl ChunkWrite for S3Store {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        if items.len() == 1 {
            self.put_single(items[0].0, items[0].1)?;
            return Ok(vec![PutOutcome::Stored]);
        }
        // One pack per BATCH_BYTES (a chunk server's batch is one).
        let mut out = Vec::with_capacity(items.len());
        let mut rest = items;
        while !rest.is_empty() {
            let mut g = S3Group::new(self);
            let mut bytes = 0;
            let mut n = 0;
            for (id, b) in rest {
                if n > 0 && bytes + b.len() > super::batch::BATCH_BYTES {
                    break;
                }
                g.add(id, [b, &[]]);
                bytes += b.len();
                n += 1;
            }
            out.extend(self.block(g.upload())?.into_iter().map(|(_, o)| o));
            rest = &rest[n..];
        }
        Ok(out)
    }
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        Box::new(SharedGroup::new(self))
    }
    fn cheap_lookups(&self) -> bool {
        true
    }
    fn groups_in_flight(&self) -> usize {
        3
    }
    fn sync(&self) -> Result<()> {
        // An S3 PUT is durable when it is acknowledged.
        Ok(())
    }
}
