//! The [`BlockDev`] trait every layer implements, its capability set and the
//! allocation-status types.
//!
//! A layer wraps the next one (`next()`); every operation it does not
//! override passes through to it, so a layer implements only what it
//! changes (as nbdkit filters do). A device at the bottom of a stack
//! (`raw`, `mem`) overrides every operation.
//!
//! Ranges and flags are validated once, at the top of a stack, by
//! [`crate::Checked`]; layers below trust `off + len <= size()`.

use crate::error::{Error, ErrorKind, Op, Result};

/// What a stack can do. Computed once when the stack is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Writes, trims and zeroing are accepted.
    pub can_write: bool,
    /// `flush` makes earlier writes durable (false only for volatile devices
    /// where flush is a no-op; the server still advertises FLUSH).
    pub can_flush: bool,
    /// Per-write durability (FUA) is supported natively or by flushing.
    pub can_fua: bool,
    /// Trim may release storage.
    pub can_trim: bool,
    /// `write_zeroes` is supported (possibly by writing zero buffers).
    pub can_zero: bool,
    /// `write_zeroes` with `fast` can succeed without writing data.
    pub can_fast_zero: bool,
    /// All connections see one consistent device (a flush on one covers
    /// writes acknowledged on every other).
    pub can_multi_conn: bool,
    /// `block_status` reports real holes and zeroes.
    pub can_extents: bool,
    /// Seeking is expensive (spinning media).
    pub rotational: bool,
    /// Smallest I/O unit the device handles without read-modify-write.
    pub min_block: u32,
    /// Preferred I/O size.
    pub preferred_block: u32,
}

impl Caps {
    /// Capabilities of a fully featured writable device.
    pub const FULL: Caps = Caps {
        can_write: true,
        can_flush: true,
        can_fua: true,
        can_trim: true,
        can_zero: true,
        can_fast_zero: true,
        can_multi_conn: true,
        can_extents: true,
        rotational: false,
        min_block: 1,
        preferred_block: 4096,
    };

    /// `self`, made read-only when `read_only` is set.
    pub fn restrict(self, read_only: bool) -> Caps {
        if read_only {
            self.read_only()
        } else {
            self
        }
    }

    /// The same capabilities with every write-like one switched off.
    pub fn read_only(self) -> Caps {
        Caps {
            can_write: false,
            can_fua: false,
            can_trim: false,
            can_zero: false,
            can_fast_zero: false,
            ..self
        }
    }
}

/// Whether a stack may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    /// Every write-like request is refused, whatever the layers could do.
    ReadOnly,
}

impl Access {
    /// [`Access::ReadOnly`] when `read_only` holds (for command-line
    /// flags and config fields).
    pub fn read_only_if(read_only: bool) -> Access {
        if read_only {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        }
    }

    pub fn is_read_only(self) -> bool {
        self == Access::ReadOnly
    }
}

/// Flags of a write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: durable before the call returns.
    pub fua: bool,
}

/// Flags of a `write_zeroes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Durable before the call returns.
    pub fua: bool,
    /// The range may be deallocated (punched) as long as it reads as zero.
    /// NBD clients clear this with NO_HOLE.
    pub may_trim: bool,
    /// Fail with [`ErrorKind::Unsupported`] rather than write zero buffers.
    pub fast: bool,
}

/// Allocation state of a range, as NBD's `base:allocation` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alloc {
    /// Allocated; contents unknown without reading.
    Data,
    /// Allocated and known to read as zeroes.
    Zero,
    /// Not allocated; reads as zeroes.
    Hole,
}

impl Alloc {
    /// Whether the range reads as zeroes.
    pub fn is_zero(self) -> bool {
        matches!(self, Alloc::Zero | Alloc::Hole)
    }
    /// NBD `base:allocation` flags: bit 0 = hole, bit 1 = zero.
    pub fn nbd_flags(self) -> u32 {
        match self {
            Alloc::Data => 0,
            Alloc::Zero => 2,
            Alloc::Hole => 3,
        }
    }
}

