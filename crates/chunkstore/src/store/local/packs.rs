//! The packs of a local store (`packs/NAME.pack`, byte layout in
//! `docs/formats/cas-pack.md`, protocol in `docs/formats/cas-store.md`):
//!
//! * the table of where each packed object is, loaded from the packs'
//!   indexes on first use, again for packs that appeared since when an
//!   object is not found, and from scratch when a pack it points into is
//!   gone (a gc repacked it);
//! * the writer of a new pack ([`PackGroup`], the store's put group):
//!   objects are written at reserved offsets from any thread into one
//!   unnamed file, then the index, one fsync, one name;
//! * reads and touches of packed objects (a touch is a touch of the pack);
//! * what gc does with packs: a pack holding unreferenced objects is
//!   rewritten without them (the others copied into a new pack that is
//!   durable and named first), then removed with remove-if-older.

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use roamdisk_blockdev::durable::{rename_noreplace, Renamed};
use roamdisk_blockdev::{ErrorKind, Op, Result};
use rustix::fs::{AtFlags, RenameFlags, CWD};

use super::{open_dir, open_unnamed, pwrite_parts, touch_at, LocalStore, Unnamed, NAMING_TMP_DIR};
use crate::error::{corrupt, err, io};
use crate::hash::ChunkId;
use crate::store::pack::{self, is_pack_name, Entry, Trailer};
use crate::store::{ObjectEntry, PutGroup, PutOutcome};

/// The names of the packs in `dir` (none if it does not exist).
fn pack_names_in(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_pack_name(n))
            .collect()),
        Err(e) if e.kind() == IoKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(Op::Read, e, dir)),
    }
}

/// A fresh random pack name.
fn new_pack_name() -> std::io::Result<String> {
    let mut r = [0u8; 16];
    roamdisk_crypto::fill_random(&mut r).map_err(std::io::Error::other)?;
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{hex}.pack"))
}

/// Where a packed object is.
#[derive(Debug, Clone, Copy)]
struct Loc {
    pack: u32,
    offset: u64,
    len: u32,
}

/// The packs a store has loaded, and where each packed object is.
#[derive(Default)]
pub(super) struct PackTable(RwLock<Table>);

#[derive(Default)]
struct Table {
    /// The packs folder has been read at least once.
    scanned: bool,
    /// Pack names by number.
    names: Vec<String>,
    by_name: HashMap<String, u32>,
    /// One location per object (the first pack loaded that has it).
    objects: HashMap<ChunkId, Loc>,
    /// Packs whose index could not be read (warned about once).
    damaged: HashSet<String>,
}

impl Table {
    fn add(&mut self, name: String, entries: &[Entry]) {
        if self.by_name.contains_key(&name) {
            return;
        }
        let n = self.names.len() as u32;
        self.names.push(name.clone());
        self.by_name.insert(name, n);
        for e in entries {
            self.objects.entry(e.id).or_insert(Loc {
                pack: n,
                offset: e.offset,
                len: e.len,
            });
        }
    }

    /// Forget everything: the next lookup loads every pack again (a pack
    /// went away; objects it held may be in another one).
    fn reset(&mut self) {
        let damaged = std::mem::take(&mut self.damaged);
        *self = Table {
            damaged,
            ..Table::default()
        };
    }
}

impl PackTable {
    fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.0.read()
    }
    fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.0.write()
    }
}

fn mtime(m: &fs::Metadata) -> SystemTime {
    m.modified().unwrap_or(UNIX_EPOCH)
}

/// A group of puts stored as new packs ([`crate::store::ChunkWrite::put_group`]
/// of a local store): one pack per worker thread that writes (threads
/// appending to one file wait for each other on its inode lock).
pub(super) struct PackGroup<'a> {
    store: &'a LocalStore,
    lanes: Vec<Lane>,
    state: Mutex<GroupState>,
}

/// The pack one worker thread of a group writes.
struct Lane {
    /// Created on the first write (a group whose objects all existed
    /// makes no pack).
    file: Mutex<Option<Arc<Unnamed>>>,
    /// End of the object area: the next object goes here.
    end: AtomicU64,
    entries: Mutex<Vec<Entry>>,
}

