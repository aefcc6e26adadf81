//! A chunk store in a local directory (the embedded default).
//!
//! ```text
//! STORE/store.toml          settings (hash, compression, quota)
//! STORE/packs/NAME.pack     objects stored together: a commit's chunks
//! STORE/objects/4e/4e11…    objects stored one at a time, a file each,
//!                           named by its hex id, under a folder named by
//!                           the first two digits
//! STORE/refs/USER/IMAGE     catalogs (compare-and-swap under refs/.lock)
//! STORE/leases/ID           commits in progress
//! STORE/tmp/                objects being written
//! STORE/trash/              objects and packs a running gc is about to delete
//! ```
//!
//! A group of objects (a put group, or a `put_many` of more than one) is
//! written as packs (`packs.rs`, one per writing thread): each an unnamed
//! file, made durable, then named. A single object is a file of its own: written to an unnamed file
//! in its folder (`O_TMPFILE`; a named file in `tmp/` where the file
//! system has none), made durable, then given its name (a link that fails
//! if the name exists). The folders that received names are fsynced by
//! [`ChunkWrite::sync`] before any version refers to them. Details and the
//! crash argument: `docs/formats/cas-store.md`.

mod packs;

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, IoSlice, Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use roamdisk_blockdev::durable::{rename_noreplace, sync_dir, Renamed};
use roamdisk_blockdev::{ErrorKind, Op, Result};
use rustix::fs::{AtFlags, RenameFlags, Timespec, Timestamps, CWD, UTIME_NOW, UTIME_OMIT};

use super::{
    check_ref_name, config, ref_tag, ChunkPrune, ChunkRead, ChunkWrite, Lease, LeaseStore,
    ObjectEntry, ObjectParts, PutGroup, PutOutcome, RefStore, StoreConfig, StoreLayer,
};
use crate::error::{err, io, not_found};
use crate::hash::ChunkId;
use crate::store::pack::is_pack_name;
use packs::{PackGroup, PackTable};

const LEASE_MAGIC: &str = "roamdisk-lease 1";

/// Fan-out folders under `objects/`: one per first byte of an id.
const FANS: usize = 256;

/// How long a fan-out folder found absent is taken as absent by lookups.
const FAN_ABSENT_MEMO_MS: u64 = 1000;

/// Objects written (and kept open) before the group is made durable and
/// named: bounds the open files of one `put_many`.
const GROUP: usize = 128;

/// How an unnamed (`O_TMPFILE`) file is given its name, found on first use.
const NAMING_UNKNOWN: u8 = 0;
/// `linkat(fd, "", AT_EMPTY_PATH)` (Linux ≥ 6.10 for the file's opener, or
/// `CAP_DAC_READ_SEARCH`).
const NAMING_EMPTY_PATH: u8 = 1;
/// `linkat("/proc/self/fd/N", AT_SYMLINK_FOLLOW)`.
const NAMING_PROC: u8 = 2;
/// No `O_TMPFILE` here: named temporary files in `tmp/`, renamed.
const NAMING_TMP_DIR: u8 = 3;

/// A store in a directory.
pub struct LocalStore {
    root: PathBuf,
    config: StoreConfig,
    /// Folders other than the fan-out ones that received a name since the
    /// last `sync` (`objects/` when a fan-out folder was created).
    dirty_dirs: Mutex<HashSet<PathBuf>>,
    /// Fan-out folders that received a name since the last `sync`.
    dirty_fans: [AtomicBool; FANS],
    /// When a lookup last found a fan-out folder absent (ms since `opened`,
    /// plus one; 0: not known absent). New stores make their fan-out
    /// folders only for loose objects, so a commit's lookups would
    /// otherwise fail one `open` per chunk.
    fan_absent: [AtomicU64; FANS],
    opened: std::time::Instant,
    /// Fan-out folders, opened once: objects are created, named, touched
    /// and looked up relative to them (no walk of the whole path each time).
    fans: Mutex<Vec<Option<Arc<OwnedFd>>>>,
    /// One of the `NAMING_*` values.
    naming: AtomicU8,
    seq: AtomicU64,
    pid: u32,
    /// Where each packed object is.
    packs: PackTable,
    /// The `packs/` folder, opened once.
    packs_fd: Mutex<Option<Arc<OwnedFd>>>,
    /// The layout version `store.toml` declares (1: no packs yet).
    layout: AtomicU32,
    /// Held while `store.toml` is rewritten for a new layout version.
    layout_lock: Mutex<()>,
}

/// A file being written that has no name yet: unnamed (`O_TMPFILE`), or
/// a named temporary file in `tmp/` where the file system has no unnamed
/// files — removed on drop unless it was renamed into place (`tmp` set to
/// `None` then).
struct Unnamed {
    file: File,
    tmp: Option<PathBuf>,
}

impl Drop for Unnamed {
    fn drop(&mut self) {
        if let Some(t) = &self.tmp {
            let _ = fs::remove_file(t);
        }
    }
}

/// A new unnamed file (`O_TMPFILE`) in the folder `dir`.
fn open_unnamed(dir: &OwnedFd) -> rustix::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map(File::from)
}

