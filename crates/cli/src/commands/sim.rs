//! `roamdisk sim`: trace-driven cache simulation (TransCom seed sections
//! 5-6): many policies and sizes in one pass, the exact LRU curve, the
//! Table 2 split by temporal distance, and two-level runs.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::{format_size, parse_size};
use roamdisk_cachesim::policy::{PolicyKind, PolicySpec};
use roamdisk_cachesim::sim::{
    trace_requests, ClientCache, HitMiss, Interner, LevelReport, Request, Sharing, SimConfig,
    SimReport, Simulator,
};

use crate::plot::{Charts, LineChart, Series};
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

/// Simulate cache policies on a trace, TransCom style. The trace is cut
/// into fixed-size blocks; a block is ⟨block, client⟩ under the
/// copy-on-write sharing model (clients share the base image's blocks until
/// a client's first write creates its private copy). Every policy runs at
/// every size in one pass over the trace; LRU's hit ratio comes exactly for
/// every size at once from stack distances. Hits and misses are split by
/// temporal distance (accesses since the block's previous access; < 32k or
/// ≥ 32k, the seed's Table 2). With --client-size, a client cache per
/// client sits in front and the server sees only its misses.
///
/// Policies: fmpq, 2q, fbr, lru, arc, s3fifo, mq, with parameters in
/// brackets: fmpq[w=8,qoff=4x,duration=4x], 2q[kin=0.25,kout=0.5],
/// fbr[fnew=0.25,fold=0.5,amax=100,cmax=1024], mq[queues=8,qout=4x,lifetime=2x],
/// s3fifo[small=0.1,ghost=0.9,threshold=2]; "4x" means four times the
/// cache's capacity. See docs/cachesim.md for each definition and source.
///
/// Sizes: bytes (256M), or a fraction of the working set (1/16, 6.25%).
///
/// Examples:
///   roamdisk trace synth desktop --clients 15 -o desk.rdtrace
///   roamdisk sim desk.rdtrace --size 1/16 --plot out/desk
///   roamdisk sim desk.rdtrace --policy lru,fmpq[duration=8x] --size 64M,256M --block 8K
///   roamdisk sim desk.rdtrace --client-size 1M,16M --size 1/32,1/16,1/8 --plot out/two-level
///   roamdisk sim desk.rdtrace --policy fmpq --size 256M --shards 16 --sharing shared
///     (the hits of cache[shards=16]:fmpq:256M:... replaying the same one-client trace)
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The trace (roamdisk binary or CSV trace format).
    trace: PathBuf,
    /// Server cache policies, comma-separated (repeatable).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "fmpq,2q,fbr,lru,arc,s3fifo"
    )]
    policy: Vec<String>,
    /// Server cache sizes, comma-separated: bytes or fractions of the working set.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "1/64,1/32,1/16,1/8,1/4,1/2"
    )]
    size: String,
    /// Block size: the unit of caching.
    #[arg(long, value_name = "SIZE", default_value = "4K")]
    block: String,
    /// How clients' blocks map to cache blocks: cow (TransCom: shared until
    /// a client writes), shared (one disk), private (a disk per client).
    #[arg(long, default_value = "cow")]
    sharing: String,
    /// Temporal-distance threshold of the Table 2 split, in accesses.
    #[arg(long, value_name = "ACCESSES", default_value_t = 32768)]
    split: u64,
    /// Client cache sizes (per client), comma-separated: each adds a
    /// two-level run with that client cache in front of the server.
    #[arg(long, value_name = "LIST")]
    client_size: Option<String>,
    /// Client cache policy.
    #[arg(long, value_name = "SPEC", default_value = "lru")]
    client_policy: String,
    /// Client writes: "through" (also sent to the server, which holds the
    /// private copy) or "absorb" (a write hit stays at the client).
    #[arg(long, default_value = "through")]
    client_writes: String,
    /// The size (bytes or fraction) shown in the seed's Table 2 form and
    /// its plot (default: the configured size nearest 1/16 of the working set).
    #[arg(long, value_name = "SIZE")]
    focus: Option<String>,
    /// Write plots: STEM-hit-ratio, STEM-table2-short, STEM-table2-long
    /// (and STEM-two-level with --client-size), each as .png and .svg.
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
    /// Print the whole report as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Write the block keys the (first) server level sees, one decimal id
    /// per line, for another simulator (libCacheSim's txt trace format).
    #[arg(long, value_name = "FILE")]
    export_keys: Option<PathBuf>,
    /// Skip the exact all-sizes LRU curve (LRU then runs as a policy).
    #[arg(long)]
    no_lru_curve: bool,
    /// Stop after this many requests.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Cut each server cache into N shards by block address, as the
    /// `cache` layer does (same engine): with the layer's policy, size,
    /// block size and shard count the hits are the layer's. 1 = one
    /// policy over the whole cache. LRU then runs as a policy, not from
    /// the stack-distance curve.
    #[arg(long, value_name = "N", default_value_t = 1)]
    shards: usize,
}

