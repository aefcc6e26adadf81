//! [`Checked`]: the validation layer every stack gets on top.
//!
//! Ranges are checked against the size and write-like operations against
//! the capabilities here, once, so that no layer below has to.

use std::sync::Arc;

use crate::dev::{Access, BlockDev, Caps, Extent, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};

/// Validates every request before it reaches the stack below.
pub struct Checked {
    next: Arc<dyn BlockDev>,
    size: u64,
    caps: Caps,
}

impl Checked {
    /// Wrap a stack. With [`Access::ReadOnly`], every write-like request
    /// is refused whatever the stack could do.
    pub fn new(next: Arc<dyn BlockDev>, access: Access) -> Self {
        let size = next.size();
        let caps = next.caps().restrict(access.is_read_only());
        Checked { next, size, caps }
    }

    /// The wrapped stack.
    pub fn inner(&self) -> &Arc<dyn BlockDev> {
        &self.next
    }

    fn range(&self, op: Op, off: u64, len: u64) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::new(
                ErrorKind::OutOfRange,
                op,
                "checked",
                format!(
                    "range of {len} bytes ends past the device size {}",
                    self.size
                ),
            )
            .at(off)),
        }
    }

    fn writable(&self, op: Op) -> Result<()> {
        if self.caps.can_write {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::ReadOnly,
                op,
                "checked",
                "the device is read-only",
            ))
        }
    }
}

impl BlockDev for Checked {
    crate::layer!("checked", next);
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.range(Op::Read, off, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.next.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.writable(Op::Write)?;
        self.range(Op::Write, off, buf.len() as u64)?;
        if buf.is_empty() {
            return if flags.fua { self.next.flush() } else { Ok(()) };
        }
        self.next.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        self.next.flush()
    }
    fn settle(&self) -> Result<()> {
        self.next.settle()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.writable(Op::Trim)?;
        self.range(Op::Trim, off, len)?;
        if len == 0 || !self.caps.can_trim {
            return Ok(());
        }
        self.next.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.writable(Op::WriteZeroes)?;
        self.range(Op::WriteZeroes, off, len)?;
        if flags.fast && !self.caps.can_fast_zero {
            return Err(Error::new(
                ErrorKind::Unsupported,
                Op::WriteZeroes,
                "checked",
                "fast zeroing is not supported by this stack",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.next.write_zeroes(off, len, flags)
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.range(Op::BlockStatus, off, len)?;
        if len == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                Op::BlockStatus,
                "checked",
                "block status of an empty range",
            )
            .at(off));
        }
        self.next.block_status(off, len)
    }
    fn cache(&self, off: u64, len: u64) -> Result<()> {
        self.range(Op::Cache, off, len)?;
        self.next.cache(off, len)
    }
    fn write_behind(&self, off: u64, len: u64) -> Result<()> {
        self.range(Op::Write, off, len)?;
        self.next.write_behind(off, len)
    }
}
