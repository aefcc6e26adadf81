//! Exact MVA agrees within 2% with a discrete-event simulation of the
//! same closed network, for every population N = 1..100, in the regimes of
//! TransCom's server with Table 1's 4 KB demands: disk-bound (hit ratio
//! 0.5: half the requests go to memory, half to the disk) and
//! network-bound (hit ratio 1).
//!
//! Near the knee of the throughput curve the simulation's estimates are
//! strongly autocorrelated, so each population runs in batches until the
//! batch-means 99% confidence interval of both throughput and response
//! time is within ±1% (or 1.5 million completions): the 2% bound is then
//! more than five standard errors away, so it tests MVA, not sampling
//! noise. (The crossover regime, where disk and network are equally
//! loaded, needs ten times more simulation; bench/cachesim-mva.sh runs it
//! in release mode.)

use roamdisk_cachesim::mva::{self, Demands};
use roamdisk_cachesim::qnsim::estimate;

fn check(d: &Demands, hit: f64, seed: u64) {
    let net = d.network(hit);
    let exact = mva::solve(&net, 100);
    let mut worst = (0.0f64, 0usize);
    let mut work = 0u64;
    for p in &exact {
        let e = estimate(&net, p.clients, 0.01, 1_500_000, seed + p.clients as u64);
        let (x, r, util, completions) = (e.throughput, e.response, e.utilization, e.completions);
        work += completions;
        let ex = (x - p.throughput).abs() / p.throughput;
        let er = (r - p.response).abs() / p.response;
        assert!(
            ex < 0.02 && er < 0.02,
            "hit {hit}, N = {}: MVA X = {:.1}/s R = {:.4} ms, simulated X = {x:.1}/s R = {:.4} ms ({completions} completions)",
            p.clients,
            p.throughput,
            p.response * 1e3,
            r * 1e3
        );
        for (k, (u_sim, u_mva)) in util.iter().zip(&p.utilization).enumerate() {
            assert!(
                (u_sim - u_mva).abs() < 0.02,
                "hit {hit}, N = {}, station {k}: utilisation {u_sim:.3} vs {u_mva:.3}",
                p.clients
            );
        }
        if ex.max(er) > worst.0 {
            worst = (ex.max(er), p.clients);
        }
    }
    eprintln!(
        "hit {hit:.4}: worst relative difference {:.3}% at N = {} ({work} simulated requests)",
        worst.0 * 100.0,
        worst.1
    );
}

#[test]
fn disk_bound_table1_4k() {
    check(&Demands::table1_4k(), 0.5, 1000);
}

#[test]
fn network_bound_table1_4k() {
    check(&Demands::table1_4k(), 1.0, 2000);
}
