//! A whole simulation of a trace file, as `roamdisk sim` runs it: a first
//! pass counts the requests and the working set under the sharing model,
//! the cache sizes are resolved against it (a size may be a fraction of
//! the working set), and a second pass feeds every request to one
//! [`Simulator`] that runs every policy at every size at once.
//!
//! Also the trace reader every trace-driven model uses
//! ([`read_requests`]), with the trace's path in every error.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::str::FromStr;

use roamdisk_blockdev::progress::{Progress, Unit};
use roamdisk_blockdev::units::{parse_size, UnitError};

use crate::policy::{PolicyKind, PolicySpec};
use crate::sim::{
    trace_requests, Access, ClientCache, Interner, Request, Sharing, SimConfig, SimReport,
    Simulator, TraceError,
};

/// Why a trace could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The trace does not open (or is not a trace).
    #[error("cannot read trace {} (record one with the trace: layer or make one with `roamdisk trace synth`)", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: TraceError,
    },
    /// The trace fails part way.
    #[error("reading trace {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: TraceError,
    },
    /// Nothing in the trace reads or writes data.
    #[error("{} has no read or write requests to simulate", .path.display())]
    Empty { path: PathBuf },
    /// Zero shards asked for.
    #[error("--shards must be at least 1")]
    NoShards,
    /// More shards than the smallest cache has blocks.
    #[error("--shards {shards}: the smallest cache has only {smallest} blocks; give at most that many shards")]
    TooManyShards { shards: usize, smallest: usize },
    /// A client cache size given as a fraction of the working set.
    #[error("--client-size takes sizes in bytes (1M), not fractions")]
    ClientFraction,
    /// The key export file does not open.
    #[error("cannot create {}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the key export failed.
    #[error("writing {} failed (disk full?)", .path.display())]
    Export { path: PathBuf },
}

/// The requests of a trace file, reduced by [`Request::from_record`]
/// (`Ok(None)` for records the cache ignores), with the path in every
/// error.
pub fn read_requests(
    path: &Path,
) -> Result<impl Iterator<Item = Result<Option<Request>, RunError>>, RunError> {
    let reader = trace_requests(path).map_err(|source| RunError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let p = path.to_path_buf();
    Ok(reader.map(move |r| {
        r.map_err(|source| RunError::Read {
            path: p.clone(),
            source,
        })
    }))
}

/// A cache size as given: bytes, or a fraction of the working set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    Bytes(u64),
    Fraction(f64),
}

/// A cache size that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizeError {
    #[error("'{0}': expected a percentage such as 6.25%")]
    Percent(String, #[source] std::num::ParseFloatError),
    #[error("'{0}': a percentage of the working set must lie in (0, 100]")]
    PercentRange(String),
    #[error("'{0}': expected a fraction such as 1/16")]
    Fraction(String, #[source] std::num::ParseFloatError),
    #[error("'{0}': a fraction of the working set must lie in (0, 1]")]
    FractionRange(String),
    #[error("{0} (or give a fraction of the working set: 1/16, 6.25%)")]
    Bytes(UnitError),
    #[error("'{0}': a cache size must be positive")]
    Zero(String),
}

impl FromStr for CacheSize {
    type Err = SizeError;

    /// `256M` (bytes), `1/16` or `6.25%` (of the working set).
    fn from_str(s: &str) -> Result<CacheSize, SizeError> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let f: f64 = p
                .trim()
                .parse()
                .map_err(|e| SizeError::Percent(t.to_string(), e))?;
            if !(f > 0.0 && f <= 100.0) {
                return Err(SizeError::PercentRange(t.to_string()));
            }
            return Ok(CacheSize::Fraction(f / 100.0));
        }
        if let Some((a, b)) = t.split_once('/') {
            let num = |x: &str| {
                x.trim()
                    .parse::<f64>()
                    .map_err(|e| SizeError::Fraction(t.to_string(), e))
            };
            let (a, b) = (num(a)?, num(b)?);
            if !(a > 0.0 && b > 0.0 && a <= b) {
                return Err(SizeError::FractionRange(t.to_string()));
            }
            return Ok(CacheSize::Fraction(a / b));
        }
        let n = parse_size(t).map_err(SizeError::Bytes)?;
        if n == 0 {
            return Err(SizeError::Zero(t.to_string()));
        }
        Ok(CacheSize::Bytes(n))
    }
}

