//! TransCom's closed queueing network and its exact mean value analysis
//! (seed sections 3-4, Table 1, Figures 3 and 5-7).
//!
//! N clients each cycle between thinking at their workstation (a delay
//! centre: the seed's "Client-Delay", client CPU plus NIU per request) and
//! one request at the server, which visits the CPU, the storage subsystem
//! and the network interface (single-server FCFS centres). The storage
//! subsystem is a memory cache in front of a disk: a request hits memory
//! with probability h (the server cache's hit ratio) and otherwise goes to
//! the disk, so its demand is h·S_mem + (1 − h)·S_disk — modelled as two
//! centres visited with probabilities h and 1 − h, which keeps the network
//! product-form (the seed draws the subsystem as a flow-equivalent
//! server; for MVA the two views have the same demands).
//!
//! Exact MVA (Reiser & Lavenberg 1980) for n = 1..N:
//! R_k(n) = D_k·(1 + Q_k(n − 1)) at each queueing centre,
//! X(n) = n / (Z + Σ R_k(n)), Q_k(n) = X(n)·R_k(n), U_k = X·D_k.
//! The bottleneck is the centre of largest demand: throughput is bounded
//! by 1 / D_max, reached beyond N* = (Z + Σ D_k) / D_max clients.

/// A single-server FCFS service centre.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Station {
    pub name: String,
    /// Mean service time per visit, seconds.
    pub service: f64,
}

/// One step of a request's route: one of `choices` (station, probability)
/// is visited; probabilities summing below 1 leave a chance of skipping.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Stage {
    pub choices: Vec<(usize, f64)>,
}

/// A closed network: N customers alternate between a delay centre (think
/// time `think`) and a route through the stations.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Network {
    pub stations: Vec<Station>,
    pub route: Vec<Stage>,
    /// Mean think time at the delay centre, seconds.
    pub think: f64,
}

impl Network {
    /// Service demand per request at each station: Σ visits × service.
    pub fn demands(&self) -> Vec<f64> {
        let mut d = vec![0.0; self.stations.len()];
        for st in &self.route {
            for &(k, p) in &st.choices {
                d[k] += p * self.stations[k].service;
            }
        }
        d
    }

    /// Index of the station with the largest demand.
    pub fn bottleneck(&self) -> usize {
        let d = self.demands();
        (0..d.len())
            .max_by(|&a, &b| d[a].total_cmp(&d[b]))
            .unwrap_or(0)
    }

    /// N* = (Z + ΣD) / D_max: the population beyond which the bottleneck
    /// saturates.
    pub fn saturation_population(&self) -> f64 {
        let d = self.demands();
        let dmax = d.iter().copied().fold(0.0, f64::max);
        (self.think + d.iter().sum::<f64>()) / dmax
    }

    /// Whether MVA can solve the network: non-negative times, route
    /// probabilities in [0, 1] over existing stations, some demand.
    pub fn validate(&self) -> Result<(), MvaError> {
        for s in &self.stations {
            if !(s.service.is_finite() && s.service >= 0.0) {
                return Err(MvaError::Service(s.name.clone()));
            }
        }
        if !(self.think.is_finite() && self.think >= 0.0) {
            return Err(MvaError::Think);
        }
        for st in &self.route {
            let sum: f64 = st.choices.iter().map(|c| c.1).sum();
            if st.choices.iter().any(|c| !(0.0..=1.0).contains(&c.1)) || sum > 1.0 + 1e-12 {
                return Err(MvaError::Probabilities);
            }
            if st.choices.iter().any(|c| c.0 >= self.stations.len()) {
                return Err(MvaError::NoStation);
            }
        }
        if self.demands().iter().all(|&d| d == 0.0) && self.think == 0.0 {
            return Err(MvaError::AllZero);
        }
        Ok(())
    }
}

/// Why MVA cannot solve a network.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MvaError {
    /// A station's service time is negative or not a number.
    #[error("{0}: service time must be ≥ 0")]
    Service(String),
    /// The think time is negative or not a number.
    #[error("think time must be ≥ 0")]
    Think,
    /// A stage's probabilities are out of range or sum above 1.
    #[error("route probabilities must lie in [0, 1] and sum to at most 1")]
    Probabilities,
    /// A stage visits a station index that does not exist.
    #[error("route names a station that does not exist")]
    NoStation,
    /// Nothing takes time: MVA's throughput would be infinite.
    #[error("every demand and the think time are zero")]
    AllZero,
}

/// MVA's answer for one population.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MvaPoint {
    pub clients: usize,
    /// Requests per second.
    pub throughput: f64,
    /// Seconds a request spends at the server (excluding think time).
    pub response: f64,
    /// Per station: residence time per request, mean queue length,
    /// utilisation.
    pub residence: Vec<f64>,
    pub queue: Vec<f64>,
    pub utilization: Vec<f64>,
}

/// Exact MVA for populations 1..=n_max.
pub fn solve(net: &Network, n_max: usize) -> Vec<MvaPoint> {
    let d = net.demands();
    let mut q = vec![0.0f64; d.len()];
    let mut out = Vec::with_capacity(n_max);
    for n in 1..=n_max {
        let r: Vec<f64> = d.iter().zip(&q).map(|(dk, qk)| dk * (1.0 + qk)).collect();
        let rsum: f64 = r.iter().sum();
        let x = n as f64 / (net.think + rsum);
        q = r.iter().map(|rk| x * rk).collect();
        out.push(MvaPoint {
            clients: n,
            throughput: x,
            response: rsum,
            residence: r,
            queue: q.clone(),
            utilization: d.iter().map(|dk| x * dk).collect(),
        });
    }
    out
}

