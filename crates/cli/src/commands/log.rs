//! `roamdisk log USER/IMAGE`: the versions of an image, newest first.

use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::catalog::format_time;
use roamdisk_chunkstore::repo::{existing_full, split_target};

use crate::store_args::StoreArgs;

/// List the versions of an image, newest first: id, commit time (UTC),
/// tags, what the commit uploaded, and the description. Any line's id, tag
/// or a date can be checked out again (time travel).
///
/// Example:
///   roamdisk log alice/desktop --store /srv/store
///   roamdisk checkout alice/desktop@2026-11-20 --output old.raw
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The image: USER/IMAGE.
    image: String,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (name, rev) = split_target(&a.image)?;
    if !rev.is_empty() {
        anyhow::bail!("`roamdisk log` takes USER/IMAGE without @");
    }
    let store = a.st.open(false)?;
    let cat = existing_full(&*store, &name)?;
    if a.st.json {
        let v: Vec<_> = cat
            .entries
            .iter()
            .rev()
            .map(|e| {
                serde_json::json!({
                    "version": e.version.to_hex(),
                    "parent": e.parent.map(|p| p.to_hex()),
                    "created": format_time(e.created),
                    "created_ns": e.created,
                    "tags": e.tags,
                    "description": e.description,
                    "disk_size": e.disk_size,
                    "data_bytes": e.data_bytes,
                    "encrypted": e.encrypted,
                    "new_objects": e.new_objects,
                    "reused_objects": e.reused_objects,
                    "uploaded_bytes": e.uploaded_bytes,
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!(
        "{:<12}  {:<20}  {:>9}  {:>7}  {:>10}  DESCRIPTION",
        "VERSION",
        "COMMITTED (UTC)",
        "DATA",
        "NEW",
        "UPLOADED"
    );
    let ids: Vec<_> = cat.entries.iter().map(|e| e.version).collect();
    for e in cat.entries.iter().rev() {
        let mut desc = e.description.clone();
        if !e.tags.is_empty() {
            desc = format!("[{}] {desc}", e.tags.join(", "));
        }
        if let Some(p) = e.parent {
            if !ids.contains(&p) {
                desc.push_str(&format!(" (from {}, another image)", p.short()));
            }
        }
        if e.encrypted {
            desc.push_str(" (encrypted)");
        }
        outln!(
            "{:<12}  {:<20}  {:>9}  {:>7}  {:>10}  {}",
            e.version.short(),
            format_time(e.created),
            format_size(e.data_bytes),
            e.new_objects,
            format_size(e.uploaded_bytes),
            desc
        );
    }
    Ok(())
}
