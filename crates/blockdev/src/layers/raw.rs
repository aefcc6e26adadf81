//! `raw:PATH` — a plain file or block device, byte for byte.
//!
//! Sparse aware: allocation status comes from `SEEK_DATA`/`SEEK_HOLE`, trim
//! and zeroing punch holes (`FALLOC_FL_PUNCH_HOLE`) or use
//! `FALLOC_FL_ZERO_RANGE`, falling back to writing zero buffers only when
//! the file system supports neither and the caller allowed slow zeroing.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::FallocateFlags;

use crate::dev::{
    push_extent, write_zero_buffers, Alloc, BlockDev, Caps, Extent, WriteFlags, ZeroFlags,
};
use crate::error::{Error, ErrorKind, Op, Result};

/// Most extents one `block_status` call returns; callers ask again for
/// more. Kept small: NBD clients often want one extent (REQ_ONE), and each
/// extent costs two `lseek` calls.
const MAX_EXTENTS: usize = 64;

/// Lock `file` for this process: exclusively when it will be written,
/// shared when only read, so two servers never write one image (nor one
/// write an image another uses as a read-only base). Advisory (`flock`),
/// like qemu's image locking.
pub fn lock_file(file: &File, read_only: bool, layer: &'static str, path: &Path) -> Result<()> {
    use rustix::fs::FlockOperation;
    let op = if read_only {
        FlockOperation::NonBlockingLockShared
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    match rustix::fs::flock(file, op) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(Error::new(
            ErrorKind::PermissionDenied,
            Op::Open,
            layer,
            if read_only {
                "the file is open for writing by another process; stop it first"
            } else {
                "the file is in use by another process (another server, or a stack using it as a base); stop it first"
            },
        )
        .path(path)),
        // File systems without flock support: carry on unlocked.
        Err(_) => Ok(()),
    }
}

/// How far behind the end of a [`BlockDev::write_behind`] range the
/// writes started before are waited for and dropped from the page cache:
/// a long copy keeps about this much, plus its batches in flight, dirty or
/// cached.
const WRITE_BEHIND: u64 = 64 << 20;

/// A file or block device used as a disk.
pub struct RawDev {
    file: File,
    path: PathBuf,
    size: u64,
    read_only: bool,
    block_device: bool,
    /// Cleared the first time the file system refuses to punch holes.
    can_punch: AtomicBool,
    /// Cleared the first time the file system refuses FALLOC_FL_ZERO_RANGE.
    can_zero_range: AtomicBool,
    /// Opened with O_DIRECT: callers must pass 4 KiB-aligned buffers,
    /// offsets and lengths.
    direct: bool,
    /// Something was written since the last `fdatasync`; a flush of a
    /// clean file costs nothing.
    dirty: AtomicBool,
    /// How far [`BlockDev::write_behind`] has waited for and dropped the
    /// page cache.
    behind: AtomicU64,
    /// A write-behind found a write the device failed: the kernel reports
    /// such an error once per file, so every later flush must fail too.
    lost_write: AtomicBool,
}

impl RawDev {
    /// Open an existing file or block device.
    pub fn open(path: &Path, read_only: bool) -> Result<Self> {
        Self::open_with(path, read_only, false)
    }