#[derive(Default)]
struct GroupState {
    seen: HashSet<ChunkId>,
    /// Outcomes in the order objects were handed over.
    order: Vec<(ChunkId, PutOutcome)>,
}

impl<'a> PackGroup<'a> {
    pub(super) fn new(store: &'a LocalStore) -> PackGroup<'a> {
        let lanes = (0..rayon::current_num_threads().max(1))
            .map(|_| Lane {
                file: Mutex::new(None),
                end: AtomicU64::new(pack::HEADER_SIZE as u64),
                entries: Mutex::new(Vec::new()),
            })
            .collect();
        PackGroup {
            store,
            lanes,
            state: Mutex::new(GroupState::default()),
        }
    }

    /// This thread's lane, its pack file made on first use.
    fn lane(&self) -> Result<(&Lane, Arc<Unnamed>)> {
        let k = rayon::current_thread_index().unwrap_or(0) % self.lanes.len();
        let lane = &self.lanes[k];
        let mut f = lane.file.lock();
        if let Some(b) = &*f {
            return Ok((lane, b.clone()));
        }
        let p = self.store.packs_path();
        let b = Arc::new(
            self.store
                .create_pack_file()
                .map_err(|e| io(Op::Write, e, &p).msg("cannot create a pack file"))?,
        );
        *f = Some(b.clone());
        Ok((lane, b))
    }
}

impl PutGroup for PackGroup<'_> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        let len = u32::try_from(parts[0].len() + parts[1].len()).map_err(|_| {
            err(
                ErrorKind::InvalidArgument,
                Op::Write,
                format!("object {id} is too large for a pack"),
            )
        })?;
        {
            let mut s = self.state.lock();
            let first = s.seen.insert(*id);
            let outcome = match first {
                true => PutOutcome::Stored,
                false => PutOutcome::Existed,
            };
            s.order.push((*id, outcome));
            if !first {
                return Ok(());
            }
        }
        let (lane, b) = self.lane()?;
        let offset = lane.end.fetch_add(len as u64, Ordering::Relaxed);
        pwrite_parts(&b.file, &parts, offset).map_err(|e| self.store.put_error(id, e))?;
        lane.entries.lock().push(Entry {
            id: *id,
            offset,
            len,
        });
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let state = self.state.into_inner();
        let store = self.store;
        let seal = |lane: Lane| -> Result<()> {
            let building = lane.file.into_inner();
            let mut entries = lane.entries.into_inner();
            match building {
                Some(b) => store
                    .seal_pack(&b, &mut entries, lane.end.load(Ordering::Relaxed))
                    .map(|_| ()),
                None => Ok(()),
            }
        };
        // Each pack on a thread of its own: their fsyncs wait together, and
        // not on the worker pool (which may be busy with the next group).
        let lanes = self.lanes;
        std::thread::scope(|scope| {
            let mut lanes = lanes.into_iter();
            let first = lanes.next();
            let others: Vec<_> = lanes.map(|l| scope.spawn(move || seal(l))).collect();
            let mut r = first.map_or(Ok(()), seal);
            for h in others {
                let o = h.join().expect("pack sealing thread");
                r = r.and(o);
            }
            r
        })?;
        Ok(state.order)
    }
}

impl LocalStore {
    pub(super) fn packs_path(&self) -> PathBuf {
        self.root.join("packs")
    }

    /// The `packs/` folder, opened once (made with `create`).
    fn packs_dir(&self, create: bool) -> std::io::Result<Arc<OwnedFd>> {
        let mut d = self.packs_fd.lock();
        if let Some(fd) = &*d {
            return Ok(fd.clone());
        }
        let p = self.packs_path();
        let fd = match open_dir(&p) {
            Err(e) if e.kind() == IoKind::NotFound && create => {
                fs::create_dir_all(&p)?;
                self.mark_dirty(self.root.clone());
                open_dir(&p)?
            }
            r => r?,
        };
        let fd = Arc::new(fd);
        *d = Some(fd.clone());
        Ok(fd)
    }

