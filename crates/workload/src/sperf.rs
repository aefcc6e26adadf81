//! sperf (seed `lbs-logging-block-store` section 2): bandwidth of I/O
//! patterns within an area of a device — sequential, strided, partitioned
//! (interleaved sequential writers) and random — for any block size and
//! read/write mix, and the five sweeps behind the seed's Figures 1-5.
//!
//! Time is the simulated card time when the target holds a `flashsim`
//! layer, else wall-clock time.

use std::time::Instant;

use rand::RngExt;
use roamdisk_blockdev::progress::{Progress, Unit};
use roamdisk_blockdev::units::{parse_size, UnitError};
use roamdisk_blockdev::{BlockDev, Error, ErrorKind, Op, Result, WriteFlags};
use serde::Serialize;

use crate::target::{AlignedBuf, Target};

/// An I/O ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Pattern {
    Sequential,
    Random,
    /// Each request `stride` blocks after the previous one, wrapping at
    /// the end of the area (one block further each time round).
    Strided {
        stride: u64,
    },
    /// `writers` sequential streams `distance` bytes apart, taking turns.
    Partitioned {
        writers: u64,
        distance: u64,
    },
}

/// A pattern that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatternError {
    #[error("stride:N needs a number of blocks, not '{0}'")]
    Stride(String, #[source] std::num::ParseIntError),
    #[error("writers:N needs a count, not '{0}'")]
    Writers(String),
    #[error(transparent)]
    Distance(UnitError),
    #[error("unknown pattern '{0}' (sequential, random, stride:N, writers:N[:DISTANCE])")]
    Unknown(String),
}

impl Pattern {
    /// `sequential` (or `seq`), `random`, `stride:N` (blocks) or
    /// `writers:N[:DISTANCE]` (DISTANCE a size, `2 * au` when not given).
    pub fn parse(s: &str, au: u64) -> std::result::Result<Pattern, PatternError> {
        let parts: Vec<&str> = s.split(':').collect();
        Ok(match parts.as_slice() {
            ["sequential"] | ["seq"] => Pattern::Sequential,
            ["random"] => Pattern::Random,
            ["stride", n] => Pattern::Strided {
                stride: n
                    .parse()
                    .map_err(|e| PatternError::Stride(n.to_string(), e))?,
            },
            ["writers", n] | ["writers", n, _] => Pattern::Partitioned {
                writers: n
                    .parse()
                    .ok()
                    .filter(|&w: &u64| w > 0)
                    .ok_or_else(|| PatternError::Writers(n.to_string()))?,
                distance: match parts.get(2) {
                    Some(d) => parse_size(d).map_err(PatternError::Distance)?,
                    None => 2 * au,
                },
            },
            _ => return Err(PatternError::Unknown(s.to_string())),
        })
    }

