//! Objects of a local store: reading them (packs, then an object's own
//! file, then packs written since, then what a gc left in the trash),
//! looking them up and touching them for a commit, and writing them —
//! several as a pack (`pack_writer.rs`), a single one as a file of its own
//! (steps 1-3 of "Writing an object" in `docs/formats/cas-store.md`:
//! written unnamed in its fan-out folder, made durable, then named) — and
//! `sync`, which makes the folders that received names durable.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind as IoKind, Read, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rayon::prelude::*;
use roamdisk_blockdev::durable::{rename_noreplace_at, sync_dir, Renamed};
use roamdisk_blockdev::{Op, Result};

use super::files::{
    dir_removed, if_found, open_dir, open_unnamed, pwrite_parts, touch_at, touch_or_stat, Unnamed,
};
use super::pack_writer::PackGroup;
use super::store::{LocalStore, FANS};
use crate::error::{io, not_found};
use crate::hash::ChunkId;
use crate::store::api::{ChunkRead, ChunkWrite, ObjectParts, PutGroup, PutOutcome};

/// How long a fan-out folder found absent is taken as absent by lookups.
const FAN_ABSENT_MEMO_MS: u64 = 1000;

/// Objects written (and kept open) before the group is made durable and
/// named: bounds the open files of one `put_many`.
const GROUP: usize = 128;

/// A loose object written to an [`Unnamed`] file, not yet durable or named.
struct Pending {
    fan: usize,
    f: Unnamed,
}

impl LocalStore {
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
        if !self.naming.tmp_dir_only() {
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
                        self.naming.use_tmp_dir();
                        break;
                    }
                    // Anything else: try a named file once.
                    Err(_) => break,
                }
            }
        }
        self.write_named(id, parts)
    }

    /// Step 1 of a put where there are no unnamed files: a new named file
    /// in `tmp/`.
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
    /// Step 3 of a put: give a durable object its name unless the name
    /// exists (then touch the existing object, which has the same bytes).
    fn name_pending(&self, mut p: Pending, id: &ChunkId) -> std::io::Result<PutOutcome> {
        let name = id.to_hex();
        // A gc may move the existing object aside between the failed link
        // and the touch: then link again.
        for _ in 0..8 {
            let dir = self.fan_dir(p.fan, true)?;
            let named = match &p.f.tmp {
                None => self.naming.link(dir.as_fd(), &p.f.file, &name)?,
                Some(tmp) => match rename_noreplace_at(tmp, &*dir, &name)? {
                    Renamed::Moved => {
                        p.f.tmp = None;
                        Some(true)
                    }
                    Renamed::TargetExists => Some(false),
                    // The temporary file, or the folder, is gone.
                    Renamed::SourceMissing => None,
                },
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
                    self.naming.use_tmp_dir();
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

    /// The error of a failed put of object `id`.
    pub(super) fn put_error(&self, id: &ChunkId, e: std::io::Error) -> roamdisk_blockdev::Error {
        io(Op::Write, e, &self.object_path(id)).msg(format!("cannot store object {id}"))
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
        // Packed objects in runs; the rest (loose, repacked since the
        // table was loaded, in the trash, missing) one by one.
        // (A failed scan is reported by each `get`.)
        let packed = self
            .get_packed_many(ids)
            .unwrap_or_else(|_| vec![None; ids.len()]);
        ids.par_iter()
            .zip(packed)
            .map(|(id, got)| match got {
                Some(v) => Ok(v),
                None => self.get(id),
            })
            .collect()
    }
    fn has_many(&self, ids: &[ChunkId], touch_found: bool) -> Result<Vec<bool>> {
        let packed = self.has_packed(ids, touch_found)?;
        ids.par_iter()
            .zip(packed)
            .map(|(id, packed)| {
                if packed {
                    return Ok(true);
                }
                let r = self
                    .fan_dir(id.0[0] as usize, false)
                    .and_then(|dir| touch_or_stat(&*dir, &id.to_hex(), touch_found));
                // Not in place: a commit uploads it again (an object a
                // crashed gc left in the trash is not worth a lookup per
                // missing object; readers and gc put it back).
                let found = if_found(r).map_err(|e| io(Op::Read, e, &self.object_path(id)))?;
                Ok(found.is_some())
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

#[cfg(test)]
mod tests {
    use super::super::store::testing::store;
    use super::*;
    use crate::store::api::{fetch, StoreLayer};
    use roamdisk_blockdev::ErrorKind;

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
}
