//! Garbage collection: mark every object a version in a catalog
//! references, sweep the rest, safely while commits run.
//!
//! Order (argument in `docs/formats/cas-store.md`, "gc and commits"):
//! 1. put back anything a crashed gc left aside; remove stale temp files;
//! 2. read the leases of running commits: the cutoff is the earliest start
//!    among live leases (and now), minus a margin;
//! 3. mark from every catalog (a version's package and everything it
//!    references); an unreadable version stops gc before anything is
//!    removed;
//! 4. remove every unmarked object last stored or referenced before the
//!    cutoff, atomically against a concurrent touch.
//!
//! A commit touches every object it references after taking its lease and
//! adds its version to its catalog before ending the lease, so its objects
//! are either marked (step 3 sees the catalog entry) or newer than the
//! cutoff (its lease was seen in step 2, or it started after it).

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::catalog::Catalog;
use crate::error::context;
use crate::hash::ChunkId;
use crate::store::{fetch, ChunkPrune, LeaseStore, RefStore};
use crate::version::Version;
use roamdisk_blockdev::Progress;
use roamdisk_blockdev::Result;

/// Candidates handed to the store at once (a local store rewrites each
/// pack once per batch).
const SWEEP_BATCH: usize = 1 << 16;

/// Options of a gc run.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// A lease not refreshed for this long belongs to a dead commit.
    pub lease_timeout: Duration,
    /// Safety margin subtracted from the cutoff (clock granularity).
    pub margin: Duration,
    /// Report what would be removed, remove nothing.
    pub dry_run: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            lease_timeout: Duration::from_secs(3600),
            margin: Duration::from_secs(5),
            dry_run: false,
        }
    }
}

/// What a gc run found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub catalogs: u64,
    pub versions: u64,
    /// Objects referenced by some version (packages included).
    pub referenced: u64,
    pub objects: u64,
    pub bytes: u64,
    pub removed_objects: u64,
    pub removed_bytes: u64,
    /// Unreferenced but too recent to remove (a commit may be using them).
    pub kept_recent: u64,
    pub live_leases: u64,
    pub stale_leases: u64,
    /// Objects a crashed gc had moved aside, put back.
    pub restored: u64,
    pub temp_removed: u64,
    pub seconds: f64,
    pub dry_run: bool,
}

/// Mark: every object referenced by a version of any catalog.
pub fn mark<S: ChunkPrune + RefStore + LeaseStore + ?Sized>(
    store: &S,
    progress: &dyn Progress,
    report: &mut GcReport,
) -> Result<HashSet<ChunkId>> {
    let mut marked = HashSet::new();
    let refs = store.ref_list()?;
    progress.items("marking", refs.len() as u64);
    for name in refs {
        let Some(bytes) = store.ref_get(&name)? else {
            continue;
        };
        let mut cat = Catalog::parse(&bytes).map_err(|e| {
            context(
                e,
                format!("gc stopped, nothing was removed: catalog {name} is unreadable"),
            )
        })?;
        // Its sealed segments are objects it references, and hold the
        // older versions.
        marked.extend(cat.segments.iter().map(|g| g.id));
        crate::repo::load_segments(store, &name, &mut cat)
            .map_err(|e| context(e, "gc stopped, nothing was removed"))?;
        report.catalogs += 1;
        for e in &cat.entries {
            report.versions += 1;
            if !marked.insert(e.version) {
                continue;
            }
            let pkg = fetch(store, &e.version, None).map_err(|err| {
                context(
                    err,
                    format!(
                        "gc stopped, nothing was removed: version {} of {name} is unreadable (remove it with `roamdisk rm {name}@{}` if it is lost)",
                        e.version,
                        e.version.short()
                    ),
                )
            })?;
            let r = Version::references_of(&pkg).map_err(|err| {
                context(err, format!("gc stopped: version {} of {name}", e.version))
            })?;
            marked.extend(r);
        }
        progress.advance(1);
    }
    report.referenced = marked.len() as u64;
    Ok(marked)
}

