//! Trace statistics: the columns of LBS Table 3 per partition, the
//! request mix by count and bytes, the request-size distribution,
//! sequentiality, working sets, reuse distances, per client and per
//! partition. One streaming pass; memory grows with the working set, not
//! with the trace length.
//!
//! Definitions (also in `docs/formats/trace.md`, "Statistics"):
//!
//! - A *stream* is the requests of one client to one partition in one
//!   direction (reads, or writes).
//! - A request is *sequential* when it starts where the previous request
//!   of its stream ended, a *skip* when there was a previous request and
//!   it does not. The first request of a stream is neither.
//! - **skip %** (LBS Table 3) counts block accesses in 512-byte sectors:
//!   every sector of a request is adjacent to the previous one except the
//!   first sector of a skip, so skip % = 100 × skips / (bytes / 512).
//! - Size classes (Table 3's "1", "≤ 4", "> 4" KB, each exclusive of its
//!   neighbours): below 2 KiB, 2 KiB to 4 KiB, above 4 KiB.
//! - **write %** and **barrier %** are relative to the reads plus writes of
//!   the partition (the denominators that reproduce Table 3).
//! - Working set: distinct `block`-sized blocks (default 4 KiB) touched at
//!   least once. Reuse distance: block accesses between two accesses of
//!   the same block of the same partition (TransCom's temporal distance).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use roamdisk_blockdev::progress::{Progress, Unit};
use roaring::RoaringTreemap;
use serde::Serialize;

use crate::format::{Format, Reader, Record, TraceError, TraceOp};

/// Statistics of one direction (reads or writes) of a group.
#[derive(Debug, Clone, Copy, Default, Serialize, derive_more::AddAssign)]
pub struct DirStats {
    pub count: u64,
    pub bytes: u64,
    /// Requests below 2 KiB.
    pub small: u64,
    /// Requests of 2 KiB to 4 KiB.
    pub medium: u64,
    /// Requests above 4 KiB.
    pub large: u64,
    pub skips: u64,
    pub sequential: u64,
    /// Distinct blocks touched (not a sum: merged groups count the blocks
    /// of their union).
    #[add_assign(skip)]
    pub working_set_blocks: u64,
}

impl DirStats {
    fn add(&mut self, len: u32) {
        self.count += 1;
        self.bytes += len as u64;
        if len < 2048 {
            self.small += 1;
        } else if len <= 4096 {
            self.medium += 1;
        } else {
            self.large += 1;
        }
    }

    /// Size in KiB.
    pub fn kib(&self) -> f64 {
        self.bytes as f64 / 1024.0
    }

    /// LBS Table 3's skip %: skips per 512-byte sector accessed; `None`
    /// when nothing was accessed ("NA").
    pub fn skip_pct(&self) -> Option<f64> {
        (self.bytes > 0).then(|| 100.0 * self.skips as f64 * 512.0 / self.bytes as f64)
    }

    /// Percentage of requests that continue their stream.
    pub fn sequential_pct(&self) -> Option<f64> {
        (self.count > 0).then(|| 100.0 * self.sequential as f64 / self.count as f64)
    }
}

/// Statistics of a group of requests (a partition, a client, the trace).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupStats {
    pub read: DirStats,
    pub write: DirStats,
    pub trim_count: u64,
    pub trim_bytes: u64,
    pub zero_count: u64,
    pub zero_bytes: u64,
    pub flushes: u64,
    /// Distinct blocks touched by reads or writes.
    pub working_set_blocks: u64,
    pub first_ns: Option<u64>,
    pub last_ns: u64,
}

impl GroupStats {
    fn add(&mut self, r: &Record) {
        match r.op {
            TraceOp::Read => self.read.add(r.len),
            TraceOp::Write => self.write.add(r.len),
            TraceOp::Trim => {
                self.trim_count += 1;
                self.trim_bytes += r.len as u64;
            }
            TraceOp::WriteZeroes => {
                self.zero_count += 1;
                self.zero_bytes += r.len as u64;
            }
            TraceOp::Flush => self.flushes += 1,
        }
        self.first_ns = Some(self.first_ns.map_or(r.time_ns, |f| f.min(r.time_ns)));
        self.last_ns = self.last_ns.max(r.time_ns);
    }

    /// Reads plus writes.
    pub fn rw_count(&self) -> u64 {
        self.read.count + self.write.count
    }

    /// Every request, barriers included.
    pub fn requests(&self) -> u64 {
        self.rw_count() + self.trim_count + self.zero_count + self.flushes
    }

