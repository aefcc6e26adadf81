//! The generic layers and their registry entries.

pub mod cow;
pub mod hdd;
pub mod mem;
pub mod raw;
pub mod report;
pub mod throttle;

use std::sync::Arc;

use crate::dev::BlockDev;
use crate::error::{Error, ErrorKind, Op};
use crate::spec::{LayerKind, OpenCtx, Registry};

/// The layer kinds of this crate.
pub static BUILTIN: &[&LayerKind] = &[&RAW, &MEM, &COW, &THROTTLE, &HDD];

impl Registry {
    /// A registry with the generic layers of this crate ([`BUILTIN`]).
    pub fn with_builtin() -> Self {
        let mut r = Registry::default();
        for k in BUILTIN {
            r.add(k);
        }
        r
    }
}

/// `raw:PATH`.
pub static RAW: LayerKind = LayerKind {
    name: "raw",
    summary: "a plain file or block device, sparse aware (SEEK_DATA/SEEK_HOLE, punch-hole trim)",
    args: &["path"],
    options: &[],
    open: |ctx: &OpenCtx<'_>, _next| {
        let path = ctx.path("raw", "path")?;
        Ok(Arc::new(raw::RawDev::open(&path, ctx.read_only)?) as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};

/// `mem:SIZE`.
pub static MEM: LayerKind = LayerKind {
    name: "mem",
    summary: "a sparse RAM disk of SIZE bytes (volatile: lost when the server stops)",
    args: &["size"],
    options: &[],
    open: |ctx: &OpenCtx<'_>, _next| {
        let size = ctx.size_opt("mem", "size")?.unwrap_or(0);
        if size == 0 || size > mem::MAX_SIZE {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "mem",
                format!(
                    "size must be more than 0 and at most {} bytes (e.g. mem:1G)",
                    mem::MAX_SIZE
                ),
            ));
        }
        Ok(Arc::new(mem::MemDev::new(size)) as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};

/// `cow:OVERLAY:NEXT`.
pub static COW: LayerKind = LayerKind {
    name: "cow",
    summary: "copy-on-write over a read-only NEXT; writes go to the sparse file OVERLAY (+ OVERLAY.cowmap)",
    args: &["overlay"],
    options: &[("cluster", "copy-on-write granularity for a new overlay, 4K..4M (default 64K)")],
    inner_read_only: true,
    open: |ctx: &OpenCtx<'_>, next| {
        let overlay = ctx.path("cow", "overlay")?;
        let base = ctx.inner("cow", next)?;
        let cluster = ctx.size_opt("cow", "cluster")?.unwrap_or(cow::DEFAULT_CLUSTER as u64);
        let cluster_size = u32::try_from(cluster).map_err(|_| {
            Error::new(ErrorKind::InvalidArgument, Op::Open, "cow", "cluster size too large (at most 4M)")
        })?;
        let opts = cow::CowOptions { cluster_size };
        Ok(Arc::new(cow::CowDev::open(&overlay, base, ctx.read_only, &opts)?) as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};

/// `throttle[rate=R,latency=D,burst=B,link=NAME,report=FILE]:NEXT`.
pub static THROTTLE: LayerKind = LayerKind {
    name: "throttle",
    summary: "NEXT behind an emulated network link: a bandwidth limit (token bucket) and a latency per request",
    args: &[],
    options: &[
        ("rate", "bandwidth per direction: 1Mbit, 100kbit, or bytes per second such as 10M (default unlimited)"),
        ("latency", "added to every request: 8ms, 250us (default 0)"),
        ("burst", "bytes that may go at once after an idle period (default 64K)"),
        ("link", "a name: every throttle layer of the process with this name is one link, one rate per direction (default: a link of its own)"),
        ("report", "write the link's counters (requests, bytes, busy time per direction) as JSON to this file at each flush and at close"),
    ],
    open: |ctx: &OpenCtx<'_>, next| {
        let next = ctx.inner("throttle", next)?;
        let rate = ctx.rate_opt("throttle", "rate")?.unwrap_or(0);
        let latency = ctx.duration_opt("throttle", "latency")?.unwrap_or_default();
        let burst = ctx.size_opt("throttle", "burst")?.unwrap_or(64 << 10);
        let spec = crate::throttle::LinkSpec { rate, latency, burst };
        let link = match ctx.opt("link") {
            None => crate::throttle::Duplex::new(spec),
            Some(name) => crate::throttle::Duplex::named(link_name(name)?, spec)?,
        };
        let report = match ctx.opt("report") {
            Some("") => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    Op::Open,
                    "throttle",
                    "report: give a file name (report=link.json)",
                ))
            }
            r => r.map(std::path::PathBuf::from),
        };
        Ok(Arc::new(throttle::ThrottleDev::on(next, link, report)) as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};

/// A `link=` name: letters, digits, `-`, `_` and `.`, 1-64 of them.
fn link_name(name: &str) -> crate::error::Result<&str> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(name)
    } else {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            Op::Open,
            "throttle",
            format!(
                "link '{name}': a name is 1-64 letters, digits, '-', '_' or '.' (e.g. link=server)"
            ),
        ))
    }
}

/// `hdd[seek=T,rpm=R,rate=B,near=N,head=NAME,charge=all|writes,report=FILE]:NEXT`.
pub static HDD: LayerKind = LayerKind {
    name: "hdd",
    summary: "NEXT behind an emulated spinning disk: one head, requests served in arrival order, a seek + half a turn unless sequential",
    args: &[],
    options: &[
        ("seek", "average seek time (default 3.4ms, a 15,000 rpm drive)"),
        ("rpm", "spindle speed; half a revolution is added to every seek (default 15000)"),
        ("rate", "media transfer rate: 100M (bytes per second) or 800Mbit (default 100M)"),
        ("near", "a request this close after the previous one needs no seek (default 128K)"),
        ("head", "a name: every hdd layer of the process with this name is one disk, one queue (default: a disk of its own)"),
        ("charge", "all (default) or writes: reads pass without waiting for the disk"),
        ("report", "write the counters (requests, seeks, busy time) as JSON to this file at each flush and at close"),
    ],
    open: |ctx: &OpenCtx<'_>, next| {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "hdd", m);
        let next = ctx.inner("hdd", next)?;
        let d = hdd::HddSpec::FIFTEEN_K;
        let seek = ctx.duration_opt("hdd", "seek")?.unwrap_or(d.seek);
        let rpm = match ctx.opt("rpm") {
            None => d.rpm,
            Some(r) => r
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&r| r <= 100_000)
                .ok_or_else(|| bad(format!("rpm '{r}': expected a whole number up to 100000 (0: no rotation)")))?,
        };
        let rate = ctx.rate_opt("hdd", "rate")?.unwrap_or(d.rate);
        let near = ctx.size_opt("hdd", "near")?.unwrap_or(d.near);
        let report = ctx.opt("report").map(std::path::PathBuf::from);
        let spec = hdd::HddSpec { seek, rpm, rate, near };
        let charge_reads = match ctx.opt("charge").unwrap_or("all") {
            "all" => true,
            "writes" => false,
            c => return Err(bad(format!("charge '{c}': expected all or writes"))),
        };
        let disk = match ctx.opt("head") {
            Some(name) => hdd::Disk::named(name, spec)?,
            None => hdd::Disk::new(spec),
        };
        Ok(Arc::new(hdd::HddDev::on(next, disk, charge_reads, report)) as Arc<dyn BlockDev>)
    },
    ..LayerKind::WRAPPING
};