/// A run of bytes with one allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub state: Alloc,
}

/// Push `e` onto `v`, merging it with the last extent when the state matches.
pub fn push_extent(v: &mut Vec<Extent>, e: Extent) {
    if e.len == 0 {
        return;
    }
    match v.last_mut() {
        Some(last) if last.state == e.state => last.len += e.len,
        _ => v.push(e),
    }
}

/// A block device: a fixed-size array of bytes with durability barriers.
///
/// Safe to call from many threads at once; concurrent overlapping writes
/// land in an unspecified order, as on a real disk.
///
/// Every layer is also [`Any`](std::any::Any), so a command that built a
/// stack through the registry can reach one layer's own API with
/// [`find_layer`].
pub trait BlockDev: std::any::Any + Send + Sync + 'static {
    /// The layer's kind name (`raw`, `cow`, ...), used in errors.
    fn layer(&self) -> &'static str;

    /// The device this layer wraps, if any. Every operation not overridden
    /// passes through to it.
    fn next(&self) -> Option<&dyn BlockDev> {
        None
    }

    /// One line describing this layer's configuration (no trailing layers).
    fn describe(&self) -> String {
        self.layer().to_string()
    }

    /// Size in bytes.
    fn size(&self) -> u64 {
        self.next().map_or(0, |n| n.size())
    }

    /// Capabilities; a layer usually adjusts the next layer's.
    fn caps(&self) -> Caps {
        self.next().map_or(Caps::FULL.read_only(), |n| n.caps())
    }

    /// Fill `buf` from offset `off`.
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.pass(Op::Read)?.read_at(buf, off)
    }

    /// Write `buf` at offset `off`.
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.pass(Op::Write)?.write_at(buf, off, flags)
    }

    /// Barrier: every write acknowledged before this call is durable when it
    /// returns.
    fn flush(&self) -> Result<()> {
        self.pass(Op::Flush)?.flush()
    }

    /// Make every acknowledged write independent of this process, without
    /// the promise of a barrier: after it returns, a crash of the process
    /// (not of the machine) loses nothing. Called when a client disconnects
    /// without a final FLUSH, which is all such a client was promised.
    ///
    /// The default is a full [`flush`](Self::flush), always safe. A layer
    /// whose writes already live outside the process (`raw`: the kernel's
    /// page cache) does nothing; a stateless pass-through layer forwards
    /// the call.
    fn settle(&self) -> Result<()> {
        self.flush()
    }

    /// Hint that a range is no longer needed. Contents afterwards are
    /// unspecified until rewritten.
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.pass(Op::Trim)?.trim(off, len, flags)
    }

    /// Make a range read as zeroes.
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.pass(Op::WriteZeroes)?.write_zeroes(off, len, flags)
    }

    /// Allocation status of a prefix of `[off, off+len)`: at least one extent,
    /// lengths summing to at most `len`.
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.pass(Op::BlockStatus)?.block_status(off, len)
    }

    /// Hint that a range will be read soon.
    fn cache(&self, off: u64, len: u64) -> Result<()> {
        match self.next() {
            Some(n) => n.cache(off, len),
            None => Ok(()),
        }
    }

    /// Hint that a range was written and will not be written again soon:
    /// the layer may start writing it to its device now, and wait for what
    /// it started well before. A long copy then keeps the page cache's
    /// dirty pages few and the device busy from the start, instead of
    /// being throttled by the kernel once past its dirty-page limit.
    /// Nothing is promised about durability (that is [`flush`](Self::flush));
    /// an error is a write the device failed. A layer that maps offsets
    /// to other places below (or writes elsewhere than `next()`) must not
    /// pass the hint on as it is.
    fn write_behind(&self, off: u64, len: u64) -> Result<()> {
        match self.next() {
            Some(n) => n.write_behind(off, len),
            None => Ok(()),
        }
    }

    /// The next layer, or an `Unsupported` error naming the operation.
    #[doc(hidden)]
    fn pass(&self, op: Op) -> Result<&dyn BlockDev> {
        self.next().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                op,
                self.layer(),
                "operation not implemented by this layer",
            )
        })
    }
}

