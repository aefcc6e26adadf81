//! The TransCom desktop mix (seed `transcom-vdisk-two-level-cache`,
//! section 3.2): requests of 0.5 KB to 64 KB averaging 8 KB, 70% of them
//! at most 4 KB and 4 KB the most frequent size (60%); read:write traffic
//! 1:3; read:write working sets 4:5; half of the requests sequential.
//!
//! Sizes are drawn from a fixed table with exactly those moments. Reads
//! and writes each keep a cursor: with probability 1/2 a request continues
//! its cursor, otherwise it jumps. A jump goes to fresh space or back to
//! where an earlier jump went, whichever keeps the working sets on target
//! (reads: 0.8 blocks of working set per block read; writes: the read
//! working set / 0.8).

use rand::RngExt;
use roaring::RoaringTreemap;

use crate::format::{Record, TraceOp};

/// Requests per client when no length is given.
pub const DEFAULT_REQUESTS: u64 = 100_000;
/// The disk the mix addresses.
pub const DISK_BYTES: u64 = 64 << 30;
/// Block size of the working-set accounting (TransCom's 4 KB).
pub const BLOCK: u64 = 4096;
/// Mean time between requests of one client.
pub const MEAN_GAP_NS: f64 = 5e6;
/// Share of requests that are writes (1:3 traffic with equal size laws).
pub const WRITE_SHARE: f64 = 0.75;
/// Share of requests that continue their cursor.
pub const SEQUENTIAL_SHARE: f64 = 0.5;
/// Read working set per block read.
pub const READ_WS_PER_BLOCK: f64 = 0.8;
/// Read working set : write working set.
pub const WS_RATIO: f64 = 0.8;

/// Request sizes and probabilities: 60% 4 KiB; 10% from 0.5 to 3.5 KiB;
/// 30% from 8 to 64 KiB; mean 8 KiB.
pub const SIZES: &[(u32, f64)] = &[
    (512, 0.10 / 7.0),
    (1024, 0.10 / 7.0),
    (1536, 0.10 / 7.0),
    (2048, 0.10 / 7.0),
    (2560, 0.10 / 7.0),
    (3072, 0.10 / 7.0),
    (3584, 0.10 / 7.0),
    (4096, 0.60),
    (8192, 0.30 * 0.44),
    (12288, 0.30 * 0.12),
    (16384, 0.30 * 0.20),
    (24576, 0.30 * 0.05),
    (32768, 0.30 * 0.11),
    (65536, 0.30 * 0.08),
];

#[derive(Default)]
struct Cursor {
    end: Option<u64>,
    ws: RoaringTreemap,
    traffic_blocks: u64,
    jumps: Vec<u64>,
    jumps_seen: u64,
}

impl Cursor {
    fn touch(&mut self, off: u64, len: u32) {
        let first = off / BLOCK;
        let last = (off + len as u64 - 1) / BLOCK;
        self.ws.insert_range(first..=last);
        self.traffic_blocks += last - first + 1;
    }

    fn remember_jump(&mut self, off: u64, rng: &mut impl rand::Rng) {
        // Reservoir of jump targets, uniformly over the history.
        const KEEP: usize = 1 << 16;
        self.jumps_seen += 1;
        if self.jumps.len() < KEEP {
            self.jumps.push(off);
        } else {
            let i = rng.random_range(0..self.jumps_seen);
            if (i as usize) < KEEP {
                self.jumps[i as usize] = off;
            }
        }
    }
}

/// One desktop client.
pub struct Generator {
    left: u64,
    rng: rand::rngs::Xoshiro256PlusPlus,
    client: u32,
    time: f64,
    read: Cursor,
    write: Cursor,
}

impl Generator {
    pub fn new(requests: u64, seed: u64, client: u32) -> Self {
        Generator {
            left: requests,
            rng: super::stream::rng(seed),
            client,
            time: 0.0,
            read: Cursor::default(),
            write: Cursor::default(),
        }
    }

