//! The garbage collector's mover: pick a victim cluster by the policy's
//! score, move its live blocks through the write path, free it at the next
//! barrier; and the background thread that keeps free clusters between the
//! watermarks.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

impl Inner {
    /// Move the live blocks of the best victim cluster and free it.
    /// Returns false when no cluster is worth collecting.
    pub(super) fn collect_one(&self, st: &mut State) -> Result<bool> {
        let eligible: Vec<ClusterState> = st
            .cstate
            .iter()
            .zip(&st.quarantined)
            .map(|(s, q)| if *q { ClusterState::Active } else { *s })
            .collect();
        let ages: Vec<u64> = st
            .activated
            .iter()
            .map(|a| st.clock.saturating_sub(*a))
            .collect();
        let per_stream =
            crate::gc::stream_lifetimes(&st.cstate, &st.stream_of, &ages, &st.written, &st.live);
        let lifetimes: Vec<f64> = st
            .stream_of
            .iter()
            .map(|&s| per_stream[s as usize])
            .collect();
        let Some(v) = pick_victim(
            &eligible,
            &st.live,
            &lifetimes,
            self.bpc,
            st.streams[HOT].active,
            &self.policy,
        ) else {
            return Ok(false);
        };
        let lo = v as u64 * self.bpc;
        let mut moves: Vec<(u64, u64)> = st
            .l2p
            .iter()
            .enumerate()
            .filter(|(_, &p)| p < ZERO && (p as u64) >= lo && (p as u64) < lo + self.bpc)
            .map(|(l, &p)| (p as u64, l as u64))
            .collect();
        moves.sort_unstable();
        if let (Some(&(first, _)), Some(&(last, _))) = (moves.first(), moves.last()) {
            // One read for the span of live blocks, then verify each.
            let n = (last - first + 1) as usize;
            let mut span = AlignedBuf::new(n * self.bs);
            self.data.read_at(
                span.as_mut_slice(),
                self.geo.data_offset() + first * self.bs as u64,
            )?;
            let epoch = st.epochs[v];
            for &(pbn, lbn) in &moves {
                if st.l2p[lbn as usize] as u64 != pbn {
                    continue;
                }
                let i = (pbn - first) as usize;
                let blk = &mut span.as_mut_slice()[i * self.bs..(i + 1) * self.bs];
                let mut want = [0u8; 16];
                want[..self.width].copy_from_slice(
                    &st.sums[lbn as usize * self.width..(lbn as usize + 1) * self.width],
                );
                if let Err(e) = self.decrypt_verify(lbn, pbn, epoch, &want, blk) {
                    tracing::error!(cluster = v, lbn, error = %e, "cannot move a corrupt block; the cluster is quarantined");
                    st.quarantined[v] = true;
                    return Ok(true);
                }
                let copy = blk.to_vec();
                self.insert(st, lbn, &copy, true)?;
                self.stats.gc_moved.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats.gc_clusters.fetch_add(1, Ordering::Relaxed);
        // The victim is free after the next barrier (see `barrier`).
        Ok(true)
    }

    /// Collect victims until free plus pending clusters reach `target`,
    /// then one barrier frees them all. Returns clusters collected.
    pub(super) fn collect_to(&self, st: &mut State, target: u64) -> Result<u64> {
        let mut n = 0;
        while st.free + (st.pending.len() as u64) < target {
            if !self.collect_one(st)? {
                break;
            }
            n += 1;
        }
        if !st.pending.is_empty() {
            self.barrier(st)?;
        }
        Ok(n)
    }

    /// Run the garbage collector until the high watermark (or nothing is
    /// left to collect). Returns clusters reclaimed.
    pub fn gc_now(&self) -> Result<u64> {
        let mut st = self.lock();
        self.check_writable(&st, Op::Write)?;
        self.collect_to(&mut st, self.policy.high)
    }
}

pub(super) fn gc_thread(lbs: Arc<Inner>) {
    let idle = Duration::from_millis(100);
    loop {
        if lbs.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut st = lbs.lock();
        let mut progressed = false;
        if st.free < lbs.policy.low && st.poisoned.is_none() {
            // One victim per lock hold, up to the high watermark counting
            // clusters that the next barrier frees; then that barrier.
            while !lbs.stop.load(Ordering::SeqCst)
                && st.free + (st.pending.len() as u64) < lbs.policy.high
            {
                match lbs.collect_one(&mut st) {
                    Ok(true) => progressed = true,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "background garbage collection failed");
                        break;
                    }
                }
                drop(st);
                std::thread::yield_now();
                st = lbs.lock();
            }
            if !st.pending.is_empty() {
                if let Err(e) = lbs.barrier(&mut st) {
                    tracing::error!(error = %e, "barrier after garbage collection failed");
                }
            }
        }
        if !progressed {
            let (g, _) = lbs
                .gc_wake
                .wait_timeout(st, idle)
                .unwrap_or_else(|p| p.into_inner());
            drop(g);
        }
    }
}
