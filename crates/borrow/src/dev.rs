//! [`BorrowDev`]: the plan's extents served as one block device.
//!
//! Every request is split at extent boundaries, each piece mapped to its
//! host device and checked against the plan's extents (a second,
//! independent lookup) before any host I/O. Data is XTS-AES-256 encrypted
//! in 4 KiB units (tweak: the unit's logical number) with a fresh random
//! key that exists only in this process's memory, so what is left on the
//! host after the session is noise. Three bitmaps track the units:
//! `data` (holds guest data; other units read as zeroes, so the guest
//! never sees what the host had there), `ever` (written at least once:
//! what a zero-scrub must clear) and `dirty` (modified by the guest since
//! the VM state was copied in: what goes back to the portable medium).

use parking_lot::RwLock;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::{
    push_extent, Alloc, BlockDev, Caps, Error, ErrorKind, Extent, Op, Result, WriteFlags, ZeroFlags,
};
use roamdisk_crypto::{new_key, Xts};

use crate::bits::Bits;
use crate::plan::{Plan, UNIT};
use crate::verify::verify;
use crate::Progress;

/// How much of the host to re-check at open.
pub use crate::verify::Depth as Verify;

/// Options of a borrowed device.
#[derive(Debug, Clone)]
pub struct BorrowOptions {
    /// Encrypt with a fresh in-memory key (default). Off leaves the
    /// guest's data readable on the host's free blocks after the session.
    pub encrypt: bool,
    /// Zero every unit ever written when the device is released.
    pub scrub: bool,
    /// What to re-check against the host before use.
    pub verify: Verify,
    /// Serve only the first `size` bytes of the plan (`None`: all of it).
    pub size: Option<u64>,
}

impl Default for BorrowOptions {
    fn default() -> Self {
        BorrowOptions {
            encrypt: true,
            scrub: false,
            verify: Verify::Full,
            size: None,
        }
    }
}

/// One piece of the logical disk.
#[derive(Debug, Clone, Copy)]
struct Seg {
    logical: u64,
    dev: usize,
    phys: u64,
    len: u64,
}

/// Bytes processed per host I/O (bounds temporary buffers).
const CHUNK: u64 = 1 << 20;

/// The borrowed disk.
pub struct BorrowDev {
    hosts: Vec<Arc<dyn BlockDev>>,
    /// O_EXCL holds on host block devices: the kernel refuses them while a
    /// file system on them is mounted, and refuses mounts while held.
    _exclusive: Vec<std::fs::File>,
    segs: Vec<Seg>,
    /// Per host device, the plan's extents `[start, end)`, sorted.
    allowed: Vec<Vec<(u64, u64)>>,
    size: u64,
    /// `size` rounded up to whole units (the plan always has them).
    span: u64,
    xts: Option<Xts>,
    data: Bits,
    ever: Bits,
    dirty: Bits,
    /// Read-modify-write of partial units excludes every other write.
    rmw: RwLock<()>,
    scrub: bool,
    released: AtomicBool,
    describe: String,
}

fn err(op: Op, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, op, "borrow", msg)
}

impl BorrowDev {
    /// Open the plan's host devices read-write, check they did not change
    /// since the scan, and build the device.
    pub fn open(plan: &Plan, opts: &BorrowOptions) -> Result<BorrowDev> {
        plan.validate()?;
        let mut hosts: Vec<Arc<dyn BlockDev>> = Vec::new();
        let mut exclusive = Vec::new();
        for d in &plan.devices {
            let meta = std::fs::metadata(&d.path)
                .map_err(|e| Error::io(Op::Open, "borrow", e).path(&d.path))?;
            if meta.file_type().is_block_device() {
                let f = std::fs::File::options()
                    .read(true)
                    .custom_flags(rustix::fs::OFlags::EXCL.bits() as i32)
                    .open(&d.path)
                    .map_err(|e| {
                        Error::io(Op::Open, "borrow", e)
                            .path(&d.path)
                            .msg("the device is in use (a file system on it is mounted?); borrowing needs it unused")
                    })?;
                exclusive.push(f);
            }
            hosts.push(Arc::new(RawDev::open(&d.path, false)?));
        }
        let refs: Vec<&dyn BlockDev> = hosts.iter().map(|h| h.as_ref()).collect();
        verify(plan, &refs, opts.verify)?;
        Self::with_hosts(plan, hosts, exclusive, opts)
    }

