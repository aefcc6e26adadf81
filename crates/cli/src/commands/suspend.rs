//! `roamdisk suspend`: end a session on this host — commit its useful
//! updates with the memory image, configuration and recorded working set,
//! and optionally write the resume set to a portable folder.

use std::path::PathBuf;

use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_chunkstore::commit::{CommitOptions, MemoryImage};
use roamdisk_roam::suspend::{suspend, suspend_live, LiveSuspend, Suspended};

use crate::disk::DiskSpec;
use crate::render::commit::finish;
use crate::store_args::{short, Filters, StoreArgs};

/// Suspend a session: commit its useful updates (the same filters as
/// `roamdisk commit cas:SESSION`) as a new version that also keeps the
/// VM's memory image, its configuration and the session's recorded
/// working set (the disk chunks the guest read, in the order it first
/// read them). A session of that version — `roamdisk resume` on another
/// host — fetches that working set first, in that order.
///
/// A running VM: --qmp SOCKET (QEMU started with `-qmp
/// unix:SOCKET,server=on,wait=off`). The VM is stopped, its state goes
/// straight into the store as the memory image (QEMU's migration stream,
/// chunked as it comes: no file the size of RAM), QEMU quits (it must not
/// run on: the disk is committed), the process serving the session
/// (`roamdisk serve` or `resume`; serve the session alone in it) is asked
/// to end, and the session is committed. If the state cannot be stored,
/// nothing is committed and the VM runs on. `roamdisk resume --qmp`
/// continues it on the next host.
///
/// Otherwise stop the VM first (or have it save its memory to a file for
/// --memory), and stop the process serving the session.
///
/// --to-media DIR writes the resume set (the version package, the memory
/// image, the working-set chunks and the chunks the guest wrote, as
/// stored: compressed or encrypted) to a folder, e.g. on a USB key; give it to `roamdisk resume
/// --lookaside DIR` on the next host. Every chunk read from it is
/// verified, so a stale or damaged copy costs only speed.
///
/// Examples:
///   roamdisk suspend ~/s/alice --qmp /tmp/vm.qmp --to-media /media/usb/alice
///   roamdisk suspend ~/s/alice --memory vm.mem --config vm.conf -m "end of day"
///   roamdisk suspend ~/s/alice --memory vm.mem --to-media /media/usb/alice
///   (next host) roamdisk resume alice/desktop --session ~/s/alice --lookaside /media/usb/alice --socket /tmp/vm.sock
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The session folder (or cas:SESSION).
    session: String,
    /// Description of the version.
    #[arg(short, long, default_value = "suspended")]
    message: String,
    /// The VM's memory image to keep with the version.
    #[arg(long, value_name = "FILE")]
    memory: Option<PathBuf>,
    /// Suspend the running VM behind this QMP socket: its state is
    /// stored as the memory image, then QEMU quits.
    #[arg(long, value_name = "PATH", conflicts_with = "memory")]
    qmp: Option<PathBuf>,
    /// With --qmp: the memory image's chunk size (power of two, 4K..4M;
    /// default 16K: what a lazy resume fetches per page fault).
    #[arg(long, value_name = "SIZE", requires = "qmp")]
    memory_chunk_size: Option<String>,
    /// The VM configuration file to keep (default: the base version's).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Tag the new version.
    #[arg(long)]
    tag: Option<String>,
    /// Write the resume set to this folder (created as a chunk store).
    #[arg(long, value_name = "DIR")]
    to_media: Option<PathBuf>,
    #[command(flatten)]
    filters: Filters,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let progress = a.st.progress(quiet);
    let config = crate::store_args::read_optional(a.config.as_deref())?;
    if let Some(t) = &a.tag {
        roamdisk_chunkstore::catalog::check_tag(t)?;
    }
    let u = a.filters.update(CommitOptions {
        description: a.message.clone(),
        config,
        memory: a.memory.clone().map(MemoryImage::File),
        tag: a.tag.clone(),
        ..Default::default()
    });
    let spec = match a.session.strip_prefix("cas:") {
        Some(_) => a.session.clone(),
        None => format!("cas:{}", a.session),
    };
    let (dir, open) = a.st.session_open(&DiskSpec::parse(&spec)?.spec)?;
    let reg = super::registry();
    let s = match &a.qmp {
        Some(q) => {
            let live = LiveSuspend {
                qmp: q.clone(),
                memory_chunk_size: match &a.memory_chunk_size {
                    Some(c) => crate::args::chunk_size(c)?,
                    None => 0,
                },
            };
            suspend_live(
                &dir,
                &open,
                &u,
                &live,
                a.to_media.as_deref(),
                &reg,
                &progress,
            )?
        }
        None => suspend(&dir, &open, &u, a.to_media.as_deref(), &reg, &progress)?,
    };
    if a.st.json {
        progress.finish();
        outln!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    finish(&s.commit, progress, quiet, false)?;
    if !quiet {
        render_suspended(&s, a.to_media.as_deref());
    }
    Ok(())
}

fn render_suspended(s: &Suspended, media: Option<&std::path::Path>) {
    let c = &s.commit;
    if let Some(l) = &s.live {
        outln!(
            "  VM state    {} of RAM ({} in stored chunks, {} zero pages) taken from QEMU in {:.2} s as pages ({} new objects, {} already stored; memory working set {} chunks); QEMU quit{}",
            format_size(l.ram_bytes),
            format_size(l.data_bytes),
            l.zero_pages,
            l.seconds,
            l.upload.new_objects,
            l.upload.reused_objects,
            l.working_set_chunks,
            l.server_ended
                .map(|p| format!(", the server of the session (pid {p}) ended"))
                .unwrap_or_default()
        );
    }
    outln!(
        "  working set {} chunks ({}) recorded, fetched first on resume",
        s.working_set_chunks,
        format_size(s.working_set_chunks as u64 * s.chunk_size as u64)
    );
    if let (Some(m), Some(dir)) = (&s.resume_set, media) {
        outln!(
            "  resume set  {} memory-image, {} working-set and {} written chunks in {}: {} objects copied ({}), {} already there",
            m.memory_chunks,
            m.working_set_chunks,
            m.written_chunks,
            dir.display(),
            m.copied,
            format_size(m.copied_bytes),
            m.already_there
        );
    }
    outln!(
        "suspended {}@{}; on the next host:\n  roamdisk resume {}@{} --session DIR{} --socket /tmp/vm.sock{}",
        c.catalog,
        short(&c.version),
        c.catalog,
        short(&c.version),
        media
            .map(|d| format!(" --lookaside {}", d.display()))
            .unwrap_or_default(),
        if s.live.is_some() {
            " --qmp /tmp/vm.qmp  (QEMU with -incoming defer)"
        } else {
            ""
        }
    );
}
