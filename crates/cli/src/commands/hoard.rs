//! `roamdisk hoard`: fetch a whole version into the host's shared cache
//! and keep it there; `--release` ends that, `--check` tells the level.

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::repo::resolve;
use roamdisk_roam::cache::hoard_marks::HoardMark;
use roamdisk_roam::cache::SharedCache;
use roamdisk_roam::hoard::{hoard, marks_named, percent, HoardSummary};
use roamdisk_roam::view::VersionView;
use serde::Serialize;

use crate::store_args::{short, StoreArgs};

/// Hoard a version on this host: fetch every chunk of its disk and memory
/// image that the host's shared cache lacks (verified, in parallel), keep
/// them there, and say when the network may go. Sessions of the version
/// on this host then read everything locally, and open with the store
/// unreachable.
///
/// A hoarded version stays: the cache never evicts its chunks for other
/// images, in any process, until `roamdisk hoard --release`. The chunks of
/// all hoarded versions must fit under the cache's cap together: a version
/// that does not fit is refused before anything is fetched, with what it
/// needs and what the cache holds. A hoard that is interrupted keeps what
/// it stored and its mark: run it again to fetch the rest. While running
/// sessions pin the rest of a full cache, some chunks may be refused: the
/// hoard then fails, and says so.
///
/// --release ends the hoard of USER/IMAGE (every hoarded version of it) or
/// of USER/IMAGE@REV; it works without the store for versions named by an
/// id prefix. The chunks stay in the cache until its policy evicts them.
/// --check only reports the level: how much of the version is here, and
/// whether it is hoarded; with the store out of reach (a server down, a
/// store folder unplugged) a hoarded version's level comes from its hoard
/// mark. `roamdisk cache status` lists every hoard.
///
/// Examples:
///   roamdisk hoard alice/desktop --store https://store.example:8700
///   roamdisk hoard alice/desktop@monday --check --json
///   roamdisk hoard alice/desktop --shared-cache /var/cache/roamdisk
///   roamdisk hoard alice/desktop --lookaside /media/usb/alice
///   roamdisk hoard --release alice/desktop
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The version: USER/IMAGE, USER/IMAGE@VERSION, @TAG or @DATE.
    version: String,
    /// Only report how much of the version is on this host, and whether
    /// it is hoarded.
    #[arg(long, conflicts_with = "release")]
    check: bool,
    /// End the hoard: the cache may evict the version's chunks again.
    #[arg(long)]
    release: bool,
    /// The shared cache (default $ROAMDISK_SHARED_CACHE, else
    /// ~/.cache/roamdisk/shared).
    #[arg(long, value_name = "DIR")]
    shared_cache: Option<String>,
    /// Lookaside media tried before the store (a resume set, an image
    /// file, a qcow2 image, a block device); repeat for several. Every
    /// chunk is verified.
    #[arg(long, value_name = "PATH")]
    lookaside: Vec<std::path::PathBuf>,
    #[command(flatten)]
    st: StoreArgs,
}

fn open_cache(a: &Args) -> anyhow::Result<std::sync::Arc<SharedCache>> {
    crate::env::get()
        .shared_cache_choice(a.shared_cache.as_deref())
        .open()?
        .context(
        "the shared cache is off ($ROAMDISK_SHARED_CACHE=off): name one with --shared-cache DIR",
    )
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    if a.release {
        return release(&a, quiet);
    }
    if a.check {
        // The level is the cache's business: a hoarded version is checked
        // from its mark when the store cannot be reached.
        let cache = open_cache(&a)?;
        let found = a.st.open(false).and_then(|store| {
            let (name, entry) = resolve(&*store, &a.version)?;
            Ok((store, name, entry))
        });
        return match found {
            Ok((store, name, entry)) => hoard_version(&a, quiet, store, &name, &entry, cache),
            Err(e) => check_offline(&a, quiet, &cache, e),
        };
    }
    let store = a.st.open(false)?;
    let (name, entry) = resolve(&*store, &a.version)?;
    let cache = open_cache(&a)?;
    hoard_version(&a, quiet, store, &name, &entry, cache)
}

/// `--check` with the store out of reach: from the hoard mark of the
/// version named (USER/IMAGE: its newest hoarded version; @REV: an id
/// prefix), or the store's error if no mark names it.
fn check_offline(
    a: &Args,
    quiet: bool,
    cache: &SharedCache,
    why: anyhow::Error,
) -> anyhow::Result<()> {
    let mark = marks_named(cache, &a.version)?
        .into_iter()
        .max_by_key(|m| m.created);
    let Some(mark) = mark else {
        return Err(why.context(format!(
            "cannot check {}: the store cannot be read and no hoard mark in {} names it",
            a.version,
            cache.dir().display()
        )));
    };
    let s = roamdisk_roam::hoard::check_from_mark(cache, &mark)?;
    if a.st.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else if !quiet {
        outln!("the store cannot be read ({why:#}): the level comes from the hoard mark");
        print_summary(&s, cache, true);
    }
    Ok(())
}