    /// Build over already opened (and verified) hosts, in plan order.
    pub fn with_hosts(
        plan: &Plan,
        hosts: Vec<Arc<dyn BlockDev>>,
        exclusive: Vec<std::fs::File>,
        opts: &BorrowOptions,
    ) -> Result<BorrowDev> {
        plan.validate()?;
        let size = match opts.size {
            Some(s) if s > plan.total_bytes => {
                return Err(err(
                    Op::Open,
                    format!(
                        "asked for {s} bytes but the plan holds only {}",
                        plan.total_bytes
                    ),
                ))
            }
            Some(s) => s,
            None => plan.total_bytes,
        };
        if size == 0 {
            return Err(err(Op::Open, "the plan holds no extents: nothing to serve"));
        }
        let mut segs = Vec::with_capacity(plan.extents.len());
        let mut allowed = vec![Vec::new(); plan.devices.len()];
        let mut logical = 0;
        for e in &plan.extents {
            segs.push(Seg {
                logical,
                dev: e.device as usize,
                phys: e.offset,
                len: e.len,
            });
            allowed[e.device as usize].push((e.offset, e.offset + e.len));
            logical += e.len;
        }
        for a in &mut allowed {
            a.sort_unstable();
        }
        for (h, d) in hosts.iter().zip(&plan.devices) {
            if h.size() != d.size {
                return Err(err(
                    Op::Open,
                    format!("host {} is not the size the plan says", d.path.display()),
                ));
            }
        }
        let units = size.div_ceil(UNIT);
        let xts = if opts.encrypt {
            Some(Xts::new(&new_key()).map_err(|m| err(Op::Open, m.to_string()))?)
        } else {
            None
        };
        Ok(BorrowDev {
            hosts,
            _exclusive: exclusive,
            segs,
            allowed,
            size,
            span: size.next_multiple_of(UNIT),
            xts,
            data: Bits::new(units),
            ever: Bits::new(units),
            dirty: Bits::new(units),
            rmw: RwLock::new(()),
            scrub: opts.scrub,
            released: AtomicBool::new(false),
            describe: format!(
                "borrow: {} extents on {} host device(s), {}{}",
                plan.extents.len(),
                plan.devices.len(),
                if opts.encrypt {
                    "XTS-AES-256 with an in-memory key"
                } else {
                    "NOT encrypted"
                },
                if opts.scrub {
                    ", zero-scrub at release"
                } else {
                    ""
                }
            ),
        })
    }

