//! Hoarding (ISR, Machine Bank 3.3): fetch every chunk of a version — its
//! disk and its memory image — into the host's shared cache and keep it
//! there, so that its sessions on this host read everything locally and
//! the network may go.
//!
//! A hoard first writes the version's hoard mark ([`crate::cache::hoard_marks`]):
//! from then on no process evicts the version's chunks, those already in
//! the cache and those that come later, until the hoard is released. The
//! mark is refused, before anything is fetched, if the chunks of every
//! hoarded version together would not fit under the cache's cap. Chunks
//! already cached are not fetched again; the rest are fetched in batches
//! (in parallel from an HTTP store), verified, and stored. A hoard that is
//! killed leaves its mark and what it stored: running it again fetches the
//! rest. The cache may still refuse chunks while running sessions pin the
//! rest of it; the summary counts them.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use crate::cache::hoard_marks::HoardMark;
use crate::cache::SharedCache;
use crate::fetch::{Source, Wanted};
use crate::view::{VersionView, GATHER_BATCH};
use roamdisk_chunkstore::hash::ChunkId;

/// What a hoard did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HoardSummary {
    pub version: String,
    /// `USER/IMAGE` it was hoarded as.
    pub name: String,
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
    /// Chunks the cache refused (it is full of chunks hoarded or pinned by
    /// running sessions).
    pub refused: u64,
    /// In the cache when the hoard ended: chunks, bytes, and the bytes'
    /// share of the version.
    pub cached_after: u64,
    pub cached_bytes: u64,
    pub percent: f64,
    /// A hoard mark keeps the version's chunks in the cache.
    pub hoarded: bool,
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

/// Whether a hoard mark keeps `version` in `cache`.
pub fn is_hoarded(cache: &SharedCache, version: &ChunkId) -> Result<bool> {
    Ok(cache
        .hoard_marks()?
        .iter()
        .any(|l| l.mark.as_ref().is_ok_and(|m| m.version == *version)))
}

/// Hoard `view` (the version `name`) into its shared cache; with
/// `check_only`, only say how much of it is there.
pub fn hoard(
    view: &VersionView,
    name: &str,
    check_only: bool,
    progress: &dyn Progress,
) -> Result<HoardSummary> {
    let t0 = Instant::now();
    let cache = view.shared_cache().ok_or_else(|| {
        roamdisk_chunkstore::error::bad_arg("hoarding needs the host's shared cache (it is off)")
    })?;
    let all = chunks_of(view);
    let mut s = HoardSummary {
        version: view.id.to_hex(),
        name: name.to_string(),
        chunks: all.len() as u64,
        bytes: all.iter().map(|c| c.len as u64).sum(),
        ..Default::default()
    };
    if !check_only {
        let unit = cache.config().unit as usize;
        if let Some(big) = all.iter().find(|c| c.len > unit) {
            return Err(roamdisk_chunkstore::error::bad_arg(format!(
                "{name}@{} has chunks of {}, larger than the {} the shared cache {} holds per chunk: hoard it into a cache made with a larger unit (--shared-cache DIR)",
                view.id.short(),
                format_size(big.len as u64),
                format_size(unit as u64),
                cache.dir().display()
            )));
        }
        let mark = HoardMark::new(view.id, name, s.bytes, all.iter().map(|c| c.id).collect());
        cache.mark_hoard(&mark)?;
    }
    // Looked at once marked: what is resident now stays.
    let resident: HashSet<ChunkId> = cache.resident()?.into_iter().collect();
    s.cached_before = all.iter().filter(|c| resident.contains(&c.id)).count() as u64;
    if !check_only {
        let missing: Vec<Wanted> = all
            .iter()
            .filter(|c| !resident.contains(&c.id))
            .copied()
            .collect();
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
    if !check_only {
        // What it reports as here must outlive a power cut: "the network
        // may go".
        cache.persist()?;
    }
    let now: HashMap<ChunkId, u32> = cache.snapshot()?.resident;
    for c in &all {
        if let Some(&n) = now.get(&c.id) {
            s.cached_after += 1;
            s.cached_bytes += n as u64;
        }
    }
    s.percent = percent(s.cached_bytes, s.bytes);
    s.hoarded = is_hoarded(cache, &view.id)?;
    s.complete = s.cached_after == s.chunks;
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}

/// The hoard marks in `cache` a target names without asking the store:
/// `USER/IMAGE` (every hoarded version of it) or `USER/IMAGE@REV` with
/// REV a version id prefix of at least 4 hex digits.
pub fn marks_named(cache: &SharedCache, target: &str) -> Result<Vec<HoardMark>> {
    let (image, rev) = match target.split_once('@') {
        Some((i, r)) => (i, Some(r.to_ascii_lowercase())),
        None => (target, None),
    };
    Ok(cache
        .hoard_marks()?
        .into_iter()
        .filter_map(|l| l.mark.ok())
        .filter(|m| m.name == image)
        .filter(|m| match &rev {
            None => true,
            Some(r) => r.len() >= 4 && m.version.to_hex().starts_with(r.as_str()),
        })
        .collect())
}

/// `hoard --check` with the store out of reach: the level of the hoarded
/// version `mark` from the cache alone (its mark lists every chunk).
pub fn check_from_mark(cache: &SharedCache, mark: &HoardMark) -> Result<HoardSummary> {
    let t0 = Instant::now();
    let now: HashMap<ChunkId, u32> = cache.snapshot()?.resident;
    let mut s = HoardSummary {
        version: mark.version.to_hex(),
        name: mark.name.clone(),
        chunks: mark.ids.len() as u64,
        bytes: mark.bytes,
        hoarded: true,
        ..Default::default()
    };
    for id in &mark.ids {
        if let Some(&n) = now.get(id) {
            s.cached_after += 1;
            s.cached_bytes += n as u64;
        }
    }
    s.cached_before = s.cached_after;
    s.percent = percent(s.cached_bytes, s.bytes);
    s.complete = s.cached_after == s.chunks;
    s.seconds = t0.elapsed().as_secs_f64();
    Ok(s)
}

/// `part` of `whole` in percent (100 for nothing of nothing).
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}