/// A loose object written to an [`Unnamed`] file, not yet durable or named.
struct Pending {
    fan: usize,
    f: Unnamed,
}

/// Write `parts` back to back at `offset` with vectored writes.
fn pwrite_parts(f: &File, parts: &[&[u8]; 2], mut offset: u64) -> std::io::Result<()> {
    let mut slices = [IoSlice::new(parts[0]), IoSlice::new(parts[1])];
    let mut bufs = &mut slices[..];
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match rustix::io::pwritev(f, bufs, offset) {
            Ok(0) => return Err(std::io::Error::from(IoKind::WriteZero)),
            Ok(n) => {
                IoSlice::advance_slices(&mut bufs, n);
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether an opened folder has been removed (no entry can be made in it).
fn dir_removed(dir: &OwnedFd) -> bool {
    rustix::fs::fstat(dir).is_ok_and(|st| st.st_nlink == 0)
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

fn write_file_durably(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(tmp, path)
}

fn touch(path: &Path) -> std::io::Result<()> {
    touch_at(CWD, path)
}

/// Set the modification time of `dir/name` to now.
fn touch_at<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> std::io::Result<()> {
    let t = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
    };
    rustix::fs::utimensat(dir, name, &t, AtFlags::empty()).map_err(std::io::Error::from)
}

impl LocalStore {
    /// Open the store at `root`; with `create`, make a new one there if
    /// the directory has no store yet.
    pub fn open(root: &Path, create: Option<&StoreConfig>) -> Result<LocalStore> {
        let cfg_path = root.join("store.toml");
        let text = match fs::read_to_string(&cfg_path) {
            Ok(t) => t,
            Err(e) if e.kind() == IoKind::NotFound => match create {
                Some(c) => {
                    Self::init(root, c)?;
                    fs::read_to_string(&cfg_path).map_err(|e| io(Op::Open, e, &cfg_path))?
                }
                None => {
                    return Err(not_found(format!(
                        "no chunk store at {}: create one with `roamdisk store init {}`",
                        root.display(),
                        root.display()
                    )))
                }
            },
            Err(e) => return Err(io(Op::Open, e, &cfg_path)),
        };
        let (config, layout) =
            StoreConfig::parse_versioned(&text).map_err(|e| e.path(&cfg_path))?;
        for d in ["objects", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        Ok(LocalStore {
            root: root.to_path_buf(),
            config,
            dirty_dirs: Mutex::new(HashSet::new()),
            dirty_fans: std::array::from_fn(|_| AtomicBool::new(false)),
            fan_absent: std::array::from_fn(|_| AtomicU64::new(0)),
            opened: std::time::Instant::now(),
            fans: Mutex::new(vec![None; FANS]),
            naming: AtomicU8::new(NAMING_UNKNOWN),
            seq: AtomicU64::new(0),
            pid: std::process::id(),
            packs: PackTable::default(),
            packs_fd: Mutex::new(None),
            layout: AtomicU32::new(layout),
            layout_lock: Mutex::new(()),
        })
    }

    /// Before the first pack of a store written by an older build gets a
    /// name: rewrite `store.toml` (same settings) with the layout version
    /// that has packs, durably, so older builds refuse the store rather
    /// than miss its packed objects.
    fn upgrade_layout(&self) -> Result<()> {
        if self.layout.load(Ordering::Acquire) >= config::VERSION {
            return Ok(());
        }
        let _held = self.layout_lock.lock();
        if self.layout.load(Ordering::Acquire) >= config::VERSION {
            return Ok(());
        }
        let cfg_path = self.root.join("store.toml");
        let tmp = self.tmp_path("store.toml");
        write_file_durably(&cfg_path, &tmp, self.config.to_toml().as_bytes())
            .and_then(|()| sync_dir(&self.root))
            .map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io(Op::Write, e, &cfg_path).msg("cannot record the pack layout in store.toml")
            })?;
        self.layout.store(config::VERSION, Ordering::Release);
        Ok(())
    }

    /// Remember that `dir` received a name (fsynced by the next `sync`).
    fn mark_dirty(&self, dir: PathBuf) {
        self.dirty_dirs.lock().insert(dir);
    }

    /// Create a new, empty store. Fails if `root` already holds one.
    pub fn init(root: &Path, config: &StoreConfig) -> Result<()> {
        let cfg_path = root.join("store.toml");
        if cfg_path.exists() {
            return Err(err(
                ErrorKind::InvalidArgument,
                Op::Open,
                format!("{} already holds a chunk store", root.display()),
            ));
        }
        fs::create_dir_all(root).map_err(|e| io(Op::Open, e, root))?;
        // Fan-out folders are made when an object first needs one.
        for d in ["objects", "packs", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        let tmp = root.join("tmp").join("store.toml");
        let _ = fs::remove_file(&tmp);
        write_file_durably(&cfg_path, &tmp, config.to_toml().as_bytes())
            .map_err(|e| io(Op::Write, e, &cfg_path))?;
        sync_dir(root).map_err(|e| io(Op::Write, e, root))?;
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where an object lives.
    pub fn object_path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join("objects").join(&hex[..2]).join(hex)
    }

    fn trash_path(&self, id: &ChunkId) -> PathBuf {
        self.root.join("trash").join(id.to_hex())
    }

    fn tmp_path(&self, what: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{what}.{}.{n}", self.pid))
    }

    fn ref_path(&self, name: &str) -> Result<PathBuf> {
        check_ref_name(name)?;
        Ok(self.root.join("refs").join(name))
    }

    /// Put back an object a crashed (or concurrent) gc moved aside, and
    /// refresh its time. True if it is now in place.
    fn restore_from_trash(&self, id: &ChunkId) -> Result<bool> {
        let t = self.trash_path(id);
        let p = self.object_path(id);
        if !t.exists() {
            return Ok(false);
        }
        // Its folder may not exist (yet, or any more).
        let dir = p.parent().expect("fan-out folder");
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(|e| io(Op::Write, e, dir))?;
            self.mark_dirty(self.root.join("objects"));
        }
        let r = rename_noreplace(&t, &p).map_err(|e| io(Op::Write, e, &t))?;
        if r == Renamed::SourceMissing {
            return Ok(false);
        }
        if r == Renamed::Moved || p.exists() {
            let _ = touch(&p);
            if let Some(dir) = p.parent() {
                self.dirty_dirs.lock().insert(dir.to_path_buf());
            }
            return Ok(p.exists());
        }
        Ok(false)
    }

    /// The fan-out folder of ids starting with byte `fan`, opened once.
    /// With `create`, a missing folder is made (and `objects/` marked for
    /// the next `sync`).
    fn fan_dir(&self, fan: usize, create: bool) -> std::io::Result<Arc<OwnedFd>> {
        let now = self.opened.elapsed().as_millis() as u64 + 1;
        let absent = self.fan_absent[fan].load(Ordering::Relaxed);
        if !create && absent != 0 && now - absent < FAN_ABSENT_MEMO_MS {
            // Found absent a moment ago: a lookup misses (another process
            // may have made it since; a commit then stores a second copy).
            return Err(std::io::Error::from(IoKind::NotFound));
        }
        let mut fans = self.fans.lock();
        if let Some(fd) = &fans[fan] {
            return Ok(fd.clone());
        }
        let dir = self.root.join("objects").join(format!("{fan:02x}"));
        let fd = match open_dir(&dir) {
            Err(e) if e.kind() == IoKind::NotFound && !create => {
                self.fan_absent[fan].store(now, Ordering::Relaxed);
                return Err(e);
            }
            Err(e) if e.kind() == IoKind::NotFound && create => {
                fs::create_dir_all(&dir)?;
                self.dirty_dirs.lock().insert(self.root.join("objects"));
                open_dir(&dir)?
            }
            r => r?,
        };
        let fd = Arc::new(fd);
        fans[fan] = Some(fd.clone());
        self.fan_absent[fan].store(0, Ordering::Relaxed);
        Ok(fd)
    }

    /// Forget an opened fan-out folder (it was removed behind our back).
    fn forget_fan(&self, fan: usize) {
        self.fans.lock()[fan] = None;
    }

    /// Step 1 of a put: write the object to an unnamed file in its folder
    /// (`O_TMPFILE`), or to a named temporary file in `tmp/` where the file
    /// system has no unnamed files.
    fn write_unnamed(&self, id: &ChunkId, parts: &[&[u8]; 2]) -> std::io::Result<Pending> {
        let fan = id.0[0] as usize;
        if self.naming.load(Ordering::Relaxed) != NAMING_TMP_DIR {
            for attempt in 0..2 {
                let dir = self.fan_dir(fan, true)?;
                match open_unnamed(&dir) {
                    Ok(file) => {
                        pwrite_parts(&file, parts, 0)?;
                        return Ok(Pending {
                            fan,
                            f: Unnamed { file, tmp: None },
                        });
                    }
                    // The folder was removed since we opened it: again.
                    Err(rustix::io::Errno::NOENT) if attempt == 0 => self.forget_fan(fan),
                    Err(rustix::io::Errno::NOENT) => {
                        return Err(std::io::Error::from(IoKind::NotFound))
                    }
                    // No O_TMPFILE on this file system.
                    Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR) => {
                        self.naming.store(NAMING_TMP_DIR, Ordering::Relaxed);
                        break;
                    }
                    // Anything else: try a named file once.
                    Err(_) => break,
                }
            }
        }
        self.write_named(id, parts)
    }

    fn write_named(&self, id: &ChunkId, parts: &[&[u8]; 2]) -> std::io::Result<Pending> {
        let tmp = self.tmp_path("object");
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        let p = Pending {
            fan: id.0[0] as usize,
            f: Unnamed {
                file,
                tmp: Some(tmp),
            },
        };
        pwrite_parts(&p.f.file, parts, 0)?;
        Ok(p)
    }

    /// Give a durable unnamed file the name `name` in `dir`: true if it
    /// was named, false if the name exists, `None` if this system can
    /// name no unnamed file (no `AT_EMPTY_PATH` right, no `/proc`).
    fn link_unnamed(
        &self,
        dir: BorrowedFd<'_>,
        file: &File,
        name: &str,
    ) -> std::io::Result<Option<bool>> {
        use rustix::io::Errno;
        let mode = self.naming.load(Ordering::Relaxed);
        if mode == NAMING_UNKNOWN || mode == NAMING_EMPTY_PATH {
            match rustix::fs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
                Ok(()) => {
                    if mode == NAMING_UNKNOWN {
                        self.naming.store(NAMING_EMPTY_PATH, Ordering::Relaxed);
                    }
                    return Ok(Some(true));
                }
                Err(Errno::EXIST) => return Ok(Some(false)),
                // Not allowed here (older kernel without the capability).
                Err(Errno::NOENT | Errno::PERM | Errno::INVAL | Errno::ACCESS) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        match rustix::fs::linkat(CWD, proc_path.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW) {
            Ok(()) => {
                if mode != NAMING_PROC {
                    self.naming.store(NAMING_PROC, Ordering::Relaxed);
                }
                Ok(Some(true))
            }
            Err(Errno::EXIST) => Ok(Some(false)),
            Err(_) => Ok(None),
        }
    }

    /// Step 3 of a put: give a durable object its name unless the name
    /// exists (then touch the existing object, which has the same bytes).
    fn name_pending(&self, mut p: Pending, id: &ChunkId) -> std::io::Result<PutOutcome> {
        let name = id.to_hex();
        // A gc may move the existing object aside between the failed link
        // and the touch: then link again.
        for _ in 0..8 {
            let dir = self.fan_dir(p.fan, true)?;
            let named = match &p.f.tmp {
                None => self.link_unnamed(dir.as_fd(), &p.f.file, &name)?,
                Some(tmp) => {
                    match rustix::fs::renameat_with(CWD, tmp, &*dir, &name, RenameFlags::NOREPLACE)
                    {
                        Ok(()) => {
                            p.f.tmp = None;
                            Some(true)
                        }
                        Err(rustix::io::Errno::EXIST) => Some(false),
                        Err(rustix::io::Errno::NOENT) => None,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            let named = match named {
                Some(n) => n,
                None if dir_removed(&dir) => {
                    // The folder was removed since we opened it: make it
                    // again and retry.
                    self.forget_fan(p.fan);
                    continue;
                }
                None if p.f.tmp.is_none() => {
                    // Cannot name unnamed files here: copy it to a named
                    // temporary file and rename that.
                    self.naming.store(NAMING_TMP_DIR, Ordering::Relaxed);
                    let mut bytes = Vec::new();
                    (&p.f.file).seek(std::io::SeekFrom::Start(0))?;
                    (&p.f.file).read_to_end(&mut bytes)?;
                    p = self.write_named(id, &[&bytes, &[]])?;
                    p.f.file.sync_all()?;
                    continue;
                }
                None => return Err(std::io::Error::from(IoKind::NotFound)),
            };
            if named {
                self.dirty_fans[p.fan].store(true, Ordering::Relaxed);
                return Ok(PutOutcome::Stored);
            }
            match touch_at(&*dir, &name) {
                Ok(()) => return Ok(PutOutcome::Existed),
                Err(e) if e.kind() == IoKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::other(
            "the object kept vanishing while it was being stored (a gc running in a loop?)",
        ))
    }

    /// Store objects each as a file of its own (steps 1-3 of "Writing an
    /// object" in `docs/formats/cas-store.md`), in groups of [`GROUP`].
    fn put_loose(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        let mut out = Vec::with_capacity(items.len());
        for items in items.chunks(GROUP) {
            // 1. Write each to an unnamed file.
            let pending: Vec<(ChunkId, Pending)> = items
                .par_iter()
                .map(|(id, parts)| {
                    let p = self
                        .write_unnamed(id, parts)
                        .map_err(|e| self.put_error(id, e))?;
                    Ok((*id, p))
                })
                .collect::<Result<_>>()?;
            // 2. Make them all durable, 3. name each (in order).
            self.make_durable(&pending)?;
            let named: Vec<PutOutcome> = pending
                .into_par_iter()
                .map(|(id, p)| {
                    self.name_pending(p, &id)
                        .map_err(|e| self.put_error(&id, e))
                })
                .collect::<Result<_>>()?;
            out.extend(named);
        }
        Ok(out)
    }

    /// remove-if-older of an object's own file (`None`: kept, or no such
    /// file).
    fn remove_loose_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        let p = self.object_path(id);
        let t = self.trash_path(id);
        // 1. Move aside: from here on a commit's touch finds no object and
        //    uploads it again (or restores it from the trash).
        if rename_noreplace(&p, &t).map_err(|e| io(Op::Write, e, &p))? != Renamed::Moved {
            return Ok(None);
        }
        // 2. Re-read its time: a touch that came before the move shows here.
        let m = match fs::metadata(&t) {
            Ok(m) => m,
            Err(e) if e.kind() == IoKind::NotFound => return Ok(None),
            Err(e) => return Err(io(Op::Read, e, &t)),
        };
        if m.modified().unwrap_or(UNIX_EPOCH) >= cutoff {
            let _ = rename_noreplace(&t, &p);
            let _ = fs::remove_file(&t);
            return Ok(None);
        }
        match fs::remove_file(&t) {
            Ok(()) => Ok(Some(m.len())),
            Err(e) if e.kind() == IoKind::NotFound => Ok(None),
            Err(e) => Err(io(Op::Write, e, &t)),
        }
    }

    /// Step 2 of a put: make a group of written objects durable. (On a
    /// journalling file system the first fsync of a group commits the
    /// others' new inodes and, in ordered mode, their data too, so the
    /// rest cost little. A pool of 16 fsync threads cost 7% more CPU on
    /// tmpfs and showed no gain above the noise of a shared disk.)
    fn make_durable(&self, pending: &[(ChunkId, Pending)]) -> Result<()> {
        pending
            .par_iter()
            .try_for_each(|(id, p)| p.f.file.sync_all().map_err(|e| self.put_error(id, e)))
    }

    fn put_error(&self, id: &ChunkId, e: std::io::Error) -> roamdisk_blockdev::Error {
        io(Op::Write, e, &self.object_path(id)).msg(format!("cannot store object {id}"))
    }

    fn refs_lock(&self) -> Result<File> {
        let p = self.root.join("refs").join(".lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| io(Op::Write, e, &p))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(Op::Write, e.into(), &p))?;
        Ok(f)
    }

    /// Total bytes of every stored object (used by the quota decorator).
    pub fn usage(&self) -> Result<u64> {
        let mut total = 0;
        self.list_objects(&mut |e| total += e.size)?;
        Ok(total)
    }
}

fn system_time_from_nanos(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n)
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl StoreLayer for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

impl ChunkRead for LocalStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        // Packs the table knows, then its own file, then packs written
        // since the table was loaded, then what a gc left in the trash.
        if let Some(v) = self.get_packed(id, false)? {
            return Ok(v);
        }
        let p = self.object_path(id);
        let read = |p: &Path| -> std::io::Result<Vec<u8>> {
            let mut f = File::open(p)?;
            let mut v = Vec::with_capacity(f.metadata().map(|m| m.len() as usize).unwrap_or(0));
            f.read_to_end(&mut v)?;
            Ok(v)
        };
        match read(&p) {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == IoKind::NotFound => {
                if let Some(v) = self.get_packed(id, true)? {
                    return Ok(v);
                }
                if self.restore_from_trash(id)? {
                    return read(&p).map_err(|e| io(Op::Read, e, &p));
                }
                if self.restore_pack_holding(id)? {
                    if let Some(v) = self.get_packed(id, true)? {
                        return Ok(v);
                    }
                }
                Err(not_found(format!(
                    "object {id} is missing from store {} (a damaged store, or a version whose chunks were removed)",
                    self.root.display()
                ))
                .path(&p))
            }
            Err(e) => Err(io(Op::Read, e, &p).msg(format!("cannot read object {id}"))),
        }
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        ids.par_iter().map(|id| self.get(id)).collect()
    }
    fn has_many(&self, ids: &[ChunkId], touch_found: bool) -> Result<Vec<bool>> {
        let packed = self.has_packed(ids, touch_found)?;
        ids.par_iter()
            .zip(packed)
            .map(|(id, packed)| {
                if packed {
                    return Ok(true);
                }
                let r = self.fan_dir(id.0[0] as usize, false).and_then(|dir| {
                    let name = id.to_hex();
                    if touch_found {
                        touch_at(&*dir, &name)
                    } else {
                        rustix::fs::statat(&*dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                            .map(|_| ())
                            .map_err(std::io::Error::from)
                    }
                });
                match r {
                    Ok(()) => Ok(true),
                    // Not in place: a commit uploads it again (an object a
                    // crashed gc left in the trash is not worth a lookup
                    // per missing object; readers and gc put it back).
                    Err(e) if e.kind() == IoKind::NotFound => Ok(false),
                    Err(e) => Err(io(Op::Read, e, &self.object_path(id))),
                }
            })
            .collect()
    }
}

impl ChunkWrite for LocalStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        let items: Vec<ObjectParts<'_>> = items.iter().map(|(id, b)| (*id, [*b, &[]])).collect();
        self.put_many_parts(&items)
    }
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        if items.len() < 2 {
            return self.put_loose(items);
        }
        // Objects stored together go into one pack; those the store has
        // are touched instead.
        let ids: Vec<ChunkId> = items.iter().map(|(id, _)| *id).collect();
        let have = self.has_many(&ids, true)?;
        let group = PackGroup::new(self);
        items
            .par_iter()
            .zip(&have)
            .filter(|(_, h)| !**h)
            .try_for_each(|((id, parts), _)| group.write(id, *parts))?;
        let mut stored: HashMap<ChunkId, PutOutcome> = HashMap::new();
        for (id, o) in Box::new(group).finish()? {
            stored.entry(id).or_insert(o);
        }
        Ok(items
            .iter()
            .zip(have)
            .map(|((id, _), h)| match h {
                true => PutOutcome::Existed,
                // A duplicate within `items` is stored once.
                false => stored
                    .insert(*id, PutOutcome::Existed)
                    .unwrap_or(PutOutcome::Existed),
            })
            .collect())
    }
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        Box::new(PackGroup::new(self))
    }
    fn cheap_lookups(&self) -> bool {
        true
    }
    fn sync(&self) -> Result<()> {
        let fans: Vec<usize> = (0..FANS)
            .filter(|&i| self.dirty_fans[i].swap(false, Ordering::Relaxed))
            .collect();
        fans.par_iter().try_for_each(|&i| {
            let p = self.root.join("objects").join(format!("{i:02x}"));
            let r = self
                .fan_dir(i, false)
                .and_then(|d| rustix::fs::fsync(&*d).map_err(std::io::Error::from));
            r.map_err(|e| {
                self.dirty_fans[i].store(true, Ordering::Relaxed);
                io(Op::Flush, e, &p)
            })
        })?;
        let dirs: Vec<PathBuf> = self.dirty_dirs.lock().drain().collect();
        // Fan-out folders first, then `objects/` (new folders' entries).
        let (top, fan): (Vec<_>, Vec<_>) = dirs
            .into_iter()
            .partition(|d| d == &self.root.join("objects"));
        fan.par_iter()
            .try_for_each(|d| sync_dir(d).map_err(|e| io(Op::Flush, e, d)))?;
        for d in top {
            sync_dir(&d).map_err(|e| io(Op::Flush, e, &d))?;
        }
        Ok(())
    }
}

impl ChunkPrune for LocalStore {
    fn now(&self) -> Result<SystemTime> {
        Ok(SystemTime::now())
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        let objects = self.root.join("objects");
        for fan in fs::read_dir(&objects).map_err(|e| io(Op::Read, e, &objects))? {
            let fan = fan.map_err(|e| io(Op::Read, e, &objects))?;
            let dir = fan.path();
            if !fan.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            for ent in fs::read_dir(&dir).map_err(|e| io(Op::Read, e, &dir))? {
                let ent = ent.map_err(|e| io(Op::Read, e, &dir))?;
                let Some(id) = ChunkId::from_hex(&ent.file_name().to_string_lossy()) else {
                    continue;
                };
                // The object may vanish under a concurrent gc.
                let Ok(m) = ent.metadata() else { continue };
                f(ObjectEntry {
                    id,
                    mtime: m.modified().unwrap_or(UNIX_EPOCH),
                    size: m.len(),
                });
            }
        }
        for e in self.list_packed()? {
            f(e);
        }
        Ok(())
    }
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        Ok(self.remove_many_if_older(&[*id], cutoff)?[0])
    }
    fn remove_many_if_older(
        &self,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<Vec<Option<u64>>> {
        let mut out = ids
            .iter()
            .map(|id| self.remove_loose_if_older(id, cutoff))
            .collect::<Result<Vec<_>>>()?;
        let packed = self.remove_packed_if_older(ids, cutoff)?;
        for (id, o) in ids.iter().zip(&mut out) {
            if let Some(n) = packed.get(id) {
                *o = Some(o.unwrap_or(0) + n);
            }
        }
        Ok(out)
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        let mut restored = 0;
        let trash = self.root.join("trash");
        for ent in fs::read_dir(&trash).map_err(|e| io(Op::Read, e, &trash))? {
            let ent = ent.map_err(|e| io(Op::Read, e, &trash))?;
            let name = ent.file_name().to_string_lossy().to_string();
            if let Some(id) = ChunkId::from_hex(&name) {
                if self.restore_from_trash(&id)? {
                    restored += 1;
                }
                let _ = fs::remove_file(ent.path());
            } else if is_pack_name(&name) {
                if let Some(n) = self.restore_pack(&name)? {
                    restored += n as u64;
                }
                let _ = fs::remove_file(ent.path());
            }
        }
        let mut removed = 0;
        let tmp = self.root.join("tmp");
        for ent in fs::read_dir(&tmp).map_err(|e| io(Op::Read, e, &tmp))? {
            let ent = ent.map_err(|e| io(Op::Read, e, &tmp))?;
            let old = ent
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| t < cutoff)
                .unwrap_or(false);
            if old && fs::remove_file(ent.path()).is_ok() {
                removed += 1;
            }
        }
        self.sync()?;
        Ok((restored, removed))
    }
}

