//! What each way of making slot reuse safe costs a shared-cache hit
//! (issue 38: "generation numbers, reuse only after every process has
//! passed the eviction, or a check on read — measure each"). A hit today
//! is one `pread` of the bytes asked for (4 KiB for a guest's 4 KiB read)
//! from the page cache; each way adds to it:
//!
//! - `gens`: a generation per 4 KiB granule in a `MAP_SHARED` file, read
//!   before the `pread` and again after a fence (a seqlock);
//! - `epoch`: the reader publishes how far it has applied the journal (one
//!   store to a shared page per read) so the writer reuses a slot only
//!   after every process passed its eviction (a scan of the table on
//!   reuse, not measured here: it is on the writer's side);
//! - `crc32c` and `blake3`: the whole 64 KiB chunk read and checked on
//!   every hit (OpenISR's parcelkeeper checks each chunk against its tag).
//!
//!     cargo run --release -p roamdisk-roam --example reuse_check_cost [-- ROUNDS]
//!
//! Prints ns per hit for each (median of ROUNDS rounds of 200,000 random
//! hits over 64 MiB of slots, all in the page cache).

#![allow(clippy::disallowed_macros, reason = "a benchmark prints its table")]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

const SLOT: usize = 64 << 10;
const SLOTS: usize = 1024;
const GRANULE: usize = 4096;
const HITS: usize = 200_000;

/// A file of `bytes` zeroes mapped shared (what `slots.gens` would be).
struct Shared {
    ptr: *mut u8,
    len: usize,
    _file: File,
}

impl Shared {
    fn new(path: &std::path::Path, len: usize) -> Shared {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("create the table file");
        file.set_len(len as u64).expect("size the table file");
        // SAFETY: a fresh shared mapping of a file we own, of its length;
        // the result is checked before use and unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "mmap failed");
        Shared {
            ptr: ptr.cast(),
            len,
            _file: file,
        }
    }
    fn u32s(&self) -> &[AtomicU32] {
        // SAFETY: the mapping is page-aligned, `len` bytes long and lives
        // as long as `self`; AtomicU32 has the layout of u32 and every bit
        // pattern is valid.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len / 4) }
    }
    fn u64s(&self) -> &[AtomicU64] {
        // SAFETY: as `u32s`, for AtomicU64 (the mapping is 8-aligned).
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len / 8) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// xorshift: random slots without a crate.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("slots");
    let data: Vec<u8> = (0..SLOT * SLOTS).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&path, &data).expect("write slots");
    let slots = File::open(&path).expect("open slots");
    let gens = Shared::new(&dir.path().join("slots.gens"), SLOT * SLOTS / GRANULE * 4);
    let epochs = Shared::new(&dir.path().join("epochs"), 4096);
    let crcs: Vec<u32> = data.chunks(SLOT).map(crc32c::crc32c).collect();
    let tags: Vec<blake3::Hash> = data.chunks(SLOT).map(blake3::hash).collect();
    let mut small = vec![0u8; GRANULE];
    let mut whole = vec![0u8; SLOT];
    let kinds = ["pread 4K", "gens", "epoch", "crc32c 64K", "blake3 64K"];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    let mut wrong = 0u64;
    for _ in 0..rounds {
        for (k, out) in results.iter_mut().enumerate() {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 + k as u64;
            let t = Instant::now();
            for _ in 0..HITS {
                let r = next(&mut seed) as usize;
                let slot = r % SLOTS;
                let g = (r >> 20) % (SLOT / GRANULE);
                let at = (slot * SLOT + g * GRANULE) as u64;
                match k {
                    0 => slots.read_exact_at(&mut small, at).expect("pread"),
                    1 => {
                        let gen = &gens.u32s()[slot * SLOT / GRANULE + g];
                        let before = gen.load(Ordering::Acquire);
                        slots.read_exact_at(&mut small, at).expect("pread");
                        fence(Ordering::SeqCst);
                        wrong += (gen.load(Ordering::Relaxed) != before) as u64;
                    }
                    2 => {
                        slots.read_exact_at(&mut small, at).expect("pread");
                        epochs.u64s()[0].store(r as u64, Ordering::Release);
                    }
                    3 => {
                        slots
                            .read_exact_at(&mut whole, (slot * SLOT) as u64)
                            .expect("pread");
                        wrong += (crc32c::crc32c(&whole) != crcs[slot]) as u64;
                    }
                    _ => {
                        slots
                            .read_exact_at(&mut whole, (slot * SLOT) as u64)
                            .expect("pread");
                        wrong += (blake3::hash(&whole) != tags[slot]) as u64;
                    }
                }
            }
            out.push(t.elapsed().as_nanos() as f64 / HITS as f64);
        }
    }
    assert_eq!(wrong, 0, "a check failed on unchanged data");
    let base = median(results[0].clone());
    println!(
        "ns per shared-cache hit (median of {rounds} rounds of {HITS} random hits, page cache)"
    );
    for (k, r) in kinds.iter().zip(results) {
        let m = median(r);
        println!("{k:>12}: {m:8.0} ns  {:5.2}x", m / base);
    }
}
