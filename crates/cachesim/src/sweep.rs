//! The sweeps of TransCom's capacity model (`roamdisk model mva`): exact
//! MVA against the number of clients, one curve per server hit ratio, and
//! against the hit ratio at one population; optionally each shown
//! population checked by the discrete-event simulation ([`crate::qnsim`]).

use crate::mva::{self, Demands, MvaError, MvaPoint};
use crate::qnsim::{self, Estimate};

/// What to sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepOptions {
    /// Hit ratios of the curves against N.
    pub hits: Vec<f64>,
    /// The population of the sweep over the hit ratio (at least 1).
    pub clients: usize,
    /// The largest population of the sweep over N.
    pub max_clients: usize,
    /// Populations shown: 1-5, every `step`-th beyond (at least 1), and
    /// the last.
    pub step: usize,
    /// Simulate the shown populations too.
    pub simulate: bool,
}

/// One curve against N.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    pub hit: f64,
    /// MVA for populations 1..=max_clients.
    pub points: Vec<MvaPoint>,
    /// The shown populations: indices into `points`, each with the
    /// simulation's estimate when asked for.
    pub shown: Vec<(usize, Option<Estimate>)>,
}

/// MVA at one hit ratio for the population of the sweep over the hit
/// ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct AtHit {
    pub hit: f64,
    pub point: MvaPoint,
    /// Index of the bottleneck station (0 CPU, 1 memory, 2 disk, 3 network).
    pub bottleneck: usize,
}

/// Both sweeps.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    pub curves: Vec<Curve>,
    /// On a grid of hit ratios (every 0.05, the region near 1 finer, and
    /// the curves' hit ratios), ascending.
    pub by_hit: Vec<AtHit>,
}

/// Names of the TransCom network's stations, by index.
pub const STATIONS: [&str; 4] = ["CPU", "memory", "disk", "network"];

/// Sweep the TransCom network of demands `d`.
pub fn sweep(d: &Demands, o: &SweepOptions) -> Result<Sweep, MvaError> {
    d.network(0.5).validate()?;
    let curves = o
        .hits
        .iter()
        .map(|&h| {
            let net = d.network(h);
            let points = mva::solve(&net, o.max_clients);
            let shown = points
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    p.clients <= 5 || p.clients % o.step == 0 || p.clients == o.max_clients
                })
                .map(|(i, p)| {
                    let sim = o.simulate.then(|| {
                        qnsim::estimate(&net, p.clients, 0.01, 2_000_000, p.clients as u64)
                    });
                    (i, sim)
                })
                .collect();
            Curve {
                hit: h,
                points,
                shown,
            }
        })
        .collect();
    let mut grid: Vec<f64> = (0..=20).map(|i| i as f64 * 0.05).collect();
    grid.extend([0.97, 0.975, 0.98, 0.99, 0.995]);
    grid.extend(o.hits.iter().copied());
    grid.sort_by(|x, y| x.total_cmp(y));
    grid.dedup_by(|x, y| (*x - *y).abs() < 1e-12);
    let by_hit = grid
        .iter()
        .map(|&h| {
            let net = d.network(h);
            AtHit {
                hit: h,
                point: mva::solve(&net, o.clients).pop().expect("n ≥ 1"),
                bottleneck: net.bottleneck(),
            }
        })
        .collect();
    Ok(Sweep { curves, by_hit })
}
