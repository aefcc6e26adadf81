//! The shared cache as the first source of a fetch chain: partial reads
//! from its chunk files, a cheap "which of these do you hold" from the
//! journal, keeping what the sources below bring (now, or in the
//! background), and page-cache advice.

use std::sync::Arc;

use roamdisk_blockdev::Result;
use roamdisk_chunkstore::hash::ChunkId;

use super::shared::SharedCache;
use crate::fetch::{Admission, ChunkSource, Source, Wanted};

impl ChunkSource for SharedCache {
    fn kind(&self) -> Source {
        Source::SharedCache
    }
    fn is_cache(&self) -> bool {
        true
    }
    fn read_part(&self, w: &Wanted, dst: &mut [u8], within: usize) -> Result<bool> {
        self.read(&w.id, w.len, dst, within)
    }
    fn holds(&self, ids: &[ChunkId]) -> Result<Vec<bool>> {
        self.has_many(ids)
    }
    fn fetch(&self, wanted: &[Wanted]) -> Vec<Result<Option<Vec<u8>>>> {
        wanted
            .iter()
            .map(|w| {
                let mut b = vec![0u8; w.len];
                Ok(self.read(&w.id, w.len, &mut b, 0)?.then_some(b))
            })
            .collect()
    }
    fn keep(&self, items: &[(ChunkId, Arc<Vec<u8>>)]) -> Vec<Result<Admission>> {
        self.insert_many_now(items)
    }
    fn keep_later(&self, id: ChunkId, data: Arc<Vec<u8>>) {
        self.insert(id, data)
    }
    fn advise(&self, w: &Wanted) {
        self.will_need(&w.id, w.len)
    }
}
