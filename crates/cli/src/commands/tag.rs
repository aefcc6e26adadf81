//! `roamdisk tag`: name a version.

use anyhow::bail;
use clap::Parser;
use roamdisk_chunkstore::catalog::check_tag;
use roamdisk_chunkstore::repo::{resolve, split_target, update_full};

use crate::store_args::StoreArgs;

/// Give a version a name (a tag) to check it out by, or remove a tag. A
/// tag is unique within an image: tagging another version moves it.
///
/// Examples:
///   roamdisk tag alice/desktop@3f2a1b9c stable
///   roamdisk checkout alice/desktop@stable --output stable.raw
///   roamdisk tag alice/desktop --delete stable
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The version: USER/IMAGE[@VERSION|@TAG|@DATE] (latest without @).
    version: String,
    /// The tag to give it.
    name: Option<String>,
    /// Remove this tag instead.
    #[arg(long, value_name = "TAG", conflicts_with = "name")]
    delete: Option<String>,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let store = a.st.open(false)?;
    if let Some(t) = &a.delete {
        let (name, _) = split_target(&a.version)?;
        let mut found = false;
        update_full(&*store, &name, |entries| {
            found = false;
            for e in entries.iter_mut() {
                let before = e.tags.len();
                e.tags.retain(|x| x != t);
                found |= e.tags.len() != before;
            }
            Ok(())
        })?;
        if !found {
            bail!("{name} has no tag '{t}'");
        }
        if !quiet {
            outln!("removed tag {t} from {name}");
        }
        return Ok(());
    }
    let Some(tag) = &a.name else {
        bail!("give the tag name (or --delete TAG)");
    };
    check_tag(tag)?;
    let (name, entry) = resolve(&*store, &a.version)?;
    update_full(&*store, &name, |entries| {
        for e in entries.iter_mut() {
            e.tags.retain(|x| x != tag);
            if e.version == entry.version {
                e.tags.push(tag.clone());
            }
        }
        Ok(())
    })?;
    if !quiet {
        outln!("tagged {name}@{} as {tag}", entry.version.short());
    }
    Ok(())
}
