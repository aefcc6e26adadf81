//! Commits: the initial commit of any disk (a block-device stack, or a
//! stream such as a memory image file) and the pieces shared with the update
//! commit of a session (`roamdisk_roam::session`): building the version package,
//! storing it before the catalog names it, and the summary.
//!
//! Order of a commit (seed section 3.4; crash argument in
//! `docs/formats/cas-store.md`): take a lease; upload chunks (only the
//! ones the store lacks); make them durable; store the version package
//! and make it durable; refresh the lease; append the version to the
//! catalog by compare-and-swap; refresh the lease again (a commit stopped
//! past the lease timeout may have lost its uploads to a gc); end the
//! lease. A crash anywhere before the catalog update leaves the previous
//! version current and nothing half-visible.

use std::collections::HashSet;
use std::io::Read;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::catalog::{now_nanos, Entry};
use crate::chunk::Key;
use crate::error::{bad_arg, context, err};
use crate::hash::ChunkId;
use crate::index::{valid_chunk_size, Index, SECTOR};
use crate::memimage::MemoryPages;
use crate::repo::{read_catalog, update_catalog};
use crate::store::{ChunkWrite, LeaseStore, RefStore};
use crate::upload::{Prepared, UploadStats, Uploader};
use crate::version::{Memory, Version};
use roamdisk_blockdev::Progress;
use roamdisk_blockdev::{extents_covering, BlockDev, ErrorKind, Op, Result};

/// Which version a new one descends from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// The latest version of the target catalog, if any.
    Latest,
    /// None (a new history).
    None,
    /// This version.
    Given(ChunkId),
}

/// The memory image a version keeps (a suspended VM's state).
#[derive(Debug, Clone)]
pub enum MemoryImage {
    /// A file, chunked and uploaded by the commit.
    File(std::path::PathBuf),
    /// Already chunked and uploaded ([`upload_memory_stream`]) by an
    /// uploader that is still alive (its lease keeps the chunks from a
    /// gc until the version names them); `stats` is what that took.
    Uploaded { memory: Memory, stats: UploadStats },
    /// A running VM's memory as pages, uploaded like `Uploaded`.
    Pages {
        pages: Box<MemoryPages>,
        stats: UploadStats,
    },
}

/// Options of a commit.
#[derive(Debug, Clone)]
pub struct CommitOptions {
    /// The catalog the version goes to: `USER/IMAGE`.
    pub target: String,
    pub description: String,
    /// Chunk size of an initial commit (an update keeps its base's).
    pub chunk_size: u32,
    /// The user's key: convergent encryption of chunks, sealed index.
    pub user_key: Option<Key>,
    /// The VM configuration file.
    pub config: Vec<u8>,
    /// A memory image to keep with the version.
    pub memory: Option<MemoryImage>,
    pub parent: Parent,
    /// A tag for the new version.
    pub tag: Option<String>,
    /// Read at most this many disk bytes per second (spare the network
    /// or the disk for other users).
    pub rate_limit: Option<u64>,
}

impl Default for CommitOptions {
    fn default() -> Self {
        CommitOptions {
            target: String::new(),
            description: String::new(),
            chunk_size: crate::index::DEFAULT_CHUNK,
            user_key: None,
            config: Vec::new(),
            memory: None,
            parent: Parent::Latest,
            tag: None,
            rate_limit: None,
        }
    }
}

/// Useful-update filter statistics of an update commit (the seed's
/// Figure 9), in sectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FilterReport {
    /// Sectors written in the session (DIRTY or ZERO).
    pub dirty: u64,
    /// Dropped by P1: written zeroes, kept as ZERO with no data.
    pub p1_zero: u64,
    /// Dropped by P2: in clusters the guest file system marks free.
    pub p2_free: u64,
    /// Dropped by P3: in guest swap.
    pub p3_swap: u64,
    /// Left: sectors whose data goes into new chunks.
    pub committed: u64,
    /// Which filters ran.
    pub p1: bool,
    pub p2: bool,
    pub p3: bool,
}

