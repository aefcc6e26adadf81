//! A commit's summary, as text or JSON (`commit`, `suspend`).

use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::commit::CommitSummary;

use crate::progress::Reporter;
use crate::store_args::short;

pub fn print_summary(s: &CommitSummary, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    let u = &s.upload;
    let m = &s.memory_upload;
    let d = *u - *m;
    outln!(
        "committed {}@{}{}",
        s.catalog,
        short(&s.version),
        s.parent
            .as_deref()
            .map(|p| format!(" (parent {})", short(p)))
            .unwrap_or_default()
    );
    outln!(
        "  disk        {} in {} chunks of {}: {} all-zero (stored as nothing), {} hashed ({})",
        format_size(s.disk_size),
        s.disk_size.div_ceil(s.chunk_size as u64),
        format_size(s.chunk_size as u64),
        d.zero_chunks,
        d.chunks - d.zero_chunks,
        format_size(d.hashed_bytes)
    );
    if m.chunks > 0 {
        outln!(
            "  memory      {} chunks: {} all-zero (stored as nothing), {} hashed ({})",
            m.chunks,
            m.zero_chunks,
            m.chunks - m.zero_chunks,
            format_size(m.hashed_bytes)
        );
    }
    outln!(
        "  store       {} new chunks uploaded ({} after compression), {} already there (reused)",
        u.new_objects,
        format_size(u.uploaded_bytes),
        u.reused_objects
    );
    if u.uploaded_bytes == 0 {
        outln!("  dedup       nothing new: every chunk was already stored");
    } else {
        outln!(
            "  dedup       {:.2}x (bytes hashed / bytes uploaded, compression included)",
            u.hashed_bytes as f64 / u.uploaded_bytes as f64
        );
    }
    outln!(
        "  index       {} compressed ({:.3}% of the disk), in a {} version package{}",
        format_size(s.index_bytes as u64),
        s.index_bytes as f64 * 100.0 / s.disk_size as f64,
        format_size(s.package_bytes as u64),
        if s.encrypted {
            ", sealed with the user's key"
        } else {
            ""
        }
    );
    if let Some(f) = &s.filters {
        let pct = |n: u64| n as f64 * 100.0 / f.dirty.max(1) as f64;
        outln!("  useful updates (sectors; the seed's Figure 9):");
        outln!("    dirty                       {:>10}  100.0%", f.dirty);
        let mut left = f.dirty;
        for (name, on, dropped) in [
            ("P1 zero writes", f.p1, f.p1_zero),
            ("P2 free clusters", f.p2, f.p2_free),
            ("P3 swap", f.p3, f.p3_swap),
        ] {
            left -= dropped;
            let label = format!("after {name}{}", if on { "" } else { " (off)" });
            outln!(
                "    {label:<26}  {left:>10}  {:>5.1}%  (-{dropped})",
                pct(left)
            );
        }
    }
    outln!("  time        {:.2} s ({:.0} MB/s)", s.seconds, s.mb_per_s);
    Ok(())
}

pub fn finish(
    summary: &CommitSummary,
    progress: Reporter,
    quiet: bool,
    json: bool,
) -> anyhow::Result<()> {
    progress.finish();
    if !quiet || json {
        print_summary(summary, json)?;
    }
    Ok(())
}
