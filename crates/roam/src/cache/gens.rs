//! The slot layout's generation table (`DIR/slots.gens`,
//! `docs/formats/cas-shared-cache.md` "Version 3: slot files"): a `u32`
//! per 4 KiB granule of the slot file, mapped shared by every process
//! that uses the cache, so that a read never returns bytes of a chunk
//! other than the one it asked for, even when another process evicts that
//! chunk and reuses its place during the read.
//!
//! The protocol is a seqlock per granule. The writer (the lock holder)
//! gives granules it reuses a new generation ([`GenTable::claim`]: one
//! more than the largest they carry), stores it *before* it writes the new
//! bytes, and names it in the insert record. A reader knows the chunk's
//! generation from the record; [`GenTable::read_checked`] checks that the
//! granules it reads carry it, reads, fences, and checks again. If the
//! writer claimed any of them before the read ended, the second check sees
//! the new generation (the claim precedes the write, the fence orders the
//! reader's loads after its read), so torn or foreign bytes are never
//! returned as the chunk: the read reports the place stale instead.
//!
//! Generations are not durable (the file is not synced): after a power cut
//! the open repairs them from the journal, under the lock.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU32, Ordering};

use super::journal2::GRANULE;

/// The table of one slot file, mapped for its whole cap.
pub struct GenTable {
    ptr: *mut AtomicU32,
    granules: usize,
    _file: File,
}

// SAFETY: the mapping is only reached through atomics; the pointer stays
// valid until Drop, which takes the table by value.
unsafe impl Send for GenTable {}
// SAFETY: as above: shared access is only through `AtomicU32`.
unsafe impl Sync for GenTable {}

impl GenTable {
    /// Open (creating it if needed) the table at `path` for `granules`
    /// granules; a shorter file is extended with zeroes (generation 0:
    /// never written).
    pub fn open(path: &Path, granules: usize) -> std::io::Result<GenTable> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = (granules.max(1) * 4) as u64;
        if file.metadata()?.len() < len {
            file.set_len(len)?;
        }
        // SAFETY: a new shared mapping of `len` bytes of a file at least
        // that long, checked below, unmapped in Drop; nothing else in this
        // process aliases it except through this table.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(GenTable {
            ptr: ptr.cast(),
            granules: granules.max(1),
            _file: file,
        })
    }

    fn cells(&self) -> &[AtomicU32] {
        // SAFETY: `granules` u32s of a live, page-aligned mapping; every
        // bit pattern is a valid AtomicU32, and it is only used atomically.
        unsafe { std::slice::from_raw_parts(self.ptr, self.granules) }
    }

    /// Granules the table covers.
    pub fn len(&self) -> usize {
        self.granules
    }

    /// Whether it covers none (never: at least one is mapped).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The generation of granule `g`.
    pub fn get(&self, g: usize) -> u32 {
        self.cells()[g].load(Ordering::Acquire)
    }

    /// Set granule `g`'s generation (the open's repair from the journal).
    pub fn set(&self, g: usize, gen: u32) {
        self.cells()[g].store(gen, Ordering::Release);
    }

    /// Give granules `first..first + n` a new generation before their
    /// bytes are rewritten, and return it: one more than the largest they
    /// carry (never 0). Lock holder only.
    pub fn claim(&self, first: usize, n: usize) -> u32 {
        let cells = &self.cells()[first..first + n];
        let top = cells.iter().map(|c| c.load(Ordering::Relaxed)).max();
        let gen = top.unwrap_or(0).wrapping_add(1).max(1);
        for c in cells {
            c.store(gen, Ordering::Release);
        }
        // The new generation is visible before any byte of the write.
        fence(Ordering::SeqCst);
        gen
    }

    /// Whether granules `first..first + n` all carry `gen`.
    fn all(&self, first: usize, n: usize, gen: u32) -> bool {
        self.cells()[first..first + n]
            .iter()
            .all(|c| c.load(Ordering::Acquire) == gen)
    }

    /// Read `buf.len()` bytes at byte `offset` of `slots` (within one
    /// chunk whose granules carry `gen`): `Ok(true)` if they are that
    /// chunk's bytes, `Ok(false)` if its place was reused before or during
    /// the read (catch up with the journal and look again), or a short
    /// read (the file was cut: the same).
    pub fn read_checked(
        &self,
        slots: &File,
        offset: u64,
        buf: &mut [u8],
        gen: u32,
    ) -> std::io::Result<bool> {
        if buf.is_empty() {
            return Ok(true);
        }
        let first = (offset / GRANULE as u64) as usize;
        let last = ((offset + buf.len() as u64 - 1) / GRANULE as u64) as usize;
        let n = last + 1 - first;
        if last >= self.granules || !self.all(first, n, gen) {
            return Ok(false);
        }
        match slots.read_exact_at(buf, offset) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        fence(Ordering::SeqCst);
        Ok(self.all(first, n, gen))
    }
}

impl Drop for GenTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of this length, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.granules * 4) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_makes_an_older_generation_stale_in_every_mapping() {
        let t = tempfile::tempdir().unwrap();
        let slots = t.path().join("slots");
        std::fs::write(&slots, vec![7u8; 65536]).unwrap();
        let slots = File::open(&slots).unwrap();
        let a = GenTable::open(&t.path().join("slots.gens"), 16).unwrap();
        let b = GenTable::open(&t.path().join("slots.gens"), 16).unwrap();
        let gen = a.claim(0, 16);
        assert_eq!((gen, b.get(5)), (1, 1), "both mappings see the claim");
        let mut buf = [0u8; 8192];
        assert!(b.read_checked(&slots, 4096, &mut buf, gen).unwrap());
        assert_eq!(buf, [7u8; 8192]);
        // A claim of one granule the read covers makes it stale.
        assert_eq!(a.claim(2, 1), 2);
        assert!(!b.read_checked(&slots, 4096, &mut buf, gen).unwrap());
        assert!(b.read_checked(&slots, 0, &mut buf, gen).unwrap());
        // Past the file or the table: stale, not an error.
        assert!(!b.read_checked(&slots, 60000, &mut buf, gen).unwrap());
        assert!(!b.read_checked(&slots, 65536, &mut buf, gen).unwrap());
        // A reopened table keeps what was stored (the page cache).
        drop((a, b));
        let c = GenTable::open(&t.path().join("slots.gens"), 32).unwrap();
        assert_eq!((c.get(2), c.get(3), c.get(20)), (2, 1, 0));
    }
}
