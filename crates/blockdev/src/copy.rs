//! One sparse copy for every command and engine that copies a disk into
//! another (LBS import and export, a borrowed disk's copy-in): only the
//! ranges the source reports as data are read and written.

use crate::dev::{extents_covering, BlockDev, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::progress::Progress;

/// Bytes read at a time.
pub const STEP: u64 = 4 << 20;

/// What to do with the source's holes and zero ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeroes {
    /// Nothing: the destination already reads as zeroes there (a new
    /// sparse file, a fresh image).
    Skip,
    /// `write_zeroes` (may deallocate) where the destination can; skipped
    /// where it cannot.
    Write,
}

/// How [`copy_sparse`] copies.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    pub zeroes: Zeroes,
    /// Inside data ranges, runs of this many zero bytes (aligned to it)
    /// are not written either; 0 writes data ranges whole.
    pub zero_grain: usize,
    /// The progress phase's name.
    pub what: &'static str,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            zeroes: Zeroes::Write,
            zero_grain: 0,
            what: "copying",
        }
    }
}

/// Copy `src` into `dst` (which must be at least as large) as
/// [`CopyOptions`] says. Returns the bytes written as data. Does not flush.
pub fn copy_sparse(
    src: &dyn BlockDev,
    dst: &dyn BlockDev,
    opts: &CopyOptions,
    progress: &dyn Progress,
) -> Result<u64> {
    let can_zero = dst.caps().can_zero;
    copy_sparse_to(
        src,
        &mut |buf, off| dst.write_at(buf, off, WriteFlags::default()),
        &mut |off, len| {
            if can_zero {
                let flags = ZeroFlags {
                    may_trim: true,
                    ..Default::default()
                };
                dst.write_zeroes(off, len, flags)?;
            }
            Ok(())
        },
        opts,
        progress,
    )
}

/// [`copy_sparse`] into functions instead of a device: `write` gets the
/// data ranges, `zero` the zero ranges (called only with [`Zeroes::Write`]).
pub fn copy_sparse_to(
    src: &dyn BlockDev,
    write: &mut dyn FnMut(&[u8], u64) -> Result<()>,
    zero: &mut dyn FnMut(u64, u64) -> Result<()>,
    opts: &CopyOptions,
    progress: &dyn Progress,
) -> Result<u64> {
    let size = src.size();
    progress.phase(opts.what, size);
    let mut buf = Vec::new();
    let mut written = 0u64;
    let mut off = 0u64;
    while off < size {
        let n = STEP.min(size - off);
        let mut pos = off;
        for e in extents_covering(src, off, n)? {
            if e.state.is_zero() {
                if opts.zeroes == Zeroes::Write {
                    zero(pos, e.len)?;
                }
            } else {
                buf.resize(e.len as usize, 0);
                src.read_at(&mut buf, pos)?;
                written += write_data(&buf, pos, opts.zero_grain, write)?;
            }
            pos += e.len;
        }
        off += n;
        progress.set(off);
    }
    progress.end();
    Ok(written)
}

/// Write `buf` at `off`, leaving out aligned runs of `grain` zero bytes
/// (none when `grain` is 0); returns the bytes written.
fn write_data(
    buf: &[u8],
    off: u64,
    grain: usize,
    write: &mut dyn FnMut(&[u8], u64) -> Result<()>,
) -> Result<u64> {
    if grain == 0 {
        write(buf, off)?;
        return Ok(buf.len() as u64);
    }
    let mut written = 0;
    let mut run: Option<usize> = None;
    let pieces = buf.len().div_ceil(grain);
    for i in 0..=pieces {
        let nonzero = i < pieces && {
            let end = ((i + 1) * grain).min(buf.len());
            buf[i * grain..end].iter().any(|&b| b != 0)
        };
        match (nonzero, run) {
            (true, None) => run = Some(i * grain),
            (false, Some(s)) => {
                let e = (i * grain).min(buf.len());
                write(&buf[s..e], off + s as u64)?;
                written += (e - s) as u64;
                run = None;
            }
            _ => {}
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::mem::MemDev;
    use crate::progress::NoProgress;

    fn source() -> MemDev {
        // Data, a hole, zeroes written as data, data again, an odd tail.
        let m = MemDev::new((9 << 20) + 1000);
        m.write_at(&[7u8; 100_000], 0, WriteFlags::default())
            .unwrap();
        m.write_at(&vec![0u8; 200_000], 3 << 20, WriteFlags::default())
            .unwrap();
        m.write_at(&[9u8; 5000], (9 << 20) - 2000, WriteFlags::default())
            .unwrap();
        m
    }

    fn read_all(d: &dyn BlockDev) -> Vec<u8> {
        let mut v = vec![0u8; d.size() as usize];
        d.read_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn copies_every_byte_and_writes_only_data() {
        let src = source();
        for grain in [0, 64 << 10] {
            let dst = MemDev::new(src.size());
            dst.write_at(&[1u8; 300], 5 << 20, WriteFlags::default())
                .unwrap();
            let opts = CopyOptions {
                zero_grain: grain,
                ..Default::default()
            };
            let n = copy_sparse(&src, &dst, &opts, &NoProgress).unwrap();
            assert_eq!(read_all(&dst), read_all(&src), "grain {grain}");
            assert!(n < src.size() / 2, "wrote {n} bytes of data");
        }
    }

    #[test]
    fn skip_leaves_the_destination_alone_in_zero_ranges() {
        let src = source();
        let dst = MemDev::new(src.size());
        let opts = CopyOptions {
            zeroes: Zeroes::Skip,
            ..Default::default()
        };
        copy_sparse(&src, &dst, &opts, &NoProgress).unwrap();
        assert_eq!(read_all(&dst), read_all(&src));
    }

    #[test]
    fn zero_grain_leaves_out_zero_runs_inside_data() {
        let mut buf = vec![0u8; 256 << 10];
        buf[10] = 1;
        buf[(200 << 10) + 5] = 2;
        let mut got = Vec::new();
        let n = write_data(&buf, 1 << 20, 64 << 10, &mut |b, o| {
            got.push((o, b.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            vec![(1 << 20, 64 << 10), ((1 << 20) + (192 << 10), 64 << 10)]
        );
        assert_eq!(n, 128 << 10);
    }
}
