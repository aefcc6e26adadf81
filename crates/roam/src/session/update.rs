//! The update commit of a session (seed section 3.4): merge the DIRTY and
//! ZERO sectors of the private cache with the base chunks, dropping
//! useless updates, upload only new chunks, store the version, add it to
//! the catalog, and rebase the session onto it.
//!
//! Each written sector goes through the filters in order:
//! - P1: a write of zeroes needs no data (the sector becomes ZERO; a chunk
//!   of zero sectors is stored as no chunk);
//! - P2: a sector inside a cluster the guest file system marks free is
//!   dropped (the version keeps the base's bytes there);
//! - P3: a sector inside guest swap is dropped.
//!
//! What is left is committed. Dropped sectors stay in the private cache
//! (CLEAN), so the running guest sees no change.

use std::time::Instant;

use rayon::prelude::*;

use super::dev::CasDev;
use crate::guest::{GuestAnalyzer, GuestRegions};
use crate::view::VersionView;
use roamdisk_blockdev::Progress;
use roamdisk_blockdev::{BlockDev, Result, WriteFlags};
use roamdisk_chunkstore::catalog::now_nanos;
use roamdisk_chunkstore::commit::{
    finish_commit, CommitOptions, CommitSummary, FilterReport, Parent,
};
use roamdisk_chunkstore::error::bad_arg;
use roamdisk_chunkstore::index::{SectorState, SECTOR};
use roamdisk_chunkstore::upload::Uploader;
use roamdisk_chunkstore::version::Version;

/// Options of an update commit.
#[derive(Debug, Clone)]
pub struct UpdateOptions {
    /// Target, description, config, memory, tag. An empty target means the
    /// session's own; the parent is always the session's base.
    pub commit: CommitOptions,
    pub p1: bool,
    pub p2: bool,
    pub p3: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Not written this session.
    Keep,
    /// Committed with its data from the cache.
    TakeData,
    /// Committed as zeroes.
    TakeZero,
    /// Dropped (P2/P3): the version keeps the base's bytes.
    Drop,
}

struct Plan {
    record: usize,
    content: Option<Vec<u8>>,
    report: FilterReport,
    /// Per-sector state after the commit, as runs (start, end, state).
    changes: Vec<(u64, u64, SectorState)>,
    /// Sectors whose ZERO write was dropped: the cache must read zero.
    zero_fill: Vec<(u64, u64)>,
}