    /// The host pieces of the logical range `[off, off + len)`, each
    /// checked to lie inside one of the plan's extents.
    fn pieces(
        &self,
        op: Op,
        off: u64,
        len: u64,
        mut f: impl FnMut(u64, usize, u64, u64) -> Result<()>,
    ) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.span) {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                op,
                "borrow",
                "past the end of the borrowed disk",
            )
            .at(off));
        }
        let mut i = self.segs.partition_point(|s| s.logical + s.len <= off);
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let s = self
                .segs
                .get(i)
                .ok_or_else(|| err(op, "offset not mapped by the plan"))?;
            let within = pos - s.logical;
            let n = (s.len - within).min(end - pos);
            let phys = s.phys + within;
            self.check_inside(op, s.dev, phys, n)?;
            f(pos, s.dev, phys, n)?;
            pos += n;
            i += 1;
        }
        Ok(())
    }

    /// Refuse any host range that is not inside one plan extent.
    fn check_inside(&self, op: Op, dev: usize, phys: u64, n: u64) -> Result<()> {
        let a = &self.allowed[dev];
        let k = a.partition_point(|x| x.1 <= phys);
        match a.get(k) {
            Some(&(s, e)) if s <= phys && phys + n <= e => Ok(()),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                op,
                "borrow",
                format!("refused: host range {phys}+{n} on device {dev} is outside the plan"),
            )
            .at(phys)),
        }
    }

    fn live(&self, op: Op) -> Result<()> {
        if self.released.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Shutdown,
                op,
                "borrow",
                "the borrowed disk has been released",
            ));
        }
        Ok(())
    }

    /// Read aligned `[off, off + buf.len())`, decrypting units that hold
    /// data and zeroing the others.
    fn read_aligned(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.pieces(Op::Read, off, buf.len() as u64, |pos, dev, phys, n| {
            let b = &mut buf[(pos - off) as usize..(pos - off + n) as usize];
            let u0 = pos / UNIT;
            let units = n / UNIT;
            if !self.data.any(u0, u0 + units) {
                b.fill(0);
                return Ok(());
            }
            self.hosts[dev].read_at(b, phys)?;
            for (k, blk) in b.chunks_mut(UNIT as usize).enumerate() {
                let u = u0 + k as u64;
                if !self.data.get(u) {
                    blk.fill(0);
                } else if let Some(x) = &self.xts {
                    x.decrypt(u, 0, blk);
                }
            }
            Ok(())
        })
    }

    /// Write aligned `[off, off + buf.len())`, encrypting.
    fn write_aligned(&self, buf: &[u8], off: u64, fua: bool, mark_dirty: bool) -> Result<()> {
        let mut tmp = Vec::new();
        self.pieces(Op::Write, off, buf.len() as u64, |pos, dev, phys, n| {
            let mut done = 0;
            while done < n {
                let m = (n - done).min(CHUNK);
                let at = (pos - off + done) as usize;
                let src = &buf[at..at + m as usize];
                let u0 = (pos + done) / UNIT;
                let out: &[u8] = match &self.xts {
                    Some(x) => {
                        tmp.clear();
                        tmp.extend_from_slice(src);
                        for (k, blk) in tmp.chunks_mut(UNIT as usize).enumerate() {
                            x.encrypt(u0 + k as u64, 0, blk);
                        }
                        &tmp
                    }
                    None => src,
                };
                // `ever` before the write: a crash between the two must
                // not leave a written unit the scrub would miss.
                self.ever.put_range(u0, u0 + m / UNIT, true);
                self.hosts[dev].write_at(out, phys + done, WriteFlags { fua })?;
                self.data.put_range(u0, u0 + m / UNIT, true);
                if mark_dirty {
                    self.dirty.put_range(u0, u0 + m / UNIT, true);
                }
                done += m;
            }
            Ok(())
        })
    }

    /// Write any range: whole units directly, partial ones by
    /// read-modify-write under the exclusive lock.
    fn write_any(&self, buf: &[u8], off: u64, fua: bool, mark_dirty: bool) -> Result<()> {
        let len = buf.len() as u64;
        if off.is_multiple_of(UNIT) && len.is_multiple_of(UNIT) {
            let _g = self.rmw.read();
            return self.write_aligned(buf, off, fua, mark_dirty);
        }
        let _g = self.rmw.write();
        let a = off / UNIT * UNIT;
        let b = (off + len).next_multiple_of(UNIT);
        let mut tmp = vec![0u8; (b - a) as usize];
        // Only the edge units need their old contents.
        let u = UNIT as usize;
        self.read_aligned(&mut tmp[..u], a)?;
        if b - a > UNIT {
            let t = tmp.len() - u;
            self.read_aligned(&mut tmp[t..], b - UNIT)?;
        }
        tmp[(off - a) as usize..(off - a + len) as usize].copy_from_slice(buf);
        self.write_aligned(&tmp, a, fua, mark_dirty)
    }

    /// Write without marking the units dirty: the VM state being copied
    /// in (it is already on the portable medium).
    pub fn write_unmarked(&self, buf: &[u8], off: u64) -> Result<()> {
        self.live(Op::Write)?;
        self.write_any(buf, off, false, false)
    }

    /// Units modified since the copy-in, as logical byte ranges, clipped
    /// to the size.
    pub fn dirty_ranges(&self) -> Vec<(u64, u64)> {
        self.dirty
            .runs()
            .into_iter()
            .map(|(a, b)| (a * UNIT, (b * UNIT).min(self.size)))
            .collect()
    }

    /// Units ever written (what a scrub clears).
    pub fn written_bytes(&self) -> u64 {
        self.ever.count() * UNIT
    }

    /// Whether this disk encrypts.
    pub fn encrypted(&self) -> bool {
        self.xts.is_some()
    }

    /// End the session: flush, and with `scrub` write zeroes over every
    /// host range ever written. Later I/O fails. Returns bytes scrubbed.
    pub fn release(&self, scrub: bool, progress: &dyn Progress) -> Result<u64> {
        let _g = self.rmw.write();
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(0);
        }
        let mut scrubbed = 0;
        if scrub {
            let runs = self.ever.runs();
            let total: u64 = runs.iter().map(|(a, b)| (b - a) * UNIT).sum();
            progress.phase("scrubbing", total);
            for (a, b) in runs {
                let (off, end) = (a * UNIT, b * UNIT);
                let mut i = self.segs.partition_point(|s| s.logical + s.len <= off);
                let mut pos = off;
                while pos < end {
                    let s = self.segs[i];
                    let within = pos - s.logical;
                    let n = (s.len - within).min(end - pos);
                    let phys = s.phys + within;
                    self.check_inside(Op::WriteZeroes, s.dev, phys, n)?;
                    self.hosts[s.dev].write_zeroes(phys, n, ZeroFlags::default())?;
                    pos += n;
                    i += 1;
                    scrubbed += n;
                    progress.set(scrubbed);
                }
            }
            progress.end();
        }
        for h in &self.hosts {
            h.flush()?;
        }
        self.data.put_range(0, self.size.div_ceil(UNIT), false);
        Ok(scrubbed)
    }
}