    /// Open bypassing the page cache (O_DIRECT) where the file system
    /// allows it, else as `open` does; [`RawDev::is_direct`] tells which.
    /// With O_DIRECT every buffer, offset and length must be aligned to
    /// 4 KiB.
    pub fn open_direct(path: &Path, read_only: bool) -> Result<Self> {
        match Self::open_with(path, read_only, true) {
            Ok(d) => {
                // Some file systems accept the flag but refuse the I/O.
                let mut probe = vec![0u8; 2 * 4096];
                let at = probe.as_ptr().align_offset(4096);
                if d.size >= 4096 && d.file.read_exact_at(&mut probe[at..at + 4096], 0).is_err() {
                    drop(d);
                    return Self::open_with(path, read_only, false);
                }
                Ok(d)
            }
            Err(e) if e.kind() == ErrorKind::InvalidArgument || e.raw_os_error() == Some(22) => {
                Self::open_with(path, read_only, false)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether O_DIRECT is in effect.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn open_with(path: &Path, read_only: bool, direct: bool) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut oo = File::options();
        oo.read(true).write(!read_only);
        if direct {
            oo.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
        }
        let file = oo.open(path).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                "the file does not exist; create it first (e.g. `truncate -s 1G FILE`)"
            } else {
                "cannot open the file"
            };
            Error::io(Op::Open, "raw", e).path(path).msg(hint)
        })?;
        lock_file(&file, read_only, "raw", path)?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(Op::Open, "raw", e).path(path))?;
        let block_device = meta.file_type().is_block_device();
        let size = if block_device {
            (&file)
                .seek(SeekFrom::End(0))
                .map_err(|e| Error::io(Op::Open, "raw", e).path(path))?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "raw",
                "not a regular file or block device",
            )
            .path(path));
        };
        Ok(RawDev {
            file,
            path: path.to_path_buf(),
            size,
            read_only,
            block_device,
            can_punch: AtomicBool::new(true),
            can_zero_range: AtomicBool::new(true),
            direct,
            dirty: AtomicBool::new(false),
            behind: AtomicU64::new(0),
            lost_write: AtomicBool::new(false),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, op: Op, off: u64, e: std::io::Error) -> Error {
        Error::io(op, "raw", e).at(off).path(&self.path)
    }

    fn punch(&self, off: u64, len: u64) -> Result<bool> {
        self.fallocate(
            &self.can_punch,
            FallocateFlags::PUNCH_HOLE,
            Op::Trim,
            off,
            len,
        )
    }

    fn zero_range(&self, off: u64, len: u64) -> Result<bool> {
        let mode = FallocateFlags::ZERO_RANGE;
        self.fallocate(&self.can_zero_range, mode, Op::WriteZeroes, off, len)
    }

    /// `fallocate(mode | KEEP_SIZE)` while `supported` holds; `Ok(false)`
    /// when the file system does not have the mode (it is not tried again).
    fn fallocate(
        &self,
        supported: &AtomicBool,
        mode: FallocateFlags,
        op: Op,
        off: u64,
        len: u64,
    ) -> Result<bool> {
        if !supported.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match rustix::fs::fallocate(&self.file, mode | FallocateFlags::KEEP_SIZE, off, len) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                supported.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(self.err(op, off, e.into())),
        }
    }

    /// `lseek(SEEK_DATA)` or `lseek(SEEK_HOLE)` from `pos`; `None` past the last data.
    fn seek_to(&self, pos: u64, data: bool) -> std::result::Result<Option<u64>, std::io::Error> {
        let whence = if data {
            rustix::fs::SeekFrom::Data(pos)
        } else {
            rustix::fs::SeekFrom::Hole(pos)
        };
        match rustix::fs::seek(&self.file, whence) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e == rustix::io::Errno::NXIO => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// `sync_file_range(a..b, flags)`. A failed write it reports is an
    /// error, now and at every later flush (the kernel tells each file of
    /// a failed write once: the next `fdatasync` would not). A file system
    /// without the call loses nothing: flushes still sync.
    fn sync_range(&self, flags: libc::c_uint, a: u64, b: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(at), Ok(n)) = (i64::try_from(a), i64::try_from(b - a)) else {
            return Ok(());
        };
        // SAFETY: a plain system call on a descriptor this layer owns, with
        // no pointers.
        let r = unsafe { libc::sync_file_range(self.file.as_raw_fd(), at, n, flags) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS | libc::EINVAL | libc::ESPIPE | libc::EOPNOTSUPP) => Ok(()),
            _ => {
                self.lost_write.store(true, Ordering::Release);
                Err(Error::io(Op::Write, "raw", e).path(&self.path))
            }
        }
    }

    fn sync(&self, op: Op) -> Result<()> {
        if self.lost_write.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Io,
                op,
                "raw",
                "a write to the device failed earlier (reported by write-behind): what was written since the last flush may be lost",
            )
            .path(&self.path));
        }
        self.dirty.store(false, Ordering::Release);
        self.file.sync_data().map_err(|e| {
            // Still unsynced: the next flush must try again.
            self.mark_dirty();
            Error::io(op, "raw", e).path(&self.path)
        })
    }
}

