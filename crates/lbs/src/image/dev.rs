//! The BlockDev operations of an image: requests checked and split into
//! blocks, then handed to the write path or the read path.

use super::*;

impl BlockDev for Inner {
    roamdisk_blockdev::layer!("lbs");
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn size(&self) -> u64 {
        self.header.logical_size
    }
    fn caps(&self) -> Caps {
        let c = Caps {
            min_block: 1,
            preferred_block: self.bs as u32,
            ..Caps::FULL
        };
        c.restrict(self.opts.read_only)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let bs = self.bs as u64;
        let first = off / bs;
        let end = off + buf.len() as u64;
        let last = end.div_ceil(bs);
        if off.is_multiple_of(bs) && end.is_multiple_of(bs) {
            return self.read_whole(first, buf);
        }
        let mut tmp = vec![0u8; ((last - first) * bs) as usize];
        self.read_whole(first, &mut tmp)?;
        let s = (off - first * bs) as usize;
        buf.copy_from_slice(&tmp[s..s + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let bs = self.bs as u64;
        let first = off / bs;
        let end = off + buf.len() as u64;
        let last = end.div_ceil(bs);
        // Partial edge blocks are read, merged and written whole.
        let mut head = None;
        let mut tail = None;
        if !off.is_multiple_of(bs) {
            let mut b = vec![0u8; self.bs];
            self.read_whole(first, &mut b)?;
            head = Some(b);
        }
        if !end.is_multiple_of(bs) && (last - 1 != first || head.is_none()) {
            let mut b = vec![0u8; self.bs];
            self.read_whole(last - 1, &mut b)?;
            tail = Some(b);
        }
        let mut st = self.state.lock();
        self.check_writable(&st, Op::Write)?;
        for lbn in first..last {
            let bstart = lbn * bs;
            let lo = off.max(bstart);
            let hi = end.min(bstart + bs);
            let src = &buf[(lo - off) as usize..(hi - off) as usize];
            if hi - lo == bs {
                self.insert(&mut st, lbn, src)?;
            } else {
                let mut b = if lbn == first { head.take() } else { None }
                    .or_else(|| tail.take())
                    .expect("edge block was read");
                b[(lo - bstart) as usize..(hi - bstart) as usize].copy_from_slice(src);
                self.insert(&mut st, lbn, &b)?;
            }
            self.stats.client_blocks.fetch_add(1, Ordering::Relaxed);
        }
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        if self.opts.read_only {
            return Ok(());
        }
        if let Some(p) = &st.poisoned {
            return Err(err(
                ErrorKind::Io,
                Op::Flush,
                format!("an earlier write failed ({p}); reopen the image"),
            ));
        }
        self.barrier(&mut st)
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let bs = self.bs as u64;
        let first = off.div_ceil(bs);
        let last = (off + len) / bs;
        let mut st = self.state.lock();
        self.check_writable(&st, Op::Trim)?;
        if first < last {
            self.unmap(&mut st, first, last - first, false)?;
        }
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let bs = self.bs as u64;
        let end = off + len;
        let first = off.div_ceil(bs);
        let last = end / bs;
        if first >= last {
            return self.write_at(&vec![0u8; len as usize], off, WriteFlags { fua: flags.fua });
        }
        if off < first * bs {
            self.write_at(
                &vec![0u8; (first * bs - off) as usize],
                off,
                WriteFlags::default(),
            )?;
        }
        if end > last * bs {
            self.write_at(
                &vec![0u8; (end - last * bs) as usize],
                last * bs,
                WriteFlags::default(),
            )?;
        }
        let mut st = self.state.lock();
        self.check_writable(&st, Op::WriteZeroes)?;
        self.unmap(&mut st, first, last - first, !flags.may_trim)?;
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let bs = self.bs as u64;
        let st = self.state.lock();
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let lbn = pos / bs;
            let n = ((lbn + 1) * bs).min(end) - pos;
            let state = match st.l2p[lbn as usize] {
                UNMAPPED => Alloc::Hole,
                ZERO => Alloc::Zero,
                _ => Alloc::Data,
            };
            roamdisk_blockdev::push_extent(&mut out, Extent { len: n, state });
            pos += n;
            if out.len() >= 1024 {
                break;
            }
        }
        Ok(out)
    }
}