/// What a commit did.
#[derive(Debug, Clone, Serialize)]
pub struct CommitSummary {
    pub version: String,
    pub catalog: String,
    pub parent: Option<String>,
    pub disk_size: u64,
    pub chunk_size: u32,
    pub upload: UploadStats,
    /// Size of the compressed index in the package.
    pub index_bytes: usize,
    pub package_bytes: usize,
    pub seconds: f64,
    /// Disk bytes processed per second.
    pub mb_per_s: f64,
    pub filters: Option<FilterReport>,
    pub encrypted: bool,
    /// The part of `upload` that was the memory image (all zero without
    /// one).
    pub memory_upload: UploadStats,
}

/// Where an initial commit reads the disk from.
pub enum Source<'a> {
    /// A block device (any stack); holes are not read.
    Dev(&'a dyn BlockDev),
}

impl Source<'_> {
    fn size(&self) -> u64 {
        match self {
            Source::Dev(d) => d.size(),
        }
    }
}

/// Bytes read per batch (hashed and uploaded together). For a chunk
/// server each batch is one have request, then batch puts over the
/// connections, then the next batch: 64 MiB batches left the uploads idle
/// less often (`store serve s3://` in front of Swift, 512 MiB commit: 87 ->
/// 127 MB/s) but took a commit's peak memory from ~115 to ~500 MB; the way
/// to keep uploads busy is to pipeline the batches, not to grow them.
const BATCH_BYTES: usize = 16 << 20;

/// Chunks read together: records `first..first + holes.len()`, their
/// bytes back to back in `data` (hole chunks are not read: their bytes are
/// left over from an earlier batch and never used).
struct Batch {
    first: usize,
    data: Vec<u8>,
    holes: Vec<bool>,
}

impl Batch {
    /// The chunks read (record number, content).
    fn chunks(&self, chunk: usize) -> Vec<(usize, &[u8])> {
        let mut out = Vec::with_capacity(self.holes.len());
        for (k, hole) in self.holes.iter().enumerate() {
            if !*hole {
                let a = k * chunk;
                let b = (a + chunk).min(self.data.len());
                out.push((self.first + k, &self.data[a..b]));
            }
        }
        out
    }
}

