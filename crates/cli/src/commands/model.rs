//! `roamdisk model`: the capacity models — Machine Bank's block-size
//! latency model and TransCom's closed queueing network (exact MVA).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use roamdisk_blockdev::units::{self, parse_size};
use roamdisk_cachesim::blocksize::{self, BlockSizeConfig};
use roamdisk_cachesim::mva::Demands;
use roamdisk_cachesim::sweep::{sweep, SweepOptions};

use crate::args::list;
use crate::progress::{Output, Reporter};
use crate::render::model::{show_blocksize, show_mva};

/// Capacity models: `blocksize` (Machine Bank: which fetch block size
/// minimises on-demand latency for a trace) and `mva` (TransCom: server
/// throughput, response time, utilisations and bottleneck for N clients
/// and any server cache hit ratio).
///
/// Examples:
///   roamdisk model blocksize boot.rdtrace --fix-delay 8ms --bandwidth 6MB/s --plot out/bs
///   roamdisk model mva --hit 0.5,0.9,0.95,1 --clients 50 --plot out/mva
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Blocksize(BlockSizeArgs),
    Mva(MvaArgs),
}

/// Machine Bank's block-size model (section 3.3, Figures 4-5): replay the
/// trace's reads against an empty on-demand cache at each block size and
/// compute AccessedBlocks and TotalLatency = AccessedBlocks × (FixDelay +
/// BlockSize / Bandwidth). Each client fetches its own blocks unless
/// --shared-cache; writes fetch nothing unless --include-writes.
///
/// Example:
///   roamdisk model blocksize boot.rdtrace --fix-delay 8ms --bandwidth 6MB/s --plot out/bs
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct BlockSizeArgs {
    /// The trace (roamdisk binary or CSV trace format).
    trace: PathBuf,
    /// Fixed delay per fetched block (seek + request round trip).
    #[arg(long, value_name = "TIME", default_value = "8ms")]
    fix_delay: String,
    /// Transfer bandwidth: 6MB/s (SI, 10^6) or 6MiB/s (2^20).
    #[arg(long, value_name = "RATE", default_value = "6MB/s")]
    bandwidth: String,
    /// Block sizes, comma-separated (default 4K,8K,...,1M).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "4K,8K,16K,32K,64K,128K,256K,512K,1M"
    )]
    sizes: String,
    /// Count writes as fetches too.
    #[arg(long)]
    include_writes: bool,
    /// All clients share one cache (a block is fetched once in total).
    #[arg(long)]
    shared_cache: bool,
    /// Write STEM-accessed-blocks and STEM-latency plots (.png and .svg).
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// TransCom's closed queueing network solved by exact mean value
/// analysis: N clients alternate between a delay centre (Client-Delay) and
/// a request at the server's CPU, storage (memory with probability h, the
/// server cache hit ratio, else disk) and network interface. Prints and
/// plots throughput, response time and utilisations against N (one curve
/// per hit ratio) and against the hit ratio (at --clients), and names the
/// bottleneck. Demands default to the seed's Table 1 (--demands 4k or
/// 32k); each can be overridden.
///
/// Example:
///   roamdisk model mva --hit 0.5,0.9,0.95,1 --clients 50 --plot out/mva
///   roamdisk model mva --demands 32k --disk 5ms --simulate
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct MvaArgs {
    /// Built-in demands: Table 1's 4k or 32k column.
    #[arg(long, default_value = "4k")]
    demands: String,
    /// Server CPU demand per request.
    #[arg(long, value_name = "TIME")]
    cpu: Option<String>,
    /// Disk demand per request (a miss).
    #[arg(long, value_name = "TIME")]
    disk: Option<String>,
    /// Memory demand per request (a hit); Table 1 has none.
    #[arg(long, value_name = "TIME")]
    memory: Option<String>,
    /// Server network interface demand per request.
    #[arg(long, value_name = "TIME")]
    network: Option<String>,
    /// Client delay (client CPU + NIU) per request: the think time.
    #[arg(long, value_name = "TIME")]
    client_delay: Option<String>,
    /// Server cache hit ratios for the curves against N, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "0,0.5,0.8,0.9,0.95,1")]
    hit: String,
    /// Population for the sweep over the hit ratio.
    #[arg(long, value_name = "N", default_value_t = 50)]
    clients: usize,
    /// Largest population of the sweep over N.
    #[arg(long, value_name = "N", default_value_t = 100)]
    max_clients: usize,
    /// Print (and with --simulate, simulate) populations 1-5 and every
    /// STEP-th one beyond; 1 prints every population.
    #[arg(long, value_name = "STEP", default_value_t = 5)]
    step: usize,
    /// Also run the discrete-event simulation of the same network (until
    /// its 99% confidence intervals are within ±1%) and print its
    /// throughput and response time beside MVA's, with the larger relative
    /// difference.
    #[arg(long)]
    simulate: bool,
    /// Write STEM-throughput, STEM-response, STEM-utilization and
    /// STEM-vs-hit plots (.png and .svg).
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Blocksize(b) => blocksize(b, quiet),
        Cmd::Mva(m) => mva_cmd(m),
    }
}