    fn size(&mut self) -> u32 {
        let mut x = self.rng.random::<f64>();
        for &(s, p) in SIZES {
            if x < p {
                return s;
            }
            x -= p;
        }
        SIZES[SIZES.len() - 1].0
    }
}

/// A fresh start: a random block not yet in `ws` (a few tries), never the
/// cursor's own end.
fn fresh(ws: &RoaringTreemap, end: Option<u64>, rng: &mut impl rand::Rng) -> u64 {
    let blocks = (DISK_BYTES - (1 << 20)) / BLOCK;
    let mut off = 0;
    for _ in 0..16 {
        off = rng.random_range(0..blocks) * BLOCK;
        if !ws.contains(off / BLOCK) && Some(off) != end {
            return off;
        }
    }
    if Some(off) == end {
        off = (off + 64 * BLOCK) % (blocks * BLOCK);
    }
    off
}

impl Iterator for Generator {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let is_write = self.rng.random_bool(WRITE_SHARE);
        let len = self.size();
        let seq = self.rng.random_bool(SEQUENTIAL_SHARE);
        let read_ws = self.read.ws.len() as f64;
        let rng = &mut self.rng;
        let (cur, want_fresh) = if is_write {
            let w = self.write.ws.len() as f64;
            (
                &mut self.write,
                w * WS_RATIO < read_ws || read_ws == 0.0 && w == 0.0,
            )
        } else {
            let t = self.read.traffic_blocks as f64;
            (&mut self.read, read_ws < READ_WS_PER_BLOCK * t || t == 0.0)
        };
        let off = match cur.end {
            Some(e) if seq && e + len as u64 <= DISK_BYTES => e,
            _ => {
                let off = if want_fresh || cur.jumps.is_empty() {
                    fresh(&cur.ws, cur.end, rng)
                } else {
                    let mut o = cur.jumps[rng.random_range(0..cur.jumps.len())];
                    if Some(o) == cur.end {
                        o = fresh(&cur.ws, cur.end, rng);
                    }
                    o
                };
                cur.remember_jump(off, rng);
                off
            }
        };
        cur.touch(off, len);
        cur.end = Some(off + len as u64);
        let gap = -(1.0 - self.rng.random::<f64>()).ln() * MEAN_GAP_NS;
        self.time += gap;
        let op = if is_write {
            TraceOp::Write
        } else {
            TraceOp::Read
        };
        Some(super::stream::request(
            self.time as u64,
            self.client,
            op,
            off,
            len,
        ))
    }
}

#[cfg(test)]
mod tests {
    //! The desktop mix against the numbers of TransCom section 3.2.
    use super::*;
    use crate::stats::StatsOptions;
    use crate::testkit::{stats_of, within};

    #[test]
    fn desktop_mix_matches_transcom_within_5_percent() {
        let n = 200_000;
        let s = stats_of(Generator::new(n, 42, 0), StatsOptions { block: BLOCK });
        let t = &s.total;
        let mut bad = Vec::new();
        let mut check = |what: &str, ours: f64, target: f64| {
            if !within(ours, target) {
                bad.push(format!("{what}: generated {ours:.4}, published {target}"));
            }
        };
        check(
            "minimum size (KB)",
            s.min_size.unwrap() as f64 / 1024.0,
            0.5,
        );
        check("maximum size (KB)", s.max_size as f64 / 1024.0, 64.0);
        check("mean size (KB)", s.mean_size() / 1024.0, 8.0);
        check("share <= 4 KB", s.share_at_most(4096), 0.70);
        let (top, share) = s.most_frequent_size().unwrap();
        assert_eq!(top, 4096);
        check("share of 4 KB", share, 0.60);
        check(
            "read:write traffic",
            t.read.bytes as f64 / t.write.bytes as f64,
            1.0 / 3.0,
        );
        check(
            "read:write working set",
            s.read_working_set_blocks as f64 / s.write_working_set_blocks as f64,
            0.8,
        );
        let seq = (t.read.sequential + t.write.sequential) as f64 / t.rw_count() as f64;
        check("sequential share", seq, 0.5);
        assert_eq!(t.rw_count(), n);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
