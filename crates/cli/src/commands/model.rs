//! `roamdisk model`: the capacity models — Machine Bank's block-size
//! latency model and TransCom's closed queueing network (exact MVA).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use roamdisk_blockdev::units::{self, format_size, parse_size};
use roamdisk_cachesim::blocksize::{BlockSizeConfig, BlockSizeModel};
use roamdisk_cachesim::mva::{self, Demands};
use roamdisk_cachesim::qnsim;

use super::sim::read_requests;
use crate::plot::{Charts, LineChart, Series};
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

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
    let mut sizes = Vec::new();
    for s in a.sizes.split(',').filter(|s| !s.trim().is_empty()) {
        let n = parse_size(s).map_err(|e| anyhow::anyhow!("--sizes: {e}"))?;
        if n == 0 {
            bail!("--sizes: a block size must be positive");
        }
        sizes.push(n);
    }
    if sizes.is_empty() {
        bail!("--sizes: give at least one block size");
    }
    let mut model = BlockSizeModel::new(BlockSizeConfig {
        sizes,
        fix_delay,
        bandwidth,
        include_writes: a.include_writes,
        shared_cache: a.shared_cache,
    });
    let total = read_requests(&a.trace)?.count() as u64;
    let progress = Reporter::phase_of(
        Output::human(quiet || a.json),
        "replaying",
        total,
        Unit::Items,
    );
    for (n, r) in read_requests(&a.trace)?.enumerate() {
        if let Some(req) = r? {
            model.feed(&req);
        }
        if n % 65536 == 0 {
            progress.set(n as u64);
        }
    }
    progress.finish();
    let r = model.finish();
    if r.requests == 0 {
        bail!(
            "{} has no {}requests to replay",
            a.trace.display(),
            if a.include_writes { "" } else { "read " }
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{} requests ({}), FixDelay {:.3} ms, Bandwidth {:.3} MB/s",
            r.requests,
            format_size(r.bytes_requested),
            r.fix_delay_s * 1e3,
            r.bandwidth / 1e6
        );
        println!(
            "{:>10} {:>15} {:>15} {:>13} {:>13} {:>13}",
            "block", "AccessedBlocks", "bytes fetched", "fixed s", "transfer s", "TotalLatency s"
        );
        for (i, p) in r.points.iter().enumerate() {
            println!(
                "{:>10} {:>15} {:>15} {:>13.2} {:>13.2} {:>13.2}{}",
                format_size(p.block_size),
                p.accessed_blocks,
                format_size(p.bytes_fetched),
                p.fixed_s,
                p.transfer_s,
                p.total_s,
                if i == r.optimum { "  <- optimum" } else { "" }
            );
        }
        println!(
            "optimum: {} ({})",
            format_size(r.optimum().block_size),
            if r.interior_optimum() {
                "an interior optimum: fixed delays dominate below it, useless transfer above"
            } else if r.optimum == 0 {
                "the smallest size: the reads are mostly random"
            } else {
                "the largest size: the reads are mostly sequential"
            }
        );
    }
    if let Some(stem) = &a.plot {
        let kib = |b: u64| b as f64 / 1024.0;
        let accessed = vec![
            Series {
                name: "AccessedBlocks".into(),
                points: r
                    .points
                    .iter()
                    .map(|p| (kib(p.block_size), p.accessed_blocks as f64))
                    .collect(),
            },
            Series {
                name: "inversely proportional".into(),
                points: r
                    .points
                    .iter()
                    .map(|p| (kib(p.block_size), p.inverse))
                    .collect(),
            },
        ];
        let mut charts = Charts::new(stem, "model");
        charts.line(
            "accessed-blocks",
            &LineChart {
                title: "Accessed blocks vs block size (Machine Bank Fig. 4)",
                x_label: "block size (KiB)",
                y_label: "accessed blocks",
                log_x: true,
                log_y: true,
                series: &accessed,
            },
        )?;
        let latency = vec![
            Series {
                name: "TotalLatency".into(),
                points: r
                    .points
                    .iter()
                    .map(|p| (kib(p.block_size), p.total_s))
                    .collect(),
            },
            Series {
                name: "fixed delays".into(),
                points: r
                    .points
                    .iter()
                    .map(|p| (kib(p.block_size), p.fixed_s))
                    .collect(),
            },
            Series {
                name: "transfer".into(),
                points: r
                    .points
                    .iter()
                    .map(|p| (kib(p.block_size), p.transfer_s))
                    .collect(),
            },
        ];
        charts.line(
            "latency",
            &LineChart {
                title: "Total latency vs block size (Machine Bank Fig. 5)",
                x_label: "block size (KiB)",
                y_label: "seconds",
                log_x: true,
                log_y: false,
                series: &latency,
            },
        )?;
        if !a.json {
            charts.report();
        }
    }
    Ok(())
}

