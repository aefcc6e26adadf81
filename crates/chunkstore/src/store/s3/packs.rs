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

/// Whether a GET was answered 416 Range Not Satisfiable (object_store
/// reports it as a generic error naming the status).
fn refused_range(e: &object_store::Error) -> bool {
    let text = e.to_string();
    text.contains("416") || text.contains("Range Not Satisfiable")
}

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
        let key = self.key(&rel);
        let suffix = GetOptions {
            range: Some(GetRange::Suffix(INDEX_PROBE)),
            ..Default::default()
        };
        let r = match self.os.get_opts(&key, suffix).await {
            Ok(r) => r,
            Err(e @ object_store::Error::NotFound { .. }) => {
                return Err(self.fail(e, Op::Read, &what))
            }
            // Some S3 servers (`rclone serve s3`) answer a suffix longer
            // than the object with 416 where AWS sends the whole object:
            // ask its size, then a plain range. If that fails too, the
            // first error is the one to report. (Only a 416: any other
            // error, an outage, is reported as it is, at once.)
            Err(e) if refused_range(&e) => match self.plain_tail(&key).await {
                Ok(r) => r,
                Err(_) => return Err(self.fail(e, Op::Read, &what)),
            },
            Err(e) => return Err(self.fail(e, Op::Read, &what)),
        };
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

    /// The last [`INDEX_PROBE`] bytes of `key` (all of a smaller object)
    /// without a suffix range: a HEAD, then a bounded GET.
    async fn plain_tail(
        &self,
        key: &object_store::path::Path,
    ) -> object_store::Result<object_store::GetResult> {
        let size = self.os.head(key).await?.size;
        let range = GetRange::Bounded(size.saturating_sub(INDEX_PROBE)..size.max(1));
        self.os
            .get_opts(
                key,
                GetOptions {
                    range: Some(range),
                    ..Default::default()
                },
            )
            .await
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

#[cfg(test)]
mod tests {
    use super::super::testing::NoLongSuffix;
    use super::*;
    use crate::store::api::prelude::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_small_packs_index_is_read_where_a_long_suffix_range_is_refused() {
        let os = NoLongSuffix::new();
        let loc = "s3://bucket/store";
        let s = S3Store::init_over(os.clone(), loc).unwrap();
        let codec = s.config().codec();
        let objs: Vec<(ChunkId, Vec<u8>)> = (0u32..20)
            .map(|i| {
                let sealed = codec.seal(&i.to_le_bytes().repeat(50), false);
                (sealed.id, sealed.object)
            })
            .collect();
        let items: Vec<(ChunkId, &[u8])> = objs.iter().map(|(id, b)| (*id, &b[..])).collect();
        s.put_many(&items).unwrap();
        s.sync().unwrap();
        // Another client: the pack (well under 64 KiB) is new to it.
        let other = S3Store::open_over(os.clone(), loc).unwrap();
        let ids: Vec<ChunkId> = objs.iter().map(|(id, _)| *id).collect();
        assert!(other.has_many(&ids, false).unwrap().iter().all(|h| *h));
        for (id, b) in &objs {
            assert_eq!(&other.get(id).unwrap(), b);
        }
        assert!(
            os.refused.load(Ordering::Relaxed) > 0,
            "the suffix read was tried"
        );
    }
}