fn plan_chunk(
    dev: &CasDev,
    base: &VersionView,
    i: usize,
    regions: &GuestRegions,
    o: &UpdateOptions,
) -> Result<Plan> {
    let idx = &base.version.index;
    let cs = idx.chunk_sectors() as u64;
    let len = idx.chunk_len(i);
    let nsec = len / SECTOR as usize;
    let s_base = i as u64 * cs;
    let states: Vec<SectorState> = (0..nsec).map(|k| dev.state(s_base + k as u64)).collect();
    // The cache's data for DIRTY sectors, read in runs.
    let mut cached = vec![0u8; len];
    let mut k = 0;
    while k < nsec {
        if states[k] != SectorState::Dirty {
            k += 1;
            continue;
        }
        let mut e = k + 1;
        while e < nsec && states[e] == SectorState::Dirty {
            e += 1;
        }
        let (a, b) = (k * SECTOR as usize, e * SECTOR as usize);
        dev.cache_dev()
            .read_at(&mut cached[a..b], (s_base + k as u64) * SECTOR)?;
        k = e;
    }
    let mut rep = FilterReport::default();
    let mut fates = vec![Fate::Keep; nsec];
    for k in 0..nsec {
        let st = states[k];
        if st != SectorState::Dirty && st != SectorState::Zero {
            continue;
        }
        rep.dirty += 1;
        let a = k * SECTOR as usize;
        let zero_write = st == SectorState::Zero
            || roamdisk_chunkstore::hash::is_zero(&cached[a..a + SECTOR as usize]);
        let byte = (s_base + k as u64) * SECTOR;
        fates[k] = if o.p1 && zero_write {
            rep.p1_zero += 1;
            Fate::TakeZero
        } else if o.p2 && regions.free.covers(byte, SECTOR) {
            rep.p2_free += 1;
            Fate::Drop
        } else if o.p3 && regions.swap.covers(byte, SECTOR) {
            rep.p3_swap += 1;
            Fate::Drop
        } else {
            rep.committed += 1;
            if st == SectorState::Zero {
                Fate::TakeZero
            } else {
                Fate::TakeData
            }
        };
    }
    let taken = fates
        .iter()
        .any(|f| matches!(f, Fate::TakeData | Fate::TakeZero));
    let content = if taken {
        let needs_base = !idx.ids[i].is_zero()
            && (0..nsec).any(|k| {
                matches!(fates[k], Fate::Keep | Fate::Drop) && idx.state(i, k) == SectorState::Empty
            });
        let mut c = if needs_base {
            base.chunk(i)?.as_ref().clone()
        } else {
            vec![0u8; len]
        };
        for (k, fate) in fates.iter().enumerate() {
            let r = k * SECTOR as usize..(k + 1) * SECTOR as usize;
            match fate {
                Fate::TakeData => c[r.clone()].copy_from_slice(&cached[r]),
                Fate::TakeZero => c[r].fill(0),
                Fate::Keep | Fate::Drop => {
                    if !needs_base {
                        // Base chunk absent or these sectors are ZERO in it.
                        c[r].fill(0);
                    }
                }
            }
        }
        Some(c)
    } else {
        None
    };
    let mut changes = Vec::new();
    let mut zero_fill = Vec::new();
    for k in 0..nsec {
        let s = s_base + k as u64;
        let new = match (fates[k], states[k]) {
            (Fate::Keep, _) => continue,
            (Fate::TakeZero, _) => SectorState::Empty,
            (Fate::TakeData, _) => SectorState::Clean,
            (Fate::Drop, SectorState::Zero) => {
                zero_fill.push((s, s + 1));
                SectorState::Clean
            }
            (Fate::Drop, _) => SectorState::Clean,
        };
        match changes.last_mut() {
            Some((_, e, st)) if *e == s && *st == new => *e += 1,
            _ => changes.push((s, s + 1, new)),
        }
    }
    Ok(Plan {
        record: i,
        content,
        report: rep,
        changes,
        zero_fill,
    })
}

/// The working set a new version keeps: what this session read, first
/// touch first, then the rest of its base's set.
fn carried_working_set(session: Vec<u32>, base: &[u32]) -> Vec<u32> {
    let mut seen: std::collections::HashSet<u32> = session.iter().copied().collect();
    let mut out = session;
    out.extend(base.iter().copied().filter(|c| seen.insert(*c)));
    out
}

