//! Plots for commands whose results read better as curves: line charts
//! and bar charts written as PNG and SVG side by side.
//!
//! PNG text needs a TrueType font; DejaVu Sans from Debian's
//! `fonts-dejavu-core` (installed by `scripts/test`) is loaded at run time.
//! SVG output needs no font file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context};
use plotters::prelude::*;

/// Where the font lives on Debian.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn register_font() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = FONT_PATHS
            .iter()
            .find(|p| Path::new(p).exists())
            .ok_or_else(|| {
                "no DejaVu Sans font found: install fonts-dejavu-core (scripts/test does)"
                    .to_string()
            })?;
        let bytes: &'static [u8] = Box::leak(
            std::fs::read(path)
                .map_err(|e| format!("cannot read {path}: {e}"))?
                .into_boxed_slice(),
        );
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path} is not a usable font"))?;
        Ok(())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// One named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Logarithmic x axis (base 2 ticks look best for sizes).
    pub log_x: bool,
    pub log_y: bool,
    pub series: &'a [Series],
}

/// The PNG and SVG paths for an output stem (`out/hit-ratio` → `.png`,
/// `.svg`); an extension on `stem` is dropped.
pub fn outputs(stem: &Path) -> (PathBuf, PathBuf) {
    let s = stem.with_extension("");
    (s.with_extension("png"), s.with_extension("svg"))
}

/// The charts one command writes: each named `STEM-SUFFIX.png` and `.svg`,
/// then listed for the user.
pub struct Charts {
    stem: PathBuf,
    written: Vec<PathBuf>,
}

impl Charts {
    /// Charts named after `stem` (`out/bs` → `out/bs-latency.png`); when
    /// `stem` is a folder, after `default` inside it.
    pub fn new(stem: &Path, default: &str) -> Charts {
        let name = stem
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| default.into());
        Charts {
            stem: stem.with_file_name(name),
            written: Vec::new(),
        }
    }

    fn path(&self, suffix: &str) -> PathBuf {
        let name = self.stem.file_name().unwrap_or_default().to_string_lossy();
        self.stem.with_file_name(format!("{name}-{suffix}"))
    }

    /// A line chart.
    pub fn line(&mut self, suffix: &str, c: &LineChart) -> anyhow::Result<()> {
        let (png, svg) = line_chart(&self.path(suffix), c)?;
        self.written.extend([png, svg]);
        Ok(())
    }

    /// A bar chart.
    pub fn bar(
        &mut self,
        suffix: &str,
        title: &str,
        y_label: &str,
        bars: &[(String, f64)],
    ) -> anyhow::Result<()> {
        let (png, svg) = bar_chart(&self.path(suffix), title, y_label, bars)?;
        self.written.extend([png, svg]);
        Ok(())
    }

    /// `wrote PATH` for every file, on stdout.
    pub fn report(&self) {
        for p in &self.written {
            outln!("wrote {}", p.display());
        }
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn bounds(series: &[Series], log_x: bool, log_y: bool) -> anyhow::Result<((f64, f64), (f64, f64))> {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| {
            x.is_finite() && y.is_finite() && (!log_x || *x > 0.0) && (!log_y || *y > 0.0)
        })
        .collect();
    if pts.is_empty() {
        bail!("nothing to plot");
    }
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    let (mut y0, mut y1) = (f64::MAX, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    if y0 == y1 {
        y1 = y0 + 1.0;
    }
    if !log_y {
        y0 = y0.min(0.0);
        y1 += (y1 - y0) * 0.05;
    }
    Ok(((x0, x1), (y0, y1)))
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    c: &LineChart,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let ((x0, x1), (y0, y1)) = bounds(c.series, c.log_x, c.log_y)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(c.x_label)
                .y_desc(c.y_label)
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            for (i, s) in c.series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| (!c.log_x || *x > 0.0) && (!c.log_y || *y > 0.0))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .draw()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }};
    }
    match (c.log_x, c.log_y) {
        (false, false) => finish!(b
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?),
        (true, false) => finish!(b
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?),
        (false, true) => finish!(b
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(|e| anyhow::anyhow!("{e:?}"))?),
        (true, true) => finish!(b
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(|e| anyhow::anyhow!("{e:?}"))?),
    }
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// Write a line chart as `stem.png` and `stem.svg`; returns both paths.
pub fn line_chart(stem: &Path, c: &LineChart) -> anyhow::Result<(PathBuf, PathBuf)> {
    register_font()?;
    let (png, svg) = outputs(stem);
    if let Some(d) = png.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    draw_lines(BitMapBackend::new(&png, (1000, 620)).into_drawing_area(), c)
        .with_context(|| format!("drawing {}", png.display()))?;
    draw_lines(SVGBackend::new(&svg, (1000, 620)).into_drawing_area(), c)
        .with_context(|| format!("drawing {}", svg.display()))?;
    Ok((png, svg))
}

/// A bar chart of labelled values (one series), as `stem.png` and `stem.svg`.
pub fn bar_chart(
    stem: &Path,
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    register_font()?;
    let (png, svg) = outputs(stem);
    if let Some(d) = png.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        title: &str,
        y_label: &str,
        bars: &[(String, f64)],
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let ymax = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let n = bars.len().max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(60)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n).into_segmented(), 0.0..ymax)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_label)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), *v),
                    ],
                    COLORS[i % COLORS.len()].filled(),
                );
                r.set_margin(0, 0, 8, 8);
                r
            }))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        Ok(())
    }
    draw(
        BitMapBackend::new(&png, (1000, 620)).into_drawing_area(),
        title,
        y_label,
        bars,
    )?;
    draw(
        SVGBackend::new(&svg, (1000, 620)).into_drawing_area(),
        title,
        y_label,
        bars,
    )?;
    Ok((png, svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::disallowed_methods, reason = "a test reads its environment")]
    fn charts_are_written_as_png_and_svg() {
        let d = std::env::temp_dir().join(format!("roamdisk-plot-test-{}", std::process::id()));
        let series = vec![
            Series {
                name: "LRU".into(),
                points: (1..=10)
                    .map(|i| ((1u64 << i) as f64, i as f64 / 10.0))
                    .collect(),
            },
            Series {
                name: "FMPQ".into(),
                points: (1..=10)
                    .map(|i| ((1u64 << i) as f64, i as f64 / 9.0))
                    .collect(),
            },
        ];
        let (png, svg) = line_chart(
            &d.join("hit"),
            &LineChart {
                title: "hit ratio",
                x_label: "cache size",
                y_label: "hit ratio",
                log_x: true,
                log_y: false,
                series: &series,
            },
        )
        .unwrap();
        assert!(std::fs::metadata(&png).unwrap().len() > 5000);
        assert!(std::fs::read_to_string(&svg).unwrap().contains("FMPQ"));
        let (png, _) = bar_chart(
            &d.join("bars"),
            "sizes",
            "count",
            &[("4K".into(), 60.0), ("8K".into(), 20.0)],
        )
        .unwrap();
        assert!(std::fs::metadata(&png).unwrap().len() > 2000);
        if std::env::var_os("ROAMDISK_KEEP_PLOTS").is_none() {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}
