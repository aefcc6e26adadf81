//! Suspending a session (ISR): [`suspend`] commits its useful updates with
//! its memory image and recorded working set, and writes the *resume set*
//! — what the session needs first on the next host — the version's memory image and the chunks of its recorded
//! working set, in order — written to a portable folder (a USB key) as a
//! chunk-store folder. On the next host it is a lookaside medium: every
//! object is verified against its id when read, so a stale or damaged
//! copy costs only the time to fetch what it fails to give.
//!
//! The folder is an ordinary local store with the source store's settings
//! (so objects are copied as stored, compressed or encrypted, never
//! decoded), plus the version package itself.

use roamdisk_chunkstore::store::prelude::*;
use std::path::{Path, PathBuf};

use roamdisk_chunkstore::commit::CommitSummary;

use crate::session::dev::SessionOpen;
use crate::session::update::{commit_session, open_to_commit, UpdateOptions};

use rayon::prelude::*;
use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use crate::view::{VersionView, GATHER_BATCH};
use roamdisk_chunkstore::error::context;
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::store::local::LocalStore;

/// What [`write_resume_set`] wrote.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ResumeSetSummary {
    pub version: String,
    /// Memory-image chunks and working-set chunks (distinct, non-zero).
    pub memory_chunks: u64,
    pub working_set_chunks: u64,
    /// Disk chunks the version has and its parent did not (what the guest
    /// wrote), not already counted above: with them the medium carries
    /// the session, so the next host reads them with no network.
    pub written_chunks: u64,
    /// Objects copied (the version package included) and their stored
    /// bytes; objects the folder already held are not copied again.
    pub copied: u64,
    pub copied_bytes: u64,
    pub already_there: u64,
}

/// The resume set's objects, in the order a resume needs them: the
/// version package, the memory image, the working set, then the disk
/// chunks new since `parent` (the version it was committed on, if known).
/// Returns them with the counts of each kind after the package.
pub fn resume_set_ids(
    view: &VersionView,
    parent: Option<&VersionView>,
) -> (Vec<ChunkId>, [u64; 3]) {
    let mut seen = std::collections::HashSet::new();
    let mut ids = vec![view.id];
    seen.insert(view.id);
    let mut take = |it: &mut dyn Iterator<Item = ChunkId>| -> u64 {
        let before = ids.len();
        ids.extend(it.filter(|id| !id.is_zero() && seen.insert(*id)));
        (ids.len() - before) as u64
    };
    let m = take(&mut view.memory_chunks().into_iter().map(|w| w.id));
    let idx = &view.version.index;
    let w = take(
        &mut view
            .version
            .working_set
            .iter()
            .map(|&c| idx.ids[c as usize]),
    );
    let written = match parent {
        Some(p) => {
            let old: std::collections::HashSet<ChunkId> =
                p.version.index.ids.iter().copied().collect();
            take(&mut idx.ids.iter().copied().filter(|id| !old.contains(id)))
        }
        None => 0,
    };
    (ids, [m, w, written])
}

/// Copy the resume set of `view` from its store into the folder `dir`
/// (created as a chunk store with the same settings if it holds none).
/// Each object is verified before it is written; the folder is synced
/// before this returns.
pub fn write_resume_set(
    view: &VersionView,
    parent: Option<&VersionView>,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<ResumeSetSummary> {
    let store = view.store();
    let media = LocalStore::open(dir, Some(store.config()))
        .map_err(|e| context(e, format!("the resume-set folder {}", dir.display())))?;
    if media.config() != store.config() {
        return Err(roamdisk_chunkstore::error::bad_arg(format!(
            "{} is a chunk store with other settings than {}: give an empty folder",
            dir.display(),
            store.describe()
        )));
    }
    let (ids, [memory_chunks, working_set_chunks, written_chunks]) = resume_set_ids(view, parent);
    let mut s = ResumeSetSummary {
        version: view.id.to_hex(),
        memory_chunks,
        working_set_chunks,
        written_chunks,
        ..Default::default()
    };
    let codec = store.config().codec();
    progress.items("writing the resume set", ids.len() as u64);
    for batch in ids.chunks(GATHER_BATCH) {
        let have = media.has_many(batch, false)?;
        let want: Vec<ChunkId> = batch
            .iter()
            .zip(&have)
            .filter(|(_, h)| !**h)
            .map(|(id, _)| *id)
            .collect();
        s.already_there += (batch.len() - want.len()) as u64;
        let raw = store.get_many(&want);
        let objects: Vec<Vec<u8>> = want
            .par_iter()
            .zip(raw)
            .map(|(id, r)| {
                let ctx = |e| context(e, format!("object {id} of the resume set"));
                let obj = r.map_err(ctx)?;
                // Keys are not needed to check an object against its name.
                codec.verify(id, &obj).map_err(ctx)?;
                Ok(obj)
            })
            .collect::<Result<_>>()?;
        let items: Vec<(ChunkId, &[u8])> = want
            .iter()
            .copied()
            .zip(objects.iter().map(Vec::as_slice))
            .collect();
        media.put_many(&items)?;
        s.copied += items.len() as u64;
        s.copied_bytes += objects.iter().map(|o| o.len() as u64).sum::<u64>();
        progress.advance(batch.len() as u64);
    }
    media.sync()?;
    Ok(s)
}

/// What [`suspend`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Suspended {
    pub commit: CommitSummary,
    /// Chunks of the new version's recorded working set, and their size.
    pub working_set_chunks: usize,
    pub chunk_size: u32,
    /// The resume set written, if asked for.
    pub resume_set: Option<ResumeSetSummary>,
    /// A live suspend ([`suspend_live`]): the VM's state taken.
    pub live: Option<crate::live::Saved>,
}

