//! The seed's LBS-versus-flat experiment (LBS section 5.2, Figure 12)
//! without an SD card: each Android workload of Table 3 is replayed, one
//! writable partition at a time (blksim), against a flat image and against
//! an LBS image, both on the `flashsim` model of a Class 6 card, and the
//! simulated card times are compared.
//!
//! The flat image is the card itself (straight-through mapping). The LBS
//! image keeps its data file on the card and its metadata log on internal
//! storage (uncharged), 1 KiB blocks, 256 KiB clusters and a 256 KiB write
//! buffer as in the seed, and enough spare space that garbage collection
//! does not run (the seed set aside 160 MB for that).
//!
//! Run: cargo run --release -p roamdisk-workload --example lbs_vs_flat -- [CARD] [SCALE]
//! (CARD: class6, class4 or class10; SCALE: repetitions of each trace, default 1).

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::progress::NoProgress;
use roamdisk_blockdev::BlockDev;
use roamdisk_lbs::create::{create, CreateOptions, Paths};
use roamdisk_lbs::storage::FileLog;
use roamdisk_lbs::{ChecksumKind, Lbs, LbsOptions};
use roamdisk_trace::format::{Format, Writer};
use roamdisk_trace::synth::{self, android, Kind, SynthOptions};
use roamdisk_workload::flashsim::{parse_params, FlashSimDev, FlashSimOptions};
use roamdisk_workload::replay::{self, Grouping, ReplayError, ReplayOptions, Targets};

/// Each device's target and the card under it.
struct Cards {
    devs: BTreeMap<u32, (Arc<dyn BlockDev>, Arc<FlashSimDev>)>,
}

impl Targets for Cards {
    fn connect(&self, _client: u32, device: u32) -> Result<Arc<dyn BlockDev>, ReplayError> {
        self.devs
            .get(&device)
            .map(|d| Arc::clone(&d.0))
            .ok_or_else(|| ReplayError::Invalid(format!("no target for device {device}")))
    }
    fn simulated_ns(&self) -> Option<u64> {
        Some(self.devs.values().map(|d| d.1.stats().elapsed_ns).sum())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let card = args.first().cloned().unwrap_or_else(|| "class6".into());
    let scale: f64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1.0);
    let params = parse_params(&card)?;
    let dir = tempfile::tempdir()?;
    let mut results: BTreeMap<(u32, &str), f64> = BTreeMap::new();
    println!("card {card}, scale {scale}; simulated card seconds per writable partition");
    println!(
        "{:<10} {:<8} {:>10} {:>10} {:>8}",
        "trace", "part", "flat s", "LBS s", "speedup"
    );
    for (i, t) in android::TRACES.iter().enumerate() {
        // Only the writable partitions (the squashfs ones are flat files
        // in both set-ups).
        let path = dir.path().join(format!("{}.rdtrace", t.name));
        let mut w = Writer::create(&path, Format::Binary)?;
        let gen = synth::generate(
            Kind::Android(i),
            &SynthOptions {
                scale,
                ..SynthOptions::default()
            },
        )?;
        for r in gen.filter(|r| r.device != 0 && r.device != 4) {
            w.write(&r)?;
        }
        w.finish()?;
        let opts = ReplayOptions {
            grouping: Grouping::Partition,
            one_at_a_time: true,
            ..ReplayOptions::default()
        };
        let loaded = replay::load(&path, &opts, &NoProgress)?;
        let devices: Vec<u32> = loaded.extent.keys().copied().collect();
        for flavour in ["flat", "lbs"] {
            let mut devs = BTreeMap::new();
            let mut images = Vec::new();
            for &d in &devices {
                let size = android::PARTITIONS[d as usize].1;
                let (dev, card): (Arc<dyn BlockDev>, Arc<FlashSimDev>) = if flavour == "flat" {
                    let card = Arc::new(FlashSimDev::new(
                        Arc::new(MemDev::new(size)),
                        params.clone(),
                        FlashSimOptions::default(),
                    )?);
                    (card.clone(), card)
                } else {
                    let paths =
                        Paths::resolve(&dir.path().join(format!("{}-{d}.lbsd", t.name)), None);
                    create(
                        &paths,
                        &CreateOptions {
                            size,
                            block_size: 1024,
                            overprovision_pct: 200,
                            checksum: ChecksumKind::Crc32c,
                            ..CreateOptions::default()
                        },
                    )?;
                    let raw: Arc<dyn BlockDev> = Arc::new(RawDev::open(&paths.data, false)?);
                    let card = Arc::new(FlashSimDev::new(
                        raw,
                        params.clone(),
                        FlashSimOptions::default(),
                    )?);
                    let log = FileLog::open(&paths.meta, true)?;
                    let lbs = Arc::new(Lbs::open(
                        card.clone(),
                        Box::new(log),
                        None,
                        LbsOptions {
                            background_gc: false,
                            ..LbsOptions::default()
                        },
                    )?);
                    images.push((lbs.clone(), paths));
                    (lbs as Arc<dyn BlockDev>, card)
                };
                devs.insert(d, (dev, card));
            }
            let cards = Cards { devs };
            let rep = replay::replay(&loaded, &cards, &opts, &NoProgress)?;
            if rep.errors > 0 {
                return Err(format!("{}: {:?}", t.name, rep.first_error).into());
            }
            // The final barrier (the seed's blksim ends with the device
            // flushed): LBS writes out what its buffer still holds.
            for (d, (dev, card)) in &cards.devs {
                dev.flush()?;
                results.insert((*d, flavour), card.stats().elapsed_ns as f64 / 1e9);
            }
            for (lbs, paths) in images {
                lbs.close()?;
                drop(lbs);
                let _ = std::fs::remove_file(&paths.data);
                let _ = std::fs::remove_file(&paths.meta);
            }
        }
        for &d in &devices {
            let (flat, lbs) = (results[&(d, "flat")], results[&(d, "lbs")]);
            println!(
                "{:<10} {:<8} {:>10.2} {:>10.2} {:>7.1}x",
                t.name,
                android::partition_name(d).unwrap_or("?"),
                flat,
                lbs,
                flat / lbs.max(1e-9)
            );
        }
    }
    Ok(())
}
