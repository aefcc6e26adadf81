//! `cow:OVERLAY:BASE` — copy-on-write over a read-only base.
//!
//! The overlay is a sparse file the size of the base: cluster `i` lives at
//! offset `i * cluster_size`. Which clusters are in the overlay is kept in
//! memory and persisted in `OVERLAY.cowmap` (see [`map`] and
//! `docs/formats/cow-map.md`): an append-only log of cluster-state runs
//! committed at every flush, after the overlay's data has been synced, so a
//! crash never makes the map claim data that did not reach the disk.
//!
//! A write into a cluster not yet in the overlay copies the cluster from the
//! base (or zeroes) first, under a per-cluster lock, then marks it `Data`.

pub mod map;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dev::{push_extent, Alloc, BlockDev, Caps, Extent, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::overlay::OverlayMap;
use crate::vfs::{VFile, Vfs};
pub use map::map_path;
use map::State;

/// Default cluster size: 64 KiB.
pub const DEFAULT_CLUSTER: u32 = 64 * 1024;

/// Options for [`CowDev::open`].
#[derive(Debug, Clone)]
pub struct CowOptions {
    /// Cluster size for a new overlay (an existing overlay keeps its own).
    pub cluster_size: u32,
}

impl Default for CowOptions {
    fn default() -> Self {
        CowOptions {
            cluster_size: DEFAULT_CLUSTER,
        }
    }
}

/// A copy-on-write overlay over a read-only base.
pub struct CowDev {
    base: Arc<dyn BlockDev>,
    overlay: Arc<dyn VFile>,
    overlay_path: PathBuf,
    size: u64,
    cluster: u64,
    clusters: u64,
    map: OverlayMap<map::Header>,
    read_only: bool,
}

fn open_err(path: &Path, e: std::io::Error) -> Error {
    Error::io(Op::Open, "cow", e).path(path)
}

impl CowDev {
    /// Open (or create) an overlay over `base`.
    pub fn open(
        overlay_path: &Path,
        base: Arc<dyn BlockDev>,
        read_only: bool,
        opts: &CowOptions,
    ) -> Result<Self> {
        Self::open_in(crate::vfs::os(), overlay_path, base, read_only, opts)
    }