/// Opens a layer's `impl BlockDev`: states the layer's kind name and, for a
/// layer stacked on another, the field holding that lower device (an `Arc`
/// or `Box` of a [`BlockDev`]), once. Expands to [`BlockDev::layer`] and
/// [`BlockDev::next`], exactly as written by hand (no extra call or
/// allocation: the operations a layer does not override still reach the
/// lower device through `next()`).
///
/// ```
/// use std::sync::Arc;
/// use roamdisk_blockdev::{layers::mem::MemDev, BlockDev};
///
/// /// Counts nothing, changes nothing: every operation passes through.
/// struct Pass {
///     next: Arc<dyn BlockDev>,
/// }
/// impl BlockDev for Pass {
///     roamdisk_blockdev::layer!("pass", next);
/// }
///
/// let dev = Pass { next: Arc::new(MemDev::new(4096)) };
/// assert_eq!((dev.layer(), dev.next().unwrap().layer()), ("pass", "mem"));
/// assert_eq!(dev.size(), 4096);
/// ```
///
/// A device at the bottom of a stack names no field:
/// `roamdisk_blockdev::layer!("mem");`.
#[macro_export]
macro_rules! layer {
    ($name:expr) => {
        fn layer(&self) -> &'static str {
            $name
        }
    };
    ($name:expr, $next:tt) => {
        $crate::layer!($name);
        fn next(&self) -> ::core::option::Option<&dyn $crate::BlockDev> {
            ::core::option::Option::Some(&*self.$next)
        }
    };
}

/// The first layer of type `T` in the stack from `top` down (`top`
/// included), following [`BlockDev::next`]: how a command reaches a layer's
/// own API (a session's rebase after a commit) on a stack the registry
/// built, without opening that layer by hand.
pub fn find_layer<T: BlockDev>(top: &dyn BlockDev) -> Option<&T> {
    find_layers(top).into_iter().next()
}

/// Every layer of type `T` in the stack from `top` down, top first.
pub fn find_layers<T: BlockDev>(top: &dyn BlockDev) -> Vec<&T> {
    let mut out = Vec::new();
    let mut cur = Some(top);
    while let Some(d) = cur {
        if let Some(t) = (d as &dyn std::any::Any).downcast_ref::<T>() {
            out.push(t);
        }
        cur = d.next();
    }
    out
}

/// Write zero buffers over a range, in bounded pieces. The fallback for
/// devices that cannot zero without writing.
pub fn write_zero_buffers(dev: &dyn BlockDev, off: u64, len: u64, fua: bool) -> Result<()> {
    const PIECE: u64 = 1 << 20;
    let zeros = vec![0u8; PIECE.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = PIECE.min(len - done);
        let last = done + n == len;
        dev.write_at(
            &zeros[..n as usize],
            off + done,
            WriteFlags { fua: fua && last },
        )?;
        done += n;
    }
    Ok(())
}

/// Collect extents covering all of `[off, off+len)`, calling `block_status`
/// as often as needed.
pub fn extents_covering(dev: &dyn BlockDev, off: u64, len: u64) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut pos = off;
    let end = off.checked_add(len).ok_or_else(|| {
        Error::new(
            ErrorKind::OutOfRange,
            Op::BlockStatus,
            dev.layer(),
            "offset + length overflows",
        )
        .at(off)
    })?;
    while pos < end {
        let got = dev.block_status(pos, end - pos)?;
        let mut advanced = 0;
        for e in got {
            let l = e.len.min(end - pos - advanced);
            push_extent(
                &mut out,
                Extent {
                    len: l,
                    state: e.state,
                },
            );
            advanced += l;
            if pos + advanced >= end {
                break;
            }
        }
        if advanced == 0 {
            return Err(Error::new(
                ErrorKind::Io,
                Op::BlockStatus,
                dev.layer(),
                "block status returned no extent",
            )
            .at(pos));
        }
        pos += advanced;
    }
    Ok(out)
}
