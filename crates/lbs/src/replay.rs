//! Recovery: replay the metadata log up to the last valid barrier.
//!
//! Pure (bytes in, map out), so it is fuzzed directly
//! (`fuzz/fuzz_targets/lbs_log.rs`). Entries after the last barrier whose
//! number and cumulative checksum verify are discarded: that is the
//! rollback to the last barrier of the seed, and it also cuts a torn tail.

use crate::format::{parse_entry, ClusterHint, Entry, MetaHeader, TailError, META_HEADER_SIZE};

/// Sentinel PBNs in the LBN→PBN map.
pub const UNMAPPED: u32 = u32::MAX;
pub const ZERO: u32 = u32::MAX - 1;
/// Sentinel seal PBN: the block is sealed where it lies (in its cluster's
/// epoch); it was written there, never moved.
pub const IN_PLACE: u32 = u32::MAX;

/// The map state a log describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapState {
    /// PBN of each LBN, or [`UNMAPPED`] / [`ZERO`].
    pub l2p: Vec<u32>,
    /// Checksums, `width` bytes per LBN (meaningful for mapped LBNs).
    pub sums: Vec<u8>,
    /// Write epoch of each cluster's current use (0 = never written).
    pub epochs: Vec<u64>,
    /// Where each LBN's block was sealed (encrypted and checksummed), when
    /// it was moved since: the PBN, or [`IN_PLACE`]...
    pub seal_pbn: Vec<u32>,
    /// ...and the epoch (meaningful where `seal_pbn` is not `IN_PLACE`).
    pub seal_epoch: Vec<u64>,
}

/// The collector's hints a log carried (STAMPS and CLUSTERS entries,
/// version 3): what it knew of the blocks' and clusters' ages when the log
/// was compacted. Each vector is empty when the log held none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hints {
    /// The activation clock of the last hint applied.
    pub clock: u64,
    /// Per LBN: its write stamp (0 = unknown).
    pub stamps: Vec<u16>,
    /// Per cluster (epoch 0 = no hint).
    pub clusters: Vec<ClusterHint>,
}

impl Hints {
    fn apply(&mut self, e: &Entry, lblocks: usize, clusters: usize) {
        match e {
            Entry::Stamps { lbn, clock, stamps } => {
                if self.stamps.is_empty() {
                    self.stamps = vec![0; lblocks];
                }
                let at = *lbn as usize;
                self.stamps[at..at + stamps.len()].copy_from_slice(stamps);
                self.clock = *clock;
            }
            Entry::Clusters {
                first,
                clock,
                hints,
            } => {
                if self.clusters.is_empty() {
                    self.clusters = vec![ClusterHint::default(); clusters];
                }
                let at = *first as usize;
                self.clusters[at..at + hints.len()].copy_from_slice(hints);
                self.clock = *clock;
            }
            _ => {}
        }
    }
}

/// What replay found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub map: MapState,
    /// Byte length of the header plus the entries up to the last valid barrier.
    pub valid_len: usize,
    /// Bytes after it (rolled back or torn).
    pub discarded: usize,
    /// Why reading stopped, when it stopped before the end.
    pub stop: Option<TailError>,
    /// Number of the last valid barrier (0 if none).
    pub barriers: u64,
    /// Next entry sequence number.
    pub next_seq: u64,
    /// Entries applied.
    pub entries: u64,
    /// The collector's hints (version 3 logs).
    pub hints: Hints,
}

/// The log was valid but describes an impossible state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata log is inconsistent at byte {offset}: {what}")]
pub struct Inconsistent {
    pub offset: usize,
    pub what: &'static str,
}

impl MapState {
    /// An empty map for `header`'s geometry.
    pub fn empty(h: &MetaHeader) -> MapState {
        let lb = h.logical_blocks() as usize;
        MapState {
            l2p: vec![UNMAPPED; lb],
            sums: vec![0u8; lb * h.checksum.width()],
            epochs: vec![0u64; h.geometry.clusters as usize],
            seal_pbn: vec![IN_PLACE; lb],
            seal_epoch: vec![0u64; lb],
        }
    }

    /// Live (mapped) blocks per cluster.
    pub fn live_counts(&self, bpc: u64) -> Vec<u32> {
        let mut live = vec![0u32; self.epochs.len()];
        for &p in &self.l2p {
            if p < ZERO {
                live[(p as u64 / bpc) as usize] += 1;
            }
        }
        live
    }

