//! The cost the `trace:` recorder adds to a request: N small writes through
//! `trace:FILE:NEXT` and straight to NEXT, where NEXT does nothing, so the
//! difference is the recorder alone. Reports the fastest of several runs
//! (the least disturbed by other load) in nanoseconds per request. The
//! "in a client context" rows run every write inside
//! `context::with_context`, as the NBD server does: what a stack without a
//! recorder pays for client ids, and the recorder reading them.
//!
//! Run: cargo run --release -p roamdisk-workload --example recorder_cost -- [N]

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::context::{with_context, IoContext};
use roamdisk_blockdev::{BlockDev, Result, WriteFlags};
use roamdisk_trace::recorder::{RecorderOptions, TraceDev};

/// A device that accepts everything and does nothing.
struct Null;

impl BlockDev for Null {
    roamdisk_blockdev::layer!("null");
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

fn run(dev: &dyn BlockDev, n: u64, buf: &[u8], ctx: bool) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        // Mostly sequential with a jump every 16 requests, like a guest.
        let off = if i % 16 == 0 {
            (i * 7919 % 100_000) << 12
        } else {
            i << 12
        };
        let write = || dev.write_at(buf, off, WriteFlags::default());
        if ctx {
            with_context(IoContext::for_client(i as u32 & 3), write)
        } else {
            write()
        }
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
    let mut best = [f64::MAX; 5];
    for _ in 0..5 {
        best[0] = best[0].min(run(&Null, n, &buf, false));
        best[3] = best[3].min(run(&Null, n, &buf, true));
        // With data, every byte goes to the payload file: fewer requests.
        for (k, data, m, ctx) in [
            (1, false, n, false),
            (2, true, n / 16, false),
            (4, false, n, true),
        ] {
            let t = TraceDev::create(
                &dir.path().join("t.rdtrace"),
                Arc::new(Null),
                RecorderOptions {
                    data,
                    ..RecorderOptions::default()
                },
            )?;
            best[k] = best[k].min(run(&t, m, &buf, ctx));
        }
    }
    println!(
        "{n} writes of 4 KiB ({} with data=on), fastest of 5 runs, ns per request:",
        n / 16
    );
    let rows = [
        ("no recorder", best[0], None),
        ("trace:FILE:", best[1], Some(best[0])),
        ("trace[data=on]:FILE:", best[2], Some(best[0])),
        ("no recorder, in a client context", best[3], Some(best[0])),
        ("trace:FILE:, in a client context", best[4], Some(best[3])),
    ];
    for (label, ns, base) in rows {
        match base {
            Some(b) => println!("  {label:<34} {ns:>8.1}  (+{:.1})", ns - b),
            None => println!("  {label:<34} {ns:>8.1}"),
        }
    }
    println!("  (+: over \"no recorder\"; the last row over the row above it)");
    Ok(())
}