impl CacheSize {
    /// A comma-separated list of sizes (empty items skipped).
    pub fn parse_list(s: &str) -> Result<Vec<CacheSize>, SizeError> {
        s.split(',')
            .filter(|x| !x.trim().is_empty())
            .map(str::parse)
            .collect()
    }

    /// The size in blocks of `block` bytes, for a working set of
    /// `working_set` blocks; at least 1.
    pub fn blocks(self, block: u64, working_set: u64) -> usize {
        match self {
            CacheSize::Bytes(b) => (b / block).max(1) as usize,
            CacheSize::Fraction(f) => ((working_set as f64 * f).round() as usize).max(1),
        }
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The unit of caching, bytes.
    pub block: u64,
    pub sharing: Sharing,
    /// Temporal-distance threshold of the Table 2 split, in accesses.
    pub split: u64,
    /// Server cache policies.
    pub policies: Vec<PolicySpec>,
    /// Server cache sizes.
    pub sizes: Vec<CacheSize>,
    /// Client cache sizes (per client, bytes): each adds a two-level run.
    pub client_sizes: Vec<CacheSize>,
    pub client_policy: PolicySpec,
    /// Client writes also go to the server.
    pub write_through: bool,
    /// Shards of each server cache (1: the plain policy).
    pub shards: usize,
    /// The exact all-sizes LRU curve (only with one shard).
    pub lru_curve: bool,
    /// Requests to read at most.
    pub limit: Option<u64>,
    /// Write the keys the first server level sees here, one per line.
    pub export_keys: Option<PathBuf>,
}

/// A run's result.
#[derive(Clone, Debug)]
pub struct Run {
    pub report: SimReport,
    /// The server cache sizes in blocks, ascending, distinct.
    pub capacities: Vec<usize>,
    /// Distinct blocks under the sharing model.
    pub working_set: u64,
}

impl Run {
    /// The capacity shown in the seed's Table 2 form: `focus`, or the
    /// simulated one nearest 1/16 of the working set.
    pub fn focus(&self, focus: Option<CacheSize>) -> usize {
        match focus {
            Some(f) => f.blocks(self.report.block_size, self.working_set),
            None => {
                let target = self.working_set as f64 / 16.0;
                *self
                    .capacities
                    .iter()
                    .min_by(|x, y| {
                        (**x as f64 / target)
                            .ln()
                            .abs()
                            .total_cmp(&(**y as f64 / target).ln().abs())
                    })
                    .expect("at least one size")
            }
        }
    }
}

/// Simulate the trace at `trace`: count the working set, resolve the
/// sizes, then feed every request to the simulator, reporting a phase
/// "simulating" over the requests.
pub fn simulate(trace: &Path, opts: &RunOptions, progress: &dyn Progress) -> Result<Run, RunError> {
    let block = opts.block;
    // Pass 1: count requests and the working set under the sharing model.
    let mut interner = Interner::new(opts.sharing);
    let mut total = 0u64;
    for r in read_requests(trace)? {
        if opts.limit.is_some_and(|l| total >= l) {
            break;
        }
        total += 1;
        if let Some(req) = r? {
            for b in req.blocks(block) {
                interner.key(&Access {
                    client: req.client,
                    device: req.device,
                    block: b,
                    write: req.write,
                });
            }
        }
    }
    let working_set = interner.keys();
    drop(interner);
    if working_set == 0 {
        return Err(RunError::Empty {
            path: trace.to_path_buf(),
        });
    }

    let mut capacities: Vec<usize> = opts
        .sizes
        .iter()
        .map(|&s| s.blocks(block, working_set))
        .collect();
    capacities.sort_unstable();
    capacities.dedup();
    if opts.shards == 0 {
        return Err(RunError::NoShards);
    }
    if let Some(&smallest) = capacities.first() {
        if opts.shards > smallest {
            return Err(RunError::TooManyShards {
                shards: opts.shards,
                smallest,
            });
        }
    }
    let lru_curve = opts.lru_curve && opts.shards == 1;
    let mut server = Vec::new();
    for spec in &opts.policies {
        if lru_curve && spec.kind == PolicyKind::Lru && spec.label() == "LRU" {
            continue; // exact from the curve
        }
        for &c in &capacities {
            server.push((spec.clone(), c));
        }
    }
    let mut levels = vec![None];
    for &cs in &opts.client_sizes {
        let CacheSize::Bytes(b) = cs else {
            return Err(RunError::ClientFraction);
        };
        levels.push(Some(ClientCache {
            policy: opts.client_policy.clone(),
            capacity: (b / block).max(1) as usize,
            write_through: opts.write_through,
        }));
    }
    let mut sim = Simulator::new(SimConfig {
        block_size: block,
        sharing: opts.sharing,
        split: opts.split,
        server,
        shards: opts.shards,
        lru_stack: lru_curve,
        levels,
    });

    // Pass 2: simulate.
    let export = match &opts.export_keys {
        Some(path) => Some(KeyExport::start(path, &mut sim)?),
        None => None,
    };
    progress.start("simulating", total, Unit::Items);
    let mut n = 0u64;
    for r in read_requests(trace)? {
        if n >= total {
            break;
        }
        n += 1;
        if let Some(req) = r? {
            sim.feed(&req);
        }
        if n.is_multiple_of(65536) {
            progress.set(n);
        }
    }
    progress.end();
    let report = sim.finish();
    if let Some(e) = export {
        e.finish()?;
    }
    Ok(Run {
        report,
        capacities,
        working_set,
    })
}

/// The keys the first server level sees, written one decimal id per line
/// (libCacheSim's txt trace format).
struct KeyExport {
    path: PathBuf,
    out: Rc<RefCell<std::io::BufWriter<std::fs::File>>>,
    failed: Rc<Cell<bool>>,
}

impl KeyExport {
    /// Create `path` and make `sim` write every key there.
    fn start(path: &Path, sim: &mut Simulator) -> Result<KeyExport, RunError> {
        let f = std::fs::File::create(path).map_err(|source| RunError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let out = Rc::new(RefCell::new(std::io::BufWriter::with_capacity(1 << 20, f)));
        let failed = Rc::new(Cell::new(false));
        let (w, flag) = (out.clone(), failed.clone());
        sim.set_server_key_sink(Box::new(move |k| {
            if writeln!(w.borrow_mut(), "{k}").is_err() {
                flag.set(true);
            }
        }));
        Ok(KeyExport {
            path: path.to_path_buf(),
            out,
            failed,
        })
    }

    /// Flush what is left; an error if any write failed.
    fn finish(self) -> Result<(), RunError> {
        if self.failed.get() || self.out.borrow_mut().flush().is_err() {
            return Err(RunError::Export { path: self.path });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arguments() {
        assert_eq!(
            "1/16".parse::<CacheSize>().unwrap(),
            CacheSize::Fraction(1.0 / 16.0)
        );
        assert_eq!(
            "6.25%".parse::<CacheSize>().unwrap(),
            CacheSize::Fraction(0.0625)
        );
        assert_eq!(
            "256M".parse::<CacheSize>().unwrap(),
            CacheSize::Bytes(256 << 20)
        );
        assert!("2/1".parse::<CacheSize>().is_err());
        assert!("0".parse::<CacheSize>().is_err());
        let e = "lots".parse::<CacheSize>().unwrap_err().to_string();
        assert!(e.contains("1/16"), "{e}");
        assert_eq!(CacheSize::Bytes(1 << 20).blocks(4096, 10), 256);
        assert_eq!(CacheSize::Fraction(0.25).blocks(4096, 1000), 250);
    }
}
