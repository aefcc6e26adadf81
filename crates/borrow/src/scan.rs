//! Free-block discovery and allocation (seed section 3.5.1,
//! `gather_free_space`): every partition of every host device is
//! identified and checked read-only; the free extents of the clean ones
//! are streamed through a size filter into a heap that keeps the largest
//! `max_extents`; the survivors are sorted by device, partition and offset
//! and become the plan.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{BlockDev, Error, ErrorKind, Op, Result};
use roamdisk_fsmeta as fsmeta;

use crate::plan::{Device, Histogram, Partition, Plan, PlanExtent, PlanOptions, Status, UNIT};
use crate::Progress;

/// What to borrow.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Ignore free extents shorter than this (after 4 KiB alignment).
    /// Seed default: 4 MiB.
    pub min_extent: u64,
    /// Keep at most this many extents, the largest. Seed default: 100,000.
    pub max_extents: u64,
    /// Fail unless at least this many bytes were found.
    pub min_size: u64,
    /// Use only this many bytes (0 = all): the largest extents first, the
    /// last one cut.
    pub size_limit: u64,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            min_extent: 4 << 20,
            max_extents: 100_000,
            min_size: 0,
            size_limit: 0,
        }
    }
}

/// A candidate extent: (length, device, partition, offset).
type Cand = (u64, u32, u32, u64);

/// Scan `paths` (disks or image files, opened read-only) and make a plan.
pub fn scan(paths: &[PathBuf], opts: &ScanOptions, progress: &dyn Progress) -> Result<Plan> {
    let mut devs: Vec<(PathBuf, RawDev)> = Vec::new();
    for p in paths {
        let abs = std::path::absolute(p).map_err(|e| Error::io(Op::Open, "borrow", e).path(p))?;
        let dev = RawDev::open(&abs, true)?;
        devs.push((abs, dev));
    }
    let refs: Vec<(&Path, &dyn BlockDev)> = devs
        .iter()
        .map(|(p, d)| (p.as_path(), d as &dyn BlockDev))
        .collect();
    scan_devices(&refs, opts, progress)
}

