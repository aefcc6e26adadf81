//! The writer of a new pack in an S3 store ([`S3Group`], the store's put
//! group; byte layout in `docs/formats/cas-pack.md`): objects are appended
//! in memory from any thread, then the index and trailer, and the whole
//! pack goes up in one PUT under a random name; the
//! table learns it once it is stored.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::SystemTime;

use roamdisk_blockdev::Result;

use super::bridge::random_hex;
use super::store::S3Store;
use crate::hash::ChunkId;
use crate::store::api::{PutGroup, PutOutcome};
use crate::store::pack::{self, Entry};

/// A pack being filled in memory ([`crate::store::api::ChunkWrite::put_group`]).
pub(super) struct S3Group<'a> {
    store: &'a S3Store,
    buf: Vec<u8>,
    entries: Vec<Entry>,
    seen: HashSet<ChunkId>,
    order: Vec<(ChunkId, PutOutcome)>,
}

impl<'a> S3Group<'a> {
    /// An empty pack of `store` (its header written).
    pub(super) fn new(store: &'a S3Store) -> S3Group<'a> {
        S3Group {
            store,
            buf: pack::header(store.config.hash).to_vec(),
            entries: Vec::new(),
            seen: HashSet::new(),
            order: Vec::new(),
        }
    }

    /// Append an object as two pieces (a second copy of an object is
    /// only reported as existing).
    pub(super) fn add(&mut self, id: &ChunkId, parts: [&[u8]; 2]) {
        if !self.seen.insert(*id) {
            self.order.push((*id, PutOutcome::Existed));
            return;
        }
        let offset = self.buf.len() as u64;
        self.buf.extend_from_slice(parts[0]);
        self.buf.extend_from_slice(parts[1]);
        self.entries.push(Entry {
            id: *id,
            offset,
            len: (parts[0].len() + parts[1].len()) as u32,
        });
        self.order.push((*id, PutOutcome::Stored));
    }

    /// Seal and upload the pack (nothing if empty); the table learns it.
    pub(super) async fn upload(mut self) -> Result<Vec<(ChunkId, PutOutcome)>> {
        if self.entries.is_empty() {
            return Ok(self.order);
        }
        let header = pack::header(self.store.config.hash);
        let at = self.buf.len() as u64;
        let tail = pack::encode_tail(&header, &mut self.entries, at);
        self.buf.extend_from_slice(&tail);
        let name = format!("{}.pack", random_hex(16)?);
        self.store
            .put(&format!("packs/{name}"), std::mem::take(&mut self.buf))
            .await?;
        self.store
            .table
            .write()
            .add_pack(name, self.entries, SystemTime::now());
        Ok(self.order)
    }
}

/// The put group handed to commits: objects gathered from any thread.
pub(super) struct SharedGroup<'a>(Mutex<Option<S3Group<'a>>>, &'a S3Store);

impl<'a> SharedGroup<'a> {
    /// A new pack, filled from any thread, uploaded by `finish`.
    pub(super) fn new(store: &'a S3Store) -> SharedGroup<'a> {
        SharedGroup(Mutex::new(Some(S3Group::new(store))), store)
    }
}

impl PutGroup for SharedGroup<'_> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        let mut g = self.0.lock();
        g.as_mut().expect("group open").add(id, parts);
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let g = self.0.into_inner().expect("group open");
        self.1.block(g.upload())
    }
}
