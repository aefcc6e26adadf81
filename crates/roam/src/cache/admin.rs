//! Looking after a host's shared cache (`roamdisk cache`): what it holds
//! and for whom ([`status`]: use against the cap, hoarded versions with
//! their levels, running sessions' pins), a check of every chunk against
//! its name ([`verify`], which drops the damaged ones), and eviction of
//! what nobody keeps ([`SharedCache::evict`]).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;
use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use super::SharedCache;
use crate::hoard::percent;
use roamdisk_chunkstore::chunk::names_content;
use roamdisk_chunkstore::hash::ChunkId;

/// A hoarded version and how much of it the cache holds.
#[derive(Debug, Clone, Serialize)]
pub struct HoardLevel {
    /// The version id (hex).
    pub version: String,
    /// `USER/IMAGE` it was hoarded as.
    pub name: String,
    /// When it was hoarded, seconds since 1970.
    pub created: u64,
    pub chunks: u64,
    pub bytes: u64,
    pub present_chunks: u64,
    pub present_bytes: u64,
    /// `present_bytes` as a share of `bytes`.
    pub percent: f64,
    pub complete: bool,
    /// The mark's file.
    pub file: PathBuf,
}

/// A mark that cannot be read: while it is there the cache evicts
/// nothing when it is full (it cannot know what the mark keeps).
#[derive(Debug, Clone, Serialize)]
pub struct DamagedMark {
    pub file: PathBuf,
    pub error: String,
}

/// A running session's pin set.
#[derive(Debug, Clone, Serialize)]
pub struct SessionPins {
    /// The process running the session.
    pub pid: Option<u32>,
    pub file: PathBuf,
    /// Chunks it pins, and of those, how many the cache holds.
    pub chunks: u64,
    pub present_chunks: u64,
}

/// What `roamdisk cache status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct CacheStatus {
    pub path: PathBuf,
    /// `cache.toml`'s version.
    pub format_version: u32,
    pub policy: String,
    /// The byte cap.
    pub size: u64,
    /// The largest chunk the cache holds; the cap holds `capacity` of them.
    pub unit: u32,
    pub capacity: u64,
    /// Resident chunks and their bytes (as the journal says; the files in
    /// `chunks/` are exactly these).
    pub chunks: u64,
    pub bytes: u64,
    /// Resident chunks a hoard mark keeps, and their bytes.
    pub hoarded_chunks: u64,
    pub hoarded_bytes: u64,
    /// Resident chunks a running session pins (and no hoard keeps).
    pub pinned_chunks: u64,
    pub pinned_bytes: u64,
    /// Resident chunks nobody keeps: `roamdisk cache evict` drops them,
    /// and the policy evicts them first when the cache is full.
    pub evictable_chunks: u64,
    pub evictable_bytes: u64,
    pub journal_records: u64,
    pub hoards: Vec<HoardLevel>,
    pub damaged_marks: Vec<DamagedMark>,
    pub sessions: Vec<SessionPins>,
}