/// Run a garbage collection.
pub fn gc<S: ChunkPrune + RefStore + LeaseStore + ?Sized>(
    store: &S,
    opts: &GcOptions,
    progress: &dyn Progress,
) -> Result<GcReport> {
    let started = Instant::now();
    let mut report = GcReport {
        dry_run: opts.dry_run,
        ..Default::default()
    };
    let t0 = store.now()?;
    let stale_before = t0
        .checked_sub(opts.lease_timeout)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if !opts.dry_run {
        let (restored, temps) = store.recover(stale_before)?;
        report.restored = restored;
        report.temp_removed = temps;
    }
    // Leases before catalogs (see the module comment).
    let mut cutoff = t0;
    for l in store.leases()? {
        if l.refreshed >= stale_before {
            report.live_leases += 1;
            cutoff = cutoff.min(l.started);
        } else if l.ended {
            // A finished commit's lease, kept until listings caught up.
            if !opts.dry_run {
                store.lease_end(&l.id)?;
            }
        } else {
            report.stale_leases += 1;
            progress.note(&format!(
                "lease {} belongs to a commit that stopped (killed or crashed); its uploads are collectable",
                l.id
            ));
            if !opts.dry_run {
                store.lease_end(&l.id)?;
            }
        }
    }
    let cutoff = cutoff
        .checked_sub(opts.margin.max(store.min_margin()))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let marked = mark(store, progress, &mut report)?;
    let mut candidates = Vec::new();
    store.list_objects(&mut |e| {
        report.objects += 1;
        report.bytes += e.size;
        if !marked.contains(&e.id) {
            if e.mtime < cutoff {
                candidates.push(e.id);
            } else {
                report.kept_recent += 1;
            }
        }
    })?;
    progress.items("sweeping", candidates.len() as u64);
    for batch in candidates.chunks(SWEEP_BATCH) {
        if opts.dry_run {
            report.removed_objects += batch.len() as u64;
        } else {
            for r in store.remove_many_if_older(batch, cutoff)? {
                match r {
                    Some(n) => {
                        report.removed_objects += 1;
                        report.removed_bytes += n;
                    }
                    None => report.kept_recent += 1,
                }
            }
        }
        progress.advance(batch.len() as u64);
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::{commit_image, CommitOptions, Source};
    use crate::store::local::testing::store;
    use crate::store::prelude::*;
    use crate::store::{ChunkRead, ChunkWrite};
    use roamdisk_blockdev::layers::mem::MemDev;
    use roamdisk_blockdev::NoProgress;
    use roamdisk_blockdev::{BlockDev, WriteFlags};

    fn disk(seed: u8) -> MemDev {
        let m = MemDev::new(1 << 20);
        let d: Vec<u8> = (0..1u32 << 20).map(|i| (i as u8) ^ seed).collect();
        m.write_at(&d, 0, WriteFlags::default()).unwrap();
        m
    }

    #[test]
    fn sweeps_unreferenced_keeps_referenced_and_leased() {
        let (_d, s) = store();
        let opts = CommitOptions {
            target: "u/img".into(),
            ..Default::default()
        };
        let a = commit_image(&s, Source::Dev(&disk(1)), &opts, &NoProgress).unwrap();
        // An orphan, old enough to collect.
        let orphan = s.config().codec().seal(b"orphan", false);
        s.put_many(&[(orphan.id, &orphan.object)]).unwrap();
        // A commit in progress holds a lease and has uploaded a chunk.
        let lease = s.lease_begin().unwrap();
        let pending = s.config().codec().seal(b"pending", false);
        s.put_many(&[(pending.id, &pending.object)]).unwrap();
        let zero_margin = GcOptions {
            margin: Duration::ZERO,
            ..Default::default()
        };
        // Make the orphan look old.
        let p = s.object_path(&orphan.id);
        let old = SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let r = gc(&s, &zero_margin, &NoProgress).unwrap();
        assert_eq!(r.removed_objects, 1, "{r:?}");
        assert!(!s.has_many(&[orphan.id], false).unwrap()[0]);
        assert!(
            s.has_many(&[pending.id], false).unwrap()[0],
            "leased upload kept"
        );
        assert_eq!(r.live_leases, 1);
        s.lease_end(&lease.id).unwrap();
        // The committed version still reads back.
        let id = ChunkId::from_hex(&a.version).unwrap();
        let v = crate::repo::load_version(&s, &id, None).unwrap();
        for rid in v.references() {
            assert!(s.has_many(&[rid], false).unwrap()[0]);
        }
    }
}
