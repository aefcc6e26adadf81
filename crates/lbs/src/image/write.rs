//! The write path: blocks go into the write buffer, which a barrier
//! flushes to the current cluster (allocating clusters as they fill) and
//! records in the metadata log; trims and zeroes unmap blocks. The
//! crash-consistency argument is in `docs/formats/lbs.md`.

use std::sync::atomic::Ordering;

use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::*;

impl Inner {
    pub(super) fn append_entry(&self, st: &mut State, e: &Entry) -> Result<()> {
        let b = encode_entry(e, st.seq, self.width);
        st.seq += 1;
        st.running = crc32c::crc32c_append(st.running, &b);
        st.dirty = true;
        let r = st.log.append(&b).map_err(|e| log_err(Op::Write, e));
        self.poison(st, r)
    }

    pub(super) fn release(&self, st: &mut State, lbn: usize) {
        let old = st.l2p[lbn];
        if old < ZERO {
            st.p2l[old as usize] = NO_LBN;
            let c = (old as u64 / self.bpc) as usize;
            st.live[c] -= 1;
            if st.live[c] == 0 && st.cstate[c] == ClusterState::Used {
                st.cstate[c] = ClusterState::PendingFree;
                st.pending.push(c);
            }
            st.touch(c);
        }
    }

    pub(super) fn buf_cap(&self) -> usize {
        (self.opts.buffer_size / self.bs).max(1)
    }

    /// Room left in stream `s`'s buffer and active cluster.
    pub(super) fn room(&self, st: &State, s: usize) -> usize {
        let w = &st.streams[s];
        let Some(a) = w.active else { return 0 };
        let end = (a as u64 + 1) * self.bpc;
        let next = w.buf.base + w.buf.lbns.len() as u64;
        (self.buf_cap() - w.buf.lbns.len().min(self.buf_cap())).min((end - next) as usize)
    }

    /// Slots left in stream `s`'s active cluster, buffered or not.
    pub(super) fn cluster_room(&self, st: &State, s: usize) -> usize {
        let w = &st.streams[s];
        let Some(a) = w.active else { return 0 };
        let end = (a as u64 + 1) * self.bpc;
        (end - (w.buf.base + w.buf.lbns.len() as u64)) as usize
    }

