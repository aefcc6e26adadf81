//! Resuming a (suspended) version on this host (ISR): [`resume`] creates a
//! session of it — its package taken from the resume set when the media
//! hold it, so only the catalog crosses the network before the disk can be
//! served — or reopens the one already in the folder, writes its memory
//! image and configuration for the VMM, and starts fetching the chunks its
//! last session read, in the order it read them, from the host's shared
//! cache, lookaside media, then the store. The caller serves the session
//! at once and reports when the working set is here ([`Resumed::report`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use roamdisk_blockdev::{BlockDev, Progress, Registry, Result, WriteFlags, ZeroFlags};
use roamdisk_chunkstore::error::{bad_arg, context};
use roamdisk_chunkstore::repo::{check_rev, resolve};
use roamdisk_chunkstore::store::DynStore;
use serde::Serialize;

use crate::cache::SharedChoice;
use crate::fetch::GatherStats;
use crate::session::dev::{CasDev, PrefetchStatus, SessionOpen};
use crate::session::NewSession;
use crate::view::VersionView;

/// What to resume, and where.
#[derive(Debug, Clone, Default)]
pub struct ResumeOptions {
    /// `USER/IMAGE[@REV]`.
    pub version: String,
    /// The session folder: created, or a session already on the version.
    pub session: PathBuf,
    /// A new session: where it commits, its cache, its store (the media
    /// are `lookaside`). The target defaults to the image resumed.
    pub new: NewSession,
    /// Lookaside media tried before the store.
    pub lookaside: Vec<PathBuf>,
    /// The store and key overrides for opening the session.
    pub open: SessionOpen,
    pub shared_cache: SharedChoice,
    /// Write the memory image here.
    pub memory_out: Option<PathBuf>,
    /// Write the VM configuration file here.
    pub config_out: Option<PathBuf>,
}

/// The session as served while a lazy resume is under way: writes made
/// durable before they are acknowledged (FUA) while `on`. The VM's memory
/// is then split between QEMU and the `resume` process; if that process
/// dies, its replacement opens the session again and QEMU's NBD client
/// reconnects and goes on — it would not know that writes acknowledged
/// since its last flush died with the process, and its file system would
/// break. Written through, none is lost.
pub struct WriteThrough {
    next: Arc<dyn BlockDev>,
    pub on: Arc<AtomicBool>,
}

impl WriteThrough {
    pub fn new(next: Arc<dyn BlockDev>) -> WriteThrough {
        WriteThrough {
            next,
            on: Arc::new(AtomicBool::new(false)),
        }
    }
    fn fua(&self, fua: bool) -> bool {
        fua || self.on.load(Ordering::Acquire)
    }
}

impl BlockDev for WriteThrough {
    roamdisk_blockdev::layer!("write-through", next);
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.next.write_at(
            buf,
            off,
            WriteFlags {
                fua: self.fua(flags.fua),
            },
        )
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.next.trim(
            off,
            len,
            WriteFlags {
                fua: self.fua(flags.fua),
            },
        )
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.next.write_zeroes(
            off,
            len,
            ZeroFlags {
                fua: self.fua(flags.fua),
                ..flags
            },
        )
    }
}

/// A resumed session, its working set being fetched.
pub struct Resumed {
    pub dev: Arc<CasDev>,
    /// What to serve: the session, written through while a lazy resume
    /// is under way.
    pub served: Arc<WriteThrough>,
    /// `USER/IMAGE` resumed.
    pub name: String,
    /// The memory image's bytes by source.
    pub memory: GatherStats,
    /// The working-set fetch, as it goes.
    pub working_set: Arc<Mutex<PrefetchStatus>>,
    started: Instant,
}

/// What a resume did, for `--json` and the report.
#[derive(Debug, Clone, Serialize)]
pub struct ResumeReport {
    pub version: String,
    pub session: PathBuf,
    /// Memory image bytes by source.
    pub memory: GatherStats,
    /// The working set: chunks that had to come, and by source.
    pub working_set: PrefetchStatus,
    /// Chunks lookaside media had but failed verification (damaged or
    /// stale media), fetched elsewhere instead.
    pub lookaside_rejected: u64,
    /// Distinct chunks of the version in the shared cache, and in all.
    pub hoard_cached: u64,
    pub hoard_chunks: u64,
    pub seconds: f64,
}