    fn apply(
        &mut self,
        e: &Entry,
        width: usize,
        bpc: u64,
        live: &mut [u32],
    ) -> Result<(), &'static str> {
        let release = |l2p: &mut Vec<u32>, live: &mut [u32], lbn: usize| {
            let old = l2p[lbn];
            if old < ZERO {
                live[(old as u64 / bpc) as usize] -= 1;
            }
        };
        match e {
            Entry::Map { .. } | Entry::Moved { .. } => {
                let p = e.placed().expect("MAP or MOVED");
                let c = (p.pbn / bpc) as usize;
                if self.epochs[c] != p.epoch {
                    if p.epoch < self.epochs[c] {
                        return Err("MAP entry with an older epoch than its cluster's");
                    }
                    if live[c] != 0 {
                        return Err("cluster reused while it still held live blocks");
                    }
                    self.epochs[c] = p.epoch;
                }
                for i in 0..p.count as usize {
                    let l = p.lbn as usize + i;
                    release(&mut self.l2p, live, l);
                    self.l2p[l] = (p.pbn + i as u64) as u32;
                    live[c] += 1;
                    self.sums[l * width..(l + 1) * width]
                        .copy_from_slice(&p.sums[i * width..(i + 1) * width]);
                    match p.seal {
                        Some((sp, se)) => {
                            self.seal_pbn[l] = (sp + i as u64) as u32;
                            self.seal_epoch[l] = se;
                        }
                        None => self.seal_pbn[l] = IN_PLACE,
                    }
                }
            }
            Entry::Zero { lbn, count } | Entry::Trim { lbn, count } => {
                let v = if matches!(e, Entry::Zero { .. }) {
                    ZERO
                } else {
                    UNMAPPED
                };
                for l in *lbn as usize..(*lbn + *count) as usize {
                    release(&mut self.l2p, live, l);
                    self.l2p[l] = v;
                    self.seal_pbn[l] = IN_PLACE;
                }
            }
            Entry::Barrier { .. } | Entry::Stamps { .. } | Entry::Clusters { .. } => {}
        }
        Ok(())
    }
}