    /// The pattern's name in reports.
    pub fn label(&self) -> String {
        match self {
            Pattern::Sequential => "sequential".into(),
            Pattern::Random => "random".into(),
            Pattern::Strided { stride } => format!("stride {stride}"),
            Pattern::Partitioned { writers, distance } => {
                format!("{writers} writers {} KiB apart", distance >> 10)
            }
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub pattern: Pattern,
    /// Block (request) size in bytes.
    pub bs: u64,
    /// Share of requests that are writes, 0-100 (chosen at random).
    pub write_pct: u32,
    /// Requests stay in `[0, area)`.
    pub area: u64,
    /// Bytes to transfer (at least `MIN_OPS` requests).
    pub bytes: u64,
    pub seed: u64,
}

/// Fewest requests per measurement.
pub const MIN_OPS: u64 = 32;

/// A measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub point: Point,
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    /// Whether `seconds` is simulated card time.
    pub simulated: bool,
}

/// The offset of request `k`.
pub fn offset(p: &Point, k: u64, rng: &mut impl rand::Rng) -> u64 {
    let blocks = (p.area / p.bs).max(1);
    match p.pattern {
        Pattern::Sequential => (k % blocks) * p.bs,
        Pattern::Random => rng.random_range(0..blocks) * p.bs,
        Pattern::Strided { stride } => {
            let step = k * stride.max(1);
            let round = step / blocks;
            ((step + round) % blocks) * p.bs
        }
        Pattern::Partitioned { writers, distance } => {
            let w = k % writers.max(1);
            let j = k / writers.max(1);
            (w * distance + j * p.bs) % (blocks * p.bs)
        }
    }
}

/// Measure one point. `clock` returns simulated nanoseconds when the
/// device has a card model.
pub fn measure(dev: &dyn BlockDev, p: &Point, clock: &dyn Fn() -> Option<u64>) -> Result<Measured> {
    if p.bs == 0 || p.area < p.bs || p.area > dev.size() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            Op::Open,
            "sperf",
            format!(
                "the area ({} bytes) must hold a block ({} bytes) and fit the device ({} bytes)",
                p.area,
                p.bs,
                dev.size()
            ),
        ));
    }
    let ops = (p.bytes / p.bs).max(MIN_OPS);
    let mut rng = roamdisk_trace::synth::rng(p.seed);
    let mut pick = roamdisk_trace::synth::rng(p.seed ^ 0x5eed);
    let mut buf = AlignedBuf::new(p.bs as usize);
    for (i, b) in buf.get_mut(p.bs as usize).iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let sim0 = clock();
    let t0 = Instant::now();
    for k in 0..ops {
        let off = offset(p, k, &mut rng);
        let write =
            p.write_pct >= 100 || (p.write_pct > 0 && pick.random_range(0..100) < p.write_pct);
        if write {
            dev.write_at(buf.get(p.bs as usize), off, WriteFlags::default())?;
        } else {
            dev.read_at(buf.get_mut(p.bs as usize), off)?;
        }
    }
    if p.write_pct > 0 {
        dev.flush()?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let (seconds, simulated) = match (sim0, clock()) {
        (Some(a), Some(b)) => ((b - a) as f64 / 1e9, true),
        _ => (wall, false),
    };
    let bytes = ops * p.bs;
    Ok(Measured {
        point: p.clone(),
        ops,
        bytes,
        seconds,
        mb_per_s: bytes as f64 / seconds.max(1e-12) / 1e6,
        simulated,
    })
}

/// Block sizes of the seed's figures: 1 KiB to 1 MiB.
pub fn block_sizes(from: u64, to: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut b = from.max(512);
    while b <= to {
        v.push(b);
        b *= 2;
    }
    v
}

/// A named series of (x, MB/s) points.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What a figure sweep varies.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub area: u64,
    pub bytes: u64,
    pub seed: u64,
    pub sizes: Vec<u64>,
    /// Allocation unit for Figure 4's writer distance (2 AUs).
    pub au: u64,
    /// Block size of Figure 5.
    pub mix_bs: u64,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            area: 128 << 20,
            bytes: 16 << 20,
            seed: 1,
            sizes: block_sizes(1024, 1 << 20),
            au: 4 << 20,
            mix_bs: 4096,
        }
    }
}

/// The points of figure `n` (1-5) as (curve name, x value, point).
pub fn figure_points(n: u32, s: &Sweep) -> Vec<(String, f64, Point)> {
    let pt = |pattern, bs, write_pct| Point {
        pattern,
        bs,
        write_pct,
        area: s.area,
        bytes: s.bytes,
        seed: s.seed,
    };
    let mut v = Vec::new();
    match n {
        // Bandwidth against block size, sequential and random, read and write.
        1 | 2 => {
            let writes_only = n == 2;
            for (name, pattern, w) in [
                ("sequential read", Pattern::Sequential, 0),
                ("random read", Pattern::Random, 0),
                ("sequential write", Pattern::Sequential, 100),
                ("random write", Pattern::Random, 100),
            ] {
                if writes_only && w == 0 {
                    continue;
                }
                for &bs in &s.sizes {
                    v.push((name.to_string(), (bs >> 10) as f64, pt(pattern, bs, w)));
                }
            }
        }
        // Write bandwidth against stride distance, 4 KiB and 256 KiB.
        3 => {
            for bs in [4096u64, 256 << 10] {
                let mut stride = 1;
                while stride * bs <= s.area {
                    v.push((
                        format!("{} KiB writes", bs >> 10),
                        ((stride * bs) >> 10) as f64,
                        pt(Pattern::Strided { stride }, bs, 100),
                    ));
                    stride *= 2;
                }
            }
        }
        // Write bandwidth against interleaved sequential writers 2 AU apart.
        4 => {
            for writers in 1..=8u64 {
                v.push((
                    "256 KiB writes".to_string(),
                    writers as f64,
                    pt(
                        Pattern::Partitioned {
                            writers,
                            distance: 2 * s.au,
                        },
                        256 << 10,
                        100,
                    ),
                ));
            }
        }
        // Bandwidth against write share, sequential and random order.
        5 => {
            for (name, pattern) in [
                ("sequential", Pattern::Sequential),
                ("random", Pattern::Random),
            ] {
                for w in [0u32, 1, 2, 5, 10, 20, 50, 100] {
                    v.push((name.to_string(), w as f64, pt(pattern, s.mix_bs, w)));
                }
            }
        }
        _ => {}
    }
    v
}