/// A cache size as given.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SizeArg {
    Bytes(u64),
    Fraction(f64),
}

fn parse_size_arg(s: &str) -> anyhow::Result<SizeArg> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let f: f64 = p
            .trim()
            .parse()
            .with_context(|| format!("'{t}': expected a percentage such as 6.25%"))?;
        if !(f > 0.0 && f <= 100.0) {
            bail!("'{t}': a percentage of the working set must lie in (0, 100]");
        }
        return Ok(SizeArg::Fraction(f / 100.0));
    }
    if let Some((a, b)) = t.split_once('/') {
        let (a, b): (f64, f64) = (
            a.trim()
                .parse()
                .with_context(|| format!("'{t}': expected a fraction such as 1/16"))?,
            b.trim()
                .parse()
                .with_context(|| format!("'{t}': expected a fraction such as 1/16"))?,
        );
        if !(a > 0.0 && b > 0.0 && a <= b) {
            bail!("'{t}': a fraction of the working set must lie in (0, 1]");
        }
        return Ok(SizeArg::Fraction(a / b));
    }
    let n = parse_size(t)
        .map_err(|e| anyhow::anyhow!("{e} (or give a fraction of the working set: 1/16, 6.25%)"))?;
    if n == 0 {
        bail!("'{t}': a cache size must be positive");
    }
    Ok(SizeArg::Bytes(n))
}

fn parse_size_list(s: &str) -> anyhow::Result<Vec<SizeArg>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(parse_size_arg)
        .collect()
}

fn resolve(s: SizeArg, block: u64, working_set: u64) -> usize {
    match s {
        SizeArg::Bytes(b) => (b / block).max(1) as usize,
        SizeArg::Fraction(f) => ((working_set as f64 * f).round() as usize).max(1),
    }
}

