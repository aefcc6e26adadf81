//! `roamdisk cache`: the host's shared chunk cache — what it holds and for
//! whom, a check of every chunk, and eviction of what nobody keeps.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::format_size;
use roamdisk_roam::cache::admin::{status, verify, CacheStatus};
use roamdisk_roam::cache::{CacheOptions, SharedCache};
use roamdisk_roam::hoard::percent;

use crate::progress::{Output, Reporter};
use crate::store_args::short;

/// The host's shared chunk cache: what it holds (status), a check of every
/// chunk (verify), and eviction of what nobody keeps (evict).
///
/// The shared cache is the folder where every session, checkout and hoard
/// on this host keeps the chunks it fetched, decoded and verified, under a
/// byte cap and a replacement policy (Machine Bank's second-level cache;
/// docs/roaming.md). Chunks of running sessions are pinned and chunks of
/// hoarded versions (`roamdisk hoard`) are kept: the policy evicts only
/// the rest. It is $ROAMDISK_SHARED_CACHE, else ~/.cache/roamdisk/shared,
/// or --shared-cache DIR.
///
/// Examples:
///   roamdisk cache status
///   roamdisk cache status --json --shared-cache /var/cache/roamdisk
///   roamdisk cache verify
///   roamdisk cache evict
///   roamdisk cache clear --all
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Status(StatusArgs),
    Verify(VerifyArgs),
    #[command(visible_alias = "clear")]
    Evict(EvictArgs),
}

/// Which cache, and how results are shown.
#[derive(ClapArgs, Clone, Debug)]
pub struct CacheArgs {
    /// The shared cache (default $ROAMDISK_SHARED_CACHE, else
    /// ~/.cache/roamdisk/shared).
    #[arg(long, value_name = "DIR")]
    shared_cache: Option<PathBuf>,
    /// Machine-readable output: the result as JSON on stdout (progress as
    /// JSON lines on stderr).
    #[arg(long)]
    json: bool,
}

/// What the shared cache holds and for whom: its folder, the bytes used
/// against the cap and the chunks, the policy, every hoarded version with
/// how much of it is here (its level), the running sessions and how many
/// chunks each pins, and how much nobody keeps (evictable).
///
/// Example:
///   roamdisk cache status --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct StatusArgs {
    #[command(flatten)]
    c: CacheArgs,
}

/// Read every chunk in the shared cache and check it against its name (a
/// hit is served without hashing: this is where damage on the host's disk
/// is found). Damaged chunks are dropped and listed; sessions fetch them
/// again when they read them. Runs beside sessions.
///
/// Example:
///   roamdisk cache verify --shared-cache /var/cache/roamdisk
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct VerifyArgs {
    #[command(flatten)]
    c: CacheArgs,
}

/// Drop every chunk that no running session pins and no hoarded version
/// keeps (what the policy would evict first anyway). With --all, release
/// every hoard too and empty the cache: refused while a session runs on
/// it (stop them first).
///
/// Examples:
///   roamdisk cache evict
///   roamdisk cache clear --all
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct EvictArgs {
    /// Also release every hoarded version and drop its chunks: the cache
    /// ends up empty. Needs no session running on it.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    c: CacheArgs,
}

