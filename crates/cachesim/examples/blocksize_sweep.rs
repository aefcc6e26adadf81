//! Where Machine Bank's block-size optimum lies as the sequential runs of a
//! trace get shorter or longer, FixDelay 8 ms, Bandwidth 6 MB/s.
//!
//! - `boot` (default): the boot generator of `roamdisk trace synth boot`
//!   (crates/trace) with its sequential-read share varied (default
//!   0.75), one client (Machine Bank's traces are of a single VM).
//! - `vpc`: the Virtual PC generators of `roamdisk trace synth vpc-boot`
//!   and `vpc-office` (defaults 0.65 and 0.40) at their default length,
//!   summed over 20 independent VMs (each with its own cache) so that the
//!   ratios are not the noise of one short trace.
//!
//! ```text
//! cargo run --release -p roamdisk-cachesim --example blocksize_sweep [boot|vpc]
//! ```

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use roamdisk_cachesim::blocksize::{BlockSizeConfig, BlockSizeModel, BlockSizeReport};
use roamdisk_cachesim::sim::Request;
use roamdisk_trace::format::Record;
use roamdisk_trace::synth::boot::{BootParams, Generator};
use roamdisk_trace::synth::vpc::{self, VpcParams};

/// Feeds `records` to the model; returns its report and the mean number
/// of reads per sequential run (per client).
fn model(records: impl Iterator<Item = Record>) -> (BlockSizeReport, f64) {
    let mut m = BlockSizeModel::new(BlockSizeConfig::default());
    let mut reads = 0u64;
    let mut runs = 0u64;
    let mut last_end = std::collections::HashMap::new();
    for rec in records {
        if let Some(r) = Request::from_record(&rec) {
            if !r.write {
                reads += 1;
                let end = r.offset + r.len as u64;
                if last_end.insert(r.client, end) != Some(r.offset) {
                    runs += 1;
                }
            }
            m.feed(&r);
        }
    }
    (m.finish(), reads as f64 / runs.max(1) as f64)
}

fn n(rep: &BlockSizeReport, bs: u64) -> f64 {
    rep.points
        .iter()
        .find(|x| x.block_size == bs)
        .map(|x| x.accessed_blocks as f64)
        .unwrap_or(f64::NAN)
}

fn t(rep: &BlockSizeReport, bs: u64) -> f64 {
    rep.points
        .iter()
        .find(|x| x.block_size == bs)
        .map(|x| x.total_s)
        .unwrap_or(f64::NAN)
}

fn boot() {
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
        let (rep, run) = model(Generator::new(&p, 1));
        println!(
            "{:>10.2} {:>10.1} {:>8}K {:>10.2} {:>10.2} {:>10.1} {:>10.1}",
            share,
            run,
            rep.optimum().block_size / 1024,
            n(&rep, 32768) / n(&rep, 65536),
            n(&rep, 65536) / n(&rep, 131072),
            t(&rep, 65536),
            rep.optimum().total_s
        );
    }
    println!("(64 KiB is optimal when N32/N64 > 1.41 and N64/N128 < 1.58)");
}

fn vpc() {
    const VMS: u32 = 20;
    println!(
        "{:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>11} {:>11} {:>11}",
        "trace",
        "seq share",
        "mean run",
        "optimum",
        "N32/N64",
        "N64/N128",
        "T(32K) s/VM",
        "T(64K) s/VM",
        "T(128K) s/VM"
    );
    for (name, base) in [
        ("vpc-boot", VpcParams::boot()),
        ("vpc-office", VpcParams::office()),
    ] {
        for share in [0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9] {
            let p = VpcParams {
                sequential_share: share,
                ..base.clone()
            };
            let records = (0..VMS).flat_map(|c| vpc::Generator::new(&p, 1000 + c as u64, c));
            let (rep, run) = model(records);
            let mark = if share == base.sequential_share {
                "  <- default"
            } else {
                ""
            };
            println!(
                "{:>10} {:>10.2} {:>10.2} {:>8}K {:>9.2} {:>9.2} {:>11.2} {:>11.2} {:>11.2}{mark}",
                name,
                share,
                run,
                rep.optimum().block_size / 1024,
                n(&rep, 32768) / n(&rep, 65536),
                n(&rep, 65536) / n(&rep, 131072),
                t(&rep, 32768) / VMS as f64,
                t(&rep, 65536) / VMS as f64,
                t(&rep, 131072) / VMS as f64,
            );
        }
    }
    println!(
        "(mean run in reads; {VMS} VMs of the default length each; \
         64 KiB is optimal when N32/N64 > 1.41 and N64/N128 < 1.58)"
    );
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        None | Some("boot") => boot(),
        Some("vpc") => vpc(),
        Some(other) => {
            eprintln!("blocksize_sweep: unknown trace family '{other}' (boot or vpc)");
            std::process::exit(2);
        }
    }
}
