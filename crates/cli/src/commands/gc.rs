//! `roamdisk gc`: free the chunks no version needs.

use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::gc::{gc, GcOptions};

use crate::store_args::StoreArgs;
use roamdisk_blockdev::units::{parse_duration, Bare};

/// Garbage-collect the chunk store: mark every chunk some version of some
/// catalog references, remove the rest. Safe while commits run: a commit
/// holds a lease, and what it has uploaded or reused is kept. A version
/// that cannot be read stops gc before anything is removed.
///
/// Examples:
///   roamdisk gc --store /srv/store
///   roamdisk gc --dry-run --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Report what would be removed; remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// A commit whose lease was not refreshed for this long is taken for
    /// dead (killed or crashed) and its uploads become collectable.
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    lease_timeout: String,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let store = a.st.open(false)?;
    let progress = a.st.progress(quiet);
    let opts = GcOptions {
        lease_timeout: parse_duration(&a.lease_timeout, Bare::Seconds)?,
        dry_run: a.dry_run,
        ..Default::default()
    };
    let r = gc(&*store, &opts, &progress)?;
    progress.finish();
    if a.st.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else if !quiet {
        outln!(
            "{} {} objects ({}) of {} ({}); {} referenced by {} versions in {} catalogs",
            if r.dry_run { "would remove" } else { "removed" },
            r.removed_objects,
            format_size(r.removed_bytes),
            r.objects,
            format_size(r.bytes),
            r.referenced,
            r.versions,
            r.catalogs
        );
        if r.kept_recent > 0 || r.live_leases > 0 {
            outln!(
                "kept {} unreferenced objects too recent to remove ({} commits running)",
                r.kept_recent,
                r.live_leases
            );
        }
        if r.restored > 0 {
            outln!(
                "put back {} objects an interrupted gc had set aside",
                r.restored
            );
        }
        outln!("{:.2} s", r.seconds);
    }
    Ok(())
}