/// Hoard (or `--check`) the version `entry` of `name` through `store`.
fn hoard_version(
    a: &Args,
    quiet: bool,
    store: roamdisk_chunkstore::store::DynStore,
    name: &str,
    entry: &roamdisk_chunkstore::catalog::Entry,
    cache: std::sync::Arc<SharedCache>,
) -> anyhow::Result<()> {
    let key = a.st.key()?;
    let view = VersionView::open(store.clone(), entry.version, key.as_ref())
        .with_context(|| format!("cannot read {name}@{}", entry.version.short()))?
        .with_shared_cache(Some(cache.clone()));
    let media = roamdisk_roam::lookaside::open_media(
        store.config().hash,
        view.version.index.chunk_size,
        &a.lookaside,
        crate::env::get().lookaside_index().as_deref(),
    )?;
    let view = view.with_lookaside(media);
    let progress = a.st.progress(quiet);
    let s = hoard(&view, name, a.check, &progress)?;
    progress.finish();
    if a.st.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else if !quiet {
        print_summary(&s, &cache, a.check);
    }
    if !a.check && !s.complete {
        let why = if s.refused > 0 {
            format!(
                "{} were refused while running sessions pin the rest of the cache (see `roamdisk cache status`; hoard again once they end)",
                s.refused
            )
        } else {
            "they left the cache while the hoard ran (`roamdisk cache verify` drops damaged chunks)"
                .to_string()
        };
        bail!(
            "{name}@{} is not fully hoarded: {} of its {} chunks are not in the shared cache; {why}. The hoard mark stays and keeps what is there: `roamdisk hoard {name}` again fetches the rest",
            entry.version.short(),
            s.chunks - s.cached_after,
            s.chunks,
        );
    }
    Ok(())
}

fn print_summary(s: &HoardSummary, cache: &SharedCache, check: bool) {
    outln!(
        "{}@{}: {} of {} chunks ({} of {}, {:.0}%) in the shared cache {}",
        s.name,
        short(&s.version),
        s.cached_after,
        s.chunks,
        format_size(s.cached_bytes),
        format_size(s.bytes),
        s.percent,
        cache.dir().display()
    );
    if !check {
        outln!(
            "  {} were there already; fetched {} ({}, {} of them from lookaside media) in {:.1} s",
            s.cached_before,
            s.fetched,
            format_size(s.fetched_bytes),
            s.from_lookaside,
            s.seconds
        );
    }
    let kept = if s.hoarded {
        format!(
            "hoarded: the cache keeps it until `roamdisk hoard --release {}`",
            s.name
        )
    } else {
        "not hoarded: the cache's policy may evict it (`roamdisk hoard` keeps it)".to_string()
    };
    if s.complete {
        outln!("  fully hoarded: the network may go (sessions of this version read everything from this host)");
    }
    outln!("  {kept}");
}

/// What `--release` did, for `--json`.
#[derive(Serialize)]
struct Released {
    released: Vec<ReleasedOne>,
}

#[derive(Serialize)]
struct ReleasedOne {
    version: String,
    name: String,
    chunks: u64,
    /// Of its chunks, those in the cache now (they stay until evicted).
    present_chunks: u64,
}

/// Every readable hoard mark of `cache`.
fn valid_marks(cache: &SharedCache) -> anyhow::Result<Vec<HoardMark>> {
    Ok(cache
        .hoard_marks()?
        .into_iter()
        .filter_map(|l| l.mark.ok())
        .collect())
}

/// `--release USER/IMAGE[@REV]`: the marks of that name (with REV, those
/// whose id starts with it), else the version REV resolves to in the
/// store.
fn release(a: &Args, quiet: bool) -> anyhow::Result<()> {
    let cache = open_cache(a)?;
    let mut chosen = marks_named(&cache, &a.version)?;
    if chosen.is_empty() && a.version.contains('@') {
        // A tag or a date: ask the store which version it names.
        let store = a.st.open(false)?;
        let (_, entry) = resolve(&*store, &a.version)?;
        chosen = valid_marks(&cache)?;
        chosen.retain(|m| m.version == entry.version);
    }
    if chosen.is_empty() {
        let hoarded: Vec<String> = valid_marks(&cache)?
            .iter()
            .map(|m| format!("{}@{}", m.name, m.version.short()))
            .collect();
        bail!(
            "{} is not hoarded in the shared cache {} (hoarded: {})",
            a.version,
            cache.dir().display(),
            if hoarded.is_empty() {
                "none".to_string()
            } else {
                hoarded.join(", ")
            }
        );
    }
    let resident = cache.snapshot()?.resident;
    let mut out = Released {
        released: Vec::new(),
    };
    for HoardMark {
        version, name, ids, ..
    } in chosen
    {
        if cache.release_hoard(&version)? {
            out.released.push(ReleasedOne {
                version: version.to_hex(),
                name,
                chunks: ids.len() as u64,
                present_chunks: ids.iter().filter(|i| resident.contains_key(i)).count() as u64,
            });
        }
    }
    if a.st.json {
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else if !quiet {
        for r in &out.released {
            outln!(
                "released {}@{}: its {} chunks here ({:.0}% of {}) stay until the cache's policy evicts them",
                r.name,
                short(&r.version),
                r.present_chunks,
                percent(r.present_chunks, r.chunks),
                r.chunks
            );
        }
    }
    Ok(())
}