/// Read the source batch by batch into buffers taken from `free` (the
/// consumer sends each batch's buffer back when done, so the same few
/// buffers are filled again and again: no page faults or zeroing of fresh
/// memory per batch).
fn read_batches(
    src: Source<'_>,
    chunk: usize,
    tx: std::sync::mpsc::SyncSender<Result<Batch>>,
    free: std::sync::mpsc::Receiver<Vec<u8>>,
) {
    let size = src.size();
    let n = size.div_ceil(chunk as u64) as usize;
    let per = (BATCH_BYTES / chunk).max(1);
    let Source::Dev(dev) = src;
    // The allocation map of the whole source, once (asking per batch makes
    // SEEK_HOLE rescan the rest of the file every time).
    let extents = match extents_covering(dev, 0, size) {
        Ok(e) => e,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    let mut ext_at = 0usize;
    let mut ext_off = 0u64;
    for first in (0..n).step_by(per) {
        let last = (first + per).min(n);
        let off = first as u64 * chunk as u64;
        let len = ((last as u64 * chunk as u64).min(size) - off) as usize;
        let r = (|| {
            // Bytes of hole chunks are left as they are: they are not used.
            let mut data = free.try_recv().unwrap_or_default();
            data.resize(len, 0);
            // Chunks entirely inside zero/hole extents are not read.
            let mut holes = vec![true; last - first];
            let end = off + len as u64;
            while ext_at < extents.len() && ext_off < end {
                let e = extents[ext_at];
                let (a, b) = (ext_off.max(off), (ext_off + e.len).min(end));
                if !e.state.is_zero() && b > a {
                    let ka = ((a - off) / chunk as u64) as usize;
                    let kb = ((b - off).div_ceil(chunk as u64)) as usize;
                    for h in &mut holes[ka..kb.min(last - first)] {
                        *h = false;
                    }
                }
                if ext_off + e.len <= end {
                    ext_off += e.len;
                    ext_at += 1;
                } else {
                    break;
                }
            }
            // Read runs of non-hole chunks, one request each.
            let mut k = 0;
            while k < holes.len() {
                if holes[k] {
                    k += 1;
                    continue;
                }
                let mut e = k + 1;
                while e < holes.len() && !holes[e] {
                    e += 1;
                }
                let a = k * chunk;
                let b = (e * chunk).min(len);
                dev.read_at(&mut data[a..b], off + a as u64)?;
                k = e;
            }
            Ok(Batch { first, data, holes })
        })();
        let failed = r.is_err();
        if tx.send(r).is_err() || failed {
            return;
        }
    }
}

/// Bytes of chunks stored as one group when workers read their own chunks
/// (one pack in a local store: one round of "make durable, then name").
const GROUP_BYTES: usize = 32 << 20;

/// Which chunks of `dev` lie entirely in holes or zero extents (they are
/// not read), from its allocation map asked once.
fn hole_map(dev: &dyn BlockDev, chunk: usize) -> Result<Vec<bool>> {
    let size = dev.size();
    let n = size.div_ceil(chunk as u64) as usize;
    let mut holes = vec![true; n];
    let mut off = 0u64;
    for e in extents_covering(dev, 0, size)? {
        if !e.state.is_zero() && e.len > 0 {
            let a = (off / chunk as u64) as usize;
            let b = ((off + e.len).div_ceil(chunk as u64) as usize).min(n);
            holes[a..b].fill(false);
        }
        off += e.len;
    }
    Ok(holes)
}

/// Chunk, hash and upload a whole source into `index` (whose geometry
/// matches the source).
pub(crate) fn upload_source<S: ChunkWrite + LeaseStore + ?Sized>(
    up: &mut Uploader<'_, S>,
    index: &mut Index,
    src: Source<'_>,
    progress: &dyn Progress,
    phase: &'static str,
    rate_limit: Option<u64>,
) -> Result<()> {
    let chunk = index.chunk_size as usize;
    progress.phase(phase, src.size());
    let t0 = Instant::now();
    let mut done = 0u64;
    let pace = |done: u64| {
        if let Some(rate) = rate_limit.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(done as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    };
    if let (Source::Dev(dev), true) = (&src, up.per_chunk()) {
        // Each worker reads, hashes and writes its own chunks.
        let dev = *dev;
        let size = dev.size();
        let holes = hole_map(dev, chunk)?;
        let len_of = |i: usize| (size - i as u64 * chunk as u64).min(chunk as u64);
        // Bytes read so far, by all workers (paced chunk by chunk).
        let read_bytes = std::sync::atomic::AtomicU64::new(0);
        let read = |i: usize, buf: &mut Vec<u8>| -> Result<()> {
            let len = len_of(i);
            buf.resize(len as usize, 0);
            dev.read_at(buf, i as u64 * chunk as u64)?;
            progress.advance(len);
            pace(read_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed) + len);
            Ok(())
        };
        let mut records = Vec::with_capacity(holes.len());
        for (i, hole) in holes.iter().enumerate() {
            if *hole {
                index.set_zero(i);
                up.stats.chunks += 1;
                up.stats.zero_chunks += 1;
                progress.advance(len_of(i));
            } else {
                records.push(i);
            }
        }
        up.upload_each(index, &records, (GROUP_BYTES / chunk).max(1), chunk, &read)?;
        return Ok(());
    }
    // Batches: read on one thread; hashed, asked about and sealed on this
    // one; put on their own threads, up to the store's groups in flight at
    // once (a chunk server: the next batch is hashed and asked about while
    // the uploads of the last ones go on).
    let limit = up.store().groups_in_flight().max(1);
    let store = up.store();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (free_tx, free_rx) = std::sync::mpsc::channel();
        scope.spawn(move || read_batches(src, chunk, tx, free_rx));
        type Putting<'s> = std::thread::ScopedJoinHandle<
            's,
            (Batch, Prepared, Result<Vec<crate::store::PutOutcome>>),
        >;
        let mut behind: std::collections::VecDeque<Putting<'_>> = Default::default();
        let mut in_flight: HashSet<ChunkId> = HashSet::new();
        let land = |h: Putting<'_>,
                    up: &mut Uploader<'_, S>,
                    index: &mut Index,
                    in_flight: &mut HashSet<ChunkId>|
         -> Result<()> {
            let (batch, prepared, outcomes) = h.join().expect("upload thread");
            for id in prepared.ids() {
                in_flight.remove(id);
            }
            up.account_batch(index, &batch.chunks(chunk), prepared, outcomes)?;
            let _ = free_tx.send(batch.data);
            Ok(())
        };
        for batch in rx {
            let batch = batch?;
            let bytes = batch.data.len() as u64;
            for (k, hole) in batch.holes.iter().enumerate() {
                if *hole {
                    // Unread (hole) chunks are zero.
                    index.set_zero(batch.first + k);
                    up.stats.chunks += 1;
                    up.stats.zero_chunks += 1;
                }
            }
            let prepared = up.prepare(index, &batch.chunks(chunk), &in_flight)?;
            while behind.len() >= limit {
                let h = behind.pop_front().expect("a batch behind");
                land(h, up, index, &mut in_flight)?;
            }
            in_flight.extend(prepared.ids().copied());
            behind.push_back(scope.spawn(move || {
                let outcomes = prepared.put(store, &batch.chunks(chunk));
                (batch, prepared, outcomes)
            }));
            progress.advance(bytes);
            done += bytes;
            pace(done);
        }
        while let Some(h) = behind.pop_front() {
            land(h, up, index, &mut in_flight)?;
        }
        Ok(())
    })
}