/// Replay a whole `.lbsm` whose header parsed as `h`.
pub fn replay(bytes: &[u8], h: &MetaHeader) -> Result<Replayed, Inconsistent> {
    let width = h.checksum.width();
    let bpc = h.geometry.blocks_per_cluster();
    let lblocks = h.logical_blocks();
    let pblocks = h.geometry.physical_blocks();
    let mut map = MapState::empty(h);
    let mut live = vec![0u32; map.epochs.len()];
    let mut pos = META_HEADER_SIZE.min(bytes.len());
    let mut valid_len = pos;
    let mut pending: Vec<(usize, Entry)> = Vec::new();
    let mut running = 0u32;
    let mut seq = 1u64;
    let mut next_seq = 1u64;
    let mut barriers = 0u64;
    let mut entries = 0u64;
    let mut stop = None;
    let mut hints = Hints::default();
    while pos < bytes.len() {
        let (e, s, len) = match parse_entry(&bytes[pos..], width, lblocks, pblocks, bpc) {
            Ok(x) => x,
            Err(t) => {
                stop = Some(t);
                break;
            }
        };
        if h.version < 2 && matches!(e, Entry::Moved { .. }) {
            stop = Some(TailError::BadEntry("MOVED entry in a version-1 log"));
            break;
        }
        if h.version < 3 && matches!(e, Entry::Stamps { .. } | Entry::Clusters { .. }) {
            stop = Some(TailError::BadEntry(
                "hint entry in a log older than version 3",
            ));
            break;
        }
        if s != seq {
            stop = Some(TailError::BadSequence {
                expected: seq,
                found: s,
            });
            break;
        }
        match e {
            Entry::Barrier { number, crc } => {
                if number != barriers + 1 || crc != running {
                    stop = Some(TailError::BadEntry("barrier number or checksum mismatch"));
                    break;
                }
                for (at, p) in pending.drain(..) {
                    if matches!(p, Entry::Stamps { .. } | Entry::Clusters { .. }) {
                        hints.apply(&p, lblocks as usize, live.len());
                    } else {
                        map.apply(&p, width, bpc, &mut live)
                            .map_err(|what| Inconsistent { offset: at, what })?;
                    }
                    entries += 1;
                }
                barriers = number;
                running = 0;
                valid_len = pos + len;
                next_seq = seq + 1;
            }
            other => {
                running = crc32c::crc32c_append(running, &bytes[pos..pos + len]);
                pending.push((pos, other));
            }
        }
        seq += 1;
        pos += len;
    }
    Ok(Replayed {
        map,
        valid_len,
        discarded: bytes.len() - valid_len,
        stop,
        barriers,
        next_seq,
        entries,
        hints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::ChecksumKind;
    use crate::format::{encode_entry, Geometry};

    fn header() -> MetaHeader {
        let geometry = Geometry {
            block_size: 1024,
            cluster_size: 16 * 1024,
            clusters: 6,
        };
        MetaHeader::plain([0; 16], 64 * 1024, geometry, ChecksumKind::Crc32c)
    }

    struct LogBuilder {
        bytes: Vec<u8>,
        seq: u64,
        running: u32,
        barriers: u64,
    }
    impl LogBuilder {
        fn new(h: &MetaHeader) -> Self {
            LogBuilder {
                bytes: h.encode(),
                seq: 1,
                running: 0,
                barriers: 0,
            }
        }
        /// A MAP entry whose checksums (4 bytes a block) are all 1s.
        fn map(&mut self, lbn: u64, pbn: u64, count: u64, epoch: u64) {
            let sums = vec![1; count as usize * 4];
            self.push(Entry::Map {
                lbn,
                pbn,
                count,
                epoch,
                sums,
            });
        }
        fn push(&mut self, e: Entry) {
            let b = encode_entry(&e, self.seq, 4);
            self.seq += 1;
            self.running = crc32c::crc32c_append(self.running, &b);
            self.bytes.extend_from_slice(&b);
        }
        fn barrier(&mut self) {
            self.barriers += 1;
            let b = encode_entry(
                &Entry::Barrier {
                    number: self.barriers,
                    crc: self.running,
                },
                self.seq,
                4,
            );
            self.seq += 1;
            self.running = 0;
            self.bytes.extend_from_slice(&b);
        }
    }

    #[test]
    fn rollback_to_last_barrier() {
        let h = header();
        let mut l = LogBuilder::new(&h);
        l.map(0, 0, 2, 1);
        l.barrier();
        let good = l.bytes.len();
        l.push(Entry::Zero { lbn: 0, count: 2 });
        let r = replay(&l.bytes, &h).unwrap();
        assert_eq!(r.map.l2p[0], 0);
        assert_eq!(r.map.l2p[1], 1);
        assert_eq!(r.valid_len, good);
        assert_eq!(r.next_seq, 3);
        l.barrier();
        let r = replay(&l.bytes, &h).unwrap();
        assert_eq!(r.map.l2p[0], ZERO);
        assert_eq!(r.discarded, 0);
        // Every truncation and every bit flip is either rolled back or
        // rejected, never applied half-way.
        for n in 0..l.bytes.len() {
            let r = replay(&l.bytes[..n], &h).unwrap();
            assert!(r.map.l2p[0] == 0 || r.map.l2p[0] == UNMAPPED || n == l.bytes.len());
        }
        for i in crate::format::META_HEADER_SIZE..l.bytes.len() {
            let mut b = l.bytes.clone();
            b[i] ^= 0x20;
            let r = replay(&b, &h).unwrap();
            assert!(
                r.map.l2p[0] != ZERO,
                "flip at {i} must roll back the second barrier"
            );
        }
    }

    #[test]
    fn moved_blocks_keep_their_seal_until_rewritten() {
        let h = header();
        let mut l = LogBuilder::new(&h);
        l.map(0, 0, 3, 1);
        // Blocks 1 and 2 moved to PBN 20, sealed at PBN 1 in epoch 1.
        l.push(Entry::placing(1, 20, 2, 2, Some((1, 1)), vec![2; 8]));
        l.barrier();
        let r = replay(&l.bytes, &h).unwrap();
        assert_eq!(&r.map.l2p[..3], &[0, 20, 21]);
        assert_eq!(&r.map.seal_pbn[..3], &[IN_PLACE, 1, 2]);
        assert_eq!(&r.map.seal_epoch[1..3], &[1, 1]);
        assert_eq!(&r.map.sums[4..12], &[2; 8]);
        assert_eq!(r.map.live_counts(16)[..2], [1, 2]);
        // Rewriting and trimming put the seal back in place.
        l.map(1, 3, 1, 1);
        l.push(Entry::Trim { lbn: 2, count: 1 });
        l.barrier();
        let r = replay(&l.bytes, &h).unwrap();
        assert_eq!(&r.map.seal_pbn[..3], &[IN_PLACE; 3]);
        // A version-1 log cannot hold MOVED entries: replay stops there.
        let h1 = MetaHeader { version: 1, ..h };
        let mut l = LogBuilder::new(&h1);
        l.map(0, 0, 3, 1);
        l.barrier();
        let good = l.bytes.len();
        l.push(Entry::placing(1, 20, 1, 2, Some((1, 1)), vec![2; 4]));
        l.barrier();
        let r = replay(&l.bytes, &h1).unwrap();
        assert_eq!(r.valid_len, good);
        assert_eq!(r.map.l2p[1], 1);
    }

    #[test]
    fn hints_are_kept_and_refused_in_older_logs() {
        let stamps = Entry::Stamps {
            lbn: 4,
            clock: 9,
            stamps: vec![7, 8],
        };
        let mut l = LogBuilder::new(&header());
        l.map(0, 0, 1, 1);
        l.push(stamps.clone());
        l.barrier();
        let r = replay(&l.bytes, &header()).unwrap();
        assert_eq!(
            (&r.hints.stamps[3..7], r.hints.clock),
            (&[0, 7, 8, 0][..], 9)
        );
        assert!(r.hints.clusters.is_empty());
        // Under a version-2 header the group holding them is cut off.
        let h2 = MetaHeader {
            version: 2,
            ..header()
        };
        let mut l = LogBuilder::new(&h2);
        l.map(0, 0, 1, 1);
        l.barrier();
        let good = l.bytes.len();
        l.push(stamps);
        l.barrier();
        let r = replay(&l.bytes, &h2).unwrap();
        assert_eq!(r.valid_len, good);
        assert!(r.hints.stamps.is_empty());
    }

    #[test]
    fn reuse_of_live_cluster_is_inconsistent() {
        let h = header();
        let mut l = LogBuilder::new(&h);
        l.map(0, 0, 1, 1);
        l.map(5, 1, 1, 2);
        l.barrier();
        assert!(replay(&l.bytes, &h).is_err());
    }
}