impl RefStore for LocalStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let p = self.ref_path(name)?;
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == IoKind::NotFound => Ok(None),
            Err(e) => Err(io(Op::Read, e, &p)),
        }
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        let refs = self.root.join("refs");
        let mut out = Vec::new();
        for user in fs::read_dir(&refs).map_err(|e| io(Op::Read, e, &refs))? {
            let user = user.map_err(|e| io(Op::Read, e, &refs))?;
            if !user.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let un = user.file_name().to_string_lossy().to_string();
            for img in fs::read_dir(user.path()).map_err(|e| io(Op::Read, e, &user.path()))? {
                let img = img.map_err(|e| io(Op::Read, e, &refs))?;
                let name = format!("{un}/{}", img.file_name().to_string_lossy());
                if check_ref_name(&name).is_ok() {
                    out.push(name);
                }
            }
        }
        out.sort();
        Ok(out)
    }
    fn ref_update(
        &self,
        name: &str,
        expected: Option<ChunkId>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        let p = self.ref_path(name)?;
        let _lock = self.refs_lock()?;
        let current = self.ref_get(name)?;
        if current.as_deref().map(ref_tag) != expected {
            return Ok(false);
        }
        let dir = p.parent().expect("user folder");
        match new {
            Some(bytes) => {
                fs::create_dir_all(dir).map_err(|e| io(Op::Write, e, dir))?;
                let tmp = self.tmp_path("ref");
                write_file_durably(&p, &tmp, bytes).map_err(|e| {
                    let _ = fs::remove_file(&tmp);
                    io(Op::Write, e, &p).msg(format!("cannot write catalog {name}"))
                })?;
            }
            None => match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == IoKind::NotFound => {}
                Err(e) => return Err(io(Op::Write, e, &p)),
            },
        }
        sync_dir(dir).map_err(|e| io(Op::Flush, e, dir))?;
        let refs = self.root.join("refs");
        sync_dir(&refs).map_err(|e| io(Op::Flush, e, &refs))?;
        Ok(true)
    }
}