/// Resume `o.version` from `store` into `o.session`.
pub fn resume(
    store: &DynStore,
    key: Option<&[u8; 32]>,
    o: &ResumeOptions,
    registry: &Registry,
) -> Result<Resumed> {
    let started = Instant::now();
    check_rev(&o.version)?;
    let (name, entry) = resolve(&**store, &o.version)?;
    let existing = o.session.join("session.toml").exists();
    if !existing {
        let (view, package) =
            VersionView::open_with_package(store.clone(), entry.version, key, &o.lookaside)
                .map_err(|e| {
                    context(e, format!("cannot resume {name}@{}", entry.version.short()))
                })?;
        let mut new = o.new.clone();
        if new.target.is_empty() {
            new.target = name.clone();
        }
        new.lookaside = o.lookaside.clone();
        crate::session::create_on(&o.session, &view, &package, &new)?;
    }
    let open = SessionOpen {
        shared_cache: o.shared_cache.clone(),
        // A new session keeps its media in session.toml.
        lookaside: if existing {
            o.lookaside.clone()
        } else {
            Vec::new()
        },
        ..o.open.clone()
    };
    let dev = Arc::new(CasDev::open(&o.session, &open, registry)?);
    let view = dev.base();
    if view.id != entry.version {
        return Err(bad_arg(format!(
            "{} holds a session on version {}, not {name}@{}: resume into a new folder, or commit and remove that session",
            o.session.display(),
            view.id.short(),
            entry.version.short()
        )));
    }
    let working_set = dev.start_prefetch();
    dev.start_readahead();
    if let Some(p) = &o.config_out {
        std::fs::write(p, &view.version.config)
            .map_err(|e| roamdisk_chunkstore::error::io(roamdisk_blockdev::Op::Write, e, p))?;
    }
    let memory = match &o.memory_out {
        Some(p) => write_file(p, |f| crate::checkout::write_memory(&view, f))?,
        None => GatherStats::default(),
    };
    let served = Arc::new(WriteThrough::new(dev.clone()));
    Ok(Resumed {
        dev,
        served,
        name,
        memory,
        working_set,
        started,
    })
}

/// Create `path`, fill it with `fill`, make it durable.
fn write_file<T>(path: &Path, fill: impl FnOnce(&mut std::fs::File) -> Result<T>) -> Result<T> {
    let io = |e| roamdisk_chunkstore::error::io(roamdisk_blockdev::Op::Write, e, path);
    let mut f = std::fs::File::create(path).map_err(io)?;
    let r = fill(&mut f)?;
    f.sync_all().map_err(io)?;
    Ok(r)
}

impl Resumed {
    /// Wait until the working set is here, showing its progress.
    pub fn wait(&self, progress: &dyn Progress) -> PrefetchStatus {
        let now = || self.working_set.lock().clone();
        progress.phase("fetching the working set", now().bytes);
        loop {
            let s = now();
            progress.set(s.got.bytes);
            if s.done {
                progress.end();
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The report, once the working set `ws` is here.
    pub fn report(&self, ws: PrefetchStatus) -> ResumeReport {
        let view = self.dev.base();
        let ids = view.chunk_ids();
        let cached = match view.shared_cache() {
            Some(sc) => sc
                .contains_many(&ids)
                .map(|v| v.iter().filter(|x| **x).count())
                .unwrap_or(0) as u64,
            None => 0,
        };
        ResumeReport {
            version: view.id.to_hex(),
            session: self.dev.dir().to_path_buf(),
            memory: self.memory,
            working_set: ws,
            lookaside_rejected: view.lookaside().map(|l| l.stats().bad).unwrap_or(0),
            hoard_cached: cached,
            hoard_chunks: ids.len() as u64,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}