/// Requests of a trace file, with the path in every error.
pub(crate) fn read_requests(
    path: &Path,
) -> anyhow::Result<impl Iterator<Item = anyhow::Result<Option<Request>>>> {
    let reader = trace_requests(path).with_context(|| {
        format!(
            "cannot read trace {} (record one with the trace: layer or make one with `roamdisk trace synth`)",
            path.display()
        )
    })?;
    let p = path.to_path_buf();
    Ok(reader.map(move |r| r.with_context(|| format!("reading trace {}", p.display()))))
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let block = parse_size(&a.block).map_err(anyhow::Error::msg)?;
    if block == 0 || block > (1 << 30) {
        bail!("--block must lie between 1 byte and 1 GiB");
    }
    let sharing = Sharing::parse(&a.sharing).with_context(|| {
        format!(
            "unknown --sharing '{}': use cow, shared or private",
            a.sharing
        )
    })?;
    if a.split == 0 {
        bail!("--split must be at least 1 access");
    }
    let mut specs = Vec::new();
    for p in &a.policy {
        specs.extend(PolicySpec::parse_list(p).map_err(|e| anyhow::anyhow!("--policy: {e}"))?);
    }
    if specs.is_empty() {
        bail!("--policy: name at least one policy");
    }
    let sizes = parse_size_list(&a.size).context("--size")?;
    if sizes.is_empty() {
        bail!("--size: give at least one cache size");
    }
    let client_sizes = match &a.client_size {
        Some(s) => parse_size_list(s).context("--client-size")?,
        None => Vec::new(),
    };
    let client_policy =
        PolicySpec::parse(&a.client_policy).map_err(|e| anyhow::anyhow!("--client-policy: {e}"))?;
    let write_through = match a.client_writes.as_str() {
        "through" => true,
        "absorb" => false,
        o => bail!("unknown --client-writes '{o}': use through or absorb"),
    };
    let focus = a
        .focus
        .as_deref()
        .map(parse_size_arg)
        .transpose()
        .context("--focus")?;

    // Pass 1: count requests and the working set under the sharing model.
    let mut interner = Interner::new(sharing);
    let mut total = 0u64;
    for r in read_requests(&a.trace)? {
        if a.limit.is_some_and(|l| total >= l) {
            break;
        }
        total += 1;
        if let Some(req) = r? {
            for b in req.blocks(block) {
                interner.key(&roamdisk_cachesim::sim::Access {
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
        bail!(
            "{} has no read or write requests to simulate",
            a.trace.display()
        );
    }

    let mut capacities: Vec<usize> = sizes
        .iter()
        .map(|&s| resolve(s, block, working_set))
        .collect();
    capacities.sort_unstable();
    capacities.dedup();
    if a.shards == 0 {
        bail!("--shards must be at least 1");
    }
    if let Some(&smallest) = capacities.first() {
        if a.shards > smallest {
            bail!(
                "--shards {}: the smallest cache has only {smallest} blocks; give at most that many shards",
                a.shards
            );
        }
    }
    let lru_curve = !a.no_lru_curve && a.shards == 1;
    let mut server = Vec::new();
    for spec in &specs {
        if lru_curve && spec.kind == PolicyKind::Lru && spec.label() == "LRU" {
            continue; // exact from the curve
        }
        for &c in &capacities {
            server.push((spec.clone(), c));
        }
    }
    let mut levels = vec![None];
    for &cs in &client_sizes {
        let cap = match cs {
            SizeArg::Bytes(b) => (b / block).max(1) as usize,
            SizeArg::Fraction(_) => bail!("--client-size takes sizes in bytes (1M), not fractions"),
        };
        levels.push(Some(ClientCache {
            policy: client_policy.clone(),
            capacity: cap,
            write_through,
        }));
    }
    let cfg = SimConfig {
        block_size: block,
        sharing,
        split: a.split,
        server,
        shards: a.shards,
        lru_stack: lru_curve,
        levels,
    };

    // Pass 2: simulate.
    let mut sim = Simulator::new(cfg);
    let export = match &a.export_keys {
        Some(path) => {
            let f = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let w = std::rc::Rc::new(std::cell::RefCell::new(std::io::BufWriter::with_capacity(
                1 << 20,
                f,
            )));
            let failed = std::rc::Rc::new(std::cell::Cell::new(false));
            let (w2, flag) = (w.clone(), failed.clone());
            sim.set_server_key_sink(Box::new(move |k| {
                if writeln!(w2.borrow_mut(), "{k}").is_err() {
                    flag.set(true);
                }
            }));
            Some((path.clone(), w, failed))
        }
        None => None,
    };
    run_pass(&a, &mut sim, total, quiet)?;
    let report = sim.finish();
    if let Some((path, w, failed)) = export {
        if failed.get() || w.borrow_mut().flush().is_err() {
            bail!("writing {} failed (disk full?)", path.display());
        }
    }
    output(&a, &report, &specs, &capacities, working_set, focus)
}

fn run_pass(a: &Args, sim: &mut Simulator, total: u64, quiet: bool) -> anyhow::Result<()> {
    let progress = Reporter::phase_of(
        Output::human(quiet || a.json),
        "simulating",
        total,
        Unit::Items,
    );
    let mut n = 0u64;
    for r in read_requests(&a.trace)? {
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
    progress.finish();
    Ok(())
}

/// Rows of the Table 2 form at one capacity: (label, short, long), LRU
/// from the exact curve when it was computed.
fn rows_at(
    level: &LevelReport,
    specs: &[PolicySpec],
    cap: usize,
) -> Vec<(String, HitMiss, HitMiss)> {
    let mut rows = Vec::new();
    for spec in specs {
        let label = spec.label();
        if let Some(r) = level
            .results
            .iter()
            .find(|r| r.policy == label && r.capacity == cap)
        {
            rows.push((label, r.short, r.long));
        } else if spec.kind == PolicyKind::Lru {
            if let Some(curve) = &level.lru {
                let (s, l) = curve.at(cap);
                rows.push((label, s, l));
            }
        }
    }
    rows
}

fn level_title(level: &LevelReport) -> String {
    match &level.client {
        None => "single level (the server sees every access)".into(),
        Some(c) => format!(
            "two levels: {} client cache of {} blocks per client ({}) in front of the server",
            c.policy,
            c.capacity,
            if c.write_through {
                "writes through"
            } else {
                "write hits absorbed"
            }
        ),
    }
}

fn k(n: u64) -> String {
    if n >= 10_000 {
        format!("{}k", (n + 500) / 1000)
    } else {
        n.to_string()
    }
}

fn output(
    a: &Args,
    r: &SimReport,
    specs: &[PolicySpec],
    capacities: &[usize],
    working_set: u64,
    focus: Option<SizeArg>,
) -> anyhow::Result<()> {
    let bs = r.block_size;
    let focus_cap = match focus {
        Some(f) => resolve(f, bs, working_set),
        None => {
            let target = working_set as f64 / 16.0;
            *capacities
                .iter()
                .min_by(|x, y| {
                    (**x as f64 / target)
                        .ln()
                        .abs()
                        .total_cmp(&(**y as f64 / target).ln().abs())
                })
                .expect("at least one size")
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        let split = r.split.to_string();
        println!(
            "trace: {} requests, {} block accesses of {} ({} reads, {} writes), {} clients",
            r.requests,
            r.accesses,
            format_size(bs),
            r.reads,
            r.writes,
            r.clients
        );
        println!(
            "working set: {} blocks ({}) under {:?} sharing, {} private copies",
            r.distinct_keys,
            format_size(r.distinct_keys * bs),
            r.sharing,
            r.private_copies
        );
        for (li, level) in r.levels.iter().enumerate() {
            println!("\nlevel {}: {}", li + 1, level_title(level));
            if let Some(c) = &level.client {
                let all = c.reads.plus(&c.writes);
                println!(
                    "  client caches: {} clients, hit ratio {:.2}% (reads {:.2}%, writes {:.2}%)",
                    c.clients,
                    100.0 * all.hit_ratio(),
                    100.0 * c.reads.hit_ratio(),
                    100.0 * c.writes.hit_ratio()
                );
            }
            println!(
                "  server: {} accesses, {} distinct blocks; temporal distance < {split}: {} ({:.1}%), ≥ {split}: {} (of which {} first accesses)",
                level.server_accesses,
                level.distinct,
                level.short,
                100.0 * level.short as f64 / level.server_accesses.max(1) as f64,
                level.server_accesses - level.short,
                level.cold
            );
            for &cap in capacities {
                let rows = rows_at(level, specs, cap);
                let lru_misses = rows
                    .iter()
                    .find(|r| r.0 == "LRU")
                    .map(|r| r.1.misses + r.2.misses);
                println!(
                    "\n  server cache {} ({} blocks, {:.2}% of the working set){}",
                    format_size(cap as u64 * bs),
                    cap,
                    100.0 * cap as f64 / working_set as f64,
                    if cap == focus_cap {
                        "  [Table 2 form]"
                    } else {
                        ""
                    }
                );
                println!(
                    "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
                    "policy",
                    format!("<{split} hit"),
                    format!("<{split} miss"),
                    format!("≥{split} hit"),
                    format!("≥{split} miss"),
                    "hit %",
                    "vs LRU"
                );
                for (label, s, l) in &rows {
                    let all = s.plus(l);
                    let vs = lru_misses
                        .filter(|&m| m > 0)
                        .map(|m| {
                            format!("{:+.1}%", 100.0 * (all.misses as f64 - m as f64) / m as f64)
                        })
                        .unwrap_or_default();
                    println!(
                        "  {:<28} {:>10} {:>10} {:>10} {:>10} {:>9.2} {:>9}",
                        label,
                        k(s.hits),
                        k(s.misses),
                        k(l.hits),
                        k(l.misses),
                        100.0 * all.hit_ratio(),
                        vs
                    );
                }
            }
            if let Some(curve) = &level.lru {
                let maxd = curve.max_distance().max(1);
                println!(
                    "\n  exact LRU hit ratio by size (stack distances; only cold misses beyond {} blocks = {}):",
                    maxd,
                    format_size(maxd as u64 * bs)
                );
                let mut c = 1usize;
                let mut line = String::new();
                while c < maxd * 2 {
                    line.push_str(&format!(
                        "  {}:{:.1}%",
                        format_size(c as u64 * bs),
                        100.0 * curve.hit_ratio(c)
                    ));
                    c *= 2;
                }
                println!("  {}", line.trim_start());
            }
        }
    }
    if let Some(stem) = &a.plot {
        let charts = plots(stem, r, specs, capacities, focus_cap)?;
        if !a.json {
            println!();
            charts.report();
        }
    }
    Ok(())
}

/// `blocks` blocks of `bs` bytes in MiB.
fn mib(blocks: usize, bs: u64) -> f64 {
    blocks as f64 * bs as f64 / 1048576.0
}

fn lru_series(level: &LevelReport, bs: u64, lo: usize, hi: usize, name: String) -> Option<Series> {
    let curve = level.lru.as_ref()?;
    let mut pts = Vec::new();
    let mut c = lo.max(1) as f64;
    while c <= hi as f64 * 1.0001 {
        let cap = c.round() as usize;
        pts.push((mib(cap, bs), curve.hit_ratio(cap)));
        c *= 2f64.powf(0.25);
    }
    Some(Series { name, points: pts })
}

/// The simulated hit ratio of `policy` at `level` against the cache size
/// (MiB), at every simulated capacity.
fn policy_series(
    level: &LevelReport,
    bs: u64,
    capacities: &[usize],
    policy: &str,
    name: String,
) -> Series {
    let points = capacities
        .iter()
        .filter_map(|&c| {
            level
                .results
                .iter()
                .find(|x| x.policy == policy && x.capacity == c)
                .map(|x| (mib(c, bs), x.all().hit_ratio()))
        })
        .collect();
    Series { name, points }
}

fn plots(
    stem: &Path,
    r: &SimReport,
    specs: &[PolicySpec],
    capacities: &[usize],
    focus_cap: usize,
) -> anyhow::Result<Charts> {
    let bs = r.block_size;
    let (lo, hi) = (capacities[0], *capacities.last().unwrap());
    // A logarithmic axis only labels decades: use it for wide ranges.
    let log_x = hi >= 8 * lo;
    let mut charts = Charts::new(stem, "sim");
    let single = &r.levels[0];

    // Hit ratio vs size per policy.
    let mut series = Vec::new();
    for spec in specs {
        let label = spec.label();
        if spec.kind == PolicyKind::Lru && single.lru.is_some() && label == "LRU" {
            if let Some(s) = lru_series(single, bs, lo, hi, "LRU (exact)".into()) {
                series.push(s);
            }
            continue;
        }
        series.push(policy_series(single, bs, capacities, &label, label.clone()));
    }
    charts.line(
        "hit-ratio",
        &LineChart {
            title: &format!("Server cache hit ratio, {} blocks", format_size(bs)),
            x_label: "cache size (MiB)",
            y_label: "hit ratio",
            log_x,
            log_y: false,
            series: &series,
        },
    )?;

    // Table 2: misses by temporal distance at the focus size, one chart
    // per class.
    let split = r.split.to_string();
    let rows = rows_at(single, specs, focus_cap);
    let size = format_size(focus_cap as u64 * bs);
    for (suffix, title, pick) in [
        (
            "table2-short",
            format!("Misses at temporal distance < {split}, server cache {size}"),
            0usize,
        ),
        (
            "table2-long",
            format!(
                "Misses at temporal distance ≥ {split} (incl. {} first accesses), server cache {size}",
                single.cold
            ),
            1,
        ),
    ] {
        let bars: Vec<(String, f64)> = rows
            .iter()
            .map(|(label, s, l)| {
                let hm = if pick == 0 { s } else { l };
                (label.clone(), hm.misses as f64)
            })
            .collect();
        charts.bar(suffix, &title, "misses", &bars)?;
    }

    // Two-level view.
    if r.levels.len() > 1 {
        let first = specs
            .iter()
            .find(|s| !(s.kind == PolicyKind::Lru && single.lru.is_some()))
            .map(|s| s.label());
        let mut series = Vec::new();
        for level in &r.levels {
            let who = match &level.client {
                None => "no client cache".to_string(),
                Some(c) => format!(
                    "client {} ({:.0}% hits)",
                    format_size(c.capacity as u64 * bs),
                    100.0 * c.reads.plus(&c.writes).hit_ratio()
                ),
            };
            if let Some(label) = &first {
                series.push(policy_series(
                    level,
                    bs,
                    capacities,
                    label,
                    format!("{label}, {who}"),
                ));
            }
            if let Some(s) = lru_series(level, bs, lo, hi, format!("LRU, {who}")) {
                series.push(s);
            }
        }
        charts.line(
            "two-level",
            &LineChart {
                title: "Server hit ratio behind client caches",
                x_label: "server cache size (MiB)",
                y_label: "server hit ratio",
                log_x,
                log_y: false,
                series: &series,
            },
        )?;
    }
    Ok(charts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_arguments() {
        assert_eq!(
            parse_size_arg("1/16").unwrap(),
            SizeArg::Fraction(1.0 / 16.0)
        );
        assert_eq!(parse_size_arg("6.25%").unwrap(), SizeArg::Fraction(0.0625));
        assert_eq!(parse_size_arg("256M").unwrap(), SizeArg::Bytes(256 << 20));
        assert!(parse_size_arg("2/1").is_err());
        assert!(parse_size_arg("0").is_err());
        let e = parse_size_arg("lots").unwrap_err().to_string();
        assert!(e.contains("1/16"), "{e}");
        assert_eq!(resolve(SizeArg::Bytes(1 << 20), 4096, 10), 256);
        assert_eq!(resolve(SizeArg::Fraction(0.25), 4096, 1000), 250);
    }
}