    /// Read and check the index of the pack at `path`.
    pub(super) fn read_pack_index(&self, path: &Path) -> Result<Vec<Entry>> {
        let r = (|| -> Result<Vec<Entry>> {
            let f = File::open(path).map_err(|e| io(Op::Read, e, path))?;
            let len = f.metadata().map_err(|e| io(Op::Read, e, path))?.len();
            let tail = (pack::HEADER_SIZE + pack::TRAILER_SIZE) as u64;
            if len < tail {
                return Err(corrupt(format!(
                    "pack of {len} bytes is too short for its header and trailer"
                )));
            }
            let mut h = [0u8; pack::HEADER_SIZE];
            f.read_exact_at(&mut h, 0)
                .map_err(|e| io(Op::Read, e, path))?;
            pack::parse_header(&h, self.config.hash)?;
            let mut t = [0u8; pack::TRAILER_SIZE];
            f.read_exact_at(&mut t, len - pack::TRAILER_SIZE as u64)
                .map_err(|e| io(Op::Read, e, path))?;
            let trailer = Trailer::parse(&t, len)?;
            let mut index = vec![0u8; trailer.index_len()];
            f.read_exact_at(&mut index, trailer.index_offset)
                .map_err(|e| io(Op::Read, e, path))?;
            trailer.parse_index(&h, &index)
        })();
        r.map_err(|e| {
            if e.kind() == ErrorKind::Corrupt {
                crate::error::context(e, format!("pack {}", path.display())).path(path)
            } else {
                e
            }
        })
    }

