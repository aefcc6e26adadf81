//! `roamdisk rm`: drop versions from a catalog.

use anyhow::bail;
use clap::Parser;
use roamdisk_chunkstore::repo::{existing_full, split_target, update_full};

use crate::store_args::StoreArgs;

/// Drop versions from an image's catalog (or the whole image with --all).
/// Their chunks are freed by the next `roamdisk gc` when no other version
/// of any user needs them. Other versions are self-contained and keep
/// working, including children of a dropped version.
///
/// Examples:
///   roamdisk rm alice/desktop@3f2a1b9c alice/desktop@old-tag
///   roamdisk rm bob/scratch --all
///   roamdisk gc
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Versions: USER/IMAGE@VERSION|@TAG|@DATE (or USER/IMAGE with --all).
    #[arg(required = true)]
    versions: Vec<String>,
    /// Drop every version of the named images.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let store = a.st.open(false)?;
    for v in &a.versions {
        let (name, rev) = split_target(v)?;
        if a.all {
            if !rev.is_empty() {
                bail!("--all drops a whole image: give USER/IMAGE without @");
            }
            let n = existing_full(&*store, &name)?.entries.len();
            update_full(&*store, &name, |entries| {
                entries.clear();
                Ok(())
            })?;
            if !quiet {
                outln!("dropped {name} ({n} versions); run `roamdisk gc` to free space");
            }
            continue;
        }
        if rev.is_empty() {
            bail!("'{v}': say which version (USER/IMAGE@VERSION), or --all for every one");
        }
        let cat = existing_full(&*store, &name)?;
        let id = cat.resolve(&rev, &name)?.version;
        update_full(&*store, &name, |entries| {
            entries.retain(|e| e.version != id);
            Ok(())
        })?;
        if !quiet {
            outln!(
                "dropped {name}@{}; run `roamdisk gc` to free space",
                id.short()
            );
        }
    }
    Ok(())
}
