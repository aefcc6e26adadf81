//! The packs of a local store (`packs/NAME.pack`, byte layout in
//! `docs/formats/cas-pack.md`, protocol in `docs/formats/cas-store.md`):
//! the `packs/` folder, opened once; the table of where each packed object
//! is (`table.rs`), loaded from the packs' indexes on first use, again for
//! packs that appeared since when an object is not found, and from scratch
//! when a pack it points into is gone (a gc repacked it); reads, lookups
//! and touches of packed objects (a touch is a touch of the pack), and
//! their listing for gc. Writing a pack: `pack_writer.rs`; removing one:
//! `gc.rs`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::ErrorKind as IoKind;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::files::{if_found, open_dir, touch_or_stat};
use super::store::LocalStore;
use super::table::Loc;
use crate::error::{corrupt, io};
use crate::hash::ChunkId;
use crate::store::api::ObjectEntry;
use crate::store::pack::{self, is_pack_name, Entry, Trailer};

/// The names of the packs in `dir` (none if it does not exist).
pub(super) fn pack_names_in(dir: &Path) -> Result<Vec<String>> {
    let Some(rd) = if_found(fs::read_dir(dir)).map_err(|e| io(Op::Read, e, dir))? else {
        return Ok(Vec::new());
    };
    Ok(rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_pack_name(n))
        .collect())
}

/// The modification time of a file (its reference time).
pub(super) fn mtime(m: &fs::Metadata) -> SystemTime {
    m.modified().unwrap_or(UNIX_EPOCH)
}

impl LocalStore {
    /// The `packs/` folder.
    pub(super) fn packs_path(&self) -> PathBuf {
        self.root.join("packs")
    }

    /// The `packs/` folder, opened once (made with `create`).
    pub(super) fn packs_dir(&self, create: bool) -> std::io::Result<Arc<OwnedFd>> {
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

    /// Load the packs once (a damaged one is left out).
    pub(super) fn ensure_scanned(&self) -> Result<()> {
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
            let found = if_found(touch_or_stat(&*dir, &name, touch))
                .map_err(|e| io(Op::Write, e, &self.packs_path().join(&name)))?;
            alive.insert(p, found.is_some());
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

    /// Make the `packs/` folder's entries durable now.
    pub(super) fn sync_packs_dir(&self) -> Result<()> {
        let p = self.packs_path();
        self.packs_dir(true)
            .and_then(|d| rustix::fs::fsync(&*d).map_err(std::io::Error::from))
            .map_err(|e| io(Op::Flush, e, &p))
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::testing::{hour, pack_files, packed, set_mtime, store};
    use super::*;
    use crate::store::api::fetch;
    use crate::store::api::prelude::*;
    use std::time::Duration;

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
}
