//! `roamdisk hoard`: fetch a whole version into the host's shared cache.

use anyhow::Context;
use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_cas::cache::hoard::hoard;
use roamdisk_cas::cache::SharedChoice;
use roamdisk_cas::repo::resolve;
use roamdisk_cas::view::VersionView;

use super::cas::StoreArgs;

/// Hoard a version on this host: fetch every chunk of its disk and memory
/// image that the host's shared cache lacks (verified, in parallel), and
/// say when the network may go. Sessions of the version on this host then
/// read everything locally, and open with the store unreachable. Chunks
/// stay while a session of the version runs (it pins them); otherwise
/// the cache's policy may evict them later for other images: run hoard
/// again, or `--check`, to see the level.
///
/// Examples:
///   roamdisk hoard alice/desktop --store http://10.0.0.5:8700
///   roamdisk hoard alice/desktop@monday --check --json
///   roamdisk hoard alice/desktop --shared-cache /var/cache/roamdisk
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The version: USER/IMAGE, USER/IMAGE@VERSION, @TAG or @DATE.
    version: String,
    /// Only report how much of the version is on this host.
    #[arg(long)]
    check: bool,
    /// The shared cache (default $ROAMDISK_SHARED_CACHE, else
    /// ~/.cache/roamdisk/shared).
    #[arg(long, value_name = "DIR")]
    shared_cache: Option<String>,
    /// Lookaside media tried before the store (a resume set, an image
    /// file, a block device); repeat for several. Every chunk is verified.
    #[arg(long, value_name = "PATH")]
    lookaside: Vec<std::path::PathBuf>,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let store = a.st.open(false)?;
    let key = a.st.key()?;
    let (name, entry) = resolve(&*store, &a.version)?;
    let cache = SharedChoice::parse(a.shared_cache.as_deref())
        .open()?
        .context(
        "the shared cache is off ($ROAMDISK_SHARED_CACHE=off): name one with --shared-cache DIR",
    )?;
    let view = VersionView::open(store.clone(), entry.version, key.as_ref())
        .with_context(|| format!("cannot read {name}@{}", entry.version.short()))?
        .with_shared_cache(Some(cache.clone()));
    let media = roamdisk_cas::lookaside::for_view(&store, &view, &a.lookaside)?;
    let view = view.with_lookaside(media);
    let progress = a.st.progress(quiet);
    let s = hoard(&view, a.check, &progress)?;
    progress.finish();
    if a.st.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    if quiet {
        return Ok(());
    }
    println!(
        "{name}@{}: {} of {} chunks ({}) in the shared cache {}",
        entry.version.short(),
        s.cached_after,
        s.chunks,
        format_size(s.bytes),
        cache.dir().display()
    );
    if !a.check {
        println!(
            "  {} were there already; fetched {} ({}, {} of them from lookaside media) in {:.1} s",
            s.cached_before,
            s.fetched,
            format_size(s.fetched_bytes),
            s.from_lookaside,
            s.seconds
        );
    }
    if s.complete {
        println!("  fully hoarded: the network may go (sessions of this version read everything from this host)");
    } else if s.refused > 0 {
        println!(
            "  not fully hoarded: {} chunks did not fit (the cache holds {}; it is full of chunks running sessions need, or smaller than the version)",
            s.refused,
            format_size(cache.config().size)
        );
    } else {
        println!("  not fully hoarded: run `roamdisk hoard {name}` to fetch the rest");
    }
    Ok(())
}