    /// Writes per 100 reads plus writes (Table 3's write %).
    pub fn write_pct(&self) -> f64 {
        pct(self.write.count, self.rw_count())
    }

    /// Barriers per 100 reads plus writes (Table 3's barrier %).
    pub fn barrier_pct(&self) -> f64 {
        pct(self.flushes, self.rw_count())
    }

    /// Time from the first to the last request, in seconds.
    pub fn duration_s(&self) -> f64 {
        self.first_ns
            .map_or(0.0, |f| (self.last_ns - f) as f64 / 1e9)
    }

    fn merge(&mut self, o: &GroupStats) {
        self.read += o.read;
        self.write += o.write;
        self.trim_count += o.trim_count;
        self.trim_bytes += o.trim_bytes;
        self.zero_count += o.zero_count;
        self.zero_bytes += o.zero_bytes;
        self.flushes += o.flushes;
        if let Some(f) = o.first_ns {
            self.first_ns = Some(self.first_ns.map_or(f, |s| s.min(f)));
        }
        self.last_ns = self.last_ns.max(o.last_ns);
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// Options of the analysis.
#[derive(Debug, Clone)]
pub struct StatsOptions {
    /// Block size for working sets and reuse distances.
    pub block: u64,
}

impl Default for StatsOptions {
    fn default() -> Self {
        StatsOptions { block: 4096 }
    }
}

#[derive(Default)]
struct WorkingSets {
    read: RoaringTreemap,
    write: RoaringTreemap,
    any: RoaringTreemap,
}

/// Number of reuse-distance buckets: bucket 0 holds distance 0 (the next
/// access), bucket k holds distances in [2^(k-1), 2^k).
pub const REUSE_BUCKETS: usize = 65;

/// The result of an analysis.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub block: u64,
    pub total: GroupStats,
    pub partitions: BTreeMap<u32, GroupStats>,
    pub clients: BTreeMap<u32, GroupStats>,
    /// Request sizes (reads and writes) and how often each occurred.
    pub sizes: BTreeMap<u32, u64>,
    /// Block accesses that touched a block for the first time.
    pub cold_accesses: u64,
    /// Reuse-distance histogram (see [`REUSE_BUCKETS`]).
    pub reuse: Vec<u64>,
    pub min_size: Option<u32>,
    pub max_size: u32,
    /// Distinct blocks read / written over the whole trace.
    pub read_working_set_blocks: u64,
    pub write_working_set_blocks: u64,
}

impl Stats {
    /// The most frequent request size and its share of reads plus writes.
    pub fn most_frequent_size(&self) -> Option<(u32, f64)> {
        let total: u64 = self.sizes.values().sum();
        self.sizes
            .iter()
            .max_by_key(|(s, c)| (**c, std::cmp::Reverse(**s)))
            .map(|(s, c)| (*s, *c as f64 / total.max(1) as f64))
    }

    /// Share of reads plus writes of at most `bytes`.
    pub fn share_at_most(&self, bytes: u32) -> f64 {
        let total: u64 = self.sizes.values().sum();
        let le: u64 = self.sizes.range(..=bytes).map(|(_, c)| c).sum();
        le as f64 / total.max(1) as f64
    }

    /// Mean request size of reads plus writes in bytes.
    pub fn mean_size(&self) -> f64 {
        let t = &self.total;
        (t.read.bytes + t.write.bytes) as f64 / t.rw_count().max(1) as f64
    }
}

/// Streaming analysis: feed records with [`Analyzer::add`], then
/// [`Analyzer::finish`].
pub struct Analyzer {
    opts: StatsOptions,
    stats: Stats,
    /// End of the last request per (client, device, is_write).
    last_end: HashMap<(u32, u32, bool), u64>,
    part_ws: HashMap<u32, WorkingSets>,
    client_ws: HashMap<u32, HashMap<u32, RoaringTreemap>>,
    read_ws: HashMap<u32, RoaringTreemap>,
    write_ws: HashMap<u32, RoaringTreemap>,
    /// Last access index per (device, block).
    last_access: HashMap<(u32, u64), u64>,
    accesses: u64,
}

impl Analyzer {
    pub fn new(opts: StatsOptions) -> Self {
        let block = opts.block.max(1);
        Analyzer {
            opts: StatsOptions { block },
            stats: Stats {
                block,
                reuse: vec![0; REUSE_BUCKETS],
                ..Stats::default()
            },
            last_end: HashMap::new(),
            part_ws: HashMap::new(),
            client_ws: HashMap::new(),
            read_ws: HashMap::new(),
            write_ws: HashMap::new(),
            last_access: HashMap::new(),
            accesses: 0,
        }
    }