/// The memory image `image` as the version's: a file is chunked and
/// uploaded now, an uploaded one is taken as it is (its stats added to the
/// commit's).
pub fn take_memory<S: ChunkWrite + LeaseStore + ?Sized>(
    up: &mut Uploader<'_, S>,
    image: Option<&MemoryImage>,
    chunk_size: u32,
    encrypted: bool,
    progress: &dyn Progress,
) -> Result<(Memory, Option<MemoryPages>)> {
    match image {
        None => Ok((Memory::default(), None)),
        Some(MemoryImage::Uploaded { memory, stats }) => {
            // Under this commit's lease from now on (the uploader that
            // stored them may have been idle longer than a lease lasts).
            up.claim(&memory.ids)?;
            up.stats += *stats;
            up.memory = *stats;
            Ok((memory.clone(), None))
        }
        Some(MemoryImage::Pages { pages, stats }) => {
            let ids: Vec<ChunkId> = pages.ids().copied().collect();
            up.claim(&ids)?;
            up.stats += *stats;
            up.memory = *stats;
            Ok((Memory::default(), Some((**pages).clone())))
        }
        Some(MemoryImage::File(path)) => {
            let f = std::fs::File::open(path).map_err(|e| {
                crate::error::io(Op::Open, e, path).msg("cannot open the memory image")
            })?;
            let size = f
                .metadata()
                .map_err(|e| crate::error::io(Op::Open, e, path))?
                .len();
            let before = up.stats;
            let m = upload_memory_stream(up, f, chunk_size, encrypted, size, progress)?;
            up.memory = up.stats - before;
            Ok((m, None))
        }
    }
}

/// Chunk and upload a memory image read from `src` to its end (a file, or
/// a VM's migration stream of unknown length), [`BATCH_BYTES`] at a time:
/// memory use does not grow with the image. `size_hint` is the expected
/// size for the progress bar (0: unknown).
pub fn upload_memory_stream<S: ChunkWrite + LeaseStore + ?Sized>(
    up: &mut Uploader<'_, S>,
    mut src: impl Read,
    chunk_size: u32,
    encrypted: bool,
    size_hint: u64,
    progress: &dyn Progress,
) -> Result<Memory> {
    let chunk = chunk_size as usize;
    let per = (BATCH_BYTES / chunk).max(1) * chunk;
    progress.phase("memory image", size_hint);
    let mut m = Memory::default();
    let mut buf = vec![0u8; per];
    loop {
        // Fill the batch (a stream returns short reads).
        let mut len = 0;
        while len < per {
            match src.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        format!(
                            "the memory image failed near byte {}: {e}",
                            m.size + len as u64
                        ),
                    ))
                }
            }
        }
        if len == 0 {
            break;
        }
        let padded = (len as u64).div_ceil(SECTOR) * SECTOR;
        let mut idx = Index::new_zero(up.hash(), chunk_size, padded, encrypted)?;
        let data: Vec<(usize, &[u8])> = buf[..len].chunks(chunk).enumerate().collect();
        up.upload(&mut idx, &data)?;
        m.size += len as u64;
        m.ids.extend(idx.ids);
        m.keys.extend(idx.keys);
        progress.advance(len as u64);
        if len < per {
            break;
        }
    }
    progress.end();
    Ok(m)
}

