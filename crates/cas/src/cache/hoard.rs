//! Hoarding (ISR, Machine Bank 3.3): fetch every chunk of a version — its
//! disk and its memory image — into the host's shared cache, so that its
//! sessions on this host read everything locally and the network may go.
//! Chunks already cached are not fetched again; the rest are fetched in
//! batches (in parallel from an HTTP store), verified, and stored. The
//! version's chunks are pinned while the hoard runs, so it never evicts
//! what it hoarded itself; a cache too small for the version refuses the
//! rest, and the summary says how much did not fit.

use std::collections::HashSet;
use std::time::Instant;

use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use crate::hash::ChunkId;
use crate::view::{Source, VersionView, Wanted, GATHER_BATCH};

/// What a hoard did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HoardSummary {
    pub version: String,
    /// Distinct chunks of the version (disk and memory image).
    pub chunks: u64,
    pub bytes: u64,
    /// Of those, already in the shared cache when the hoard began.
    pub cached_before: u64,
    /// Chunks brought into the cache (from lookaside media or the store).
    pub fetched: u64,
    pub fetched_bytes: u64,
    /// Of those, found on lookaside media.
    pub from_lookaside: u64,
    /// Chunks the cache refused (it is full of chunks running sessions need,
    /// or smaller than the version).
    pub refused: u64,
    /// In the cache when the hoard ended.
    pub cached_after: u64,
    /// Every chunk is on this host: sessions of the version need no network.
    pub complete: bool,
    pub seconds: f64,
}

/// The distinct chunks of a version (disk and memory image).
fn chunks_of(view: &VersionView) -> Vec<Wanted> {
    let mut seen = HashSet::new();
    (0..view.version.index.records())
        .map(|i| view.disk_chunk(i))
        .chain(view.memory_chunks())
        .filter(|w| !w.id.is_zero() && seen.insert(w.id))
        .collect()
}

/// Hoard `view` into its shared cache (with `check_only`, only count what
/// is there).
pub fn hoard(
    view: &VersionView,
    check_only: bool,
    progress: &dyn Progress,
) -> Result<HoardSummary> {
    let t0 = Instant::now();
    let cache = view.shared_cache().ok_or_else(|| {
        crate::error::bad_arg("hoarding needs the host's shared cache (it is off)")
    })?;
    let all = chunks_of(view);
    let resident: HashSet<ChunkId> = cache.resident()?.into_iter().collect();
    let mut s = HoardSummary {
        version: view.id.to_hex(),
        chunks: all.len() as u64,
        bytes: all.iter().map(|c| c.len as u64).sum(),
        cached_before: all.iter().filter(|c| resident.contains(&c.id)).count() as u64,
        ..Default::default()
    };
    let missing: Vec<Wanted> = all
        .iter()
        .filter(|c| !resident.contains(&c.id))
        .copied()
        .collect();
    if !check_only && !missing.is_empty() {
        let _pins = cache.pin(&all.iter().map(|c| c.id).collect::<Vec<_>>())?;
        progress.phase("hoarding", missing.iter().map(|c| c.len as u64).sum());
        for batch in missing.chunks(GATHER_BATCH) {
            for (g, w) in view.gather(batch, false)?.iter().zip(batch) {
                if g.source != Source::SharedCache {
                    s.fetched += 1;
                    s.fetched_bytes += w.len as u64;
                    s.from_lookaside += (g.source == Source::Lookaside) as u64;
                }
                s.refused += g.refused as u64;
            }
            progress.advance(batch.iter().map(|c| c.len as u64).sum());
        }
    }
    let now: HashSet<ChunkId> = cache.resident()?.into_iter().collect();
    s.cached_after = all.iter().filter(|c| now.contains(&c.id)).count() as u64;
    s.complete = s.cached_after == s.chunks;
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}