/// Commit a session's useful updates as a new version and rebase the
/// session onto it. The session must not be in use (opening it writable
/// took its lock).
pub fn commit_session(
    dev: &CasDev,
    opts: &UpdateOptions,
    analyzer: &dyn GuestAnalyzer,
    progress: &dyn Progress,
) -> Result<CommitSummary> {
    let started = Instant::now();
    dev.flush()?;
    let base = dev.base();
    let bidx = &base.version.index;
    let mut copts = opts.commit.clone();
    if copts.target.is_empty() {
        copts.target = dev.config.target.clone();
    }
    copts.parent = Parent::Given(base.id);
    copts.user_key = dev.user_key().copied();
    if bidx.encrypted() && copts.user_key.is_none() {
        return Err(bad_arg(
            "the base version is encrypted: the session needs the user's key (key-file)",
        ));
    }
    let store = dev.store();
    let regions = if opts.p2 || opts.p3 {
        progress.phase("reading guest metadata", 0);
        analyzer.analyze(dev)?
    } else {
        GuestRegions::default()
    };
    for n in &regions.notes {
        progress.note(n);
    }
    let cs = bidx.chunk_sectors() as u64;
    let dirty: Vec<usize> = (0..bidx.records())
        .into_par_iter()
        .filter(|&i| {
            let s0 = i as u64 * cs;
            let s1 = (s0 + cs).min(dev.sectors());
            (s0..s1).any(|s| matches!(dev.state(s), SectorState::Dirty | SectorState::Zero))
        })
        .collect();
    let mut index = bidx.clone();
    let mut report = FilterReport {
        p1: opts.p1,
        p2: opts.p2,
        p3: opts.p3,
        ..Default::default()
    };
    let mut changes = Vec::new();
    let mut zero_fill = Vec::new();
    let mut up = Uploader::begin(&**store, bidx.encrypted())?;
    progress.phase("committing", dirty.len() as u64 * bidx.chunk_size as u64);
    for batch in dirty.chunks(64) {
        let plans: Vec<Plan> = batch
            .par_iter()
            .map(|&i| plan_chunk(dev, &base, i, &regions, opts))
            .collect::<Result<_>>()?;
        let mut contents = Vec::new();
        for p in plans {
            report.dirty += p.report.dirty;
            report.p1_zero += p.report.p1_zero;
            report.p2_free += p.report.p2_free;
            report.p3_swap += p.report.p3_swap;
            report.committed += p.report.committed;
            changes.extend(p.changes);
            zero_fill.extend(p.zero_fill);
            if let Some(c) = p.content {
                contents.push((p.record, c));
            }
        }
        let refs: Vec<(usize, &[u8])> = contents.iter().map(|(i, c)| (*i, c.as_slice())).collect();
        up.upload(&mut index, &refs)?;
        progress.advance(batch.len() as u64 * bidx.chunk_size as u64);
    }
    let (memory, pages) = roamdisk_chunkstore::commit::take_memory(
        &mut up,
        copts.memory.as_ref(),
        bidx.chunk_size,
        bidx.encrypted(),
        progress,
    )?;
    let version = Version {
        created: now_nanos(),
        parent: Some(base.id),
        description: copts.description.clone(),
        config: if copts.config.is_empty() {
            base.version.config.clone()
        } else {
            copts.config.clone()
        },
        memory,
        index,
        working_set: carried_working_set(dev.working_set(), &base.version.working_set),
        pages,
    };
    let summary = finish_commit(&**store, up, &version, &copts, started, Some(report))?;
    // Rebase: dropped ZERO writes must keep reading as zero from the cache.
    for (a, b) in zero_fill {
        let z = vec![0u8; ((b - a) * SECTOR) as usize];
        dev.cache_dev()
            .write_at(&z, a * SECTOR, WriteFlags::default())?;
    }
    let id = roamdisk_chunkstore::hash::ChunkId::from_hex(&summary.version).expect("hex id");
    dev.rebase(
        VersionView::from_parts(store.clone(), id, version),
        &changes,
    )?;
    Ok(summary)
}

/// Open the session in `dir` (with `open`'s overrides; no prefetch, no
/// read-ahead: a commit reads the session, the guest does not run) and
/// commit its useful updates ([`commit_session`]), with the guest file
/// systems read by [`crate::guest::FsmetaAnalyzer`]. Returns the session,
/// open and rebased onto the new version. `registry` opens the private
/// cache.
pub fn commit_dir(
    dir: &std::path::Path,
    open: &super::dev::SessionOpen,
    opts: &UpdateOptions,
    registry: &roamdisk_blockdev::Registry,
    progress: &dyn Progress,
) -> Result<(CommitSummary, CasDev)> {
    let dev = open_to_commit(dir, open, registry)?;
    let summary = commit_session(&dev, opts, &crate::guest::FsmetaAnalyzer, progress)?;
    Ok((summary, dev))
}

/// The session in `dir`, opened to be committed (no prefetch, no
/// read-ahead).
pub fn open_to_commit(
    dir: &std::path::Path,
    open: &super::dev::SessionOpen,
    registry: &roamdisk_blockdev::Registry,
) -> Result<CasDev> {
    let open = super::dev::SessionOpen {
        no_prefetch: true,
        no_readahead: true,
        ..open.clone()
    };
    CasDev::open(dir, &open, registry)
}
