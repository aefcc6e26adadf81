//! The writer of a new pack in an S3 store ([`S3Group`], the store's put
//! group; byte layout in `docs/formats/cas-pack.md`): objects are appended
//! in memory from any thread, then the index and trailer, and the whole
//! pack goes up in one PUT under a random name; the
//! table learns it once it is stored. Objects a chunk server received
//! are kept as the shared buffers they arrived in, not copied: the pack
//! is sent as its pieces back to back.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::SystemTime;

use roamdisk_blockdev::Result;

use super::bridge::random_hex;
use super::store::S3Store;
use crate::hash::ChunkId;
use crate::store::api::{PutGroup, PutOutcome};
use crate::store::pack::{self, Entry};
use object_store::PutPayload;

/// A pack being filled in memory ([`crate::store::api::ChunkWrite::put_group`]).
pub(super) struct S3Group<'a> {
    store: &'a S3Store,
    /// The pack's pieces so far, then `buf` (bytes copied in), `len` in all.
    pieces: Vec<Bytes>,
    buf: Vec<u8>,
    len: u64,
    entries: Vec<Entry>,
    seen: HashSet<ChunkId>,
    order: Vec<(ChunkId, PutOutcome)>,
}

impl<'a> S3Group<'a> {
    /// An empty pack of `store` (its header written).
    pub(super) fn new(store: &'a S3Store) -> S3Group<'a> {
        let buf = pack::header(store.config.hash).to_vec();
        S3Group {
            store,
            pieces: Vec::new(),
            len: buf.len() as u64,
            buf,
            entries: Vec::new(),
            seen: HashSet::new(),
            order: Vec::new(),
        }
    }

    /// Append an object as two pieces (a second copy of an object is
    /// only reported as existing).
    pub(super) fn add(&mut self, id: &ChunkId, parts: [&[u8]; 2]) {
        let len = parts[0].len() + parts[1].len();
        if self.enter(id, len) {
            self.buf.extend_from_slice(parts[0]);
            self.buf.extend_from_slice(parts[1]);
        }
    }

    /// Append an object kept in its own shared buffer (no copy).
    pub(super) fn add_shared(&mut self, id: &ChunkId, object: &Bytes) {
        if self.enter(id, object.len()) {
            self.seal_buf();
            self.pieces.push(object.clone());
        }
    }

    /// Record object `id` of `len` bytes at the pack's end; false (and
    /// reported as existing) for a second copy.
    fn enter(&mut self, id: &ChunkId, len: usize) -> bool {
        if !self.seen.insert(*id) {
            self.order.push((*id, PutOutcome::Existed));
            return false;
        }
        self.entries.push(Entry {
            id: *id,
            offset: self.len,
            len: len as u32,
        });
        self.len += len as u64;
        self.order.push((*id, PutOutcome::Stored));
        true
    }

    /// Close the copied bytes so far into a piece.
    fn seal_buf(&mut self) {
        if !self.buf.is_empty() {
            self.pieces.push(Bytes::from(std::mem::take(&mut self.buf)));
        }
    }

    /// Seal and upload the pack (nothing if empty); the table learns it.
    pub(super) async fn upload(mut self) -> Result<Vec<(ChunkId, PutOutcome)>> {
        if self.entries.is_empty() {
            return Ok(self.order);
        }
        let header = pack::header(self.store.config.hash);
        let tail = pack::encode_tail(&header, &mut self.entries, self.len);
        self.buf.extend_from_slice(&tail);
        self.seal_buf();
        let name = format!("{}.pack", random_hex(16)?);
        let pieces = std::mem::take(&mut self.pieces);
        self.store
            .put(
                &format!("packs/{name}"),
                pieces.into_iter().collect::<PutPayload>(),
            )
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