impl LeaseStore for LocalStore {
    fn lease_begin(&self) -> Result<Lease> {
        let mut r = [0u8; 12];
        crate::secret::fill_random(&mut r, "a lease id")?;
        let id: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let started = SystemTime::now();
        let p = self.root.join("leases").join(&id);
        let tmp = self.tmp_path("lease");
        let text = format!(
            "{LEASE_MAGIC}\nstarted {}\npid {}\n",
            nanos(started),
            std::process::id()
        );
        write_file_durably(&p, &tmp, text.as_bytes()).map_err(|e| io(Op::Write, e, &p))?;
        let d = self.root.join("leases");
        sync_dir(&d).map_err(|e| io(Op::Flush, e, &d))?;
        Ok(Lease {
            ended: false,
            id,
            started,
            refreshed: started,
        })
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let p = self.root.join("leases").join(id);
        touch(&p).map_err(|e| io(Op::Write, e, &p).msg(format!("lease {id} vanished (a gc took it for dead: its commit was idle longer than the lease timeout)")))
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let p = self.root.join("leases").join(id);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(()),
            Err(e) => Err(io(Op::Write, e, &p)),
        }
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        let d = self.root.join("leases");
        let mut out = Vec::new();
        for ent in fs::read_dir(&d).map_err(|e| io(Op::Read, e, &d))? {
            let ent = ent.map_err(|e| io(Op::Read, e, &d))?;
            let id = ent.file_name().to_string_lossy().to_string();
            let Ok(text) = fs::read_to_string(ent.path()) else {
                continue;
            };
            let Ok(m) = ent.metadata() else { continue };
            let refreshed = m.modified().unwrap_or(UNIX_EPOCH);
            let mut lines = text.lines();
            let started = if lines.next() == Some(LEASE_MAGIC) {
                lines
                    .find_map(|l| l.strip_prefix("started "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .map(system_time_from_nanos)
            } else {
                None
            };
            // An unreadable lease is treated as taken at its file time.
            out.push(Lease {
                ended: false,
                id,
                started: started.unwrap_or(refreshed).min(refreshed),
                refreshed,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fetch;

    /// A new store with the default settings in a temporary folder.
    pub(super) fn store() -> (tempfile::TempDir, LocalStore) {
        let d = tempfile::tempdir().unwrap();
        let s = LocalStore::open(&d.path().join("s"), Some(&StoreConfig::default())).unwrap();
        (d, s)
    }

    #[test]
    fn put_get_has_and_verify() {
        let (_d, s) = store();
        let sealed = s.config().codec().seal(&[5u8; 65536], false);
        let out = s.put_many(&[(sealed.id, &sealed.object)]).unwrap();
        assert_eq!(out, vec![PutOutcome::Stored]);
        let out = s.put_many(&[(sealed.id, &sealed.object)]).unwrap();
        assert_eq!(out, vec![PutOutcome::Existed]);
        s.sync().unwrap();
        assert_eq!(fetch(&s, &sealed.id, None).unwrap(), vec![5u8; 65536]);
        let other = ChunkId([9; 32]);
        assert_eq!(
            s.has_many(&[sealed.id, other], true).unwrap(),
            vec![true, false]
        );
        let e = fetch(&s, &other, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains(&other.to_hex()));
        // Corrupt it on disk: the read names the chunk and fails.
        let p = s.object_path(&sealed.id);
        let mut b = fs::read(&p).unwrap();
        let n = b.len();
        b[n - 1] ^= 1;
        fs::write(&p, b).unwrap();
        let e = fetch(&s, &sealed.id, None).unwrap_err().to_string();
        assert!(
            e.contains(&sealed.id.to_hex()) && e.contains("corrupt"),
            "{e}"
        );
    }

    #[test]
    fn grouped_puts_from_parts_name_every_object_once() {
        let (_d, s) = store();
        let codec = s.config().codec();
        let datas: Vec<Vec<u8>> = (0..(GROUP as u32 * 2 + 7))
            .map(|i| i.to_le_bytes().repeat(300))
            .collect();
        let headers: Vec<_> = datas.iter().map(|d| codec.plain_header(d.len())).collect();
        let ids: Vec<ChunkId> = datas.iter().map(|d| codec.hash.hash(d)).collect();
        // Some already stored: they are reported as existing, not rewritten.
        let old: Vec<_> = (0..datas.len())
            .step_by(5)
            .map(|i| codec.seal_plain(ids[i], &datas[i]))
            .collect();
        for o in &old {
            s.put_many(&[(o.id, o.object.as_slice())]).unwrap();
        }
        let items: Vec<ObjectParts<'_>> = (0..datas.len())
            .map(|i| (ids[i], [&headers[i][..], &datas[i][..]]))
            .collect();
        let out = s.put_many_parts(&items).unwrap();
        for (i, o) in out.iter().enumerate() {
            let want = if i % 5 == 0 {
                PutOutcome::Existed
            } else {
                PutOutcome::Stored
            };
            assert_eq!(*o, want, "object {i}");
        }
        s.sync().unwrap();
        // The new ones went into packs (one per writing thread at most),
        // each object byte for byte what a file of its own would hold.
        let packs = fs::read_dir(s.root().join("packs")).unwrap().count();
        assert!(
            (1..=rayon::current_num_threads()).contains(&packs),
            "{packs}"
        );
        let again = LocalStore::open(s.root(), None).unwrap();
        for (i, d) in datas.iter().enumerate() {
            assert_eq!(&fetch(&again, &ids[i], None).unwrap(), d);
            assert_eq!(s.object_path(&ids[i]).exists(), i % 5 == 0, "object {i}");
            if i % 5 != 0 {
                let raw = again.get(&ids[i]).unwrap();
                assert_eq!(raw, [&headers[i][..], &d[..]].concat(), "object {i}");
            }
        }
        assert_eq!(fs::read_dir(s.root().join("tmp")).unwrap().count(), 0);
        // A single object is a file of its own; a fan-out folder removed
        // behind the store's back is made again.
        let lone = codec.seal(b"lone", false);
        let fan = s.object_path(&ids[0]);
        fs::remove_dir_all(fan.parent().unwrap()).unwrap();
        let lone_items = [(lone.id, [&lone.object[..], &[][..]])];
        assert_eq!(
            s.put_many_parts(&lone_items).unwrap(),
            vec![PutOutcome::Stored]
        );
        s.sync().unwrap();
        assert!(s.object_path(&lone.id).exists());
        assert_eq!(fetch(&s, &lone.id, None).unwrap(), b"lone");
    }

    #[test]
    fn refs_compare_and_swap() {
        let (_d, s) = store();
        assert!(s.ref_update("a/b", None, Some(b"one")).unwrap());
        assert!(!s.ref_update("a/b", None, Some(b"two")).unwrap());
        assert!(s
            .ref_update("a/b", Some(ref_tag(b"one")), Some(b"two"))
            .unwrap());
        assert_eq!(s.ref_get("a/b").unwrap().unwrap(), b"two");
        assert_eq!(s.ref_list().unwrap(), vec!["a/b".to_string()]);
        assert!(s.ref_update("a/b", Some(ref_tag(b"two")), None).unwrap());
        assert_eq!(s.ref_get("a/b").unwrap(), None);
    }

    #[test]
    fn removal_respects_recent_touches_and_trash_is_recovered() {
        let (_d, s) = store();
        let a = s.config().codec().seal(b"aaaa", false);
        let b = s.config().codec().seal(b"bbbb", false);
        // One at a time: files of their own.
        s.put_many(&[(a.id, &a.object)]).unwrap();
        s.put_many(&[(b.id, &b.object)]).unwrap();
        assert!(s.object_path(&a.id).exists());
        let past = SystemTime::now() - Duration::from_secs(3600);
        assert_eq!(
            s.remove_if_older(&a.id, past).unwrap(),
            None,
            "recent: kept"
        );
        assert!(s.has_many(&[a.id], false).unwrap()[0]);
        let future = SystemTime::now() + Duration::from_secs(3600);
        assert!(s.remove_if_older(&a.id, future).unwrap().is_some());
        assert!(!s.has_many(&[a.id], false).unwrap()[0]);
        // A gc that died after moving b aside: reads and recover put it back.
        fs::rename(s.object_path(&b.id), s.trash_path(&b.id)).unwrap();
        assert_eq!(fetch(&s, &b.id, None).unwrap(), b"bbbb");
        fs::rename(s.object_path(&b.id), s.trash_path(&b.id)).unwrap();
        assert_eq!(s.recover(past).unwrap(), (1, 0));
        assert!(s.object_path(&b.id).exists());
    }

    #[test]
    fn leases_list_and_end() {
        let (_d, s) = store();
        let l = s.lease_begin().unwrap();
        let all = s.leases().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].id, l.id);
        assert!(all[0].started <= all[0].refreshed);
        s.lease_refresh(&l.id).unwrap();
        s.lease_end(&l.id).unwrap();
        assert!(s.leases().unwrap().is_empty());
    }
}
