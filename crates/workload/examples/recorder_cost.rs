//! The cost the `trace:` recorder adds to a request: N small writes through
//! `trace:FILE:NEXT` and straight to NEXT, where NEXT does nothing, so the
//! difference is the recorder alone. Reports the fastest of several runs
//! (the least disturbed by other load) in nanoseconds per request.
//!
//! Run: cargo run --release -p roamdisk-workload --example recorder_cost -- [N]

use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::{BlockDev, Result, WriteFlags};
use roamdisk_workload::recorder::{RecorderOptions, TraceDev};

/// A device that accepts everything and does nothing.
struct Null;

impl BlockDev for Null {
    fn layer(&self) -> &'static str {
        "null"
    }
    fn size(&self) -> u64 {
        1 << 40
    }
    fn read_at(&self, _buf: &mut [u8], _off: u64) -> Result<()> {
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _off: u64, _flags: WriteFlags) -> Result<()> {
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

fn run(dev: &dyn BlockDev, n: u64, buf: &[u8]) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        // Mostly sequential with a jump every 16 requests, like a guest.
        let off = if i % 16 == 0 {
            (i * 7919 % 100_000) << 12
        } else {
            i << 12
        };
        dev.write_at(buf, off, WriteFlags::default())
            .expect("null write");
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2_000_000);
    let dir = tempfile::tempdir()?;
    let buf = vec![0u8; 4096];
    let mut best = [f64::MAX; 3];
    for _ in 0..5 {
        best[0] = best[0].min(run(&Null, n, &buf));
        // With data, every byte goes to the payload file: fewer requests.
        for (k, data, m) in [(1, false, n), (2, true, n / 16)] {
            let t = TraceDev::create(
                &dir.path().join("t.rdtrace"),
                Arc::new(Null),
                RecorderOptions {
                    data,
                    ..RecorderOptions::default()
                },
            )?;
            best[k] = best[k].min(run(&t, m, &buf));
        }
    }
    println!(
        "{n} writes of 4 KiB ({} with data=on), fastest of 5 runs, ns per request:",
        n / 16
    );
    println!("  no recorder            {:>8.1}", best[0]);
    println!(
        "  trace:FILE:            {:>8.1}  (+{:.1})",
        best[1],
        best[1] - best[0]
    );
    println!(
        "  trace[data=on]:FILE:   {:>8.1}  (+{:.1})",
        best[2],
        best[2] - best[0]
    );
    Ok(())
}