    /// [`CowDev::open`] with the overlay and its map on the file system
    /// `fs` (the crash tests pass a simulated one).
    pub fn open_in(
        fs: Arc<dyn Vfs>,
        overlay_path: &Path,
        base: Arc<dyn BlockDev>,
        read_only: bool,
        opts: &CowOptions,
    ) -> Result<Self> {
        let size = base.size();
        let map_path = map_path(overlay_path);
        let (has_overlay, has_map) = (fs.exists(overlay_path), fs.exists(&map_path));
        let missing = |what: &str| {
            Err(
                Error::new(ErrorKind::NotFound, Op::Open, "cow", what.to_string())
                    .path(overlay_path),
            )
        };
        if has_overlay && !has_map {
            let msg = format!("the overlay has no map file {}; it was not made by roamdisk or its map was deleted", map_path.display());
            return Err(Error::new(ErrorKind::Corrupt, Op::Open, "cow", msg).path(overlay_path));
        }
        if !has_map {
            if read_only {
                return missing("overlay does not exist and the stack is read-only");
            }
            if !map::valid_cluster_size(opts.cluster_size) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    Op::Open,
                    "cow",
                    format!(
                        "cluster size {} must be a power of two between 4 KiB and 4 MiB",
                        opts.cluster_size
                    ),
                ));
            }
            // The map first: a crash before the overlay file exists leaves
            // a map that claims nothing, and the next open makes the file.
            let header = map::Header {
                cluster_size: opts.cluster_size,
                virtual_size: size,
                generation: 1,
            };
            OverlayMap::create_in(&*fs, &map_path, &header, "cow")?;
        }
        let (map, _) = OverlayMap::<map::Header>::open_in(fs.clone(), &map_path, "cow", read_only)?;
        if !has_overlay {
            let claimed = map.states().usage()[State::Data as usize];
            if claimed > 0 {
                let msg = format!(
                    "the overlay file is missing but its map {} says it holds {claimed} clusters of data; restore the file, or remove the map to start over (losing those writes)",
                    map_path.display()
                );
                return Err(Error::new(ErrorKind::Corrupt, Op::Open, "cow", msg).path(overlay_path));
            }
            if read_only {
                return missing("overlay does not exist and the stack is read-only");
            }
            // Its name is made durable by the compaction below, which
            // syncs the same directory.
            Self::create(&*fs, overlay_path, size)?;
        }
        let overlay = fs
            .open(overlay_path, !read_only)
            .map_err(|e| open_err(overlay_path, e))?;
        if let Some(f) = overlay.os_file() {
            crate::layers::raw::lock_file(f, read_only, "cow", overlay_path)?;
        }
        let header = map.header();
        if header.virtual_size != size {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "cow",
                format!(
                    "overlay was made for a base of {} bytes but this base has {size}; use the base it was made for",
                    header.virtual_size
                ),
            )
            .path(overlay_path));
        }
        let dev = CowDev {
            base,
            overlay,
            overlay_path: overlay_path.to_path_buf(),
            size,
            cluster: header.cluster_size as u64,
            clusters: header.clusters(),
            map,
            read_only,
        };
        if !read_only {
            // Every writable open starts from a compact map with no torn tail.
            dev.map.compact(|_| {}, || dev.sync_overlay())?;
        }
        Ok(dev)
    }

    /// A new, empty overlay file of `size` bytes (sparse), durable.
    fn create(fs: &dyn Vfs, overlay: &Path, size: u64) -> Result<()> {
        let f = fs.create_new(overlay).map_err(|e| open_err(overlay, e))?;
        f.set_len(size).map_err(|e| open_err(overlay, e))?;
        f.sync_data().map_err(|e| open_err(overlay, e))
    }

    /// Make the overlay's data durable (before any map record claims it).
    fn sync_overlay(&self) -> Result<()> {
        self.overlay
            .sync_data()
            .map_err(|e| Error::io(Op::Flush, "cow", e).path(&self.overlay_path))
    }

    fn state(&self, c: u64) -> State {
        State::from_u8(self.map.get(c)).unwrap_or(State::Base)
    }

    fn set_state(&self, c: u64, s: State) {
        self.map.set(c, c + 1, s as u8);
    }

    fn lock(&self, c: u64) -> parking_lot::MutexGuard<'_, ()> {
        self.map.stripe(c)
    }

    fn cluster_len(&self, c: u64) -> u64 {
        self.cluster.min(self.size - c * self.cluster)
    }

    fn ow_err(&self, op: Op, off: u64, e: std::io::Error) -> Error {
        Error::io(op, "cow", e).at(off).path(&self.overlay_path)
    }

    /// Write `data` at `off` inside cluster `c`, copying the cluster into the
    /// overlay first if it is not there yet.
    fn write_in_cluster(&self, c: u64, off: u64, data: &[u8]) -> Result<()> {
        if self.state(c) == State::Data {
            return self
                .overlay
                .write_all_at(data, off)
                .map_err(|e| self.ow_err(Op::Write, off, e));
        }
        let _g = self.lock(c);
        let start = c * self.cluster;
        let clen = self.cluster_len(c);
        match self.state(c) {
            State::Data => {
                return self
                    .overlay
                    .write_all_at(data, off)
                    .map_err(|e| self.ow_err(Op::Write, off, e));
            }
            State::Base if data.len() as u64 != clen => {
                let mut buf = vec![0u8; clen as usize];
                self.base.read_at(&mut buf, start)?;
                let at = (off - start) as usize;
                buf[at..at + data.len()].copy_from_slice(data);
                self.overlay
                    .write_all_at(&buf, start)
                    .map_err(|e| self.ow_err(Op::Write, start, e))?;
            }
            State::Zero if data.len() as u64 != clen => {
                let mut buf = vec![0u8; clen as usize];
                let at = (off - start) as usize;
                buf[at..at + data.len()].copy_from_slice(data);
                self.overlay
                    .write_all_at(&buf, start)
                    .map_err(|e| self.ow_err(Op::Write, start, e))?;
            }
            _ => {
                self.overlay
                    .write_all_at(data, off)
                    .map_err(|e| self.ow_err(Op::Write, off, e))?;
            }
        }
        self.set_state(c, State::Data);
        Ok(())
    }

    /// Make whole clusters `[c0, c1)` read as zeroes.
    fn zero_clusters(&self, c0: u64, c1: u64) -> Result<()> {
        for c in c0..c1 {
            let _g = self.lock(c);
            if self.state(c) != State::Zero {
                self.set_state(c, State::Zero);
            }
        }
        let off = c0 * self.cluster;
        let len = (c1 * self.cluster).min(self.size) - off;
        // Releasing space is best effort: the map already says zero.
        let _ = self.overlay.punch_hole(off, len);
        Ok(())
    }

    /// Zero `[off, off+len)`: whole clusters by state, partial ones by writing.
    fn zero_range(&self, off: u64, len: u64) -> Result<()> {
        let end = off + len;
        let first_full = off.div_ceil(self.cluster);
        let last_full = if end == self.size {
            self.clusters
        } else {
            end / self.cluster
        };
        if first_full >= last_full {
            return self.write_zeros_partial(off, end);
        }
        self.write_zeros_partial(off, (first_full * self.cluster).min(end))?;
        self.zero_clusters(first_full, last_full)?;
        self.write_zeros_partial((last_full * self.cluster).min(end), end)
    }

    fn write_zeros_partial(&self, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let zeros = vec![0u8; (to - from) as usize];
        self.write_at(&zeros, from, WriteFlags::default())
    }

    /// Walk `[off, off+len)` in runs of clusters with the same state.
    fn runs(
        &self,
        off: u64,
        len: u64,
        mut f: impl FnMut(State, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let c = pos / self.cluster;
            let s = self.state(c);
            let mut run_end = ((c + 1) * self.cluster).min(end);
            while run_end < end && self.state(run_end / self.cluster) == s {
                run_end = (run_end + self.cluster).min(end);
            }
            f(s, pos, run_end - pos)?;
            pos = run_end;
        }
        Ok(())
    }

    /// Number of clusters in each state (base, data, zero).
    pub fn usage(&self) -> (u64, u64, u64) {
        let [base, data, zero, _] = self.map.states().usage();
        (base, data, zero)
    }

    /// The cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        self.cluster
    }
}