impl Drop for BorrowDev {
    fn drop(&mut self) {
        if !self.released.load(Ordering::Acquire) {
            match self.release(self.scrub, &crate::NoProgress) {
                Ok(n) if self.scrub => {
                    tracing::info!(bytes = n, "borrowed disk released and scrubbed")
                }
                Ok(_) => {}
                Err(e) => tracing::error!(%e, "releasing the borrowed disk failed"),
            }
        }
    }
}

impl BlockDev for BorrowDev {
    roamdisk_blockdev::layer!("borrow");
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps {
            rotational: self.hosts.iter().any(|h| h.caps().rotational),
            min_block: UNIT as u32,
            preferred_block: 64 * 1024,
            ..Caps::FULL
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.live(Op::Read)?;
        let len = buf.len() as u64;
        if off.is_multiple_of(UNIT)
            && len.is_multiple_of(UNIT)
            && off.saturating_add(len) <= self.size
        {
            return self.read_aligned(buf, off);
        }
        let a = off / UNIT * UNIT;
        let b = off
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::OutOfRange,
                    Op::Read,
                    "borrow",
                    "past the end of the borrowed disk",
                )
                .at(off)
            })?
            .next_multiple_of(UNIT);
        let mut tmp = vec![0u8; (b - a) as usize];
        self.read_aligned(&mut tmp, a)?;
        buf.copy_from_slice(&tmp[(off - a) as usize..(off - a + len) as usize]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.live(Op::Write)?;
        if off
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.size)
        {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                Op::Write,
                "borrow",
                "past the end of the borrowed disk",
            )
            .at(off));
        }
        self.write_any(buf, off, flags.fua, true)
    }
    fn flush(&self) -> Result<()> {
        self.live(Op::Flush)?;
        for h in &self.hosts {
            h.flush()?;
        }
        Ok(())
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.write_zeroes(
            off,
            len,
            ZeroFlags {
                fua: flags.fua,
                may_trim: true,
                fast: false,
            },
        )
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.live(Op::WriteZeroes)?;
        if off.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::new(
                ErrorKind::OutOfRange,
                Op::WriteZeroes,
                "borrow",
                "past the end of the borrowed disk",
            )
            .at(off));
        }
        let end = off + len;
        // Whole units become "no data" (they read as zeroes) without I/O;
        // partial edges are written as zeroes.
        let a = off.next_multiple_of(UNIT);
        let b = if end == self.size {
            self.span
        } else {
            end / UNIT * UNIT
        };
        if a < b {
            let _g = self.rmw.read();
            let (u0, u1) = (a / UNIT, b / UNIT);
            self.data.put_range(u0, u1, false);
            self.dirty.put_range(u0, u1, true);
        }
        let zeros = vec![0u8; UNIT as usize];
        if a >= b {
            // Less than two units, none of them whole.
            if len > 0 {
                self.write_any(&vec![0u8; len as usize], off, false, true)?;
            }
        } else {
            if off < a {
                self.write_any(&zeros[..(a - off) as usize], off, false, true)?;
            }
            if b < end {
                self.write_any(&zeros[..(end - b) as usize], b, false, true)?;
            }
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.live(Op::BlockStatus)?;
        let end = off.saturating_add(len).min(self.size);
        let mut v = Vec::new();
        let mut pos = off;
        while pos < end && v.len() < 1024 {
            let u = pos / UNIT;
            let next = ((u + 1) * UNIT).min(end);
            let state = if self.data.get(u) {
                Alloc::Data
            } else {
                Alloc::Hole
            };
            push_extent(
                &mut v,
                Extent {
                    len: next - pos,
                    state,
                },
            );
            pos = next;
        }
        Ok(v)
    }
}