/// A duration in seconds (a bare number is seconds).
fn parse_time(s: &str) -> anyhow::Result<f64> {
    Ok(units::parse_duration(s, units::Bare::Seconds)?.as_secs_f64())
}

/// A bandwidth in bytes per second, written per second: 6MB/s (SI),
/// 6MiB/s (binary), 750KB/s.
fn parse_rate(s: &str) -> anyhow::Result<f64> {
    let t = s.trim();
    if !t.ends_with("/s") {
        bail!("'{t}' is not a bandwidth: write it per second, e.g. {t}/s");
    }
    Ok(units::parse_rate(t)?)
}

fn blocksize(a: BlockSizeArgs, quiet: bool) -> anyhow::Result<()> {
    let fix_delay = parse_time(&a.fix_delay).context("--fix-delay")?;
    let bandwidth = parse_rate(&a.bandwidth).context("--bandwidth")?;
    let sizes = list(&a.sizes, |s| {
        let n = parse_size(s).map_err(|e| anyhow::anyhow!("--sizes: {e}"))?;
        if n == 0 {
            bail!("--sizes: a block size must be positive");
        }
        Ok(n)
    })?;
    if sizes.is_empty() {
        bail!("--sizes: give at least one block size");
    }
    let cfg = BlockSizeConfig {
        sizes,
        fix_delay,
        bandwidth,
        include_writes: a.include_writes,
        shared_cache: a.shared_cache,
    };
    let progress = Reporter::new(Output::human(quiet || a.json));
    let r = blocksize::run_file(cfg, &a.trace, &progress)?;
    progress.finish();
    if r.requests == 0 {
        bail!(
            "{} has no {}requests to replay",
            a.trace.display(),
            if a.include_writes { "" } else { "read " }
        );
    }
    show_blocksize(&r, a.json, a.plot.as_deref())
}

fn mva_cmd(a: MvaArgs) -> anyhow::Result<()> {
    let mut d = match a.demands.to_ascii_lowercase().as_str() {
        "4k" => Demands::table1_4k(),
        "32k" => Demands::table1_32k(),
        o => bail!("unknown --demands '{o}': use 4k or 32k (Table 1's columns)"),
    };
    let set = |v: &Option<String>, f: &mut f64, name: &str| -> anyhow::Result<()> {
        if let Some(s) = v {
            *f = parse_time(s).with_context(|| format!("--{name}"))?;
        }
        Ok(())
    };
    set(&a.cpu, &mut d.cpu, "cpu")?;
    set(&a.disk, &mut d.disk, "disk")?;
    set(&a.memory, &mut d.memory, "memory")?;
    set(&a.network, &mut d.network, "network")?;
    set(&a.client_delay, &mut d.client_delay, "client-delay")?;
    let hits = list(&a.hit, |s| match s.parse::<f64>() {
        Ok(h) if (0.0..=1.0).contains(&h) => Ok(h),
        _ => bail!("--hit: '{s}' is not a ratio between 0 and 1"),
    })?;
    if hits.is_empty() {
        bail!("--hit: give at least one hit ratio");
    }
    if a.clients == 0 || a.max_clients == 0 || a.step == 0 {
        bail!("--clients, --max-clients and --step must be at least 1");
    }
    if a.max_clients > 100_000 {
        bail!("--max-clients: at most 100000");
    }
    let opts = SweepOptions {
        hits,
        clients: a.clients,
        max_clients: a.max_clients,
        step: a.step,
        // The simulation is shown in the tables only.
        simulate: a.simulate && !a.json,
    };
    let s = sweep(&d, &opts)?;
    show_mva(&d, &s, a.clients, a.simulate, a.json, a.plot.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_rates() {
        assert!((parse_time("8ms").unwrap() - 0.008).abs() < 1e-15);
        assert!((parse_time("0.32ms").unwrap() - 0.00032).abs() < 1e-15);
        assert!((parse_time("150us").unwrap() - 150e-6).abs() < 1e-15);
        assert!((parse_time("2").unwrap() - 2.0).abs() < 1e-15);
        assert!(parse_time("8 parsecs").is_err());
        assert_eq!(parse_rate("6MB/s").unwrap(), 6e6);
        assert_eq!(parse_rate("6MiB/s").unwrap(), 6.0 * 1048576.0);
        assert_eq!(parse_rate("750KB/s").unwrap(), 750e3);
        assert!(parse_rate("6MB").unwrap_err().to_string().contains("6MB/s"));
        assert!(parse_rate("0MB/s").is_err());
    }
}
