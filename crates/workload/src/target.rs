//! What `replay` and `sperf` drive: a stack spec, an NBD export, or a file
//! or block device opened with O_DIRECT (so the page cache does not hide
//! the device, as blksim and sperf do in the seed).

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::Access;
use roamdisk_blockdev::{BlockDev, Checked, Error, ErrorKind, Op, Registry, Result, WriteFlags};

use crate::flashsim::FlashSimDev;
use roamdisk_nbd::client::{NbdDev, NbdUri};

/// Alignment O_DIRECT needs.
pub const DIRECT_ALIGN: usize = 4096;

/// A heap buffer whose start is aligned for O_DIRECT.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, start, len }
    }
    /// Grow (never shrink) to at least `len` bytes.
    pub fn ensure(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
    }
    pub fn get(&self, len: usize) -> &[u8] {
        &self.raw[self.start..self.start + len]
    }
    pub fn get_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.start..self.start + len]
    }
}

/// A file opened with O_DIRECT taking requests of any alignment: aligned
/// requests go straight through, others through an aligned bounce buffer
/// (read-modify-write for writes, serialised so two never interleave).
pub struct DirectFile {
    next: Arc<RawDev>,
    rmw: Mutex<()>,
}

impl DirectFile {
    /// Open `path` with O_DIRECT where the file system allows it, else
    /// buffered (with a warning).
    pub fn open(path: &Path, read_only: bool) -> Result<DirectFile> {
        let raw = RawDev::open_direct(path, read_only)?;
        if !raw.is_direct() {
            tracing::warn!(path = %path.display(), "O_DIRECT is not available here; the page cache is in the way");
        }
        Ok(DirectFile {
            next: Arc::new(raw),
            rmw: Mutex::new(()),
        })
    }

    pub fn is_direct(&self) -> bool {
        self.next.is_direct()
    }

    fn aligned(&self, ptr: *const u8, off: u64, len: usize) -> bool {
        !self.next.is_direct()
            || (ptr.align_offset(DIRECT_ALIGN) == 0
                && off.is_multiple_of(DIRECT_ALIGN as u64)
                && len.is_multiple_of(DIRECT_ALIGN))
    }

    fn span(&self, off: u64, len: usize) -> (u64, usize) {
        let a = off / DIRECT_ALIGN as u64 * DIRECT_ALIGN as u64;
        let end = (off + len as u64).div_ceil(DIRECT_ALIGN as u64) * DIRECT_ALIGN as u64;
        (a, (end - a) as usize)
    }

    /// An aligned span `(a, n)` must lie within the file: a file whose
    /// size is not a multiple of 4 KiB has no aligned span over its end.
    fn check_tail(&self, a: u64, n: usize, op: Op, off: u64) -> Result<()> {
        if a + n as u64 > self.next.size() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                op,
                "direct",
                "an unaligned request at the end of a file whose size is not a multiple of 4 KiB; use --no-direct",
            )
            .at(off));
        }
        Ok(())
    }
}

impl BlockDev for DirectFile {
    roamdisk_blockdev::layer!("direct", next);
    fn describe(&self) -> String {
        format!(
            "direct: {} ({})",
            self.next.describe(),
            if self.is_direct() {
                "O_DIRECT"
            } else {
                "buffered"
            }
        )
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        if self.aligned(buf.as_ptr(), off, buf.len()) {
            return self.next.read_at(buf, off);
        }
        let (a, n) = self.span(off, buf.len());
        self.check_tail(a, n, Op::Read, off)?;
        let mut b = AlignedBuf::new(n);
        self.next.read_at(b.get_mut(n), a)?;
        let s = (off - a) as usize;
        buf.copy_from_slice(&b.get(n)[s..s + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        if self.aligned(buf.as_ptr(), off, buf.len()) {
            return self.next.write_at(buf, off, flags);
        }
        let (a, n) = self.span(off, buf.len());
        let mut b = AlignedBuf::new(n);
        let s = (off - a) as usize;
        let whole = s == 0 && n == buf.len();
        let _g = self.rmw.lock();
        if !whole {
            self.check_tail(a, n, Op::Write, off)?;
            self.next.read_at(b.get_mut(n), a)?;
        }
        b.get_mut(n)[s..s + buf.len()].copy_from_slice(buf);
        self.next.write_at(b.get(n), a, flags)
    }
}

/// How to open a target.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    pub read_only: bool,
    /// Open plain files and block devices with O_DIRECT.
    pub direct: bool,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            read_only: false,
            direct: true,
        }
    }
}