    pub fn add(&mut self, r: &Record) {
        let s = &mut self.stats;
        s.total.add(r);
        s.partitions.entry(r.device).or_default().add(r);
        s.clients.entry(r.client).or_default().add(r);
        let is_write = match r.op {
            TraceOp::Read => false,
            TraceOp::Write => true,
            _ => return,
        };
        *s.sizes.entry(r.len).or_default() += 1;
        s.min_size = Some(s.min_size.map_or(r.len, |m| m.min(r.len)));
        s.max_size = s.max_size.max(r.len);

        let key = (r.client, r.device, is_write);
        let (seq, skip) = match self.last_end.insert(key, r.end()) {
            None => (false, false),
            Some(e) if e == r.offset => (true, false),
            Some(_) => (false, true),
        };
        for g in [
            &mut s.total,
            s.partitions.get_mut(&r.device).expect("added above"),
            s.clients.get_mut(&r.client).expect("added above"),
        ] {
            let d = if is_write { &mut g.write } else { &mut g.read };
            d.sequential += seq as u64;
            d.skips += skip as u64;
        }
        if r.len == 0 {
            return;
        }
        let b = self.opts.block;
        let first = r.offset / b;
        let last = (r.end() - 1) / b;
        let pws = self.part_ws.entry(r.device).or_default();
        let cws = self
            .client_ws
            .entry(r.client)
            .or_default()
            .entry(r.device)
            .or_default();
        let dws = if is_write {
            self.write_ws.entry(r.device).or_default()
        } else {
            self.read_ws.entry(r.device).or_default()
        };
        let pdir = if is_write {
            &mut pws.write
        } else {
            &mut pws.read
        };
        pdir.insert_range(first..=last);
        pws.any.insert_range(first..=last);
        cws.insert_range(first..=last);
        dws.insert_range(first..=last);
        for blk in first..=last {
            let now = self.accesses;
            self.accesses += 1;
            match self.last_access.insert((r.device, blk), now) {
                None => s.cold_accesses += 1,
                Some(prev) => {
                    let d = now - prev - 1;
                    let bucket = if d == 0 {
                        0
                    } else {
                        64 - d.leading_zeros() as usize
                    };
                    s.reuse[bucket] += 1;
                }
            }
        }
    }

    /// The statistics of everything added.
    pub fn finish(mut self) -> Stats {
        let s = &mut self.stats;
        let mut tr = 0;
        let mut tw = 0;
        let mut tany = 0;
        for (dev, ws) in &self.part_ws {
            let g = s.partitions.get_mut(dev).expect("partition seen");
            g.read.working_set_blocks = ws.read.len();
            g.write.working_set_blocks = ws.write.len();
            g.working_set_blocks = ws.any.len();
            tr += ws.read.len();
            tw += ws.write.len();
            tany += ws.any.len();
        }
        s.total.read.working_set_blocks = tr;
        s.total.write.working_set_blocks = tw;
        s.total.working_set_blocks = tany;
        s.read_working_set_blocks = self.read_ws.values().map(|t| t.len()).sum();
        s.write_working_set_blocks = self.write_ws.values().map(|t| t.len()).sum();
        for (c, devs) in &self.client_ws {
            let g = s.clients.get_mut(c).expect("client seen");
            g.working_set_blocks = devs.values().map(|t| t.len()).sum();
        }
        self.stats
    }
}

/// Merge per-group statistics (used by the formatter for "all").
pub fn merged<'a>(groups: impl Iterator<Item = &'a GroupStats>) -> GroupStats {
    let mut g = GroupStats::default();
    for o in groups {
        g.merge(o);
    }
    g
}

/// Analyse a whole trace.
pub fn analyze<I, E>(records: I, opts: StatsOptions) -> Result<Stats, E>
where
    I: IntoIterator<Item = Result<Record, E>>,
{
    let mut a = Analyzer::new(opts);
    for r in records {
        a.add(&r?);
    }
    Ok(a.finish())
}

