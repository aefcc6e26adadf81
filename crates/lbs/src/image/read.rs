//! The read path: resolve blocks to clusters under the lock, read them in
//! one I/O per run without it, decrypt and verify each; and the whole-image
//! check.

use super::*;

impl Inner {
    /// Read and verify blocks already on disk. `plan` holds (lbn, pbn,
    /// seal, checksum) of consecutive PBNs; returns their plaintext.
    pub(super) fn read_blocks(&self, plan: &[BlockRef]) -> Result<AlignedBuf> {
        let n = plan.len();
        let mut b = AlignedBuf::new(n * self.bs);
        let off = self.geo.data_offset() + plan[0].1 * self.bs as u64;
        self.data.read_at(b.as_mut_slice(), off)?;
        for (i, &(lbn, pbn, seal, want)) in plan.iter().enumerate() {
            let blk = &mut b.as_mut_slice()[i * self.bs..(i + 1) * self.bs];
            self.decrypt_verify(lbn, pbn, seal, &want, blk)?;
        }
        Ok(b)
    }

    /// Decrypt one block (at `pbn`, sealed at `seal`) in place and check
    /// its checksum.
    pub(super) fn decrypt_verify(
        &self,
        lbn: u64,
        pbn: u64,
        (seal_pbn, epoch): Seal,
        want: &[u8; 16],
        blk: &mut [u8],
    ) -> Result<()> {
        if let Some(x) = &self.cipher {
            x.decrypt(seal_pbn, epoch, blk);
        }
        let mut sum = [0u8; 16];
        self.header
            .checksum
            .compute(lbn, epoch, blk, &mut sum[..self.width]);
        if sum[..self.width] == want[..self.width] {
            return Ok(());
        }
        self.stats.integrity_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            lbn,
            pbn,
            "integrity error: block checksum mismatch (damaged, tampered or replayed block)"
        );
        Err(err(
            ErrorKind::Corrupt,
            Op::Read,
            format!("integrity error at LBN {lbn} (PBN {pbn}): checksum mismatch; the block was damaged, tampered with or replayed"),
        )
        .at(lbn * self.bs as u64))
    }

    /// Read whole blocks `first..first+n` into `out` (n * bs bytes).
    pub(super) fn read_whole(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len() / self.bs;
        let mut plan: Vec<(usize, BlockRef)> = Vec::new();
        let _reuse;
        {
            let st = self.state.lock();
            for i in 0..n {
                let lbn = first + i as u64;
                let dst = &mut out[i * self.bs..(i + 1) * self.bs];
                let p = st.l2p[lbn as usize];
                if p >= ZERO {
                    dst.fill(0);
                    continue;
                }
                let p = p as u64;
                let mut s = [0u8; 16];
                s[..self.width].copy_from_slice(
                    &st.sums[lbn as usize * self.width..(lbn as usize + 1) * self.width],
                );
                let seal = self.seal_of(&st, lbn, p);
                if let Some((b, &slot)) = st
                    .streams
                    .iter()
                    .find_map(|w| w.buf.index.get(&lbn).map(|x| (&w.buf, x)))
                {
                    dst.copy_from_slice(&b.data[slot * self.bs..(slot + 1) * self.bs]);
                    if b.seals[slot].is_some() {
                        // A moved block waiting in the collector's buffer:
                        // the bytes read from its old place, unverified.
                        self.decrypt_verify(lbn, p, seal, &s, dst)?;
                    }
                    continue;
                }
                plan.push((i, (lbn, p, seal, s)));
            }
            _reuse = self.reuse.read();
        }
        let mut k = 0;
        while k < plan.len() {
            let mut m = k + 1;
            while m < plan.len()
                && plan[m].1 .1 == plan[m - 1].1 .1 + 1
                && plan[m].1 .1 / self.bpc == plan[k].1 .1 / self.bpc
            {
                m += 1;
            }
            let run: Vec<_> = plan[k..m].iter().map(|x| x.1).collect();
            let b = self.read_blocks(&run)?;
            for (j, (i, _)) in plan[k..m].iter().enumerate() {
                out[i * self.bs..(i + 1) * self.bs]
                    .copy_from_slice(&b.as_slice()[j * self.bs..(j + 1) * self.bs]);
            }
            k = m;
        }
        Ok(())
    }

    /// Verify every mapped block's checksum. Returns the LBNs that fail.
    pub fn check(&self, mut progress: impl FnMut(u64, u64)) -> Result<Vec<u64>> {
        let total = self.header.logical_blocks();
        let mut bad = Vec::new();
        let step = 256u64;
        let mut lbn = 0;
        let mut buf = vec![0u8; step as usize * self.bs];
        while lbn < total {
            let n = step.min(total - lbn);
            let out = &mut buf[..n as usize * self.bs];
            if self.read_whole(lbn, out).is_err() {
                for l in lbn..lbn + n {
                    if self.read_whole(l, &mut vec![0u8; self.bs]).is_err() {
                        bad.push(l);
                    }
                }
            }
            lbn += n;
            progress(lbn, total);
        }
        Ok(bad)
    }
}
