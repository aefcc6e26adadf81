//! Hoarding (ISR, Machine Bank 3.3): fetch every chunk of a version — its
//! disk and its memory image — into the host's shared cache, so that its
//! sessions on this host read everything locally and the network may go.
//! Chunks already cached are not fetched again; the rest are fetched in
//! batches (in parallel from an HTTP store), verified, and stored. The
//! version's chunks are pinned while the hoard runs, so it never evicts
//! what it hoarded itself; a cache too small for the version refuses the
//! rest, and the summary says how much did not fit.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use super::{Admission, SharedCache};
use crate::chunk::Key;
use crate::error::context;
use crate::hash::ChunkId;
use crate::view::VersionView;

/// Chunks fetched per batch.
const BATCH: usize = 64;

/// What a hoard did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HoardSummary {
    pub version: String,
    /// Distinct chunks of the version (disk and memory image).
    pub chunks: u64,
    pub bytes: u64,
    /// Of those, already in the shared cache when the hoard began.
    pub cached_before: u64,
    pub fetched: u64,
    pub fetched_bytes: u64,
    /// Chunks the cache refused (it is full of chunks running sessions need,
    /// or smaller than the version).
    pub refused: u64,
    /// In the cache when the hoard ended.
    pub cached_after: u64,
    /// Every chunk is on this host: sessions of the version need no network.
    pub complete: bool,
    pub seconds: f64,
}

/// The distinct chunks of a version: id, decoded length, convergent key.
fn chunks_of(view: &VersionView) -> Vec<(ChunkId, usize, Option<Key>)> {
    let idx = &view.version.index;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for i in 0..idx.records() {
        let id = idx.ids[i];
        if !id.is_zero() && seen.insert(id) {
            out.push((id, idx.chunk_len(i), idx.key(i).copied()));
        }
    }
    let mem = &view.version.memory;
    let cs = idx.chunk_size as u64;
    for (i, id) in mem.ids.iter().enumerate() {
        let len = (mem.size - i as u64 * cs).min(cs) as usize;
        if !id.is_zero() && seen.insert(*id) {
            out.push((*id, len, mem.keys.get(i).copied()));
        }
    }
    out
}

/// Hoard `view` into `cache` (with `check_only`, only count what is there).
pub fn hoard(
    view: &VersionView,
    cache: &SharedCache,
    check_only: bool,
    progress: &dyn Progress,
) -> Result<HoardSummary> {
    let t0 = Instant::now();
    let all = chunks_of(view);
    let resident: HashSet<ChunkId> = cache.resident()?.into_iter().collect();
    let mut s = HoardSummary {
        version: view.id.to_hex(),
        chunks: all.len() as u64,
        bytes: all.iter().map(|c| c.1 as u64).sum(),
        cached_before: all.iter().filter(|c| resident.contains(&c.0)).count() as u64,
        ..Default::default()
    };
    let missing: Vec<&(ChunkId, usize, Option<Key>)> =
        all.iter().filter(|c| !resident.contains(&c.0)).collect();
    if !check_only && !missing.is_empty() {
        let _pins = cache.pin(&all.iter().map(|c| c.0).collect::<Vec<_>>())?;
        let codec = view.store().config().codec();
        progress.phase("hoarding", missing.iter().map(|c| c.1 as u64).sum());
        for batch in missing.chunks(BATCH) {
            let ids: Vec<ChunkId> = batch.iter().map(|c| c.0).collect();
            let raw = view.store().get_many(&ids);
            let items: Vec<(ChunkId, Arc<Vec<u8>>)> = batch
                .par_iter()
                .zip(raw)
                .map(|(&&(id, len, key), r)| {
                    let ctx = |e| context(e, format!("chunk {id} of version {}", view.id.short()));
                    let data = codec
                        .open(&id, key.as_ref(), &r.map_err(ctx)?)
                        .map_err(ctx)?;
                    if data.len() != len {
                        return Err(crate::error::corrupt(format!(
                            "chunk {id} holds {} bytes but the version expects {len}",
                            data.len()
                        )));
                    }
                    Ok((id, Arc::new(data)))
                })
                .collect::<Result<_>>()?;
            for ((_, d), a) in items.iter().zip(cache.insert_many_now(&items)) {
                s.fetched += 1;
                s.fetched_bytes += d.len() as u64;
                if a? == Admission::Refused {
                    s.refused += 1;
                }
            }
            progress.advance(batch.iter().map(|c| c.1 as u64).sum());
        }
    }
    let now: HashSet<ChunkId> = cache.resident()?.into_iter().collect();
    s.cached_after = all.iter().filter(|c| now.contains(&c.0)).count() as u64;
    s.complete = s.cached_after == s.chunks;
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}
