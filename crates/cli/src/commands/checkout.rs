//! `roamdisk checkout`: time travel — materialise any version as a raw,
//! LBS or qemu-img image, start a session on it, or serve it read-only.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{Access, BlockDev};
use roamdisk_chunkstore::catalog::format_time;
use roamdisk_chunkstore::repo::{check_rev, resolve};
use roamdisk_nbd::Listen;
use roamdisk_roam::checkout::materialise;
use roamdisk_roam::view::VersionView;

use crate::disk::NewImage;
use crate::serve::serve_one;
use crate::store_args::StoreArgs;

/// Check out a version of an image: USER/IMAGE (latest), USER/IMAGE@VERSION
/// (an id prefix from `roamdisk log`), USER/IMAGE@TAG, or USER/IMAGE@DATE
/// (the latest version committed at or before YYYY-MM-DD[THH:MM[:SS]] UTC;
/// a bare date means the end of that day). Every chunk is verified against
/// its hash as it is fetched.
///
///   --output FILE      write it to a new image file: raw (sparse), lbs, or
///                      any format qemu-img writes (--format qcow2)
///   --session DIR      start a session: serve it with `roamdisk serve
///                      cas:DIR`, commit it with `roamdisk commit cas:DIR`
///   --serve            serve the version read-only over NBD
///
/// Examples:
///   roamdisk checkout alice/desktop@2026-11-20 --output old.raw
///   roamdisk checkout golden/win10 --session ~/s/alice --as alice/desktop
///   roamdisk serve cas:~/s/alice --socket /tmp/alice.sock
///   roamdisk checkout alice/desktop@stable --serve --socket /tmp/ro.sock
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// USER/IMAGE[@VERSION|@TAG|@DATE].
    version: String,
    /// Write the disk to this new file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["session", "serve"])]
    output: Option<PathBuf>,
    /// Format of --output: raw, lbs, or a qemu-img format (qcow2, vmdk...).
    #[arg(long, default_value = "raw")]
    format: String,
    /// Create a session in this directory.
    #[arg(long, value_name = "DIR", conflicts_with = "serve")]
    session: Option<PathBuf>,
    /// The image a session commits to (default: the one checked out).
    #[arg(long = "as", value_name = "USER/IMAGE")]
    as_image: Option<String>,
    /// The session's private cache: raw (a sparse file) or lbs.
    #[arg(long, default_value = "raw")]
    cache: String,
    /// Serve the version read-only over NBD.
    #[arg(long)]
    serve: bool,
    /// With --serve: listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// With --serve: listen on this TCP address.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// Also write the version's VM configuration file here.
    #[arg(long, value_name = "FILE")]
    config_out: Option<PathBuf>,
    /// Also write the version's memory image here.
    #[arg(long, value_name = "FILE")]
    memory_out: Option<PathBuf>,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    check_rev(&a.version)?;
    let store = a.st.open(false)?;
    let key = a.st.key()?;
    let (name, entry) = resolve(&*store, &a.version)?;
    let progress = a.st.progress(quiet);
    let (view, package) =
        VersionView::open_with_package(store.clone(), entry.version, key.as_ref(), &[])
            .with_context(|| format!("cannot check out {name}@{}", entry.version.short()))?;
    let describe = format!(
        "{name}@{} ({}, {})",
        entry.version.short(),
        format_time(entry.created),
        format_size(entry.disk_size)
    );
    if let Some(p) = &a.config_out {
        std::fs::write(p, &view.version.config)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &a.memory_out {
        let mut f =
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?;
        roamdisk_roam::checkout::write_memory(&view, &mut f)?;
        f.sync_all()?;
    }
    if let Some(dest) = &a.output {
        let img = NewImage::create(dest, &a.format, view.size())?;
        let n = materialise(&view, img.dev(), &progress)?;
        img.finish()?;
        progress.finish();
        if a.st.json {
            outln!(
                "{}",
                serde_json::json!({"version": entry.version.to_hex(), "output": dest, "format": a.format, "bytes_written": n})
            );
        } else if !quiet {
            outln!(
                "checked out {describe} to {} ({} of data)",
                dest.display(),
                format_size(n)
            );
        }
        return Ok(());
    }
    if let Some(dir) = &a.session {
        let target = a.as_image.clone().unwrap_or_else(|| name.clone());
        let new = a.st.new_session(target.clone(), &a.cache)?;
        roamdisk_roam::session::create_on(dir, &view, &package, &new)?;
        if !quiet {
            outln!(
                "session {} on {describe}; commits go to {target}\n  serve it:  roamdisk serve cas:{} --socket /tmp/vm.sock\n  commit it: roamdisk commit cas:{} -m \"...\"",
                dir.display(),
                dir.display(),
                dir.display()
            );
        }
        return Ok(());
    }
    if a.serve {
        let mut listen: Vec<Listen> = a.socket.iter().cloned().map(Listen::Unix).collect();
        listen.extend(a.listen.map(Listen::Tcp));
        if listen.is_empty() {
            bail!("say where to serve {describe}: --socket PATH and/or --listen ADDR:PORT");
        }
        serve_one(
            view.served(),
            Access::ReadOnly,
            &describe,
            listen,
            roamdisk_nbd::Until::Signal,
            quiet,
        )?;
        return Ok(());
    }
    bail!("say what to do with {describe}: --output FILE, --session DIR or --serve --socket PATH")
}
