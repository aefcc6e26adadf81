//! A session's flushes through its write-ahead log (`super::super::wal`),
//! the parts that need no session: what a flush logs (the sectors touched
//! since the last one), the record made of them, and a read-only open's
//! view of the log's records.

use std::collections::HashMap;

use roamdisk_blockdev::overlay::{Run, StateTable};
use roamdisk_blockdev::Result;
use roamdisk_chunkstore::index::{SectorState, SECTOR};

use super::super::wal::{self, Record};

/// State changes the map may hold unlogged before a flush checkpoints.
pub(super) const MAX_PENDING: usize = 1 << 16;

/// The most data a flush puts in the log. Past it the flush checkpoints
/// (the private cache synced, then the map: two syncs) rather than write
/// the data twice: measured with fio on a new session, 1 MiB sequential
/// writes with a flush every 16 MiB ran at 0.46x through the log, while
/// 4 KiB random writes with a flush every 1-32 writes ran at 1.9-2.2x.
pub(super) const MAX_RECORD: u64 = 1 << 20;

/// The sectors written or changed since the last flush: what its log
/// record holds. Past twice what a record may hold they are forgotten
/// (`overflow`: the flush checkpoints instead).
#[derive(Default)]
pub(super) struct Touched {
    pub(super) ranges: Vec<(u64, u64)>,
    sectors: u64,
    pub(super) overflow: bool,
}

impl Touched {
    pub(super) fn add(&mut self, a: u64, b: u64) {
        if self.overflow {
            return;
        }
        self.sectors += b - a;
        if self.sectors > 2 * MAX_RECORD / SECTOR {
            *self = Touched {
                overflow: true,
                ..Default::default()
            };
            return;
        }
        if let Some(last) = self.ranges.last_mut() {
            if last.1 == a {
                last.1 = b;
                return;
            }
        }
        self.ranges.push((a, b));
    }

    /// Put back what a failed flush took.
    pub(super) fn restore(&mut self, t: Touched) {
        if t.overflow {
            self.overflow = true;
            self.ranges = Vec::new();
            return;
        }
        for (a, b) in t.ranges {
            self.add(a, b);
        }
    }

    /// The ranges sorted, overlapping and adjacent ones merged.
    fn merged(&self) -> Vec<(u64, u64)> {
        let mut r = self.ranges.clone();
        r.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
        for (a, b) in r {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        out
    }
}

/// Whether the private cache holds the bytes of a sector in `state`.
fn cached(state: u8) -> bool {
    state == SectorState::Clean as u8 || state == SectorState::Dirty as u8
}

/// The log record of the sectors `t` touched: their states (`states`) and
/// the bytes of those the private cache holds (`read(buf, offset)`), each
/// merged range read while `lock(a, b)`'s guard is held (the stripe locks
/// writers take, so that a state and its bytes agree). `None`: more than
/// `budget` bytes.
pub(super) fn record_of<G>(
    t: &Touched,
    budget: u64,
    states: &StateTable,
    lock: impl Fn(u64, u64) -> G,
    mut read: impl FnMut(&mut [u8], u64) -> Result<()>,
) -> Result<Option<Record>> {
    let merged = t.merged();
    let most: u64 = merged.iter().map(|(a, b)| b - a).sum::<u64>() * SECTOR;
    if most > budget {
        // Perhaps less with ZERO sectors among them; not worth reading.
        return Ok(None);
    }
    let mut rec = Record {
        seq: 0,
        runs: Vec::new(),
        extents: Vec::new(),
        data: Vec::new(),
    };
    for (a, b) in merged {
        let _guards = lock(a, b);
        let mut s = a;
        while s < b {
            let v = states.get(s);
            let e = states.run_end(s, b.min(s + u32::MAX as u64), |x| x);
            let count = (e - s) as u32;
            rec.runs.push(Run {
                start: s,
                count,
                state: v,
            });
            if cached(v) {
                let n = (e - s) * SECTOR;
                let len = wal::record_len(rec.runs.len(), rec.extents.len() + 1, rec.data.len());
                if len + n > budget {
                    return Ok(None);
                }
                let at = rec.data.len();
                rec.data.resize(at + n as usize, 0);
                read(&mut rec.data[at..], s * SECTOR)?;
                rec.extents.push(wal::Extent { start: s, count });
            }
            s = e;
        }
    }
    if wal::record_len(rec.runs.len(), rec.extents.len(), rec.data.len()) > budget {
        return Ok(None);
    }
    Ok(Some(rec))
}

/// Apply replayed records in order: `write(bytes, offset)` for their data,
/// `set(a, b, state)` for their states.
pub(super) fn apply(
    r: &wal::Replay,
    mut write: impl FnMut(&[u8], u64) -> Result<()>,
    mut set: impl FnMut(u64, u64, u8),
) -> Result<()> {
    for rec in &r.records {
        let mut at = 0usize;
        for e in &rec.extents {
            let n = e.count as usize * SECTOR as usize;
            write(&rec.data[at..at + n], e.start * SECTOR)?;
            at += n;
        }
        for run in &rec.runs {
            set(run.start, run.start + run.count as u64, run.state);
        }
    }
    Ok(())
}

/// A read-only open's bytes from the log (its writable opens apply them
/// to the private cache instead): sector → bytes, read over the cache.
#[derive(Default)]
pub(super) struct Logged(HashMap<u64, Box<[u8]>>);

impl Logged {
    /// What a read-only open reads of `r`: its states set in `states` (in
    /// memory only), its bytes kept.
    pub(super) fn of(r: &wal::Replay, states: &StateTable) -> Logged {
        let mut kept = Logged::default();
        let keep = |b: &[u8], off| {
            kept.keep(b, off);
            Ok(())
        };
        let _ = apply(r, keep, |a, b, v| states.set(a, b, v));
        kept
    }

    /// Keep `bytes`, whole sectors from byte `off` of the disk.
    pub(super) fn keep(&mut self, bytes: &[u8], off: u64) {
        for (k, b) in bytes.chunks(SECTOR as usize).enumerate() {
            self.0.insert(off / SECTOR + k as u64, b.into());
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Lay the kept bytes over `dst`, the disk's bytes from `a`.
    pub(super) fn lay_over(&self, dst: &mut [u8], a: u64) {
        let end = a + dst.len() as u64;
        for s in a / SECTOR..end.div_ceil(SECTOR) {
            if let Some(b) = self.0.get(&s) {
                let (x, y) = ((s * SECTOR).max(a), ((s + 1) * SECTOR).min(end));
                dst[(x - a) as usize..(y - a) as usize]
                    .copy_from_slice(&b[(x - s * SECTOR) as usize..(y - s * SECTOR) as usize]);
            }
        }
    }
}
