//! A chunk store in a local directory (the embedded default).
//!
//! ```text
//! STORE/store.toml          settings (hash, compression, quota)
//! STORE/objects/4e/4e11…    one file per object, named by its hex id,
//!                           under a folder named by the first two digits
//! STORE/refs/USER/IMAGE     catalogs (compare-and-swap under refs/.lock)
//! STORE/leases/ID           commits in progress
//! STORE/tmp/                objects being written
//! STORE/trash/              objects a running gc is about to delete
//! ```
//!
//! An object is written to `tmp/`, fsynced and renamed into place; the
//! folders it was renamed into are fsynced by [`ChunkWrite::sync`] before
//! any version refers to it. Details and the crash argument:
//! `docs/formats/cas-store.md`.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use roamdisk_blockdev::{ErrorKind, Op, Result};
use rustix::fs::{AtFlags, RenameFlags, Timespec, Timestamps, CWD, UTIME_NOW, UTIME_OMIT};

use super::{
    check_ref_name, ref_tag, ChunkPrune, ChunkRead, ChunkWrite, Lease, ObjectEntry, PutOutcome,
    StoreConfig,
};
use crate::error::{err, io, not_found};
use crate::hash::ChunkId;

const LEASE_MAGIC: &str = "roamdisk-lease 1";

/// A store in a directory.
pub struct LocalStore {
    root: PathBuf,
    config: StoreConfig,
    /// Folders that received a rename since the last `sync`.
    dirty_dirs: Mutex<HashSet<PathBuf>>,
    seq: AtomicU64,
    pid: u32,
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

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn touch(path: &Path) -> std::io::Result<()> {
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
    rustix::fs::utimensat(CWD, path, &t, AtFlags::empty()).map_err(std::io::Error::from)
}

/// What a rename without replacement did.
#[derive(PartialEq, Eq)]
enum Renamed {
    Moved,
    TargetExists,
    SourceMissing,
}

/// Rename without replacing an existing file.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<Renamed> {
    match rustix::fs::renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(Renamed::Moved),
        Err(rustix::io::Errno::EXIST) => Ok(Renamed::TargetExists),
        Err(rustix::io::Errno::NOENT) => Ok(Renamed::SourceMissing),
        Err(e) => Err(e.into()),
    }
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
        let config = StoreConfig::parse(&text).map_err(|e| e.path(&cfg_path))?;
        for d in ["objects", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        Ok(LocalStore {
            root: root.to_path_buf(),
            config,
            dirty_dirs: Mutex::new(HashSet::new()),
            seq: AtomicU64::new(0),
            pid: std::process::id(),
        })
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
        for d in ["objects", "refs", "leases", "tmp", "trash"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| io(Op::Open, e, &p))?;
        }
        for i in 0..256 {
            let p = root.join("objects").join(format!("{i:02x}"));
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
        let r = rename_noreplace(&t, &p).map_err(|e| io(Op::Write, e, &t))?;
        if r == Renamed::SourceMissing {
            return Ok(false);
        }
        if r == Renamed::Moved || p.exists() {
            let _ = touch(&p);
            if let Some(dir) = p.parent() {
                self.dirty_dirs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(dir.to_path_buf());
            }
            return Ok(p.exists());
        }
        Ok(false)
    }

    fn put_one(&self, id: &ChunkId, bytes: &[u8]) -> Result<PutOutcome> {
        let p = self.object_path(id);
        let dir = p.parent().expect("fan-out folder");
        let placed = match self.place_unnamed(dir, &p, bytes) {
            Some(r) => r,
            None => self.place_renamed(&p, bytes),
        };
        let placed = match placed {
            Err(e) if e.kind() == IoKind::NotFound && !dir.exists() => {
                fs::create_dir_all(dir).map_err(|e| io(Op::Write, e, dir))?;
                self.dirty_dirs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(self.root.join("objects"));
                return self.put_one(id, bytes);
            }
            other => other,
        };
        match placed {
            Ok(true) => {
                self.dirty_dirs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(dir.to_path_buf());
                Ok(PutOutcome::Stored)
            }
            Ok(false) => match touch(&p) {
                Ok(()) => Ok(PutOutcome::Existed),
                // A gc moved it aside between our check and the touch:
                // store it again.
                Err(e) if e.kind() == IoKind::NotFound => self.put_one(id, bytes),
                Err(e) => Err(io(Op::Write, e, &p)),
            },
            Err(e) => Err(io(Op::Write, e, &p).msg(format!("cannot store object {id}"))),
        }
    }

    /// Write `bytes` to an unnamed file in `dir` (O_TMPFILE), make it
    /// durable, and give it the name `path` unless that exists. A crash
    /// leaves nothing behind: the file has no name until it is complete.
    /// `None` when the file system has no O_TMPFILE.
    fn place_unnamed(
        &self,
        dir: &Path,
        path: &Path,
        bytes: &[u8],
    ) -> Option<std::io::Result<bool>> {
        use rustix::fs::{Mode, OFlags};
        let fd = match rustix::fs::openat(
            CWD,
            dir,
            OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => {
                return Some(Err(std::io::Error::from(std::io::ErrorKind::NotFound)))
            }
            Err(_) => return None,
        };
        let mut f = File::from(fd);
        if let Err(e) = f.write_all(bytes).and_then(|_| f.sync_all()) {
            return Some(Err(e));
        }
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", f.as_raw_fd());
        match rustix::fs::linkat(CWD, proc_path.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW) {
            Ok(()) => Some(Ok(true)),
            Err(rustix::io::Errno::EXIST) => Some(Ok(false)),
            // No /proc: fall back to a named temporary file.
            Err(_) => None,
        }
    }

    /// Write `bytes` under a temporary name in `tmp/`, fsync, and rename it
    /// to `path` unless that exists.
    fn place_renamed(&self, path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
        let tmp = self.tmp_path("object");
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        };
        let r = write().and_then(|_| rename_noreplace(&tmp, path));
        let _ = fs::remove_file(&tmp);
        match r? {
            Renamed::Moved => Ok(true),
            Renamed::TargetExists => Ok(false),
            Renamed::SourceMissing => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
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

impl ChunkRead for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
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
                if self.restore_from_trash(id)? {
                    return read(&p).map_err(|e| io(Op::Read, e, &p));
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
        ids.par_iter()
            .map(|id| {
                let p = self.object_path(id);
                let r = if touch_found {
                    touch(&p)
                } else {
                    fs::symlink_metadata(&p).map(|_| ())
                };
                match r {
                    Ok(()) => Ok(true),
                    // Not in place: a commit uploads it again (an object a
                    // crashed gc left in the trash is not worth a lookup
                    // per missing object; readers and gc put it back).
                    Err(e) if e.kind() == IoKind::NotFound => Ok(false),
                    Err(e) => Err(io(Op::Read, e, &p)),
                }
            })
            .collect()
    }
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
}

