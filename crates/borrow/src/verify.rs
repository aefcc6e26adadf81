//! Is the host still as it was when the plan was made? The plan records
//! each device's size and partition-table hash and each used partition's
//! file-system UUID and identity hash (a hash of its superblock-like
//! metadata, which changes whenever the host mounts or writes it). All of
//! them must match, each used volume must still pass the safety check,
//! and — with a full check — every extent of the plan must still lie in
//! the volume's free space as its allocation map says now.

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::{BlockDev, Result};
use roamdisk_fsmeta as fsmeta;

use crate::bad_plan;
use crate::plan::{Plan, Status};

/// How much to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Sizes, table and identity hashes and health only.
    Identity,
    /// Also re-read the allocation maps and check every extent is free.
    Full,
}

fn changed(path: &std::path::Path, what: String) -> roamdisk_blockdev::Error {
    bad_plan(format!(
        "host device {} changed since the scan ({what}): refusing to use the plan; run `roamdisk borrow scan` again",
        path.display()
    ))
}

/// Check `plan` against its host devices, opened read-only.
pub fn verify_host(plan: &Plan, depth: Depth) -> Result<()> {
    let devs: Vec<RawDev> = plan
        .devices
        .iter()
        .map(|d| RawDev::open(&d.path, true))
        .collect::<Result<_>>()?;
    let refs: Vec<&dyn BlockDev> = devs.iter().map(|d| d as &dyn BlockDev).collect();
    verify(plan, &refs, depth)
}

/// Check `plan` against the opened `hosts` (in the plan's device order).
pub fn verify(plan: &Plan, hosts: &[&dyn BlockDev], depth: Depth) -> Result<()> {
    if hosts.len() != plan.devices.len() {
        return Err(bad_plan("the number of host devices differs from the plan"));
    }
    for (d, dev) in plan.devices.iter().zip(hosts) {
        if dev.size() != d.size {
            return Err(changed(
                &d.path,
                format!("size {} is now {}", d.size, dev.size()),
            ));
        }
        let t = fsmeta::read_table(*dev)
            .map_err(|e| changed(&d.path, format!("partition table unreadable: {e}")))?;
        if fsmeta::hex(&t.identity) != d.table_sha256 || t.scheme.as_str() != d.scheme {
            return Err(changed(&d.path, "the partition table is different".into()));
        }
    }
    for p in plan.partitions.iter().filter(|p| p.status == Status::Used) {
        let d = &plan.devices[p.device as usize];
        let dev = hosts[p.device as usize];
        let probe = fsmeta::probe(dev, p.start, p.len)
            .map_err(|e| changed(&d.path, format!("partition {} unreadable: {e}", p.number)))?;
        if probe.type_name != p.fs || probe.uuid != p.uuid {
            return Err(changed(
                &d.path,
                format!(
                    "partition {} now holds {} {:?}",
                    p.number, probe.type_name, probe.uuid
                ),
            ));
        }
        if fsmeta::hex(&probe.identity) != p.identity_sha256 {
            return Err(changed(
                &d.path,
                format!(
                    "the {} superblock of partition {} is different (mounted or written since)",
                    p.fs, p.number
                ),
            ));
        }
        if let fsmeta::Health::Unsafe { reason, detail } = &probe.health {
            return Err(changed(
                &d.path,
                format!(
                    "partition {} is now {}: {detail}",
                    p.number,
                    reason.as_str()
                ),
            ));
        }
        if depth == Depth::Full {
            let mut mine: Vec<(u64, u64)> = plan
                .extents
                .iter()
                .filter(|e| e.device == p.device && e.partition == p.number)
                .map(|e| (e.offset, e.offset + e.len))
                .collect();
            mine.sort_unstable();
            let mut i = 0;
            // Both lists are sorted: advance through the plan's extents as
            // free extents go by, checking containment.
            let mut covered = 0usize;
            fsmeta::for_each_free_extent(dev, p.start, p.len, &mut |f| {
                while i < mine.len() && mine[i].0 >= f.start && mine[i].1 <= f.end() {
                    covered += 1;
                    i += 1;
                }
            })
            .map_err(|e| changed(&d.path, format!("partition {} unreadable: {e}", p.number)))?;
            if covered != mine.len() {
                let (a, b) = mine[covered];
                return Err(changed(
                    &d.path,
                    format!(
                        "bytes {a}..{b} of the plan are no longer free in partition {}",
                        p.number
                    ),
                ));
            }
        }
    }
    Ok(())
}