    /// Load the indexes of the packs not yet in the table. With `strict`
    /// a damaged pack is an error; otherwise it is left out (warned about
    /// once) and its objects look missing.
    pub(super) fn scan_packs(&self, strict: bool) -> Result<()> {
        let dir = self.packs_path();
        let names = pack_names_in(&dir)?;
        let new: Vec<String> = {
            let t = self.packs.read();
            names
                .into_iter()
                .filter(|n| !t.by_name.contains_key(n) && (strict || !t.damaged.contains(n)))
                .collect()
        };
        let loaded: Vec<(String, Result<Vec<Entry>>)> = new
            .into_par_iter()
            .map(|n| {
                let r = self.read_pack_index(&dir.join(&n));
                (n, r)
            })
            .collect();
        let mut t = self.packs.write();
        for (n, r) in loaded {
            match r {
                Ok(entries) => t.add(n, &entries),
                // Removed since the folder was read (a gc).
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) if strict => return Err(e),
                Err(e) => {
                    if t.damaged.insert(n) {
                        tracing::warn!(error = %e, "a pack of the store is unreadable; its objects look missing (`roamdisk store verify` names it)");
                    }
                }
            }
        }
        t.scanned = true;
        Ok(())
    }

    fn ensure_scanned(&self) -> Result<()> {
        if self.packs.read().scanned {
            return Ok(());
        }
        self.scan_packs(false)
    }

    /// Forget every loaded pack (one went away).
    pub(super) fn reset_packs(&self) {
        self.packs.write().reset();
    }

    /// The stored bytes of a packed object, `None` if no loaded pack has
    /// it. With `rescan`, packs that appeared since they were loaded are
    /// looked at too.
    pub(super) fn get_packed(&self, id: &ChunkId, rescan: bool) -> Result<Option<Vec<u8>>> {
        self.ensure_scanned()?;
        if rescan {
            self.scan_packs(false)?;
        }
        for _ in 0..3 {
            let hit = {
                let t = self.packs.read();
                t.objects
                    .get(id)
                    .map(|l| (t.names[l.pack as usize].clone(), *l))
            };
            let Some((name, loc)) = hit else {
                return Ok(None);
            };
            let path = self.packs_path().join(&name);
            let read = || -> std::io::Result<Vec<u8>> {
                let f = File::open(&path)?;
                let mut v = vec![0u8; loc.len as usize];
                f.read_exact_at(&mut v, loc.offset)?;
                Ok(v)
            };
            match read() {
                Ok(v) => return Ok(Some(v)),
                // Repacked by a gc: load the packs as they are now.
                Err(e) if e.kind() == IoKind::NotFound => {
                    self.reset_packs();
                    self.scan_packs(false)?;
                }
                Err(e) => {
                    return Err(io(Op::Read, e, &path).msg(format!("cannot read object {id}")))
                }
            }
        }
        Ok(None)
    }

    /// Which of `ids` a loaded pack holds; with `touch`, each pack holding
    /// one of them has its modification time set to now (once per call).
    /// An object whose pack has gone counts as missing.
    pub(super) fn has_packed(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.ensure_scanned()?;
        let (packs, names): (Vec<Option<u32>>, HashMap<u32, String>) = {
            let t = self.packs.read();
            if t.objects.is_empty() {
                return Ok(vec![false; ids.len()]);
            }
            let packs: Vec<Option<u32>> = ids
                .iter()
                .map(|id| t.objects.get(id).map(|l| l.pack))
                .collect();
            let names = packs
                .iter()
                .flatten()
                .map(|&p| (p, t.names[p as usize].clone()))
                .collect();
            (packs, names)
        };
        if names.is_empty() {
            return Ok(vec![false; ids.len()]);
        }
        let dir = self
            .packs_dir(false)
            .map_err(|e| io(Op::Read, e, &self.packs_path()))?;
        let mut alive: HashMap<u32, bool> = HashMap::new();
        for (p, name) in names {
            let r = if touch {
                touch_at(&*dir, name.as_str())
            } else {
                rustix::fs::statat(&*dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            };
            match r {
                Ok(()) => alive.insert(p, true),
                Err(e) if e.kind() == IoKind::NotFound => alive.insert(p, false),
                Err(e) => return Err(io(Op::Write, e, &self.packs_path().join(&name))),
            };
        }
        if alive.values().any(|a| !a) {
            // A gc removed a pack: its objects (if referenced) are in
            // another one, found by the next lookup.
            self.reset_packs();
        }
        Ok(packs.iter().map(|p| p.is_some_and(|p| alive[&p])).collect())
    }

    /// Every packed object, with its pack's modification time (all packs
    /// are read again; a damaged one is an error).
    pub(super) fn list_packed(&self) -> Result<Vec<ObjectEntry>> {
        self.reset_packs();
        self.scan_packs(true)?;
        let (names, objects): (Vec<String>, Vec<(ChunkId, Loc)>) = {
            let t = self.packs.read();
            (
                t.names.clone(),
                t.objects.iter().map(|(id, l)| (*id, *l)).collect(),
            )
        };
        let dir = self.packs_path();
        let times: Vec<Option<SystemTime>> = names
            .iter()
            .map(|n| fs::metadata(dir.join(n)).ok().map(|m| mtime(&m)))
            .collect();
        Ok(objects
            .into_iter()
            .filter_map(|(id, l)| {
                times[l.pack as usize].map(|t| ObjectEntry {
                    id,
                    mtime: t,
                    size: l.len as u64,
                })
            })
            .collect())
    }

    /// Step 1 of writing a pack: an unnamed file in `packs/` holding the
    /// pack header (a named one in `tmp/` where there are no unnamed files).
    fn create_pack_file(&self) -> std::io::Result<Unnamed> {
        let header = pack::header(self.config.hash);
        if self.naming.load(Ordering::Relaxed) != NAMING_TMP_DIR {
            let dir = self.packs_dir(true)?;
            match open_unnamed(&dir) {
                Ok(file) => {
                    file.write_all_at(&header, 0)?;
                    return Ok(Unnamed { file, tmp: None });
                }
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR) => {
                    self.naming.store(NAMING_TMP_DIR, Ordering::Relaxed);
                }
                // The folder was removed behind our back: open it again.
                Err(rustix::io::Errno::NOENT) => {
                    *self.packs_fd.lock() = None;
                }
                Err(_) => {}
            }
        }
        self.create_named_pack_file(&header)
    }

    fn create_named_pack_file(&self, header: &[u8]) -> std::io::Result<Unnamed> {
        let tmp = self.tmp_path("pack");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        let b = Unnamed {
            file,
            tmp: Some(tmp),
        };
        b.file.write_all_at(header, 0)?;
        Ok(b)
    }

    /// Steps 2-3 of writing a pack: append the index, make the whole file
    /// durable, then give it a name (nothing names an object of the pack
    /// before its data is on disk). The `packs/` folder is synced by
    /// [`crate::store::ChunkWrite::sync`]. Returns the pack's name.
    fn seal_pack(&self, b: &Unnamed, entries: &mut [Entry], end: u64) -> Result<String> {
        let p = self.packs_path();
        let tail = pack::encode_tail(&pack::header(self.config.hash), entries, end);
        b.file
            .write_all_at(&tail, end)
            .and_then(|()| b.file.sync_all())
            .map_err(|e| io(Op::Write, e, &p).msg("cannot write a pack file"))?;
        self.upgrade_layout()?;
        let name = self
            .name_pack(b)
            .map_err(|e| io(Op::Write, e, &p).msg("cannot name a pack file"))?;
        self.packs.write().add(name.clone(), entries);
        Ok(name)
    }

    /// Give a durable pack file a new name in `packs/`.
    fn name_pack(&self, b: &Unnamed) -> std::io::Result<String> {
        let mut copy: Option<Unnamed> = None;
        for _ in 0..8 {
            let dir = self.packs_dir(true)?;
            let name = new_pack_name()?;
            let b = copy.as_ref().unwrap_or(b);
            let named = match &b.tmp {
                None => self.link_unnamed(dir.as_fd(), &b.file, &name)?,
                Some(tmp) => {
                    match rustix::fs::renameat_with(CWD, tmp, &*dir, &name, RenameFlags::NOREPLACE)
                    {
                        Ok(()) => Some(true),
                        Err(rustix::io::Errno::EXIST) => Some(false),
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            match named {
                Some(true) => {
                    self.mark_dirty(self.packs_path());
                    return Ok(name);
                }
                // Taken (by chance): another name.
                Some(false) => continue,
                None => {
                    // Unnamed files cannot be named here: copy it to a
                    // named temporary file, durable, and rename that.
                    self.naming.store(NAMING_TMP_DIR, Ordering::Relaxed);
                    let len = b.file.metadata()?.len();
                    let named = self.create_named_pack_file(&[])?;
                    let mut buf = vec![0u8; 1 << 20];
                    let mut at = 0u64;
                    while at < len {
                        let n = ((len - at) as usize).min(buf.len());
                        b.file.read_exact_at(&mut buf[..n], at)?;
                        named.file.write_all_at(&buf[..n], at)?;
                        at += n as u64;
                    }
                    named.file.sync_all()?;
                    copy = Some(named);
                }
            }
        }
        Err(std::io::Error::other("no free pack name after 8 tries"))
    }

    /// Make the `packs/` folder's entries durable now.
    fn sync_packs_dir(&self) -> Result<()> {
        let p = self.packs_path();
        self.packs_dir(true)
            .and_then(|d| rustix::fs::fsync(&*d).map_err(std::io::Error::from))
            .map_err(|e| io(Op::Flush, e, &p))
    }

    /// gc: remove the packed copies of `ids` (unreferenced objects last
    /// referenced before `cutoff`). Each pack holding some of them is
    /// rewritten without them ([`LocalStore::repack_without`]). Returns
    /// the bytes freed per object removed.
    pub(super) fn remove_packed_if_older(
        &self,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<HashMap<ChunkId, u64>> {
        self.ensure_scanned()?;
        let mut by_pack: HashMap<String, HashSet<ChunkId>> = HashMap::new();
        {
            let t = self.packs.read();
            for id in ids {
                if let Some(l) = t.objects.get(id) {
                    by_pack
                        .entry(t.names[l.pack as usize].clone())
                        .or_default()
                        .insert(*id);
                }
            }
        }
        let mut by_pack: Vec<_> = by_pack.into_iter().collect();
        by_pack.sort_by(|a, b| a.0.cmp(&b.0));
        let mut freed = HashMap::new();
        let mut changed = false;
        for (name, dead) in by_pack {
            let gone = self.repack_without(&name, &dead, cutoff)?;
            changed |= !gone.is_empty();
            freed.extend(gone);
        }
        if changed {
            self.reset_packs();
        }
        Ok(freed)
    }

    /// Remove the objects `dead` from pack `name`, unless the pack was
    /// touched at or after `cutoff` (a commit reuses something in it). The
    /// pack's other objects are first copied into a new pack, which is made
    /// durable and named (its folder synced); then the old pack goes by
    /// remove-if-older: rename it to `trash/`, read its time again, put it
    /// back if it is now recent, else unlink it. A pack with a damaged
    /// object is kept whole. Returns the objects removed and their sizes.
    fn repack_without(
        &self,
        name: &str,
        dead: &HashSet<ChunkId>,
        cutoff: SystemTime,
    ) -> Result<Vec<(ChunkId, u64)>> {
        let path = self.packs_path().join(name);
        let recent = |p: &Path| -> Result<Option<bool>> {
            match fs::metadata(p) {
                Ok(m) => Ok(Some(mtime(&m) >= cutoff)),
                Err(e) if e.kind() == IoKind::NotFound => Ok(None),
                Err(e) => Err(io(Op::Read, e, p)),
            }
        };
        if recent(&path)? != Some(false) {
            return Ok(Vec::new());
        }
        let entries = match self.read_pack_index(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let (gone, live): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| dead.contains(&e.id));
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        if !live.is_empty() {
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == IoKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(io(Op::Read, e, &path)),
            };
            let codec = self.config.codec();
            let group = PackGroup::new(self);
            for e in &live {
                let mut buf = vec![0u8; e.len as usize];
                f.read_exact_at(&mut buf, e.offset)
                    .map_err(|err| io(Op::Read, err, &path))?;
                if let Err(bad) = codec.verify(&e.id, &buf) {
                    tracing::warn!(pack = %path.display(), error = %bad, "a pack holds a damaged object: gc keeps the whole pack");
                    return Ok(Vec::new());
                }
                group.write(&e.id, [&buf, &[]])?;
            }
            Box::new(group).finish()?;
            self.sync_packs_dir()?;
        }
        let trash = self.root.join("trash").join(name);
        if rename_noreplace(&path, &trash).map_err(|e| io(Op::Write, e, &path))? != Renamed::Moved {
            return Ok(Vec::new());
        }
        match recent(&trash)? {
            Some(false) => {}
            Some(true) => {
                // Touched before the move: a commit uses it. (The copy made
                // above stays; its objects are then stored twice.)
                let _ = rename_noreplace(&trash, &path);
                return Ok(Vec::new());
            }
            None => return Ok(Vec::new()),
        }
        match fs::remove_file(&trash) {
            Ok(()) => Ok(gone.iter().map(|e| (e.id, e.len as u64)).collect()),
            Err(e) if e.kind() == IoKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(Op::Write, e, &trash)),
        }
    }

    /// Put back a pack from `trash/` (left by a gc that died between its
    /// two renames) and refresh its time. Returns its number of objects,
    /// or `None` if it was not put back.
    pub(super) fn restore_pack(&self, name: &str) -> Result<Option<usize>> {
        let t = self.root.join("trash").join(name);
        let p = self.packs_path().join(name);
        self.packs_dir(true).map_err(|e| io(Op::Write, e, &p))?;
        let r = rename_noreplace(&t, &p).map_err(|e| io(Op::Write, e, &t))?;
        if r == Renamed::SourceMissing {
            return Ok(None);
        }
        let _ = super::touch(&p);
        self.mark_dirty(self.packs_path());
        let n = self.read_pack_index(&p).map(|e| e.len()).unwrap_or(1);
        self.scan_packs(false)?;
        Ok(Some(n))
    }

    /// A reader missed `id`: put back a pack in `trash/` that holds it.
    pub(super) fn restore_pack_holding(&self, id: &ChunkId) -> Result<bool> {
        let trash = self.root.join("trash");
        for n in pack_names_in(&trash)? {
            let Ok(entries) = self.read_pack_index(&trash.join(&n)) else {
                continue;
            };
            if entries.binary_search_by(|e| e.id.cmp(id)).is_ok() {
                return Ok(self.restore_pack(&n)?.is_some());
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::store;
    use super::*;
    use crate::store::prelude::*;
    use crate::store::{fetch, ChunkPrune, ChunkRead, ChunkWrite};
    use std::time::Duration;

    /// `n` small objects stored together (one pack per writing thread).
    fn packed(s: &LocalStore, n: u32) -> Vec<(ChunkId, Vec<u8>)> {
        let codec = s.config().codec();
        let objs: Vec<(ChunkId, Vec<u8>)> = (0..n)
            .map(|i| {
                let sealed = codec.seal(&i.to_le_bytes().repeat(100), false);
                (sealed.id, sealed.object)
            })
            .collect();
        let items: Vec<(ChunkId, &[u8])> = objs.iter().map(|(id, b)| (*id, &b[..])).collect();
        assert!(s
            .put_many(&items)
            .unwrap()
            .iter()
            .all(|o| *o == PutOutcome::Stored));
        s.sync().unwrap();
        objs
    }

    fn pack_files(s: &LocalStore) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(s.packs_path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    }

    fn set_mtime(p: &Path, t: SystemTime) {
        File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    fn hour() -> Duration {
        Duration::from_secs(3600)
    }

    #[test]
    fn a_pack_is_found_by_another_process_and_listed_with_its_time() {
        let (_d, s) = store();
        let objs = packed(&s, 50);
        let other = LocalStore::open(s.root(), None).unwrap();
        let ids: Vec<ChunkId> = objs.iter().map(|(id, _)| *id).collect();
        assert!(other.has_many(&ids, false).unwrap().iter().all(|h| *h));
        for (id, b) in &objs {
            assert_eq!(&other.get(id).unwrap(), b);
        }
        let old = SystemTime::now() - hour();
        for p in pack_files(&s) {
            set_mtime(&p, old);
        }
        let mut listed = Vec::new();
        other.list_objects(&mut |e| listed.push(e)).unwrap();
        assert_eq!(listed.len(), 50);
        assert!(listed
            .iter()
            .all(|e| e.mtime <= old + Duration::from_secs(1)));
        // A touch through `has` is a touch of the pack.
        assert!(other.has_many(&ids[..1], true).unwrap()[0]);
        let mut listed = Vec::new();
        other.list_objects(&mut |e| listed.push(e)).unwrap();
        assert!(listed.iter().any(|e| e.mtime > old + hour() / 2));
    }

    #[test]
    fn gc_rewrites_a_pack_without_its_dead_objects() {
        let (_d, s) = store();
        let objs = packed(&s, 40);
        let (dead, live) = objs.split_at(15);
        let dead_ids: Vec<ChunkId> = dead.iter().map(|(id, _)| *id).collect();
        let old = SystemTime::now() - hour();
        for p in pack_files(&s) {
            set_mtime(&p, old);
        }
        // Recent cutoff in the past: nothing goes.
        let r = s.remove_many_if_older(&dead_ids, old - hour()).unwrap();
        assert!(r.iter().all(|x| x.is_none()));
        let r = s
            .remove_many_if_older(&dead_ids, SystemTime::now())
            .unwrap();
        assert!(r.iter().all(|x| x.is_some()), "{r:?}");
        assert!(fs::read_dir(s.root().join("trash"))
            .unwrap()
            .next()
            .is_none());
        let again = LocalStore::open(s.root(), None).unwrap();
        for (id, b) in live {
            assert_eq!(&again.get(id).unwrap(), b);
        }
        assert!(again.has_many(&dead_ids, false).unwrap().iter().all(|h| !h));
        assert_eq!(
            again.get(&dead_ids[0]).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        // All dead: the pack goes without a copy.
        let live_ids: Vec<ChunkId> = live.iter().map(|(id, _)| *id).collect();
        for p in pack_files(&s) {
            set_mtime(&p, old);
        }
        let r = again
            .remove_many_if_older(&live_ids, SystemTime::now())
            .unwrap();
        assert!(r.iter().all(|x| x.is_some()));
        assert!(pack_files(&s).is_empty());
    }

    #[test]
    fn a_pack_touched_by_a_commit_is_kept_whole() {
        let (_d, s) = store();
        let objs = packed(&s, 20);
        let old = SystemTime::now() - hour();
        for p in pack_files(&s) {
            set_mtime(&p, old);
        }
        // gc listed everything as old; then a commit reused one object.
        let cutoff = SystemTime::now() - Duration::from_secs(60);
        let commit = LocalStore::open(s.root(), None).unwrap();
        assert!(commit.has_many(&[objs[3].0], true).unwrap()[0]);
        let ids: Vec<ChunkId> = objs.iter().map(|(id, _)| *id).skip(1).collect();
        let r = s.remove_many_if_older(&ids, cutoff).unwrap();
        let kept = pack_files(&s);
        // Whatever pack holds objs[3] is still there, with everything in it.
        assert!(commit.get(&objs[3].0).is_ok());
        assert!(r.iter().any(|x| x.is_none()));
        assert!(!kept.is_empty());
    }

    #[test]
    fn a_pack_left_in_the_trash_comes_back_for_readers_and_recover() {
        let (_d, s) = store();
        let objs = packed(&s, 10);
        let packs = pack_files(&s);
        let name = packs[0].file_name().unwrap().to_owned();
        let in_first = s.read_pack_index(&packs[0]).unwrap()[0].id;
        let trash = s.root().join("trash").join(&name);
        fs::rename(&packs[0], &trash).unwrap();
        // A reader (a fresh process) finds it and puts it back.
        let reader = LocalStore::open(s.root(), None).unwrap();
        assert!(fetch(&reader, &in_first, None).is_ok());
        assert!(packs[0].exists() && !trash.exists());
        fs::rename(&packs[0], &trash).unwrap();
        let past = SystemTime::now() - hour();
        let (restored, _) = s.recover(past).unwrap();
        assert!(restored >= 1);
        assert!(packs[0].exists());
        for (id, b) in &objs {
            assert_eq!(&s.get(id).unwrap(), b);
        }
    }

    #[test]
    fn a_damaged_pack_is_named_by_listing_and_its_objects_look_missing() {
        let (_d, s) = store();
        let objs = packed(&s, 10);
        let p = &pack_files(&s)[0];
        let first = s.read_pack_index(p).unwrap()[0];
        let in_it = first.id;
        let mut b = fs::read(p).unwrap();
        let n = b.len();
        b[n - pack::TRAILER_SIZE - 3] ^= 1; // inside the index
        fs::write(p, &b).unwrap();
        let reader = LocalStore::open(s.root(), None).unwrap();
        let e = reader.get(&in_it).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let e = reader.list_objects(&mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains(".pack"), "{e}");
        // A damaged object (not index) is caught by verification on read.
        b[n - pack::TRAILER_SIZE - 3] ^= 1;
        let at = first.offset as usize + 20;
        b[at] ^= 1;
        fs::write(p, &b).unwrap();
        let reader = LocalStore::open(s.root(), None).unwrap();
        let e = fetch(&reader, &in_it, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.to_string().contains(&in_it.to_hex()), "{e}");
        assert_eq!(objs.len(), 10);
    }

    #[test]
    fn an_unfinished_pack_leaves_nothing_behind() {
        let (_d, s) = store();
        let g = s.put_group();
        g.write(&ChunkId([1; 32]), [b"abcdefghijklmnopqrst", b""])
            .unwrap();
        drop(g);
        assert!(pack_files(&s).is_empty());
        assert_eq!(fs::read_dir(s.root().join("tmp")).unwrap().count(), 0);
        assert!(!s.has_many(&[ChunkId([1; 32])], false).unwrap()[0]);
    }

    #[test]
    fn a_version_1_store_opens_reads_and_moves_to_packs() {
        let (_d, s) = store();
        let cfg = s.root().join("store.toml");
        let v1 = fs::read_to_string(&cfg)
            .unwrap()
            .replace("version = 2", "version = 1");
        fs::write(&cfg, &v1).unwrap();
        fs::remove_dir(s.packs_path()).unwrap();
        let old = LocalStore::open(s.root(), None).unwrap();
        let a = old.config().codec().seal(b"loose", false);
        old.put_many(&[(a.id, &a.object)]).unwrap();
        assert_eq!(fs::read_to_string(&cfg).unwrap(), v1, "no pack: still 1");
        assert_eq!(fetch(&old, &a.id, None).unwrap(), b"loose");
        packed(&old, 3);
        let now = fs::read_to_string(&cfg).unwrap();
        assert!(now.contains("version = 2"), "{now}");
        assert_eq!(fetch(&old, &a.id, None).unwrap(), b"loose");
    }
}
