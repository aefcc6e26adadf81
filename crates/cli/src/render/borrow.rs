//! How `roamdisk borrow` shows plans, free space and a session's timings.

use std::path::Path;

use roamdisk_blockdev::units::format_size;
use roamdisk_borrow::free::PartitionFree;
use roamdisk_borrow::session::{Session, Timings};
use roamdisk_borrow::{Plan, Status};

use super::print_lines;

/// A new plan: its JSON, or (unless its device-mapper table went to
/// stdout) its summary and where it was written.
pub fn show_scan(plan: &Plan, json: bool, saved: Option<&Path>, dm_table: Option<&Path>) {
    if json {
        outln!("{}", plan.to_json());
    } else if dm_table != Some(Path::new("-")) {
        print_lines(&plan.summary());
        if let Some(p) = saved {
            outln!(
                "Plan written to {}; serve it with `roamdisk serve borrow:{} --socket SOCK`",
                p.display(),
                p.display()
            );
        }
    }
}

/// Every partition's free space: JSON, or a `# DEVICE PART FS HEALTH
/// FREE_BYTES EXTENTS` line per partition and a `START LENGTH` line per
/// extent; a partition that did not read is said on stderr too.
pub fn show_free(list: &[PartitionFree], json: bool) -> anyhow::Result<()> {
    let mut out = String::new();
    let mut values = Vec::new();
    for PartitionFree {
        device: path,
        partition: p,
        free,
    } in list
    {
        match free {
            Ok(f) => {
                let health = match &f.probe.health {
                    roamdisk_fsmeta::Health::Clean => "clean".to_string(),
                    roamdisk_fsmeta::Health::Unsafe { reason, .. } => reason.as_str().to_string(),
                };
                out.push_str(&format!(
                    "# {} {} {} {} {} {}\n",
                    path.display(),
                    p.number,
                    f.probe.type_name,
                    health,
                    f.free_bytes,
                    f.extents.len()
                ));
                for e in &f.extents {
                    out.push_str(&format!("{} {}\n", e.start, e.len));
                }
                values.push(serde_json::json!({"device": path, "partition": p, "free": f}));
            }
            Err(e) => {
                out.push_str(&format!(
                    "# {} {} error corrupt 0 0\n",
                    path.display(),
                    p.number
                ));
                eprintln!("roamdisk: {} partition {}: {e}", path.display(), p.number);
                values.push(
                    serde_json::json!({"device": path, "partition": p, "error": e.to_string()}),
                );
            }
        }
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&values)?);
    } else {
        print_lines(&out);
    }
    Ok(())
}

/// A plan: JSON, its device-mapper table, a tab-separated line per
/// partition, or its summary.
pub fn show_plan(plan: &Plan, json: bool, dm_table: bool, partitions: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", plan.to_json());
    } else if dm_table {
        print_lines(&plan.dm_table());
    } else if partitions {
        for p in &plan.partitions {
            outln!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                plan.devices[p.device as usize].path.display(),
                p.number,
                p.fs,
                match p.status {
                    Status::Used => "used",
                    Status::Skipped => "skipped",
                },
                p.reason.as_deref().unwrap_or("-"),
                p.free_bytes,
                p.borrowed_bytes,
                p.borrowed_extents
            );
        }
    } else {
        print_lines(&plan.summary());
    }
    Ok(())
}

/// A plan that still matches its host, in a line.
pub fn matches(path: &Path, plan: &Plan, identity_only: bool) -> String {
    format!(
        "plan {} matches the host: {} in {} extents{}",
        path.display(),
        format_size(plan.total_bytes),
        plan.extents.len(),
        if identity_only {
            " (identity only)"
        } else {
            ", all still free"
        }
    )
}

/// A session that started, in a line.
pub fn started(sess: &Session) -> String {
    format!(
        "borrowed {} in {} extents (scan {:.2} s, allocate {:.2} s, copy-in {:.2} s)",
        format_size(sess.plan.total_bytes),
        sess.plan.extents.len(),
        sess.timings.scan_s,
        sess.timings.allocate_s,
        sess.timings.copy_in_s
    )
}

/// A session's timings: JSON, or its start-up, serving and shut-down.
pub fn show_timings(t: &Timings, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(t)?);
        return Ok(());
    }
    outln!(
        "Start-up:  scan {:.3} s + allocate {:.3} s + copy-in {:.3} s ({})",
        t.scan_s,
        t.allocate_s,
        t.copy_in_s,
        format_size(t.copy_in_bytes)
    );
    outln!("Served:    {:.3} s", t.serve_s);
    outln!(
        "Shut-down: copy-back {:.3} s ({}) + release {:.3} s{}",
        t.copy_back_s,
        format_size(t.copy_back_bytes),
        t.release_s,
        if t.scrubbed_bytes > 0 {
            format!(" (scrubbed {})", format_size(t.scrubbed_bytes))
        } else {
            String::new()
        }
    );
    Ok(())
}
