//! How `roamdisk sperf` shows its measurements: every one as JSON, or a
//! line of points per curve and figure; and a plot per figure.

use std::path::Path;

use roamdisk_workload::sperf::{self, Curve, Measurement};
use roamdisk_workload::target::Target;

use crate::plot::{line_chart, LineChart, Series};

/// A target's name cut to 40 characters, for curve names.
fn label(t: &str) -> String {
    if t.len() <= 40 {
        t.to_string()
    } else {
        format!(
            "{}…",
            &t[..t.char_indices().nth(39).map_or(t.len(), |c| c.0)]
        )
    }
}

/// Show the measurements of `figures` (none: a custom sweep) on
/// `targets`: JSON or a line per curve, and with `plot`, a plot per
/// figure in that directory.
pub fn show(
    targets: &[Target],
    figures: &[u32],
    results: &[Measurement],
    json: bool,
    plot: Option<&Path>,
    quiet: bool,
) -> anyhow::Result<()> {
    if json {
        let v: Vec<_> = results
            .iter()
            .map(|r| {
                serde_json::json!({"figure": r.figure, "target": targets[r.target].name(), "curve": r.curve, "x": r.x, "result": r.result})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
    }
    let multi = targets.len() > 1;
    let groups: Vec<u32> = if figures.is_empty() {
        vec![0]
    } else {
        figures.to_vec()
    };
    for f in groups {
        let mut curves: Vec<Curve> = Vec::new();
        for (ti, t) in targets.iter().enumerate() {
            for mut c in sperf::target_curves(f, ti, results) {
                if multi {
                    c.name = format!("{}: {}", label(t.name()), c.name);
                }
                curves.push(c);
            }
        }
        let simulated = results.iter().any(|r| r.result.simulated);
        let (title, x_label, y_label, log_x) = match f {
            0 => ("Bandwidth by block size", "block size (KiB)", "MB/s", true),
            1 => (
                "Fig. 1: bandwidth by block size and ordering",
                "block size (KiB)",
                "MB/s",
                true,
            ),
            2 => (
                "Fig. 2: sequential:random write bandwidth",
                "block size (KiB)",
                "ratio",
                true,
            ),
            3 => (
                "Fig. 3: write bandwidth by stride",
                "stride (KiB)",
                "MB/s",
                true,
            ),
            4 => (
                "Fig. 4: interleaved sequential writers 2 AU apart",
                "writers",
                "MB/s",
                false,
            ),
            _ => (
                "Fig. 5: bandwidth by write share",
                "writes (%)",
                "MB/s",
                false,
            ),
        };
        if !json {
            outln!(
                "{title}{}",
                if simulated {
                    " (simulated card time)"
                } else {
                    ""
                }
            );
            for c in &curves {
                let pts: Vec<String> = c
                    .points
                    .iter()
                    .map(|(x, y)| format!("{x}:{y:.3}"))
                    .collect();
                outln!("  {:<40} {}", c.name, pts.join("  "));
            }
            outln!("  ({x_label} : {y_label})");
            outln!();
        }
        if let Some(dir) = plot {
            let stem = if f == 0 {
                dir.join("sperf")
            } else {
                dir.join(format!("sperf-fig{f}"))
            };
            let series: Vec<Series> = curves
                .iter()
                .map(|c| Series {
                    name: c.name.clone(),
                    points: c.points.clone(),
                })
                .collect();
            let (png, _) = line_chart(
                &stem,
                &LineChart {
                    title,
                    x_label,
                    y_label,
                    log_x,
                    log_y: f == 2 || f == 3 || f == 1,
                    series: &series,
                },
            )?;
            if !quiet {
                eprintln!("roamdisk: wrote {} (and .svg)", png.display());
            }
        }
    }
    Ok(())
}