/// Suspend the session in `dir`: commit its useful updates (`update`
/// carries the memory image and configuration), then, with `to_media`,
/// write the new version's resume set there.
pub fn suspend(
    dir: &Path,
    open: &SessionOpen,
    update: &UpdateOptions,
    to_media: Option<&Path>,
    registry: &roamdisk_blockdev::Registry,
    progress: &dyn Progress,
) -> Result<Suspended> {
    let dev = open_to_commit(dir, open, registry)?;
    let parent = dev.base();
    let commit = commit_session(&dev, update, &crate::guest::FsmetaAnalyzer, progress)?;
    let view = dev.base();
    let resume_set = match to_media {
        Some(m) => Some(write_resume_set(&view, Some(&parent), m, progress)?),
        None => None,
    };
    Ok(Suspended {
        commit,
        working_set_chunks: view.version.working_set.len(),
        chunk_size: view.version.index.chunk_size,
        resume_set,
        live: None,
    })
}

/// A live suspend's own settings.
#[derive(Debug, Clone, Default)]
pub struct LiveSuspend {
    /// QEMU's QMP socket.
    pub qmp: PathBuf,
    /// The memory image's chunk size (0: the default,
    /// [`crate::memory::build::DEFAULT_CHUNK`]).
    pub memory_chunk_size: u32,
}

/// Suspend the running VM behind the QMP socket `live.qmp` and its
/// session in `dir` — after its own memory has all arrived, if it was
/// resumed lazily: stop the VM and store its migration stream as a page
/// image (straight into the session's store, chunk by chunk; the memory
/// working set its last lazy resume recorded kept with it), have QEMU quit
/// (it flushes and closes the disk), end the process serving the session,
/// then [`suspend`] with that memory image. If the VM's state cannot be
/// stored, nothing is committed and the VM runs on.
#[allow(
    clippy::too_many_arguments,
    reason = "suspend's arguments and the live settings"
)]
pub fn suspend_live(
    dir: &Path,
    open: &SessionOpen,
    update: &UpdateOptions,
    live: &LiveSuspend,
    to_media: Option<&Path>,
    registry: &roamdisk_blockdev::Registry,
    progress: &dyn Progress,
) -> Result<Suspended> {
    use crate::live::{end_server, save_vm};
    use crate::qemu::vmm;
    use std::time::Duration;
    let (store, base) = crate::session::dev::peek(dir, open)?;
    let idx = &base.index;
    let mut q = roamdisk_qmp::Qmp::connect(&live.qmp, Duration::from_secs(5)).map_err(vmm)?;
    crate::live::wait_incoming(&mut q, progress)?;
    // The uploader's lease keeps the memory image's chunks from a gc
    // until the version names them.
    let mut up = roamdisk_chunkstore::upload::Uploader::begin(&*store, idx.encrypted())?;
    let chunk_size = match live.memory_chunk_size {
        0 => crate::memory::build::DEFAULT_CHUNK,
        c => c,
    };
    let mut saved = save_vm(&mut q, &mut up, chunk_size, idx.encrypted(), progress)?;
    // The store still takes requests (else the VM runs on: nothing lost).
    if let Err(e) = up.confirm_lease() {
        let back = crate::live::continue_vm(&mut q);
        return Err(context(
            e,
            format!(
                "the store failed after the VM's state was taken; nothing was committed and {back}"
            ),
        ));
    }
    // The VM must not run on here: its disk is committed next.
    q.quit().map_err(|e| {
        context(
            vmm(e),
            "the VM's state is stored but QEMU did not quit: quit it (it must not run on), then commit the session (`roamdisk suspend DIR` without --qmp; the state taken is not kept)",
        )
    })?;
    // From here QEMU is gone: a failure keeps the disk (the session) but
    // not the VM's state, and says so.
    let lost = |e| {
        context(
            e,
            format!(
                "QEMU has quit and the suspend did not finish: the session {} keeps the disk (commit it with `roamdisk suspend {}`), the VM's memory is lost (boot it again)",
                dir.display(),
                dir.display()
            ),
        )
    };
    let server_ended =
        end_server(dir, Duration::from_secs(2), Duration::from_secs(120)).map_err(lost)?;
    let mut pages = saved.pages.take().expect("a live suspend takes the pages");
    pages.working_set = crate::memory::workset::carried(dir, &pages, base.pages.as_ref());
    saved.working_set_chunks = pages.working_set.len();
    let mut u = update.clone();
    u.commit.memory = Some(roamdisk_chunkstore::commit::MemoryImage::Pages {
        pages: Box::new(pages),
        stats: saved.upload,
    });
    let mut s = suspend(dir, open, &u, to_media, registry, progress).map_err(lost)?;
    drop(up);
    // Kept in the version now: a later suspend of this session carries
    // the version's own unless a new lazy resume records another.
    let _ = std::fs::remove_file(dir.join(crate::memory::workset::FILE));
    s.live = Some(crate::live::Saved {
        server_ended,
        ..saved
    });
    Ok(s)
}