enum Kind {
    Shared(Arc<dyn BlockDev>),
    Nbd(NbdUri),
}

/// An opened target: hands out devices (one NBD connection each, as a
/// client per thread would have, or the one shared stack); the flashsim
/// layers inside report their simulated clocks.
pub struct Target {
    kind: Kind,
    name: String,
    size: u64,
}

impl Target {
    /// Open a target string: an NBD URI, a path to an existing file or
    /// block device (O_DIRECT unless `opts.direct` is off), or a stack.
    pub fn open(reg: &Registry, s: &str, opts: &TargetOptions) -> Result<Target> {
        if NbdUri::is_uri(s) {
            let uri = NbdUri::parse(s)?;
            let probe = NbdDev::connect(&uri)?;
            let size = probe.size();
            return Ok(Target {
                kind: Kind::Nbd(uri),
                name: s.to_string(),
                size,
            });
        }
        let head = s.split([':', '[']).next().unwrap_or("");
        let path = PathBuf::from(s);
        let access = Access::read_only_if(opts.read_only);
        let dev: Arc<dyn BlockDev> = if reg.get(head).is_none() && path.exists() && opts.direct {
            let file = Arc::new(DirectFile::open(&path, opts.read_only)?);
            Arc::new(Checked::new(file, access))
        } else {
            reg.build(s, access)?
        };
        Ok(Target {
            size: dev.size(),
            kind: Kind::Shared(dev),
            name: s.to_string(),
        })
    }

    /// A device for one client: a new NBD connection, or the shared stack.
    pub fn connect(&self) -> Result<Arc<dyn BlockDev>> {
        match &self.kind {
            Kind::Shared(d) => Ok(Arc::clone(d)),
            Kind::Nbd(u) => Ok(Arc::new(NbdDev::connect(u)?)),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Total simulated card time of the flashsim layers in the stack, if
    /// any.
    pub fn simulated_ns(&self) -> Option<u64> {
        let Kind::Shared(dev) = &self.kind else {
            return None;
        };
        let sims = roamdisk_blockdev::find_layers::<FlashSimDev>(dev.as_ref());
        (!sims.is_empty()).then(|| sims.iter().map(|s| s.stats().elapsed_ns).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_files_take_unaligned_requests() {
        let (_dir, p) = roamdisk_blockdev::testkit::scratch("f.img");
        std::fs::write(&p, vec![0u8; 64 << 10]).unwrap();
        let reg = Registry::with_builtin();
        let t = Target::open(&reg, p.to_str().unwrap(), &TargetOptions::default()).unwrap();
        let d = t.connect().unwrap();
        d.write_at(b"hello", 4093, WriteFlags::default()).unwrap();
        let mut b = [0u8; 9];
        d.read_at(&mut b, 4091).unwrap();
        assert_eq!(&b, b"\0\0hello\0\0");
        d.flush().unwrap();
        drop((d, t));
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[4093..4098], b"hello");
        assert_eq!(bytes.len(), 64 << 10);
    }

    #[test]
    fn stacks_expose_their_simulated_clock() {
        let mut reg = Registry::with_builtin();
        reg.add(&crate::flashsim::FLASHSIM);
        let t = Target::open(&reg, "flashsim:class6:mem:16M", &TargetOptions::default()).unwrap();
        assert_eq!(t.simulated_ns(), Some(0));
        t.connect()
            .unwrap()
            .write_at(&[1; 4096], 0, WriteFlags::default())
            .unwrap();
        assert!(t.simulated_ns().unwrap() > 0);
        let t = Target::open(&reg, "mem:1M", &TargetOptions::default()).unwrap();
        assert_eq!(t.simulated_ns(), None);
        assert_eq!(t.size(), 1 << 20);
    }
}
