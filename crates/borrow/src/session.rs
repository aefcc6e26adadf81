//! `roamdisk borrow run`: the TransPart session (seed sections 3.3, 4.3).
//!
//! Start-up: scan the host and allocate a borrowed disk as large as the VM
//! state ("TP Allocate"), then copy the state in whole ("VM State Copy"),
//! or let it be fetched on demand. Shut-down: copy the units the guest
//! modified back to the portable medium ("VM State Save"), then release
//! the borrowed blocks (optionally zero-scrubbing them). The caller serves
//! [`Session::export`] in between, or hands [`run`] how to serve.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::copy::copy_sparse_to;
use roamdisk_blockdev::{Access, BlockDev, Checked, CopyOptions, Result, WriteFlags, Zeroes};
use serde::Serialize;

use crate::dev::{BorrowDev, BorrowOptions};
use crate::ondemand::FetchDev;
use crate::plan::Plan;
use crate::scan::{scan, ScanOptions};
use crate::Progress;

/// How the VM state reaches the borrowed disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyIn {
    /// All of it before serving (the seed's prefetch).
    Whole,
    /// Each 4 KiB unit when the guest first touches it (demand fetch).
    OnDemand,
}

/// What a session does.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub hosts: Vec<PathBuf>,
    pub scan: ScanOptions,
    pub borrow: BorrowOptions,
    pub copy_in: CopyIn,
    /// Also write the plan here.
    pub plan_out: Option<PathBuf>,
}

/// Seconds and bytes of each phase (the seed's Figures 9 and 10).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Free-block discovery.
    pub scan_s: f64,
    /// Opening the host read-write, re-checking it, building the disk.
    pub allocate_s: f64,
    pub copy_in_s: f64,
    pub copy_in_bytes: u64,
    /// Time the disk was served (set by the caller).
    pub serve_s: f64,
    pub copy_back_s: f64,
    pub copy_back_bytes: u64,
    /// Flush, and zero-scrub if asked.
    pub release_s: f64,
    pub scrubbed_bytes: u64,
    /// Units fetched on demand during the session.
    pub fetched_bytes: u64,
    pub disk_bytes: u64,
    pub plan_bytes: u64,
    pub plan_extents: u64,
}

/// A running session.
pub struct Session {
    pub plan: Plan,
    pub timings: Timings,
    borrow: Arc<BorrowDev>,
    fetch: Option<Arc<FetchDev>>,
    state: Arc<dyn BlockDev>,
    scrub: bool,
}

/// Bytes copied per step.
const STEP: u64 = 4 << 20;

impl Session {
    /// Scan, allocate and copy in. `state` is the VM disk on the portable
    /// medium, opened writable.
    pub fn start(
        opts: &SessionOptions,
        state: Arc<dyn BlockDev>,
        progress: &dyn Progress,
    ) -> Result<Session> {
        let size = state.size();
        let mut t = Timings {
            disk_bytes: size,
            ..Timings::default()
        };
        let t0 = Instant::now();
        let scan_opts = ScanOptions {
            min_size: size,
            size_limit: size,
            ..opts.scan.clone()
        };
        let plan = scan(&opts.hosts, &scan_opts, progress)?;
        if let Some(p) = &opts.plan_out {
            plan.save(p)?;
        }
        t.scan_s = t0.elapsed().as_secs_f64();
        t.plan_bytes = plan.total_bytes;
        t.plan_extents = plan.extents.len() as u64;
        let t1 = Instant::now();
        let borrow = Arc::new(BorrowDev::open(
            &plan,
            &BorrowOptions {
                size: Some(size),
                ..opts.borrow.clone()
            },
        )?);
        t.allocate_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let fetch = match opts.copy_in {
            CopyIn::Whole => {
                t.copy_in_bytes = copy_in(&*state, &borrow, progress)?;
                None
            }
            CopyIn::OnDemand => Some(Arc::new(FetchDev::new(borrow.clone(), state.clone()))),
        };
        t.copy_in_s = t2.elapsed().as_secs_f64();
        Ok(Session {
            plan,
            timings: t,
            scrub: opts.borrow.scrub,
            borrow,
            fetch,
            state,
        })
    }

    /// The device to serve to the VM.
    pub fn export(&self) -> Arc<dyn BlockDev> {
        match &self.fetch {
            Some(f) => f.clone(),
            None => self.borrow.clone(),
        }
    }

    /// Copy modified units back, then release the borrowed blocks.
    pub fn finish(mut self, progress: &dyn Progress) -> Result<Timings> {
        let t0 = Instant::now();
        let ranges = self.borrow.dirty_ranges();
        let total: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        progress.phase("copying back", total);
        let mut buf = Vec::new();
        let mut done = 0;
        for (a, b) in ranges {
            let mut pos = a;
            while pos < b {
                let n = (b - pos).min(STEP);
                buf.resize(n as usize, 0);
                self.borrow.read_at(&mut buf, pos)?;
                self.state.write_at(&buf, pos, WriteFlags::default())?;
                pos += n;
                done += n;
                progress.set(done);
            }
        }
        self.state.flush()?;
        progress.end();
        self.timings.copy_back_s = t0.elapsed().as_secs_f64();
        self.timings.copy_back_bytes = total;
        self.timings.fetched_bytes = self.fetch.as_ref().map_or(0, |f| f.fetched_bytes());
        let t1 = Instant::now();
        self.timings.scrubbed_bytes = self.borrow.release(self.scrub, progress)?;
        self.timings.release_s = t1.elapsed().as_secs_f64();
        Ok(self.timings)
    }
}

/// A whole session: [`Session::start`], then `serve` the disk (behind a
/// [`Checked`] layer) until it returns, then [`Session::finish`].
/// `started` sees the session once its disk is ready, before serving.
/// Returns the timings, the serving time among them, and what `serve`
/// returned; when `serve` fails, nothing is copied back or released.
pub fn run<T, E: From<roamdisk_blockdev::Error>>(
    opts: &SessionOptions,
    state: Arc<dyn BlockDev>,
    progress: &dyn Progress,
    started: impl FnOnce(&Session),
    serve: impl FnOnce(Arc<dyn BlockDev>) -> std::result::Result<T, E>,
) -> std::result::Result<(Timings, T), E> {
    let sess = Session::start(opts, state, progress)?;
    started(&sess);
    let dev: Arc<dyn BlockDev> = Arc::new(Checked::new(sess.export(), Access::ReadWrite));
    let t0 = Instant::now();
    let served = serve(dev)?;
    let serve_s = t0.elapsed().as_secs_f64();
    let mut t = sess.finish(progress)?;
    t.serve_s = serve_s;
    Ok((t, served))
}

/// Zero runs at least this long are not written.
const ZERO_GRAIN: usize = 64 << 10;

/// Copy the allocated parts of `state` into `borrow` (holes and zero
/// blocks are skipped: unwritten units read as zeroes).
fn copy_in(state: &dyn BlockDev, borrow: &BorrowDev, progress: &dyn Progress) -> Result<u64> {
    let opts = CopyOptions {
        zeroes: Zeroes::Skip,
        zero_grain: ZERO_GRAIN,
        what: "copying in",
    };
    copy_sparse_to(
        state,
        &mut |buf, off| borrow.write_unmarked(buf, off),
        &mut |_, _| Ok(()),
        &opts,
        progress,
    )
}