/// Store a finished version: package first (durable), then the catalog
/// entry, with the lease refreshed before and after it. Returns the
/// summary.
pub fn finish_commit<S: ChunkWrite + RefStore + LeaseStore + ?Sized>(
    store: &S,
    mut up: Uploader<'_, S>,
    version: &Version,
    opts: &CommitOptions,
    started: Instant,
    filters: Option<FilterReport>,
) -> Result<CommitSummary> {
    let index = version.index.encode(Some(9));
    let index_bytes = index.len();
    let package = version.encode_with_index(&index, opts.user_key.as_ref())?;
    up.sync()?;
    let id = up.put_object(&package)?;
    up.sync()?;
    // Stopped for longer than the lease timeout, a commit may have lost
    // what it uploaded to a gc: it stops before a catalog names it.
    up.confirm_lease().map_err(|e| {
        context(
            e,
            "commit stopped before adding its version to the catalog; the previous version is intact",
        )
    })?;
    let stats = up.stats;
    let memory_upload = up.memory;
    let entry = Entry {
        version: id,
        parent: version.parent,
        created: version.created,
        disk_size: version.index.disk_size,
        encrypted: version.index.encrypted(),
        new_objects: stats.new_objects,
        reused_objects: stats.reused_objects,
        uploaded_bytes: stats.uploaded_bytes,
        data_bytes: version.index.data_bytes(),
        description: version.description.clone(),
        tags: opts.tag.iter().cloned().collect(),
    };
    update_catalog(store, &opts.target, |c| {
        if let Some(t) = &opts.tag {
            for e in &mut c.entries {
                e.tags.retain(|x| x != t);
            }
        }
        c.entries.retain(|e| e.version != id);
        c.entries.push(entry.clone());
        Ok(())
    })
    .map_err(|e| {
        context(
            e,
            format!(
                "version {id} is stored but could not be added to catalog {}",
                opts.target
            ),
        )
    })?;
    // The lease still there proves that no gc took the commit for dead
    // before its version was in the catalog (`docs/formats/cas-store.md`,
    // "A commit"); without it, the version stays only if it is complete.
    if let Err(lost) = up.confirm_lease() {
        keep_or_withdraw(store, &opts.target, id, version, lost)?;
    }
    drop(up);
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    Ok(CommitSummary {
        version: id.to_hex(),
        catalog: opts.target.clone(),
        parent: version.parent.map(|p| p.to_hex()),
        disk_size: version.index.disk_size,
        chunk_size: version.index.chunk_size,
        upload: stats,
        index_bytes,
        package_bytes: package.len(),
        seconds: secs,
        mb_per_s: version.index.disk_size as f64 / 1e6 / secs,
        filters,
        encrypted: version.index.encrypted(),
        memory_upload,
    })
}

/// After the catalog update of a commit whose lease could not be
/// refreshed (`lost`: a gc took the commit for dead while it was stopped,
/// or the store did not answer): version `id` stays if every object it
/// needs is there — touched, so a gc sweeping now keeps them, and later
/// ones mark the version; it is taken out of the catalog again if some
/// are gone; when the store cannot tell, the user is told to check it.
fn keep_or_withdraw<S: ChunkWrite + RefStore + LeaseStore + ?Sized>(
    store: &S,
    target: &str,
    id: ChunkId,
    version: &Version,
    lost: roamdisk_blockdev::Error,
) -> Result<()> {
    let mut needs = version.references();
    needs.push(id);
    let rm = format!("`roamdisk rm {target}@{}`", id.short());
    let what = match store.has_many(&needs, true) {
        Ok(have) if have.iter().all(|&h| h) => return Ok(()),
        Ok(_) => {
            let withdrawn = update_catalog(store, target, |c| {
                c.entries.retain(|e| e.version != id);
                Ok(())
            });
            match withdrawn {
                Ok(_) => "a gc removed objects it needs while its commit was stopped (its lease was gone); it was taken out of the catalog again: commit again".to_string(),
                Err(e) => format!("a gc removed objects it needs while its commit was stopped (its lease was gone), and it is still listed ({e}): remove it with {rm} and commit again"),
            }
        }
        Err(e) => format!(
            "whether it is complete cannot be told ({e}): check it with `roamdisk store verify`, and if it is incomplete remove it with {rm} and commit again"
        ),
    };
    Err(context(
        lost,
        format!("version {id} was added to catalog {target}, but its commit could not refresh its lease; {what}"),
    ))
}

