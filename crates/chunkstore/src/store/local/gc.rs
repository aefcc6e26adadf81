//! Garbage collection in a local store: the listing of every object with
//! its reference time (an object's own file, or its pack's), removal with
//! remove-if-older (moved aside to `trash/`, its time read again, put back
//! if a commit touched it meanwhile), the rewrite of a pack without its
//! dead objects, and the recovery of what a dead gc left in `trash/` and a
//! dead writer in `tmp/`. Protocol: "gc and commits" in
//! `docs/formats/cas-store.md`.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use roamdisk_blockdev::durable::{rename_noreplace, Renamed};
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::files::{if_found, touch};
use super::pack_writer::PackGroup;
use super::packs::{mtime, pack_names_in};
use super::store::LocalStore;
use crate::error::io;
use crate::hash::ChunkId;
use crate::store::api::{ChunkPrune, ChunkWrite, Freed, ObjectEntry, PutGroup};
use crate::store::pack::{is_pack_name, Entry};

impl LocalStore {
    /// Put back an object a crashed (or concurrent) gc moved aside, and
    /// refresh its time. True if it is now in place.
    pub(super) fn restore_from_trash(&self, id: &ChunkId) -> Result<bool> {
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
        let Some(m) = if_found(fs::metadata(&t)).map_err(|e| io(Op::Read, e, &t))? else {
            return Ok(None);
        };
        if m.modified().unwrap_or(UNIX_EPOCH) >= cutoff {
            let _ = rename_noreplace(&t, &p);
            let _ = fs::remove_file(&t);
            return Ok(None);
        }
        let removed = if_found(fs::remove_file(&t)).map_err(|e| io(Op::Write, e, &t))?;
        Ok(removed.map(|()| m.len()))
    }

    /// gc: remove the packed copies of `ids` (unreferenced objects last
    /// referenced before `cutoff`). Each pack holding some of them is
    /// rewritten without them ([`LocalStore::repack_without`]). Returns
    /// the bytes freed per object removed.
    fn remove_packed_if_older(
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
            let m = if_found(fs::metadata(p)).map_err(|e| io(Op::Read, e, p))?;
            Ok(m.map(|m| mtime(&m) >= cutoff))
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
            let Some(f) = if_found(File::open(&path)).map_err(|e| io(Op::Read, e, &path))? else {
                return Ok(Vec::new());
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
        let removed = if_found(fs::remove_file(&trash)).map_err(|e| io(Op::Write, e, &trash))?;
        Ok(match removed {
            Some(()) => gone.iter().map(|e| (e.id, e.len as u64)).collect(),
            None => Vec::new(),
        })
    }

    /// Put back a pack from `trash/` (left by a gc that died between its
    /// two renames) and refresh its time. Returns its number of objects,
    /// or `None` if it was not put back.
    fn restore_pack(&self, name: &str) -> Result<Option<usize>> {
        let t = self.root.join("trash").join(name);
        let p = self.packs_path().join(name);
        self.packs_dir(true).map_err(|e| io(Op::Write, e, &p))?;
        let r = rename_noreplace(&t, &p).map_err(|e| io(Op::Write, e, &t))?;
        if r == Renamed::SourceMissing {
            return Ok(None);
        }
        let _ = touch(&p);
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
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
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

#[cfg(test)]
mod tests {
    use super::super::store::testing::{hour, pack_files, packed, set_mtime, store};
    use super::*;
    use crate::store::api::fetch;
    use crate::store::api::prelude::*;
    use std::time::Duration;

    /// Move a file aside as a gc does (to play one that died after it).
    fn move_aside(from: &Path, to: &Path) {
        assert_eq!(rename_noreplace(from, to).unwrap(), Renamed::Moved);
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
        move_aside(&s.object_path(&b.id), &s.trash_path(&b.id));
        assert_eq!(fetch(&s, &b.id, None).unwrap(), b"bbbb");
        move_aside(&s.object_path(&b.id), &s.trash_path(&b.id));
        assert_eq!(s.recover(past).unwrap(), (1, 0));
        assert!(s.object_path(&b.id).exists());
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
        move_aside(&packs[0], &trash);
        // A reader (a fresh process) finds it and puts it back.
        let reader = LocalStore::open(s.root(), None).unwrap();
        assert!(fetch(&reader, &in_first, None).is_ok());
        assert!(packs[0].exists() && !trash.exists());
        move_aside(&packs[0], &trash);
        let past = SystemTime::now() - hour();
        let (restored, _) = s.recover(past).unwrap();
        assert!(restored >= 1);
        assert!(packs[0].exists());
        for (id, b) in &objs {
            assert_eq!(&s.get(id).unwrap(), b);
        }
    }
}