impl BlockDev for RawDev {
    crate::layer!("raw");
    fn describe(&self) -> String {
        if self.direct {
            format!("raw:{} (O_DIRECT)", self.path.display())
        } else {
            format!("raw:{}", self.path.display())
        }
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        let caps = Caps {
            can_extents: !self.block_device,
            can_fast_zero: !self.block_device,
            ..Caps::FULL
        };
        caps.restrict(self.read_only)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, off)
            .map_err(|e| self.err(Op::Read, off, e))
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.file
            .write_all_at(buf, off)
            .map_err(|e| self.err(Op::Write, off, e))?;
        self.mark_dirty();
        if flags.fua {
            self.sync(Op::Write)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        if !self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        self.sync(Op::Flush)
    }
    fn settle(&self) -> Result<()> {
        // Every write is already in the kernel's page cache, which outlives
        // the process; only a flush waits for the disk.
        Ok(())
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        // Trim is advisory: a file system that cannot punch simply keeps the data.
        let punched = self.punch(off, len)?;
        if punched {
            self.mark_dirty();
        }
        if punched && flags.fua {
            self.sync(Op::Trim)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let done = (flags.may_trim && self.punch(off, len)?) || self.zero_range(off, len)?;
        if done {
            self.mark_dirty();
        }
        if !done {
            if flags.fast {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    Op::WriteZeroes,
                    "raw",
                    "the file system cannot zero without writing",
                )
                .path(&self.path));
            }
            return write_zero_buffers(self, off, len, flags.fua);
        }
        if flags.fua {
            self.sync(Op::WriteZeroes)?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let end = off + len;
        if self.block_device {
            return Ok(vec![Extent {
                len,
                state: Alloc::Data,
            }]);
        }
        let mut out = Vec::new();
        let mut pos = off;
        while pos < end && out.len() < MAX_EXTENTS {
            let data = self
                .seek_to(pos, true)
                .map_err(|e| self.err(Op::BlockStatus, pos, e))?;
            let data = data.unwrap_or(end).min(end);
            if data > pos {
                push_extent(
                    &mut out,
                    Extent {
                        len: data - pos,
                        state: Alloc::Hole,
                    },
                );
                pos = data;
                continue;
            }
            let hole = self
                .seek_to(pos, false)
                .map_err(|e| self.err(Op::BlockStatus, pos, e))?;
            let hole = hole.unwrap_or(end).min(end);
            if hole <= pos {
                // The file changed under us; report the rest as data.
                push_extent(
                    &mut out,
                    Extent {
                        len: end - pos,
                        state: Alloc::Data,
                    },
                );
                break;
            }
            push_extent(
                &mut out,
                Extent {
                    len: hole - pos,
                    state: Alloc::Data,
                },
            );
            pos = hole;
        }
        Ok(out)
    }
    fn write_behind(&self, off: u64, len: u64) -> Result<()> {
        let Some(end) = off.checked_add(len).filter(|&e| len > 0 && e <= self.size) else {
            return Ok(()); // nothing, or not ours: a hint only
        };
        if self.block_device || self.direct {
            return Ok(());
        }
        self.sync_range(libc::SYNC_FILE_RANGE_WRITE, off, end)?;
        // Wait for, and drop, everything up to WRITE_BEHIND before the end
        // of this range that no call has yet (batches end out of order).
        let upto = end.saturating_sub(WRITE_BEHIND);
        let from = self.behind.fetch_max(upto, Ordering::AcqRel);
        if upto > from {
            self.sync_range(
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                from,
                upto,
            )?;
            // Written: its pages go back to the free list, where the next
            // writes find them (a copy of 16 GiB then holds about
            // WRITE_BEHIND of page cache and a batch, not 16 GiB of pages
            // taken fresh). Pages dirtied again since stay.
            let _ = rustix::fs::fadvise(
                &self.file,
                from,
                std::num::NonZeroU64::new(upto - from),
                rustix::fs::Advice::DontNeed,
            );
        }
        Ok(())
    }
    fn cache(&self, off: u64, len: u64) -> Result<()> {
        let _ = rustix::fs::fadvise(
            &self.file,
            off,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::WillNeed,
        );
        Ok(())
    }
}