    /// Seal (checksum and encrypt) the clients' blocks of stream `s`'s
    /// buffer, write it, then log its MAP runs and its moved blocks'
    /// MOVED runs (moved blocks are written as they are, still sealed where
    /// they were first written).
    pub(super) fn flush_buffer(&self, st: &mut State, s: usize) -> Result<()> {
        let n = st.streams[s].buf.lbns.len();
        if n == 0 {
            return Ok(());
        }
        let a = st.streams[s]
            .active
            .expect("a buffered block has an active cluster");
        let epoch = st.epochs[a];
        let base = st.streams[s].buf.base;
        let mut out = AlignedBuf::new(n * self.bs);
        let (bs, w) = (self.bs, self.width);
        {
            let State { streams, sums, .. } = &mut *st;
            let buf = &streams[s].buf;
            let o = out.as_mut_slice();
            for i in 0..n {
                let plain = &buf.data[i * bs..(i + 1) * bs];
                let lbn = buf.lbns[i];
                if buf.seals[i].is_some() {
                    o[i * bs..(i + 1) * bs].copy_from_slice(plain);
                    continue;
                }
                if lbn != DEAD {
                    self.header.checksum.compute(
                        lbn,
                        epoch,
                        plain,
                        &mut sums[lbn as usize * w..(lbn as usize + 1) * w],
                    );
                }
                let blk = &mut o[i * bs..(i + 1) * bs];
                blk.copy_from_slice(plain);
                if let Some(x) = &self.cipher {
                    x.encrypt(base + i as u64, epoch, blk);
                }
            }
        }
        let off = self.geo.data_offset() + base * bs as u64;
        let r = self
            .data
            .write_at(out.as_slice(), off, WriteFlags::default());
        self.poison(st, r)?;
        self.stats
            .physical_blocks
            .fetch_add(n as u64, Ordering::Relaxed);
        let lbns = std::mem::take(&mut st.streams[s].buf.lbns);
        let seals = std::mem::take(&mut st.streams[s].buf.seals);
        // Runs of consecutive LBNs, sealed here (MAP) or moved with seals
        // at consecutive PBNs of one epoch (MOVED).
        let follows = |j: usize| match (seals[j - 1], seals[j]) {
            (None, None) => true,
            (Some((p0, e0)), Some((p1, e1))) => e1 == e0 && p1 == p0 + 1,
            _ => false,
        };
        let mut i = 0;
        while i < n {
            if lbns[i] == DEAD {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < n && lbns[j] != DEAD && lbns[j] == lbns[j - 1] + 1 && follows(j) {
                j += 1;
            }
            let lbn = lbns[i];
            let sums = st.sums[lbn as usize * w..(lbn as usize + (j - i)) * w].to_vec();
            let (pbn, count) = (base + i as u64, (j - i) as u64);
            let e = Entry::placing(lbn, pbn, count, epoch, seals[i], sums);
            self.append_entry(st, &e)?;
            i = j;
        }
        let buf = &mut st.streams[s].buf;
        buf.base += n as u64;
        buf.lbns = lbns;
        buf.lbns.clear();
        buf.seals = seals;
        buf.seals.clear();
        buf.data.clear();
        buf.index.clear();
        Ok(())
    }

    /// Make everything so far durable: data, then a barrier entry, then the
    /// log; clusters emptied since the previous barrier become free.
    pub(super) fn barrier(&self, st: &mut State) -> Result<()> {
        if !st.dirty && st.streams.iter().all(|w| w.buf.lbns.is_empty()) {
            // Nothing new since the last barrier: every release behind the
            // pending clusters is already durable.
            self.free_pending(st);
            return Ok(());
        }
        // Every stream: a victim's moved blocks must be durable before the
        // victim is freed.
        for s in 0..STREAMS {
            self.flush_buffer(st, s)?;
        }
        let r = self.data.flush();
        self.poison(st, r)?;
        let e = Entry::Barrier {
            number: st.barrier_no + 1,
            crc: st.running,
        };
        let b = encode_entry(&e, st.seq, self.width);
        let r = st
            .log
            .append(&b)
            .and_then(|_| st.log.sync())
            .map_err(|e| log_err(Op::Flush, e));
        self.poison(st, r)?;
        st.seq += 1;
        st.barrier_no += 1;
        st.running = 0;
        st.dirty = false;
        self.stats.barriers.fetch_add(1, Ordering::Relaxed);
        self.free_pending(st);
        if st.log.len() > self.opts.compact_limit.max(2 * st.compacted) {
            self.compact(st)?;
        }
        Ok(())
    }

    pub(super) fn free_pending(&self, st: &mut State) {
        for c in std::mem::take(&mut st.pending) {
            if st.cstate[c] == ClusterState::PendingFree && st.live[c] == 0 {
                st.cstate[c] = ClusterState::Free;
                st.free += 1;
                st.touch(c);
            }
        }
    }

    /// Hand the next free cluster to stream `s`'s write position (clients'
    /// streams leave [`GC_RESERVE`] for the collector's).
    pub(super) fn take_cluster(&self, st: &mut State, s: usize) -> Result<bool> {
        let reserve = if is_moved(s) { 0 } else { GC_RESERVE };
        if st.free <= reserve {
            return Ok(false);
        }
        let n = st.cstate.len();
        let start = st.streams[s].next % n;
        // The next free cluster after this stream's last one, but not just
        // in front of another stream's active cluster: streams that write
        // into the same stretch of the data file interleave, which flash
        // media (SD cards' allocation units) pay for. Any free cluster if
        // there is no other.
        let actives: Vec<usize> = (0..STREAMS)
            .filter(|&o| o != s)
            .filter_map(|o| st.streams[o].active)
            .collect();
        let ahead = |c: usize| {
            actives
                .iter()
                .any(|&a| (c + n - a) % n <= STREAM_GAP.min(n as u64 / 8) as usize)
        };
        let free = |c: &usize| st.cstate[*c] == ClusterState::Free;
        let Some(c) = (0..n)
            .map(|i| (start + i) % n)
            .filter(free)
            .find(|&c| !ahead(c))
            .or_else(|| (0..n).map(|i| (start + i) % n).find(free))
        else {
            return Ok(false);
        };
        let _w = self.reuse.write();
        if let Some(a) = st.streams[s].active {
            if st.live[a] == 0 {
                st.cstate[a] = ClusterState::PendingFree;
                st.pending.push(a);
            } else {
                st.cstate[a] = ClusterState::Used;
            }
            st.touch(a);
        }
        st.epoch_counter = st
            .epoch_counter
            .checked_add(1)
            .ok_or_else(|| err(ErrorKind::Io, Op::Write, "epoch counter exhausted"))?;
        st.epochs[c] = (st.generation << 32) | st.epoch_counter as u64;
        st.cstate[c] = ClusterState::Active;
        st.free -= 1;
        st.stream_of[c] = s as u8;
        st.activated[c] = st.clock;
        st.written[c] = 0;
        st.clock += 1;
        st.touch(c);
        st.streams[s].active = Some(c);
        st.streams[s].next = c + 1;
        st.streams[s].buf.base = c as u64 * self.bpc;
        if st.free < self.policy.low {
            self.gc_wake.notify_all();
        }
        Ok(true)
    }

    /// Make room for one more block in stream `s`'s buffer or, when no
    /// cluster can be had, in another stream of the same kind (clients' or
    /// the collector's) that has room: the temperature is only a hint.
    /// Returns the stream.
    ///
    /// No deadlock: a client's stream takes a cluster only while more than
    /// [`GC_RESERVE`] (1) are free, else runs the collector; the collector
    /// moves one victim (fewer than a cluster's blocks) at a time, and
    /// once one of its streams took the reserved cluster that stream has
    /// room for the rest of the victim; the victim is free after the next
    /// barrier. When the collector finds no victim because the spare
    /// space sits in the streams' active clusters (unwritten or dead
    /// slots), a client's write retires them all ([`Self::retire_actives`])
    /// and tries again: then any spare beyond the reserve is in victims.
    pub(super) fn ensure_room(&self, st: &mut State, s: usize) -> Result<usize> {
        let mut retired = false;
        loop {
            if self.room(st, s) > 0 {
                return Ok(s);
            }
            if !st.streams[s].buf.lbns.is_empty() {
                self.flush_buffer(st, s)?;
                continue;
            }
            if self.take_cluster(st, s)? {
                continue;
            }
            if !st.pending.is_empty() {
                self.barrier(st)?;
                continue;
            }
            if !is_moved(s) && self.collect_to(st, GC_RESERVE + 1)? > 0 {
                continue;
            }
            if let Some(o) =
                (0..STREAMS).find(|&o| is_moved(o) == is_moved(s) && self.cluster_room(st, o) > 0)
            {
                if self.room(st, o) == 0 {
                    // Its buffer is full, its cluster is not.
                    self.flush_buffer(st, o)?;
                }
                return Ok(o);
            }
            if !is_moved(s) && !retired {
                // Last resort: the slack may sit in other streams' active
                // clusters, which are no victims. Retire them all.
                retired = true;
                self.stats.retires.fetch_add(1, Ordering::Relaxed);
                self.retire_actives(st)?;
                continue;
            }
            return Err(err(
                ErrorKind::NoSpace,
                Op::Write,
                "no free cluster: the physical space is full of live data (create the image with more overprovisioning)",
            ));
        }
    }

    /// Flush every stream and take its active cluster away from it, as
    /// `take_cluster` does when it hands the stream a new one: the
    /// cluster's unwritten slots then count as free space for the
    /// collector. For when the image is out of clusters only: the slots
    /// stay unused until the cluster is collected.
    fn retire_actives(&self, st: &mut State) -> Result<()> {
        for o in 0..STREAMS {
            self.flush_buffer(st, o)?;
            if let Some(a) = st.streams[o].active.take() {
                if st.live[a] == 0 {
                    st.cstate[a] = ClusterState::PendingFree;
                    st.pending.push(a);
                } else {
                    st.cstate[a] = ClusterState::Used;
                }
                st.touch(a);
            }
        }
        Ok(())
    }

    /// Put a client's block in the buffer as the new content of `lbn`.
    pub(super) fn insert(&self, st: &mut State, lbn: u64, block: &[u8]) -> Result<()> {
        // A client's write still in a client's buffer is overwritten there.
        let hit = (0..STREAMS)
            .filter(|&s| !is_moved(s))
            .find_map(|s| st.streams[s].buf.index.get(&lbn).map(|&i| (s, i)));
        if let Some((s, slot)) = hit {
            let buf = &mut st.streams[s].buf;
            // Clients' streams hold clients' blocks only (plaintext, sealed
            // at their slot when written): moves go to the collector's.
            debug_assert!(buf.seals[slot].is_none());
            buf.data[slot * self.bs..(slot + 1) * self.bs].copy_from_slice(block);
            self.stats.absorbed.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.put(st, lbn, block, None)
    }

    /// Put a block the collector moves, `raw` as read from disk (sealed at
    /// `seal`), in a buffer of the collector's streams as the new place of
    /// `lbn`.
    pub(super) fn insert_moved(
        &self,
        st: &mut State,
        lbn: u64,
        raw: &[u8],
        seal: Seal,
    ) -> Result<()> {
        self.put(st, lbn, raw, Some(seal))
    }

    /// Append `lbn`'s block to the buffer of the stream it belongs in
    /// (a moved block when `seal` is set) and map it there.
    fn put(&self, st: &mut State, lbn: u64, block: &[u8], seal: Option<Seal>) -> Result<()> {
        let want = self.stream_for(st, lbn, seal.is_some());
        let s = self.ensure_room(st, want)?;
        // A copy buffered in another stream is superseded: written to disk
        // but never mapped.
        for o in 0..STREAMS {
            if let Some(slot) = st.streams[o].buf.index.remove(&lbn) {
                st.streams[o].buf.lbns[slot] = DEAD;
            }
        }
        let buf = &mut st.streams[s].buf;
        let slot = buf.lbns.len();
        let pbn = buf.base + slot as u64;
        buf.lbns.push(lbn);
        buf.seals.push(seal);
        buf.data.extend_from_slice(block);
        buf.index.insert(lbn, slot);
        self.release(st, lbn as usize);
        st.l2p[lbn as usize] = pbn as u32;
        st.p2l[pbn as usize] = lbn as u32;
        match seal {
            Some((sp, se)) => {
                st.seal_pbn[lbn as usize] = sp as u32;
                st.seal_epoch[lbn as usize] = se;
            }
            None => st.seal_pbn[lbn as usize] = IN_PLACE,
        }
        let a = st.streams[s]
            .active
            .expect("ensure_room set an active cluster");
        st.live[a] += 1;
        st.written[a] += 1;
        st.touch(a);
        st.dirty = true;
        self.stats.stream_blocks[s].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The stream `lbn`'s new copy should go to (`crate::gc::client_stream`,
    /// `crate::gc::moved_stream`); a client's write also stamps the block.
    fn stream_for(&self, st: &mut State, lbn: u64, for_gc: bool) -> usize {
        let now = crate::gc::stamp_now(st.clock, st.stamp_unit);
        let stamp = st.stamps[lbn as usize];
        let old = st.l2p[lbn as usize];
        let c = (old < ZERO).then(|| (old as u64 / self.bpc) as usize);
        if for_gc {
            let victim = c.map_or(crate::gc::WARM, |c| st.stream_of[c] as usize);
            return crate::gc::moved_stream(stamp, now, st.stamp_pass, victim);
        }
        // A pass: as many activations as there are clusters.
        let pass = st.cstate.len() as f64;
        let old_lifetime = c.map(|c| {
            let age = st.clock.saturating_sub(st.activated[c]);
            crate::gc::lifetime(age, st.written[c], st.live[c]) / pass
        });
        let (s, new) = crate::gc::client_stream(stamp, now, st.stamp_pass, old_lifetime);
        st.stamps[lbn as usize] = new;
        s
    }

    /// Unmap or zero whole blocks `[first, first+count)`.
    pub(super) fn unmap(&self, st: &mut State, first: u64, count: u64, zero: bool) -> Result<()> {
        for lbn in first..first + count {
            st.stamps[lbn as usize] = 0;
            for w in st.streams.iter_mut() {
                if let Some(slot) = w.buf.index.remove(&lbn) {
                    w.buf.lbns[slot] = DEAD;
                }
            }
            self.release(st, lbn as usize);
            st.l2p[lbn as usize] = if zero { ZERO } else { UNMAPPED };
            st.seal_pbn[lbn as usize] = IN_PLACE;
        }
        let e = if zero {
            Entry::Zero { lbn: first, count }
        } else {
            Entry::Trim { lbn: first, count }
        };
        self.append_entry(st, &e)
    }
}