/// Resolve the parent of a new version in `opts.target`.
pub(crate) fn parent_of<S: RefStore + ?Sized>(
    store: &S,
    opts: &CommitOptions,
) -> Result<Option<ChunkId>> {
    Ok(match opts.parent {
        Parent::None => None,
        Parent::Given(id) => Some(id),
        Parent::Latest => read_catalog(store, &opts.target)?
            .0
            .latest()
            .map(|e| e.version),
    })
}

/// Commit a whole disk as a new version of `opts.target`: chunk it, hash
/// on all cores, upload only the chunks the store lacks.
pub fn commit_image<S: ChunkWrite + RefStore + LeaseStore + ?Sized>(
    store: &S,
    src: Source<'_>,
    opts: &CommitOptions,
    progress: &dyn Progress,
) -> Result<CommitSummary> {
    let started = Instant::now();
    crate::store::check_ref_name(&opts.target)?;
    if !valid_chunk_size(opts.chunk_size) {
        return Err(bad_arg(format!(
            "chunk size {} must be a power of two from 4 KiB to 4 MiB",
            opts.chunk_size
        )));
    }
    let size = src.size();
    if !size.is_multiple_of(SECTOR) || size == 0 {
        return Err(bad_arg(format!(
            "the disk is {size} bytes; a committed disk must be a non-zero multiple of 512 bytes"
        )));
    }
    let parent = parent_of(store, opts)?;
    let hash = store.config().hash;
    let mut index = Index::new_zero(hash, opts.chunk_size, size, opts.user_key.is_some())?;
    let mut up = Uploader::begin(store, opts.user_key.is_some())?;
    upload_source(
        &mut up,
        &mut index,
        src,
        progress,
        "committing",
        opts.rate_limit,
    )?;
    let (memory, pages) = take_memory(
        &mut up,
        opts.memory.as_ref(),
        opts.chunk_size,
        opts.user_key.is_some(),
        progress,
    )?;
    let version = Version {
        created: now_nanos(),
        parent,
        description: opts.description.clone(),
        config: opts.config.clone(),
        memory,
        index,
        working_set: Vec::new(),
        pages,
    };
    finish_commit(store, up, &version, opts, started, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;
    use crate::store::{ChunkRead, StoreConfig, StoreLayer};
    use roamdisk_blockdev::progress::NoProgress;

    /// A reader handing out at most 1000 bytes per call, as a socket does.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.0.len()).min(1000);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_memory_stream_of_any_length_is_chunked_like_a_file_across_batches() {
        let store = MemStore::new(StoreConfig::default());
        let chunk = 64 << 10;
        // Past one batch, not a whole number of chunks or sectors; one
        // zero chunk in the middle.
        let len = BATCH_BYTES + 3 * chunk + 777;
        let mut x = 7u64;
        let mut data: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 56) as u8
            })
            .collect();
        data[2 * chunk..3 * chunk].fill(0);
        let mut up = Uploader::begin(&store, false).unwrap();
        let m = upload_memory_stream(&mut up, Trickle(&data), chunk as u32, false, 0, &NoProgress)
            .unwrap();
        assert_eq!(m.size, len as u64);
        assert_eq!(m.ids.len(), len.div_ceil(chunk));
        let codec = store.config().codec();
        for (i, piece) in data.chunks(chunk).enumerate() {
            if i == 2 {
                assert!(m.ids[i].is_zero(), "a zero chunk is stored as nothing");
                continue;
            }
            assert_eq!(m.ids[i], codec.hash.hash(piece), "chunk {i}");
            let obj = store.get(&m.ids[i]).unwrap();
            assert_eq!(
                codec.open(&m.ids[i], None, &obj).unwrap(),
                piece,
                "chunk {i}"
            );
        }
        // An empty stream is an empty image.
        let e = upload_memory_stream(&mut up, Trickle(&[]), chunk as u32, false, 0, &NoProgress)
            .unwrap();
        assert_eq!(e, Memory::default());
    }
}
