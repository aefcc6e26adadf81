//! How `roamdisk model` shows its results: the block-size curve and the
//! MVA sweeps, as tables or JSON, and their plots.

use std::path::Path;

use roamdisk_blockdev::units::format_size;
use roamdisk_cachesim::blocksize::BlockSizeReport;
use roamdisk_cachesim::mva::{Demands, MvaPoint};
use roamdisk_cachesim::sweep::{Sweep, STATIONS};

use crate::plot::{Charts, LineChart, Series};

/// Show the block-size model's curve: JSON, or a table with the optimum;
/// with `plot`, Machine Bank's Figures 4 and 5.
pub fn show_blocksize(r: &BlockSizeReport, json: bool, plot: Option<&Path>) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        outln!(
            "{} requests ({}), FixDelay {:.3} ms, Bandwidth {:.3} MB/s",
            r.requests,
            format_size(r.bytes_requested),
            r.fix_delay_s * 1e3,
            r.bandwidth / 1e6
        );
        outln!(
            "{:>10} {:>15} {:>15} {:>13} {:>13} {:>13}",
            "block",
            "AccessedBlocks",
            "bytes fetched",
            "fixed s",
            "transfer s",
            "TotalLatency s"
        );
        for (i, p) in r.points.iter().enumerate() {
            outln!(
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
        outln!(
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
    if let Some(stem) = plot {
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
        if !json {
            charts.report();
        }
    }
    Ok(())
}

/// A point's throughput, response time (ms) and the four utilizations,
/// as columns of the MVA tables.
fn mva_columns(p: &MvaPoint) -> String {
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

/// Show the MVA sweeps of demands `d` (`clients`: the population of the
/// sweep over the hit ratio; `simulate`: the curves carry simulation
/// estimates): JSON, or tables naming each curve's bottleneck; with
/// `plot`, throughput, response, utilisation and throughput against the
/// hit ratio.
pub fn show_mva(
    d: &Demands,
    s: &Sweep,
    clients: usize,
    simulate: bool,
    json: bool,
    plot: Option<&Path>,
) -> anyhow::Result<()> {
    let names = STATIONS;
    if json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            demands: &'a Demands,
            vs_clients: Vec<(f64, &'a Vec<MvaPoint>)>,
            vs_hit: Vec<(f64, &'a MvaPoint, &'static str)>,
            disk_bottleneck_until_hit: f64,
        }
        let out = Out {
            demands: d,
            vs_clients: s.curves.iter().map(|c| (c.hit, &c.points)).collect(),
            vs_hit: s
                .by_hit
                .iter()
                .map(|x| (x.hit, &x.point, names[x.bottleneck]))
                .collect(),
            disk_bottleneck_until_hit: d.disk_bottleneck_until(),
        };
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "demands per {} request: CPU {:.3} ms, disk {:.3} ms, memory {:.4} ms, network {:.3} ms; Client-Delay (think) {:.3} ms",
            format_size(d.request_size),
            d.cpu * 1e3,
            d.disk * 1e3,
            d.memory * 1e3,
            d.network * 1e3,
            d.client_delay * 1e3
        );
        for curve in &s.curves {
            let h = curve.hit;
            let net = d.network(h);
            let b = net.bottleneck();
            let dem = net.demands();
            outln!(
                "\nhit ratio {:.3}: bottleneck {} (demand {:.3} ms/request), throughput bound {:.0} req/s, saturates beyond N* = {:.1} clients",
                h,
                names[b],
                dem[b] * 1e3,
                1.0 / dem[b],
                net.saturation_population()
            );
            outln!(
                "  {:>5} {:>12} {:>11} {:>7} {:>7} {:>7} {:>7}{}",
                "N",
                "X (req/s)",
                "R (ms)",
                "U cpu",
                "U mem",
                "U disk",
                "U net",
                if simulate {
                    "   sim X (req/s)  sim R (ms)   diff"
                } else {
                    ""
                }
            );
            for (i, est) in &curve.shown {
                let p = &curve.points[*i];
                let sim = match est {
                    Some(s) => {
                        let diff = ((s.throughput - p.throughput) / p.throughput)
                            .abs()
                            .max(((s.response - p.response) / p.response).abs());
                        format!(
                            "   {:>13.1} {:>11.3} {:>5.2}%",
                            s.throughput,
                            s.response * 1e3,
                            100.0 * diff
                        )
                    }
                    None => String::new(),
                };
                outln!("  {:>5} {}{}", p.clients, mva_columns(p), sim);
            }
        }
        outln!("\nagainst the hit ratio at N = {}:", clients);
        outln!(
            "  {:>6} {:>12} {:>11} {:>7} {:>7} {:>7} {:>7}  bottleneck",
            "h",
            "X (req/s)",
            "R (ms)",
            "U cpu",
            "U mem",
            "U disk",
            "U net"
        );
        for x in &s.by_hit {
            outln!(
                "  {:>6.3} {}  {}",
                x.hit,
                mva_columns(&x.point),
                names[x.bottleneck]
            );
        }
        outln!(
            "\nthe disk is the bottleneck up to a hit ratio of {:.3}; beyond it, the {}",
            d.disk_bottleneck_until(),
            if d.network >= d.cpu { "network" } else { "CPU" }
        );
    }

    if let Some(stem) = plot {
        let mut charts = Charts::new(stem, "model");
        let per_n = |f: &dyn Fn(&MvaPoint) -> f64| -> Vec<Series> {
            s.curves
                .iter()
                .map(|c| Series {
                    name: format!("hit ratio {}", c.hit),
                    points: c.points.iter().map(|p| (p.clients as f64, f(p))).collect(),
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
                points: s
                    .by_hit
                    .iter()
                    .map(|x| (x.hit, x.point.utilization[k]))
                    .collect(),
            })
            .collect();
        charts.line(
            "utilization",
            &LineChart {
                title: &format!("Utilisation vs server hit ratio, {} clients", clients),
                x_label: "server cache hit ratio",
                y_label: "utilisation",
                log_x: false,
                log_y: false,
                series: &util,
            },
        )?;
        let xh = vec![Series {
            name: format!("{} clients", clients),
            points: s
                .by_hit
                .iter()
                .map(|x| (x.hit, x.point.throughput))
                .collect(),
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
        if !json {
            charts.report();
        }
    }
    Ok(())
}