/// Group measured points of a figure into curves; Figure 2 becomes the
/// sequential:random write ratio.
pub fn curves(n: u32, measured: &[(String, f64, Measured)]) -> Vec<Curve> {
    let mut out: Vec<Curve> = Vec::new();
    for (name, x, m) in measured {
        match out.iter_mut().find(|c| &c.name == name) {
            Some(c) => c.points.push((*x, m.mb_per_s)),
            None => out.push(Curve {
                name: name.clone(),
                points: vec![(*x, m.mb_per_s)],
            }),
        }
    }
    if n == 2 {
        let get = |name: &str| {
            out.iter()
                .find(|c| c.name == name)
                .map(|c| c.points.clone())
        };
        if let (Some(s), Some(r)) = (get("sequential write"), get("random write")) {
            return vec![Curve {
                name: "sequential:random write".into(),
                points: s
                    .iter()
                    .zip(&r)
                    .map(|(a, b)| (a.0, a.1 / b.1.max(1e-12)))
                    .collect(),
            }];
        }
    }
    out
}

/// One measurement to make: a point of curve `curve` at `x`, of figure
/// `figure` (0: a sweep of one's own), on target number `target`.
#[derive(Debug, Clone)]
pub struct Job {
    pub figure: u32,
    pub target: usize,
    pub curve: String,
    pub x: f64,
    pub point: Point,
}

/// A sweep of one's own: every pattern × write share × block size.
#[derive(Debug, Clone)]
pub struct Custom {
    pub patterns: Vec<Pattern>,
    pub write_pcts: Vec<u32>,
    pub sizes: Vec<u64>,
    pub area: u64,
    pub bytes: u64,
    pub seed: u64,
}

/// The jobs of a custom sweep on each of `targets` targets: a curve per
/// pattern and write share, its x the block size in KiB.
pub fn custom_jobs(c: &Custom, targets: usize) -> Vec<Job> {
    let mut jobs = Vec::new();
    for target in 0..targets {
        for p in &c.patterns {
            for &w in &c.write_pcts {
                for &bs in &c.sizes {
                    jobs.push(Job {
                        figure: 0,
                        target,
                        curve: format!("{} {}% writes", p.label(), w),
                        x: (bs >> 10) as f64,
                        point: Point {
                            pattern: *p,
                            bs,
                            write_pct: w,
                            area: c.area,
                            bytes: c.bytes,
                            seed: c.seed,
                        },
                    });
                }
            }
        }
    }
    jobs
}

/// The jobs of `figures` on each of `targets` targets.
pub fn figure_jobs(figures: &[u32], s: &Sweep, targets: usize) -> Vec<Job> {
    let mut jobs = Vec::new();
    for &figure in figures {
        for target in 0..targets {
            for (curve, x, point) in figure_points(figure, s) {
                jobs.push(Job {
                    figure,
                    target,
                    curve,
                    x,
                    point,
                });
            }
        }
    }
    jobs
}