/// Analyse a trace file (binary or CSV), reporting how far the reading
/// got through `progress` (a phase "reading" over the file's bytes,
/// estimated from the records read).
pub fn analyze_file(
    path: &Path,
    opts: StatsOptions,
    progress: &dyn Progress,
) -> Result<Stats, TraceError> {
    let reader = Reader::open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    progress.start("reading", size.max(1), Unit::Bytes);
    // Bytes per record, roughly, to turn records read into bytes read.
    let per_byte = match reader.format() {
        Format::Binary => 5.0,
        Format::Csv => 30.0,
    };
    let mut a = Analyzer::new(opts);
    let mut n = 0u64;
    for r in reader {
        a.add(&r?);
        n += 1;
        if n.is_multiple_of(65536) {
            progress.set(((n as f64 * per_byte) as u64).min(size));
        }
    }
    progress.end();
    Ok(a.finish())
}

/// One direction of a Table 3 row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Table3Dir {
    pub kib: f64,
    pub count: u64,
    pub small: u64,
    pub medium: u64,
    pub large: u64,
    /// `None` is Table 3's "NA".
    pub skip_pct: Option<f64>,
}

/// One row of LBS Table 3.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Table3Row {
    pub read: Table3Dir,
    pub write: Table3Dir,
    pub write_pct: f64,
    pub barrier_pct: f64,
}

impl From<&DirStats> for Table3Dir {
    fn from(d: &DirStats) -> Self {
        Table3Dir {
            kib: d.kib(),
            count: d.count,
            small: d.small,
            medium: d.medium,
            large: d.large,
            skip_pct: d.skip_pct(),
        }
    }
}

impl From<&GroupStats> for Table3Row {
    fn from(g: &GroupStats) -> Self {
        Table3Row {
            read: (&g.read).into(),
            write: (&g.write).into(),
            write_pct: g.write_pct(),
            barrier_pct: g.barrier_pct(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::stats_of;

    fn rec(op: TraceOp, offset: u64, len: u32) -> Record {
        Record {
            time_ns: 0,
            client: 0,
            device: 0,
            op,
            offset,
            len,
            fragment: 0,
        }
    }

    #[test]
    fn table3_columns_follow_their_definitions() {
        let recs = vec![
            rec(TraceOp::Read, 0, 1024),       // first: neither
            rec(TraceOp::Read, 1024, 4096),    // sequential
            rec(TraceOp::Read, 100_000, 8192), // skip
            rec(TraceOp::Write, 0, 512),
            rec(TraceOp::Flush, 0, 0),
            rec(TraceOp::Write, 4096, 2048), // skip
            rec(TraceOp::Trim, 0, 4096),
        ];
        let s = stats_of(recs, StatsOptions::default());
        let row = Table3Row::from(&s.partitions[&0]);
        assert_eq!(row.read.count, 3);
        assert_eq!((row.read.small, row.read.medium, row.read.large), (1, 1, 1));
        assert_eq!(row.read.kib, 13.0);
        // One skip in 26 sectors.
        assert!((row.read.skip_pct.unwrap() - 100.0 / 26.0).abs() < 1e-9);
        assert_eq!(row.write.count, 2);
        assert!((row.write.skip_pct.unwrap() - 100.0 / 5.0).abs() < 1e-9);
        assert!((row.write_pct - 40.0).abs() < 1e-9);
        assert!((row.barrier_pct - 20.0).abs() < 1e-9);
        assert_eq!(s.total.trim_count, 1);
        assert_eq!(s.total.read.sequential, 1);
        // Blocks 0 (read, write), 1, 24..26 (read), 1 (write): reads touch
        // 0,1,24,25,26; writes 0,1.
        assert_eq!(s.read_working_set_blocks, 5);
        assert_eq!(s.write_working_set_blocks, 2);
        assert_eq!(s.total.working_set_blocks, 5);
        let none = DirStats::default();
        assert_eq!(none.skip_pct(), None);
    }

    #[test]
    fn reuse_distances_count_block_accesses_in_between() {
        let recs = vec![
            rec(TraceOp::Read, 0, 4096),
            rec(TraceOp::Read, 4096, 4096),
            rec(TraceOp::Read, 8192, 4096),
            rec(TraceOp::Read, 0, 4096), // distance 2
            rec(TraceOp::Read, 0, 4096), // distance 0
        ];
        let s = stats_of(recs, StatsOptions::default());
        assert_eq!(s.cold_accesses, 3);
        assert_eq!(s.reuse[0], 1);
        assert_eq!(s.reuse[2], 1);
        assert_eq!(s.most_frequent_size(), Some((4096, 1.0)));
    }
}