impl ChunkWrite for LocalStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        items
            .par_iter()
            .map(|(id, bytes)| self.put_one(id, bytes))
            .collect()
    }
    fn sync(&self) -> Result<()> {
        let dirs: Vec<PathBuf> = self
            .dirty_dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
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
    fn lease_begin(&self) -> Result<Lease> {
        let mut r = [0u8; 12];
        openssl::rand::rand_bytes(&mut r).map_err(|e| {
            err(
                ErrorKind::Io,
                Op::Write,
                format!("no randomness for a lease id: {e}"),
            )
        })?;
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
        Ok(())
    }
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
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
                id,
                started: started.unwrap_or(refreshed).min(refreshed),
                refreshed,
            });
        }
        Ok(out)
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        let mut restored = 0;
        let trash = self.root.join("trash");
        for ent in fs::read_dir(&trash).map_err(|e| io(Op::Read, e, &trash))? {
            let ent = ent.map_err(|e| io(Op::Read, e, &trash))?;
            if let Some(id) = ChunkId::from_hex(&ent.file_name().to_string_lossy()) {
                if self.restore_from_trash(&id)? {
                    restored += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fetch;

    fn store() -> (tempfile::TempDir, LocalStore) {
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
        s.put_many(&[(a.id, &a.object), (b.id, &b.object)]).unwrap();
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
