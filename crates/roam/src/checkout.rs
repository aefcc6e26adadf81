//! Checking a version out: [`materialise`] copies its disk into any
//! writable device, [`write_memory`] its memory image into a file, both
//! fetching chunks in batches through the view's chain.

use roamdisk_blockdev::{BlockDev, Op, Progress, Result, WriteFlags};
use roamdisk_chunkstore::error::context;
use roamdisk_chunkstore::index::{SectorState, SECTOR};
use std::sync::Arc;

use crate::fetch::{GatherStats, Wanted};
use crate::view::{VersionView, GATHER_BATCH};

/// Write the version's memory image to `w`: its chunks gathered in
/// batches from the shared cache, lookaside media or the store (each
/// verified as it arrives). A page image is written as the migration
/// stream QEMU loads (`-incoming "exec:cat FILE"`).
pub fn write_memory(view: &VersionView, w: &mut dyn std::io::Write) -> Result<GatherStats> {
    if view.version.pages.is_some() {
        return crate::memory::eager::write_precopy(view, w);
    }
    let mut stats = GatherStats::default();
    for batch in view.memory_chunks().chunks(GATHER_BATCH) {
        let wanted: Vec<Wanted> = batch.iter().filter(|c| !c.id.is_zero()).copied().collect();
        let mut got = view.gather(&wanted, true)?.into_iter();
        for c in batch {
            let data = if c.id.is_zero() {
                Arc::new(vec![0u8; c.len])
            } else {
                let g = got.next().expect("one result per chunk");
                stats.add(&g, c.len);
                g.data.expect("gathered with data")
            };
            w.write_all(&data)
                .map_err(|e| roamdisk_blockdev::Error::io(Op::Write, "cas", e))?;
        }
    }
    Ok(stats)
}

/// Batches of chunks fetched and written at once by [`materialise`]: a
/// remote store's round trips overlap.
const MATERIALISE_THREADS: usize = 4;

/// Pieces smaller than this are gathered with their neighbours into one
/// write ([`Runs`]); larger ones are written as they are.
const SMALL_WRITE: usize = 64 << 10;
/// Most bytes gathered into one write.
const RUN_MAX: usize = 1 << 20;

/// Writes of adjacent small pieces gathered into one: a checkout of 4 KiB
/// chunks made one `pwrite` per chunk (406k for 4 GiB), and at 16 GiB the
/// writers spent a third of the time on the file's lock and in the page
/// cache's per-write path.
struct Runs<'d> {
    dst: &'d dyn BlockDev,
    /// Held for each write: a file's buffered writes take its lock one at
    /// a time anyway, and threads waiting here sleep where in the kernel
    /// they spin (`rwsem_spin_on_owner`, 21% of a 16 GiB checkout).
    turn: &'d parking_lot::Mutex<()>,
    buf: Vec<u8>,
    at: u64,
}

impl<'d> Runs<'d> {
    fn new(dst: &'d dyn BlockDev, turn: &'d parking_lot::Mutex<()>) -> Self {
        Runs {
            dst,
            turn,
            buf: Vec::new(),
            at: 0,
        }
    }

    /// Write `data` at `off`, now or with the next pieces.
    fn put(&mut self, data: &[u8], off: u64) -> Result<()> {
        let joins = self.at + self.buf.len() as u64 == off;
        if !self.buf.is_empty() && (!joins || self.buf.len() + data.len() > RUN_MAX) {
            self.flush()?;
        }
        if data.len() >= SMALL_WRITE {
            self.flush()?;
            let _turn = self.turn.lock();
            return self.dst.write_at(data, off, WriteFlags::default());
        }
        if self.buf.is_empty() {
            self.at = off;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Write what is gathered.
    fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            let _turn = self.turn.lock();
            self.dst
                .write_at(&self.buf, self.at, WriteFlags::default())?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Copy every non-zero sector of a version into `dst` (which must read
/// as zeroes beforehand: a new sparse file or image). Chunks are gathered
/// ([`VersionView::gather`]) in batches, verified in parallel, several
/// batches at once (each written where it belongs, in any order). Returns
/// the bytes written.
pub fn materialise(view: &VersionView, dst: &dyn BlockDev, progress: &dyn Progress) -> Result<u64> {
    let idx = &view.version.index;
    progress.phase("checking out", idx.disk_size);
    let batch = GATHER_BATCH;
    let batches = idx.records().div_ceil(batch);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let turn = parking_lot::Mutex::new(());
    let one = |first: usize| -> Result<u64> {
        let mut written = 0u64;
        let mut runs = Runs::new(dst, &turn);
        let recs: Vec<usize> = (first..(first + batch).min(idx.records())).collect();
        let wanted: Vec<usize> = recs
            .iter()
            .copied()
            .filter(|&i| !idx.ids[i].is_zero())
            .collect();
        let objects: Vec<Wanted> = wanted.iter().map(|&i| view.disk_chunk(i)).collect();
        let decoded = view.gather(&objects, true).map_err(|e| {
            context(
                e,
                format!(
                    "checking out version {} from store {}",
                    view.id.short(),
                    view.store().describe()
                ),
            )
        })?;
        for (&i, got) in wanted.iter().zip(decoded) {
            let data = got.data.expect("gathered with data");
            let base = i as u64 * idx.chunk_size as u64;
            // Write runs of non-ZERO sectors; ZERO ones stay holes.
            let sectors = data.len().div_ceil(SECTOR as usize);
            let mut s = 0;
            while s < sectors {
                if idx.state(i, s) == SectorState::Zero {
                    s += 1;
                    continue;
                }
                let mut e = s + 1;
                while e < sectors && idx.state(i, e) != SectorState::Zero {
                    e += 1;
                }
                let a = s * SECTOR as usize;
                let b = (e * SECTOR as usize).min(data.len());
                runs.put(&data[a..b], base + a as u64)?;
                written += (b - a) as u64;
                s = e;
            }
        }
        runs.flush()?;
        let first_byte = first as u64 * idx.chunk_size as u64;
        let end_byte = ((first + batch) as u64 * idx.chunk_size as u64).min(idx.disk_size);
        dst.write_behind(first_byte, end_byte - first_byte)?;
        let done: u64 = recs.iter().map(|&i| idx.chunk_len(i) as u64).sum();
        progress.advance(done);
        Ok(written)
    };
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..MATERIALISE_THREADS.min(batches.max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut written = 0u64;
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= batches || failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(written);
                        }
                        match one(k * batch) {
                            Ok(n) => written += n,
                            Err(e) => {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a checkout worker panicked"))
            .collect()
    });
    let mut written = 0u64;
    for r in results {
        written += r?;
    }
    dst.flush()?;
    Ok(written)
}