/// [`scan`] over already opened devices.
pub fn scan_devices(
    devs: &[(&Path, &dyn BlockDev)],
    opts: &ScanOptions,
    progress: &dyn Progress,
) -> Result<Plan> {
    if opts.max_extents == 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            Op::Open,
            "borrow",
            "--max-extents must be at least 1",
        ));
    }
    let min_extent = opts.min_extent.max(UNIT);
    let mut devices = Vec::new();
    let mut partitions = Vec::new();
    let mut free_hist = Histogram::default();
    let mut heap: BinaryHeap<Reverse<Cand>> = BinaryHeap::new();
    let total: u64 = devs.iter().map(|(_, d)| d.size()).sum();
    progress.phase("scanning", total);
    let mut base = 0u64;
    for (id, (path, dev)) in devs.iter().enumerate() {
        let id = id as u32;
        let table = fsmeta::read_table(*dev).map_err(|e| {
            Error::new(
                e.kind(),
                Op::Read,
                "borrow",
                format!("cannot read the partition table of {}: {e}", path.display()),
            )
        })?;
        devices.push(Device {
            id,
            path: path.to_path_buf(),
            size: dev.size(),
            scheme: table.scheme.as_str().to_string(),
            table_sha256: fsmeta::hex(&table.identity),
        });
        for p in &table.partitions {
            progress.set(base + p.start);
            let mut part = Partition::listed(id, p.number, p.start, p.len, p.type_name);
            let skip = |part: &mut Partition, e: &Error| {
                part.reason = Some(
                    match e.kind() {
                        ErrorKind::Corrupt => "corrupt",
                        ErrorKind::Unsupported => "unsupported",
                        _ => "io-error",
                    }
                    .into(),
                );
                part.detail = Some(e.to_string());
            };
            let probe = match fsmeta::probe(*dev, p.start, p.len) {
                Ok(pr) => pr,
                Err(e) => {
                    skip(&mut part, &e);
                    partitions.push(part);
                    continue;
                }
            };
            part.fs = probe.type_name.clone();
            part.uuid = probe.uuid.clone();
            part.label = probe.label.clone();
            part.identity_sha256 = fsmeta::hex(&probe.identity);
            if let fsmeta::Health::Unsafe { reason, detail } = &probe.health {
                part.reason = Some(reason.as_str().into());
                part.detail = Some(detail.clone());
                partitions.push(part);
                continue;
            }
            // Candidates go to the heap only when the whole partition
            // scanned without error.
            let mut cands: Vec<Cand> = Vec::new();
            let mut hist = Histogram::default();
            let mut n = 0u64;
            let res = fsmeta::for_each_free_extent(*dev, p.start, p.len, &mut |e| {
                n += 1;
                hist.add(e.len);
                let a = e.start.next_multiple_of(UNIT);
                let b = e.end() / UNIT * UNIT;
                if b > a && b - a >= min_extent {
                    cands.push((b - a, id, p.number, a));
                }
                if n.is_multiple_of(4096) {
                    progress.set(base + e.end());
                }
            });
            match res {
                Err(e) => skip(&mut part, &e),
                Ok((pr, free)) => {
                    if pr.identity != probe.identity || !pr.health.is_clean() {
                        // Changed under us between the two reads.
                        part.reason = Some("changed".into());
                        part.detail =
                            Some("the file system changed while it was being scanned".into());
                    } else {
                        part.status = Status::Used;
                        part.free_bytes = free;
                        part.free_extents = n;
                        free_hist.merge(&hist);
                        for c in cands {
                            if (heap.len() as u64) < opts.max_extents {
                                heap.push(Reverse(c));
                            } else if heap.peek().is_some_and(|m| m.0 .0 < c.0) {
                                heap.pop();
                                heap.push(Reverse(c));
                            }
                        }
                    }
                }
            }
            partitions.push(part);
        }
        base += dev.size();
    }
    progress.end();
    let mut chosen: Vec<Cand> = heap.into_iter().map(|r| r.0).collect();
    if opts.size_limit > 0 {
        // Largest first, until the limit; the last one is cut.
        chosen.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
        let limit = opts.size_limit.next_multiple_of(UNIT);
        let mut sum = 0;
        let mut keep = Vec::new();
        for mut c in chosen {
            if sum >= limit {
                break;
            }
            c.0 = c.0.min(limit - sum);
            sum += c.0;
            keep.push(c);
        }
        chosen = keep;
    }
    chosen.sort_unstable_by_key(|c| (c.1, c.2, c.3));
    let extents = chosen
        .into_iter()
        .map(|(len, device, partition, offset)| PlanExtent {
            device,
            partition,
            offset,
            len,
        })
        .collect();
    let plan = Plan::new(
        PlanOptions {
            min_extent,
            max_extents: opts.max_extents,
            size_limit: opts.size_limit,
        },
        devices,
        partitions,
        free_hist,
        extents,
    );
    plan.validate()?;
    if plan.total_bytes < opts.min_size {
        return Err(Error::new(
            ErrorKind::NoSpace,
            Op::Open,
            "borrow",
            format!(
                "found only {} in {} free extents of at least {} ({}); {} are needed: free space on the host, add devices or lower --min-extent",
                format_size(plan.total_bytes),
                plan.extents.len(),
                format_size(min_extent),
                where_found(&plan),
                format_size(opts.min_size)
            ),
        ));
    }
    Ok(plan)
}

/// "sda1 ext4: 1 GiB, sda2 ntfs: 12 MiB; skipped: sda3 (hibernated)".
pub fn where_found(plan: &Plan) -> String {
    let name = |p: &Partition| {
        let dev = plan.devices[p.device as usize].path.display().to_string();
        if p.number == 0 {
            dev
        } else {
            format!("{dev} #{}", p.number)
        }
    };
    let used: Vec<String> = plan
        .partitions
        .iter()
        .filter(|p| p.status == Status::Used)
        .map(|p| format!("{} {}: {}", name(p), p.fs, format_size(p.borrowed_bytes)))
        .collect();
    let skipped: Vec<String> = plan
        .partitions
        .iter()
        .filter(|p| p.status == Status::Skipped)
        .map(|p| {
            format!(
                "{} {} ({})",
                name(p),
                p.fs,
                p.reason.as_deref().unwrap_or("?")
            )
        })
        .collect();
    let mut s = if used.is_empty() {
        "no usable partition".to_string()
    } else {
        used.join(", ")
    };
    if !skipped.is_empty() {
        s.push_str("; skipped: ");
        s.push_str(&skipped.join(", "));
    }
    s
}
