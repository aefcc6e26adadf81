//! The human summary of a plan: per partition status, reason if skipped,
//! free and borrowed space, and the extent-size histogram.

use std::fmt::Write;

use crate::plan::{Plan, Status};
use roamdisk_blockdev::units::format_size;

impl Plan {
    /// A multi-line report for people.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Host devices:");
        for d in &self.devices {
            let _ = writeln!(
                s,
                "  [{}] {}  {}  table: {}",
                d.id,
                d.path.display(),
                format_size(d.size),
                d.scheme
            );
        }
        let _ = writeln!(s, "\nPartitions:");
        let _ = writeln!(
            s,
            "  {:<4} {:>3}  {:<22} {:<10} {:<8} {:>11} {:>11} {:>8}  reason",
            "dev", "#", "type", "fs", "status", "free", "borrowed", "extents"
        );
        for p in &self.partitions {
            let status = match p.status {
                Status::Used => "used",
                Status::Skipped => "skipped",
            };
            let reason = match (&p.reason, &p.detail) {
                (Some(r), Some(d)) => format!("{r}: {d}"),
                (Some(r), None) => r.clone(),
                _ => String::new(),
            };
            let mut ty = p.type_name.clone();
            ty.truncate(22);
            let _ = writeln!(
                s,
                "  [{}]  {:>3}  {:<22} {:<10} {:<8} {:>11} {:>11} {:>8}  {}",
                p.device,
                p.number,
                ty,
                p.fs,
                status,
                if p.status == Status::Used {
                    format_size(p.free_bytes)
                } else {
                    "-".into()
                },
                format_size(p.borrowed_bytes),
                p.borrowed_extents,
                reason
            );
        }
        let _ = writeln!(
            s,
            "\nFree extents by size (used partitions; borrowed ones on the right):"
        );
        let n = self
            .free_histogram
            .counts
            .len()
            .max(self.borrowed_histogram.counts.len());
        for i in 0..n {
            let fc = self.free_histogram.counts.get(i).copied().unwrap_or(0);
            let fb = self.free_histogram.bytes.get(i).copied().unwrap_or(0);
            let bc = self.borrowed_histogram.counts.get(i).copied().unwrap_or(0);
            let bb = self.borrowed_histogram.bytes.get(i).copied().unwrap_or(0);
            if fc == 0 && bc == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "  {:>9} - {:<9} {:>9} {:>11}   | {:>9} {:>11}",
                format_size(1 << i),
                format_size(1u64 << (i + 1).min(63)),
                fc,
                format_size(fb),
                bc,
                format_size(bb)
            );
        }
        let free: u64 = self.partitions.iter().map(|p| p.free_bytes).sum();
        let _ = writeln!(
            s,
            "\nBorrowed disk: {} in {} extents (of {} free; extents of at least {}, at most {} kept{})",
            format_size(self.total_bytes),
            self.extents.len(),
            format_size(free),
            format_size(self.options.min_extent),
            self.options.max_extents,
            if self.options.size_limit > 0 {
                format!(", cut to {}", format_size(self.options.size_limit))
            } else {
                String::new()
            }
        );
        s
    }
}