/// A point's throughput, response time (ms) and the four utilizations,
/// as columns of the MVA tables.
fn mva_columns(p: &mva::MvaPoint) -> String {
    format!(
        "{:>12.1} {:>11.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
        p.throughput,
        p.response * 1e3,
        p.utilization[0],
        p.utilization[1],
        p.utilization[2],
        p.utilization[3]
    )
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
    let hits: Vec<f64> = a
        .hit
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let h: f64 = s
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--hit: '{s}' is not a ratio between 0 and 1"))?;
            if !(0.0..=1.0).contains(&h) {
                bail!("--hit: '{s}' is not a ratio between 0 and 1");
            }
            Ok(h)
        })
        .collect::<anyhow::Result<_>>()?;
    if hits.is_empty() {
        bail!("--hit: give at least one hit ratio");
    }
    if a.clients == 0 || a.max_clients == 0 || a.step == 0 {
        bail!("--clients, --max-clients and --step must be at least 1");
    }
    if a.max_clients > 100_000 {
        bail!("--max-clients: at most 100000");
    }
    d.network(0.5).validate().map_err(anyhow::Error::msg)?;

    // Against N, one curve per hit ratio.
    let curves: Vec<(f64, Vec<mva::MvaPoint>)> = hits
        .iter()
        .map(|&h| (h, mva::solve(&d.network(h), a.max_clients)))
        .collect();
    // Against the hit ratio at a.clients.
    let mut hgrid: Vec<f64> = (0..=20).map(|i| i as f64 * 0.05).collect();
    hgrid.extend([0.97, 0.975, 0.98, 0.99, 0.995]);
    hgrid.extend(hits.iter().copied());
    hgrid.sort_by(|x, y| x.total_cmp(y));
    hgrid.dedup_by(|x, y| (*x - *y).abs() < 1e-12);
    let by_hit: Vec<(f64, mva::MvaPoint, usize)> = hgrid
        .iter()
        .map(|&h| {
            let net = d.network(h);
            let p = mva::solve(&net, a.clients).pop().expect("n ≥ 1");
            (h, p, net.bottleneck())
        })
        .collect();
    let names = ["CPU", "memory", "disk", "network"];

    if a.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            demands: &'a Demands,
            vs_clients: Vec<(f64, &'a Vec<mva::MvaPoint>)>,
            vs_hit: Vec<(f64, &'a mva::MvaPoint, &'static str)>,
            disk_bottleneck_until_hit: f64,
        }
        let out = Out {
            demands: &d,
            vs_clients: curves.iter().map(|(h, c)| (*h, c)).collect(),
            vs_hit: by_hit.iter().map(|(h, p, b)| (*h, p, names[*b])).collect(),
            disk_bottleneck_until_hit: d.disk_bottleneck_until(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "demands per {} request: CPU {:.3} ms, disk {:.3} ms, memory {:.4} ms, network {:.3} ms; Client-Delay (think) {:.3} ms",
            format_size(d.request_size),
            d.cpu * 1e3,
            d.disk * 1e3,
            d.memory * 1e3,
            d.network * 1e3,
            d.client_delay * 1e3
        );
        for (h, curve) in &curves {
            let net = d.network(*h);
            let b = net.bottleneck();
            let dem = net.demands();
            println!(
                "\nhit ratio {:.3}: bottleneck {} (demand {:.3} ms/request), throughput bound {:.0} req/s, saturates beyond N* = {:.1} clients",
                h,
                names[b],
                dem[b] * 1e3,
                1.0 / dem[b],
                net.saturation_population()
            );
            println!(
                "  {:>5} {:>12} {:>11} {:>7} {:>7} {:>7} {:>7}{}",
                "N",
                "X (req/s)",
                "R (ms)",
                "U cpu",
                "U mem",
                "U disk",
                "U net",
                if a.simulate {
                    "   sim X (req/s)  sim R (ms)   diff"
                } else {
                    ""
                }
            );
            for p in curve
                .iter()
                .filter(|p| p.clients <= 5 || p.clients % a.step == 0 || p.clients == a.max_clients)
            {
                let sim = if a.simulate {
                    let s = qnsim::estimate(&net, p.clients, 0.01, 2_000_000, p.clients as u64);
                    let diff = ((s.throughput - p.throughput) / p.throughput)
                        .abs()
                        .max(((s.response - p.response) / p.response).abs());
                    format!(
                        "   {:>13.1} {:>11.3} {:>5.2}%",
                        s.throughput,
                        s.response * 1e3,
                        100.0 * diff
                    )
                } else {
                    String::new()
                };
                println!("  {:>5} {}{}", p.clients, mva_columns(p), sim);
            }
        }
        println!("\nagainst the hit ratio at N = {}:", a.clients);
        println!(
            "  {:>6} {:>12} {:>11} {:>7} {:>7} {:>7} {:>7}  bottleneck",
            "h", "X (req/s)", "R (ms)", "U cpu", "U mem", "U disk", "U net"
        );
        for (h, p, b) in &by_hit {
            println!("  {:>6.3} {}  {}", h, mva_columns(p), names[*b]);
        }
        println!(
            "\nthe disk is the bottleneck up to a hit ratio of {:.3}; beyond it, the {}",
            d.disk_bottleneck_until(),
            if d.network >= d.cpu { "network" } else { "CPU" }
        );
    }

    if let Some(stem) = &a.plot {
        let mut charts = Charts::new(stem, "model");
        let per_n = |f: &dyn Fn(&mva::MvaPoint) -> f64| -> Vec<Series> {
            curves
                .iter()
                .map(|(h, c)| Series {
                    name: format!("hit ratio {h}"),
                    points: c.iter().map(|p| (p.clients as f64, f(p))).collect(),
                })
                .collect()
        };
        for (suffix, title, y, series) in [
            (
                "throughput",
                "Server throughput vs clients (MVA)",
                "requests/s",
                per_n(&|p| p.throughput),
            ),
            (
                "response",
                "Response time vs clients (MVA)",
                "ms per request",
                per_n(&|p| p.response * 1e3),
            ),
        ] {
            charts.line(
                suffix,
                &LineChart {
                    title,
                    x_label: "clients",
                    y_label: y,
                    log_x: false,
                    log_y: false,
                    series: &series,
                },
            )?;
        }
        let util: Vec<Series> = (0..4)
            .map(|k| Series {
                name: names[k].into(),
                points: by_hit
                    .iter()
                    .map(|(h, p, _)| (*h, p.utilization[k]))
                    .collect(),
            })
            .collect();
        charts.line(
            "utilization",
            &LineChart {
                title: &format!("Utilisation vs server hit ratio, {} clients", a.clients),
                x_label: "server cache hit ratio",
                y_label: "utilisation",
                log_x: false,
                log_y: false,
                series: &util,
            },
        )?;
        let xh = vec![Series {
            name: format!("{} clients", a.clients),
            points: by_hit.iter().map(|(h, p, _)| (*h, p.throughput)).collect(),
        }];
        charts.line(
            "vs-hit",
            &LineChart {
                title: "Throughput vs server hit ratio (MVA)",
                x_label: "server cache hit ratio",
                y_label: "requests/s",
                log_x: false,
                log_y: false,
                series: &xh,
            },
        )?;
        if !a.json {
            charts.report();
        }
    }
    Ok(())
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