/// What the cache holds and for whom.
pub fn status(cache: &SharedCache) -> Result<CacheStatus> {
    let snap = cache.snapshot()?;
    let cfg = cache.config();
    let mut hoarded: HashSet<ChunkId> = HashSet::new();
    let mut hoards = Vec::new();
    let mut damaged_marks = Vec::new();
    for l in cache.hoard_marks()? {
        match l.mark {
            Ok(m) => {
                let (mut n, mut b) = (0u64, 0u64);
                for id in &m.ids {
                    if let Some(&size) = snap.resident.get(id) {
                        n += 1;
                        b += size as u64;
                    }
                }
                hoarded.extend(m.ids.iter().copied());
                hoards.push(HoardLevel {
                    version: m.version.to_hex(),
                    name: m.name,
                    created: m.created,
                    chunks: m.ids.len() as u64,
                    bytes: m.bytes,
                    present_chunks: n,
                    present_bytes: b,
                    percent: percent(b, m.bytes),
                    complete: n == m.ids.len() as u64,
                    file: l.path,
                });
            }
            Err(e) => damaged_marks.push(DamagedMark {
                file: l.path,
                error: e.to_string(),
            }),
        }
    }
    let mut pinned: HashSet<ChunkId> = HashSet::new();
    let sessions = cache
        .pin_sets()?
        .into_iter()
        .map(|p| {
            let present = p
                .ids
                .iter()
                .filter(|id| snap.resident.contains_key(id))
                .count() as u64;
            pinned.extend(p.ids.iter().copied());
            SessionPins {
                pid: p.pid,
                file: p.path,
                chunks: p.ids.len() as u64,
                present_chunks: present,
            }
        })
        .collect();
    let mut s = CacheStatus {
        path: cache.dir().to_path_buf(),
        format_version: cache.format_version(),
        policy: cfg.policy.clone(),
        size: cfg.size,
        unit: cfg.unit,
        capacity: cache.capacity(),
        chunks: snap.resident.len() as u64,
        bytes: snap.bytes,
        hoarded_chunks: 0,
        hoarded_bytes: 0,
        pinned_chunks: 0,
        pinned_bytes: 0,
        evictable_chunks: 0,
        evictable_bytes: 0,
        journal_records: snap.journal_records,
        hoards,
        damaged_marks,
        sessions,
    };
    for (id, &size) in &snap.resident {
        let (n, b) = if hoarded.contains(id) {
            (&mut s.hoarded_chunks, &mut s.hoarded_bytes)
        } else if pinned.contains(id) {
            (&mut s.pinned_chunks, &mut s.pinned_bytes)
        } else {
            (&mut s.evictable_chunks, &mut s.evictable_bytes)
        };
        *n += 1;
        *b += size as u64;
    }
    Ok(s)
}

/// A chunk `verify` found damaged, and dropped.
#[derive(Debug, Clone, Serialize)]
pub struct DamagedChunk {
    pub id: String,
    pub reason: String,
}

/// What `roamdisk cache verify` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Chunks checked and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    pub damaged: Vec<DamagedChunk>,
    /// Chunks that failed the check but had left the cache or been
    /// replaced by the time they were to be dropped (a session evicted or
    /// stored them meanwhile): left alone.
    pub changed: u64,
    pub seconds: f64,
}

/// Why chunk `id`'s file (of `size` bytes by the journal) is not the
/// chunk, with the file's inode as it was checked (`None`: missing).
fn check(
    cache: &SharedCache,
    id: &ChunkId,
    size: u32,
) -> std::result::Result<(), (String, Option<u64>)> {
    let path = cache.chunk_path(id);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(("its file is missing".into(), None))
        }
        Err(e) => {
            let ino = std::fs::metadata(&path).ok().map(|m| m.ino());
            return Err((format!("its file cannot be opened: {e}"), ino));
        }
    };
    let ino = f.metadata().map(|m| m.ino()).ok();
    let mut data = Vec::with_capacity(size as usize);
    if let Err(e) = std::io::Read::read_to_end(&mut &f, &mut data) {
        return Err((format!("its file cannot be read: {e}"), ino));
    }
    if data.len() != size as usize {
        return Err((
            format!("its file holds {} bytes, not {size}", data.len()),
            ino,
        ));
    }
    if !names_content(id, &data) {
        return Err(("its content does not hash to its name".into(), ino));
    }
    Ok(())
}

/// Read every chunk the cache holds and check it against its name; drop
/// the damaged ones (the next read fetches them again). Runs beside
/// sessions: chunks evicted or replaced meanwhile are left alone.
pub fn verify(cache: &SharedCache, progress: &dyn Progress) -> Result<VerifyReport> {
    let t0 = Instant::now();
    let snap = cache.snapshot()?;
    let mut chunks: Vec<(ChunkId, u32)> = snap.resident.into_iter().collect();
    chunks.sort_unstable();
    progress.phase("verifying", snap.bytes);
    let bad: Vec<(ChunkId, String, Option<u64>)> = chunks
        .par_iter()
        .filter_map(|(id, size)| {
            let r = check(cache, id, *size);
            progress.advance(*size as u64);
            r.err().map(|(why, ino)| (*id, why, ino))
        })
        .collect();
    progress.end();
    let mut report = VerifyReport {
        chunks: chunks.len() as u64,
        bytes: snap.bytes,
        ..Default::default()
    };
    for (id, reason, ino) in bad {
        if cache.drop_damaged(&id, ino)? {
            tracing::info!("shared cache: chunk {id} was damaged ({reason}): dropped");
            report.damaged.push(DamagedChunk {
                id: id.to_hex(),
                reason,
            });
        } else {
            report.changed += 1;
        }
    }
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}
