//! Where Machine Bank's block-size optimum lies as the sequential runs of a
//! boot trace get shorter or longer: the boot generator of
//! `roamdisk trace synth boot` (crates/workload) with its sequential-read
//! share varied (default 0.75), one client (Machine Bank's traces are of a
//! single VM), FixDelay 8 ms, Bandwidth 6 MB/s.
//!
//! ```text
//! cargo run --release -p roamdisk-cachesim --example blocksize_sweep
//! ```

use roamdisk_cachesim::blocksize::{BlockSizeConfig, BlockSizeModel};
use roamdisk_cachesim::sim::Request;
use roamdisk_workload::synth::boot::{BootParams, Generator};

fn main() {
    println!(
        "{:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "seq share", "mean run", "optimum", "N32/N64", "N64/N128", "T(64K) s", "T(opt) s"
    );
    for share in [0.3, 0.45, 0.6, 0.7, 0.75, 0.8] {
        let p = BootParams {
            clients: 1,
            requests: 40_000,
            sequential_share: share,
            ..BootParams::default()
        };
        let mut m = BlockSizeModel::new(BlockSizeConfig::default());
        let mut reads = 0u64;
        let mut runs = 0u64;
        let mut last_end = None;
        for rec in Generator::new(&p, 1) {
            if let Some(r) = Request::from_record(&rec) {
                if !r.write {
                    reads += 1;
                    if last_end != Some(r.offset) {
                        runs += 1;
                    }
                    last_end = Some(r.offset + r.len as u64);
                }
                m.feed(&r);
            }
        }
        let rep = m.finish();
        let n = |bs: u64| {
            rep.points
                .iter()
                .find(|x| x.block_size == bs)
                .map(|x| x.accessed_blocks as f64)
                .unwrap_or(f64::NAN)
        };
        let t64 = rep
            .points
            .iter()
            .find(|x| x.block_size == 65536)
            .map(|x| x.total_s)
            .unwrap_or(f64::NAN);
        println!(
            "{:>10.2} {:>10.1} {:>8}K {:>10.2} {:>10.2} {:>10.1} {:>10.1}",
            share,
            reads as f64 / runs.max(1) as f64,
            rep.optimum().block_size / 1024,
            n(32768) / n(65536),
            n(65536) / n(131072),
            t64,
            rep.optimum().total_s
        );
    }
    println!("(64 KiB is optimal when N32/N64 > 1.41 and N64/N128 < 1.58)");
}