/// The seed's Table 1: service demands to transfer one request.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Demands {
    /// Request size the demands were measured for, bytes.
    pub request_size: u64,
    /// Server CPU, seconds.
    pub cpu: f64,
    /// Disk, seconds (one seek per two accesses, as measured).
    pub disk: f64,
    /// Server network interface (NIU), seconds.
    pub network: f64,
    /// Client-Delay (client CPU + NIU): the think time, seconds.
    pub client_delay: f64,
    /// Memory cache hit service, seconds. Table 1 gives none; our default
    /// is the time to copy the request at 10 GB/s (0.41 µs for 4 KiB).
    pub memory: f64,
}

impl Demands {
    /// Table 1, 4 KB column.
    pub fn table1_4k() -> Demands {
        Demands {
            request_size: 4096,
            cpu: 0.10e-3,
            disk: 6.76e-3,
            network: 0.17e-3,
            client_delay: 0.32e-3,
            memory: 4096.0 / 10e9,
        }
    }

    /// Table 1, 32 KB column.
    pub fn table1_32k() -> Demands {
        Demands {
            request_size: 32768,
            cpu: 0.23e-3,
            disk: 7.20e-3,
            network: 0.50e-3,
            client_delay: 2.56e-3,
            memory: 32768.0 / 10e9,
        }
    }

    /// The TransCom network at server hit ratio `hit` (0..=1). Stations:
    /// 0 CPU, 1 memory, 2 disk, 3 network.
    pub fn network(&self, hit: f64) -> Network {
        Network {
            stations: vec![
                Station {
                    name: "CPU".into(),
                    service: self.cpu,
                },
                Station {
                    name: "memory".into(),
                    service: self.memory,
                },
                Station {
                    name: "disk".into(),
                    service: self.disk,
                },
                Station {
                    name: "network".into(),
                    service: self.network,
                },
            ],
            route: vec![
                Stage {
                    choices: vec![(0, 1.0)],
                },
                Stage {
                    choices: vec![(1, hit), (2, 1.0 - hit)],
                },
                Stage {
                    choices: vec![(3, 1.0)],
                },
            ],
            think: self.client_delay,
        }
    }

    /// The hit ratio above which the disk stops being the bottleneck.
    pub fn disk_bottleneck_until(&self) -> f64 {
        let other = self.cpu.max(self.network);
        // (1 − h)·disk + h·memory = other
        ((self.disk - other) / (self.disk - self.memory)).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_station_is_machine_repairman() {
        // One station, demand 1, think 0: X(n) = 1 for all n ≥ 1, R = n.
        let net = Network {
            stations: vec![Station {
                name: "s".into(),
                service: 1.0,
            }],
            route: vec![Stage {
                choices: vec![(0, 1.0)],
            }],
            think: 0.0,
        };
        for p in solve(&net, 5) {
            assert!((p.throughput - 1.0).abs() < 1e-12);
            assert!((p.response - p.clients as f64).abs() < 1e-12);
        }
    }

    #[test]
    fn textbook_two_station_example() {
        // Worked by hand: D = (0.4 s, 0.2 s), Z = 1 s, N = 1..3.
        let net = Network {
            stations: vec![
                Station {
                    name: "a".into(),
                    service: 0.4,
                },
                Station {
                    name: "b".into(),
                    service: 0.2,
                },
            ],
            route: vec![
                Stage {
                    choices: vec![(0, 1.0)],
                },
                Stage {
                    choices: vec![(1, 1.0)],
                },
            ],
            think: 1.0,
        };
        let p = solve(&net, 3);
        // n=1: R = 0.6, X = 1/1.6 = 0.625, Q = (0.25, 0.125).
        assert!((p[0].throughput - 0.625).abs() < 1e-12);
        // n=2: R_a = 0.4·1.25 = 0.5, R_b = 0.2·1.125 = 0.225,
        // X = 2/1.725, Q_a = X·0.5.
        let x2 = 2.0 / 1.725;
        assert!((p[1].throughput - x2).abs() < 1e-12);
        assert!((p[1].queue[0] - x2 * 0.5).abs() < 1e-12);
        // n=3: R_a = 0.4·(1 + Q_a(2)).
        let ra = 0.4 * (1.0 + x2 * 0.5);
        let rb = 0.2 * (1.0 + x2 * 0.225);
        assert!((p[2].throughput - 3.0 / (1.0 + ra + rb)).abs() < 1e-12);
        // Utilisation law and the asymptotic bound.
        let big = solve(&net, 200);
        let last = big.last().unwrap();
        assert!((last.utilization[0] - last.throughput * 0.4).abs() < 1e-12);
        assert!(last.throughput <= 1.0 / 0.4 + 1e-12 && last.throughput > 2.49);
        assert_eq!(net.bottleneck(), 0);
    }

    #[test]
    fn transcom_bottleneck_moves_from_disk_to_network() {
        let d = Demands::table1_4k();
        assert_eq!(d.network(0.5).bottleneck(), 2, "disk at h = 0.5");
        assert_eq!(d.network(1.0).bottleneck(), 3, "network at h = 1");
        let h = d.disk_bottleneck_until();
        assert!((0.97..0.98).contains(&h), "{h}");
        assert_eq!(d.network(h - 0.001).bottleneck(), 2);
        assert_eq!(d.network(h + 0.001).bottleneck(), 3);
    }
}
