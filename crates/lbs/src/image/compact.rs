//! Log compaction: the metadata log rewritten from the in-memory map
//! through a second file and an atomic rename (seed section 4.5).

use super::*;
use crate::format::{ClusterHint, CLUSTERS_PER_ENTRY, STAMPS_PER_ENTRY};

impl Inner {
    /// Rewrite the log as the current (durable) state plus one barrier,
    /// atomically, under a new generation.
    pub(super) fn compact(&self, st: &mut State) -> Result<()> {
        debug_assert!(st.streams.iter().all(|w| w.buf.lbns.is_empty()));
        // `self.header` carries the current version (an older log is
        // upgraded here, at the compaction of a writable open).
        let mut header = self.header.clone();
        header.generation = st.generation + 1;
        let w = self.width;
        let mut out = header.encode();
        let mut seq = 1u64;
        let mut running = 0u32;
        let push = |out: &mut Vec<u8>, e: &Entry, seq: &mut u64, running: &mut u32| {
            let b = encode_entry(e, *seq, w);
            *seq += 1;
            *running = crc32c::crc32c_append(*running, &b);
            out.extend_from_slice(&b);
        };
        // Mapped blocks in PBN order, from the reverse map (no sort: on a
        // 16 GiB image of random writes, sorting the map's 4M pairs was a
        // third of a compaction's time).
        let mapped: Vec<(u32, u32)> = st
            .p2l
            .iter()
            .enumerate()
            .filter(|&(p, &l)| l != NO_LBN && st.l2p[l as usize] == p as u32)
            .map(|(p, &l)| (p as u32, l))
            .collect();
        debug_assert_eq!(
            mapped.len(),
            st.l2p.iter().filter(|&&p| p < ZERO).count(),
            "the reverse map names every mapped block"
        );
        // A block's seal, or None where it was written in place.
        let seal = |l: u32| match st.seal_pbn[l as usize] {
            IN_PLACE => None,
            sp => Some((sp as u64, st.seal_epoch[l as usize])),
        };
        let mut i = 0;
        while i < mapped.len() {
            let (p0, l0) = mapped[i];
            let c = p0 as u64 / self.bpc;
            let s0 = seal(l0);
            let mut j = i + 1;
            while j < mapped.len()
                && mapped[j].0 == p0 + (j - i) as u32
                && mapped[j].1 == l0 + (j - i) as u32
                && mapped[j].0 as u64 / self.bpc == c
                && seal(mapped[j].1) == s0.map(|(sp, se)| (sp + (j - i) as u64, se))
            {
                j += 1;
            }
            let sums = st.sums[l0 as usize * w..(l0 as usize + (j - i)) * w].to_vec();
            let (lbn, pbn, count, epoch) =
                (l0 as u64, p0 as u64, (j - i) as u64, st.epochs[c as usize]);
            let e = Entry::placing(lbn, pbn, count, epoch, s0, sums);
            push(&mut out, &e, &mut seq, &mut running);
            i = j;
        }
        let mut l = 0;
        while l < st.l2p.len() {
            if st.l2p[l] == ZERO {
                let mut m = l + 1;
                while m < st.l2p.len() && st.l2p[m] == ZERO {
                    m += 1;
                }
                push(
                    &mut out,
                    &Entry::Zero {
                        lbn: l as u64,
                        count: (m - l) as u64,
                    },
                    &mut seq,
                    &mut running,
                );
                l = m;
            } else {
                l += 1;
            }
        }
        if header.version >= 3 {
            self.push_hints(st, &mut |e: &Entry| {
                push(&mut out, e, &mut seq, &mut running)
            });
        }
        let b = encode_entry(
            &Entry::Barrier {
                number: 1,
                crc: running,
            },
            seq,
            w,
        );
        out.extend_from_slice(&b);
        let r = st.log.replace(&out).map_err(|e| log_err(Op::Flush, e));
        self.poison(st, r)?;
        st.compacted = out.len() as u64;
        st.seq = seq + 1;
        st.barrier_no = 1;
        st.running = 0;
        st.dirty = false;
        st.generation = header.generation;
        st.epoch_counter = 0;
        self.stats.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The collector's hints, for the next open: the blocks' write stamps
    /// and what it knows of every cluster in use (runs with nothing to
    /// say are left out).
    fn push_hints(&self, st: &State, push: &mut dyn FnMut(&Entry)) {
        let clock = st.clock;
        for (k, run) in st.stamps.chunks(STAMPS_PER_ENTRY).enumerate() {
            if run.iter().any(|&x| x != 0) {
                push(&Entry::Stamps {
                    lbn: (k * STAMPS_PER_ENTRY) as u64,
                    clock,
                    stamps: run.to_vec(),
                });
            }
        }
        let hints: Vec<ClusterHint> = (0..st.cstate.len())
            .map(|c| match st.cstate[c] {
                ClusterState::Used | ClusterState::Active => ClusterHint {
                    epoch: st.epochs[c],
                    activated: st.activated[c],
                    written: st.written[c],
                    stream: st.stream_of[c],
                },
                _ => ClusterHint::default(),
            })
            .collect();
        for (k, run) in hints.chunks(CLUSTERS_PER_ENTRY).enumerate() {
            if run.iter().any(|h| h.epoch != 0) {
                push(&Entry::Clusters {
                    first: (k * CLUSTERS_PER_ENTRY) as u64,
                    clock,
                    hints: run.to_vec(),
                });
            }
        }
    }

    /// Compact the metadata log now (after a barrier).
    pub fn compact_now(&self) -> Result<()> {
        let mut st = self.state.lock();
        self.check_writable(&st, Op::Flush)?;
        self.barrier(&mut st)?;
        self.compact(&mut st)
    }
}