impl BlockDev for CowDev {
    crate::layer!("cow", base);
    fn describe(&self) -> String {
        format!(
            "cow:{} (cluster {} bytes)",
            self.overlay_path.display(),
            self.cluster
        )
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        let base = self.base.caps();
        let caps = Caps {
            rotational: base.rotational,
            ..Caps::FULL
        };
        caps.restrict(self.read_only)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.runs(off, buf.len() as u64, |s, pos, n| {
            let dst = &mut buf[(pos - off) as usize..(pos - off + n) as usize];
            match s {
                State::Base => self.base.read_at(dst, pos),
                State::Data => self
                    .overlay
                    .read_exact_at(dst, pos)
                    .map_err(|e| self.ow_err(Op::Read, pos, e)),
                State::Zero => {
                    dst.fill(0);
                    Ok(())
                }
            }
        })
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let end = off + buf.len() as u64;
        let mut pos = off;
        while pos < end {
            let c = pos / self.cluster;
            let n = ((c + 1) * self.cluster).min(end) - pos;
            self.write_in_cluster(c, pos, &buf[(pos - off) as usize..(pos - off + n) as usize])?;
            pos += n;
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.map.commit(|| self.sync_overlay())
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        // Only whole clusters are released; partial ones keep their data,
        // which trim allows.
        let first = off.div_ceil(self.cluster);
        let end = off + len;
        let last = if end == self.size {
            self.clusters
        } else {
            end / self.cluster
        };
        if first < last {
            self.zero_clusters(first, last)?;
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.zero_range(off, len)?;
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        self.runs(off, len, |s, pos, n| {
            match s {
                State::Data => push_extent(
                    &mut out,
                    Extent {
                        len: n,
                        state: Alloc::Data,
                    },
                ),
                State::Zero => push_extent(
                    &mut out,
                    Extent {
                        len: n,
                        state: Alloc::Hole,
                    },
                ),
                State::Base => {
                    for e in crate::dev::extents_covering(self.base.as_ref(), pos, n)? {
                        push_extent(&mut out, e);
                    }
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
    fn write_behind(&self, _off: u64, _len: u64) -> Result<()> {
        // Writes land in the overlay, not the base `next()` is: a hint
        // passed on would evict the shared base's cache.
        Ok(())
    }
    fn cache(&self, off: u64, len: u64) -> Result<()> {
        self.runs(off, len, |s, pos, n| {
            if s == State::Base {
                self.base.cache(pos, n)
            } else {
                Ok(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::mem::MemDev;

    fn base() -> Arc<dyn BlockDev> {
        let m = MemDev::new(1 << 20);
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        m.write_at(&data, 0, WriteFlags::default()).unwrap();
        Arc::new(m)
    }

    #[test]
    fn writes_persist_after_flush_and_fall_through_elsewhere() {
        let (_dir, ov) = crate::testkit::scratch("ov");
        let b = base();
        {
            let d = CowDev::open(&ov, b.clone(), false, &CowOptions::default()).unwrap();
            d.write_at(b"XYZ", 70000, WriteFlags::default()).unwrap();
            d.write_zeroes(0, 65536, ZeroFlags::default()).unwrap();
            d.flush().unwrap();
            d.write_at(b"lost", 300000, WriteFlags::default()).unwrap();
            // dropped without flush: the last write may be lost
        }
        let d = CowDev::open(&ov, b.clone(), false, &CowOptions::default()).unwrap();
        let mut buf = [0u8; 3];
        d.read_at(&mut buf, 70000).unwrap();
        assert_eq!(&buf, b"XYZ");
        let mut z = vec![1u8; 65536];
        d.read_at(&mut z, 0).unwrap();
        assert!(z.iter().all(|&x| x == 0));
        let mut other = [0u8; 4];
        d.read_at(&mut other, 70003).unwrap();
        let mut want = [0u8; 4];
        b.read_at(&mut want, 70003).unwrap();
        assert_eq!(other, want);
        let (_, data, zero) = d.usage();
        assert_eq!((data, zero), (1, 1));
    }

    #[test]
    fn size_mismatch_is_refused() {
        let (_dir, ov) = crate::testkit::scratch("ov");
        drop(CowDev::open(&ov, base(), false, &CowOptions::default()).unwrap());
        let other: Arc<dyn BlockDev> = Arc::new(MemDev::new(2 << 20));
        let e = CowDev::open(&ov, other, false, &CowOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn torn_map_tail_reverts_to_the_previous_flush() {
        let (_dir, ov) = crate::testkit::scratch("ov");
        let b = base();
        let opts = CowOptions { cluster_size: 4096 };
        let (state_a, full_len, len_a) = {
            let d = CowDev::open(&ov, b.clone(), false, &opts).unwrap();
            d.write_at(&[1u8; 5000], 0, WriteFlags::default()).unwrap();
            d.flush().unwrap();
            let mut a = vec![0u8; 1 << 20];
            d.read_at(&mut a, 0).unwrap();
            let len_a = std::fs::metadata(map_path(&ov)).unwrap().len();
            // B touches only clusters that were still in the base.
            d.write_at(&[2u8; 3000], 100_000, WriteFlags::default())
                .unwrap();
            d.write_zeroes(200_704, 8192, ZeroFlags::default()).unwrap();
            d.flush().unwrap();
            (a, std::fs::metadata(map_path(&ov)).unwrap().len(), len_a)
        };
        let saved = std::fs::read(map_path(&ov)).unwrap();
        let saved_ov = std::fs::read(&ov).unwrap();
        for cut in len_a..full_len {
            std::fs::write(map_path(&ov), &saved[..cut as usize]).unwrap();
            std::fs::write(&ov, &saved_ov).unwrap();
            let d = CowDev::open(&ov, b.clone(), false, &opts).unwrap();
            let mut got = vec![0u8; 1 << 20];
            d.read_at(&mut got, 0).unwrap();
            assert!(
                got == state_a,
                "cut at {cut}: a torn commit must revert to the previous flush"
            );
        }
    }
}