impl CacheArgs {
    /// Open the cache, which must exist (this command never makes one).
    fn open(&self) -> anyhow::Result<Arc<SharedCache>> {
        let dir = match &self.shared_cache {
            Some(d) if d.as_os_str() == "off" => {
                bail!("--shared-cache off: name the cache's folder")
            }
            Some(d) => d.clone(),
            None => crate::env::get().shared_cache.clone().context(
                "the shared cache is off ($ROAMDISK_SHARED_CACHE=off): name one with --shared-cache DIR",
            )?,
        };
        if !dir.join("cache.toml").exists() {
            bail!(
                "{} holds no shared cache: the first session, checkout or hoard that uses it makes one",
                dir.display()
            );
        }
        Ok(Arc::new(SharedCache::open(&dir, &CacheOptions::default())?))
    }
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Status(a) => {
            let cache = a.c.open()?;
            let s = status(&cache)?;
            if a.c.json {
                outln!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print_status(&s);
            }
            Ok(())
        }
        Cmd::Verify(a) => {
            let cache = a.c.open()?;
            let progress = Reporter::new(Output {
                quiet,
                json: a.c.json,
            });
            let r = verify(&cache, &progress)?;
            progress.finish();
            if a.c.json {
                outln!("{}", serde_json::to_string_pretty(&r)?);
            } else if !quiet {
                for d in &r.damaged {
                    outln!(
                        "damaged chunk {}: {}; dropped (the next read fetches it again)",
                        d.id,
                        d.reason
                    );
                }
                if r.damaged.is_empty() {
                    outln!(
                        "ok: all {} chunks ({}) in {} match their names ({:.1} s)",
                        r.chunks,
                        format_size(r.bytes),
                        cache.dir().display(),
                        r.seconds
                    );
                } else {
                    outln!(
                        "dropped {} damaged chunks of {} ({}) in {} ({:.1} s)",
                        r.damaged.len(),
                        r.chunks,
                        format_size(r.bytes),
                        cache.dir().display(),
                        r.seconds
                    );
                }
            }
            Ok(())
        }
        Cmd::Evict(a) => {
            let cache = a.c.open()?;
            let e = cache.evict(a.all)?;
            if a.c.json {
                outln!("{}", serde_json::to_string_pretty(&e)?);
            } else if !quiet {
                if e.released > 0 {
                    outln!("released {} hoarded versions", e.released);
                }
                outln!(
                    "evicted {} chunks ({}) from {}; kept {} pinned by running sessions and {} of hoarded versions",
                    e.chunks,
                    format_size(e.bytes),
                    cache.dir().display(),
                    e.kept_pinned,
                    e.kept_hoarded
                );
            }
            Ok(())
        }
    }
}

fn print_status(s: &CacheStatus) {
    outln!(
        "shared cache  {} (format {})",
        s.path.display(),
        s.format_version
    );
    outln!(
        "cap           {}: at most {} chunks of {}; policy {}",
        format_size(s.size),
        s.capacity,
        format_size(s.unit as u64),
        s.policy
    );
    outln!(
        "used          {} ({:.0}% of the cap) in {} chunks",
        format_size(s.bytes),
        percent(s.bytes, s.size),
        s.chunks
    );
    outln!(
        "  hoarded     {} in {} chunks",
        format_size(s.hoarded_bytes),
        s.hoarded_chunks
    );
    outln!(
        "  pinned      {} in {} chunks (running sessions)",
        format_size(s.pinned_bytes),
        s.pinned_chunks
    );
    outln!(
        "  evictable   {} in {} chunks (`roamdisk cache evict` drops them)",
        format_size(s.evictable_bytes),
        s.evictable_chunks
    );
    outln!();
    if s.hoards.is_empty() {
        outln!("no version is hoarded here (`roamdisk hoard USER/IMAGE` keeps one)");
    } else {
        outln!(
            "{:<40} {:>17} {:>23} {:>6}",
            "HOARDED VERSION",
            "CHUNKS",
            "BYTES",
            "LEVEL"
        );
        for h in &s.hoards {
            outln!(
                "{:<40} {:>17} {:>23} {:>5.0}%",
                format!("{}@{}", h.name, short(&h.version)),
                format!("{} of {}", h.present_chunks, h.chunks),
                format!(
                    "{} of {}",
                    format_size(h.present_bytes),
                    format_size(h.bytes)
                ),
                h.percent
            );
        }
    }
    for d in &s.damaged_marks {
        outln!(
            "damaged hoard mark {}: {} (the cache evicts nothing while it is there: `roamdisk hoard --release` or remove it)",
            d.file.display(),
            d.error
        );
    }
    outln!();
    if s.sessions.is_empty() {
        outln!("no session is running on this cache");
    } else {
        outln!("{:<10} {:>10} {:>10}", "SESSION", "PINNED", "IN CACHE");
        for p in &s.sessions {
            outln!(
                "{:<10} {:>10} {:>10}",
                p.pid.map_or("?".into(), |p| format!("pid {p}")),
                p.chunks,
                p.present_chunks
            );
        }
    }
}