/// A job's result.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub figure: u32,
    pub target: usize,
    pub curve: String,
    pub x: f64,
    pub result: Measured,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum SperfError {
    /// The target would not connect.
    #[error(transparent)]
    Connect(#[from] Error),
    /// A measurement failed.
    #[error("measuring {what}")]
    Measure {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

/// Measure every job on its target (one connection each), in order,
/// reporting a phase "measuring" over the jobs.
pub fn measure_jobs(
    targets: &[Target],
    jobs: Vec<Job>,
    progress: &dyn Progress,
) -> std::result::Result<Vec<Measurement>, SperfError> {
    progress.start("measuring", jobs.len() as u64, Unit::Items);
    let mut out = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.into_iter().enumerate() {
        let t = &targets[j.target];
        let dev = t.connect()?;
        let p = &j.point;
        let result = measure(dev.as_ref(), p, &|| t.simulated_ns()).map_err(|source| {
            SperfError::Measure {
                what: format!("{} {} B on {}", p.pattern.label(), p.bs, t.name()),
                source: Box::new(source),
            }
        })?;
        out.push(Measurement {
            figure: j.figure,
            target: j.target,
            curve: j.curve,
            x: j.x,
            result,
        });
        progress.set(i as u64 + 1);
    }
    progress.end();
    Ok(out)
}

/// The curves of figure `figure` (0: a custom sweep) on target `target`.
pub fn target_curves(figure: u32, target: usize, results: &[Measurement]) -> Vec<Curve> {
    let mine: Vec<(String, f64, Measured)> = results
        .iter()
        .filter(|r| r.figure == figure && r.target == target)
        .map(|r| (r.curve.clone(), r.x, r.result.clone()))
        .collect();
    curves(figure, &mine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::Access;
    use roamdisk_blockdev::Registry;

    #[test]
    fn patterns_place_requests_as_described() {
        let p = |pattern| Point {
            pattern,
            bs: 4096,
            write_pct: 100,
            area: 16 * 4096,
            bytes: 0,
            seed: 1,
        };
        let mut r = roamdisk_trace::synth::rng(1);
        let offs =
            |pt: &Point, r: &mut _| (0..20).map(|k| offset(pt, k, r) / 4096).collect::<Vec<_>>();
        assert_eq!(offs(&p(Pattern::Sequential), &mut r)[..4], [0, 1, 2, 3]);
        assert_eq!(offs(&p(Pattern::Sequential), &mut r)[16], 0);
        // Stride 4 in 16 blocks: 0 4 8 12, then 1 5 9 13, ...
        assert_eq!(
            offs(&p(Pattern::Strided { stride: 4 }), &mut r)[..8],
            [0, 4, 8, 12, 1, 5, 9, 13]
        );
        let w = p(Pattern::Partitioned {
            writers: 2,
            distance: 8 * 4096,
        });
        assert_eq!(offs(&w, &mut r)[..6], [0, 8, 1, 9, 2, 10]);
        assert!(offs(&p(Pattern::Random), &mut r).iter().all(|&b| b < 16));
    }

    #[test]
    fn sperf_on_the_card_model_has_the_seed_shape() {
        let mut reg = Registry::with_builtin();
        reg.add(&crate::flashsim::FLASHSIM);
        let t = crate::target::Target::open(&reg, "flashsim:class6:mem:128M", &Default::default())
            .unwrap();
        let dev = t.connect().unwrap();
        let clock = || t.simulated_ns();
        let s = Sweep {
            bytes: 4 << 20,
            sizes: vec![4096, 256 << 10],
            ..Sweep::default()
        };
        let m: Vec<_> = figure_points(2, &s)
            .into_iter()
            .map(|(n, x, p)| (n, x, measure(dev.as_ref(), &p, &clock).unwrap()))
            .collect();
        assert!(m.iter().all(|x| x.2.simulated));
        let ratio = &curves(2, &m)[0].points;
        assert!(ratio[0].1 > 20.0, "4 KiB ratio {}", ratio[0].1);
        assert!(ratio[1].1 < 2.5, "256 KiB ratio {}", ratio[1].1);
    }

    #[test]
    fn bad_areas_are_refused() {
        let dev = Registry::with_builtin()
            .build("mem:1M", Access::ReadWrite)
            .unwrap();
        let p = Point {
            pattern: Pattern::Sequential,
            bs: 4096,
            write_pct: 0,
            area: 2 << 20,
            bytes: 0,
            seed: 1,
        };
        let e = measure(dev.as_ref(), &p, &|| None).unwrap_err();
        assert!(e.to_string().contains("fit the device"), "{e}");
    }
}
