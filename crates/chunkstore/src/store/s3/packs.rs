//! The packs of an S3 store (the local store's `RDPK` files, byte layout
//! in `docs/formats/cas-pack.md`): the listing that finds the packs and
//! loose objects, and the loading of each pack's index (one suffix GET, or
//! the local cache of `index_cache.rs`) into the table of `table.rs`.
//! Writing a pack: `pack_writer.rs`; removing one: `gc.rs`.

use std::time::{Instant, SystemTime};

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::index_cache::parse_index_tail;
use super::store::S3Store;
use super::table::Where;
use crate::error::corrupt;
use crate::hash::ChunkId;
use crate::store::pack::{self, is_pack_name, Entry};

/// Bytes fetched from the end of a pack to read its index (and trailer)
/// in one request when it fits.
const INDEX_PROBE: u64 = 64 << 10;

impl S3Store {
    /// Read a pack's index with one suffix GET (two if the index is
    /// larger than the probe), or from the local cache.
    async fn load_index(&self, name: &str) -> Result<Vec<Entry>> {
        if let Some(entries) = self.index_cache.get(self.config.hash, name) {
            return Ok(entries);
        }
        let (size, tail) = self.fetch_index(name).await?;
        let entries = parse_index_tail(self.config.hash, size, &tail)?;
        self.index_cache.put(name, size, &tail);
        Ok(entries)
    }

    /// The size of pack `name` and its index and trailer: one suffix GET
    /// (two if the index is larger than the probe).
    async fn fetch_index(&self, name: &str) -> Result<(u64, Vec<u8>)> {
        let rel = format!("packs/{name}");
        let what = format!("pack {name}");
        let r = self
            .os
            .get_opts(
                &self.key(&rel),
                GetOptions {
                    range: Some(GetRange::Suffix(INDEX_PROBE)),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.fail(e, Op::Read, &what))?;
        let size = r.meta.size;
        let start = r.range.start;
        let tail = r.bytes().await.map_err(|e| self.fail(e, Op::Read, &what))?;
        let t_len = pack::TRAILER_SIZE;
        if tail.len() < t_len || start + tail.len() as u64 != size {
            return Err(corrupt(format!("{what} is too short for its trailer")));
        }
        let trailer = pack::Trailer::parse(&tail[tail.len() - t_len..], size)?;
        let idx_end = size - t_len as u64;
        if trailer.index_offset >= start {
            return Ok((
                size,
                tail[(trailer.index_offset - start) as usize..].to_vec(),
            ));
        }
        let mut index = self
            .os
            .get_range(&self.key(&rel), trailer.index_offset..idx_end)
            .await
            .map_err(|e| self.fail(e, Op::Read, &what))?
            .to_vec();
        index.extend_from_slice(&tail[tail.len() - t_len..]);
        Ok((size, index))
    }

    /// List the packs and loose objects; load the indexes of packs not
    /// loaded yet.
    pub(super) async fn scan(&self) -> Result<()> {
        let (packs, loose) = futures::try_join!(self.list("packs"), self.list("objects"))?;
        let new: Vec<(String, SystemTime)> = {
            let t = self.table.read();
            packs
                .into_iter()
                .filter_map(|(rel, _, m)| {
                    let n = rel.strip_prefix("packs/")?.to_string();
                    (is_pack_name(&n) && !t.by_name.contains_key(&n) && !t.damaged.contains(&n))
                        .then_some((n, m))
                })
                .collect()
        };
        let loaded: Vec<(String, SystemTime, Result<Vec<Entry>>)> = futures::stream::iter(new)
            .map(|(n, m)| async move {
                let r = self.load_index(&n).await;
                (n, m, r)
            })
            .buffer_unordered(self.loc.parallel)
            .collect()
            .await;
        let mut t = self.table.write();
        for (n, m, r) in loaded {
            match r {
                Ok(entries) => t.add_pack(n, entries, m),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) if e.kind() == ErrorKind::Corrupt => {
                    tracing::warn!(pack = %n, store = %self.loc.describe(), error = %e, "a pack's index is damaged: its objects look missing");
                    t.damaged.insert(n);
                }
                Err(e) => return Err(e),
            }
        }
        for (rel, size, m) in loose {
            if let Some(id) = rel.strip_prefix("objects/").and_then(ChunkId::from_hex) {
                t.objects.entry(id).or_insert(Where::Loose { len: size });
                t.loose_modified.insert(id, m);
            }
        }
        t.scanned = Some(Instant::now());
        Ok(())
    }

    pub(super) fn ensure_scanned(&self) -> Result<()> {
        if self.table.read().scanned.is_none() {
            self.block(self.scan())?;
        }
        Ok(())
    }
}
