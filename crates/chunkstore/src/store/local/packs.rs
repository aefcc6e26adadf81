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

/// Objects of one pack at most this far apart are read in one run by
/// `get_packed_many` (the bytes between are read and dropped).
const RUN_GAP: u64 = 64 << 10;
/// The most bytes one run reads.
const RUN_MAX: u64 = 4 << 20;

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

    /// The packed objects among `ids` (`None`: not in a loaded pack, or
    /// its read failed — the caller asks [`ChunkRead::get`] for those),
    /// read with one `pread` per run of neighbours in one pack: a batch of
    /// 4 KiB chunks committed together is one read, not an open, a read
    /// and a close each.
    ///
    /// [`ChunkRead::get`]: crate::store::ChunkRead::get
    pub(super) fn get_packed_many(&self, ids: &[ChunkId]) -> Result<Vec<Option<Vec<u8>>>> {
        self.ensure_scanned()?;
        // (pack, offset, len, index in ids), by pack and offset.
        let mut wanted: Vec<(u32, u64, u32, usize)> = Vec::with_capacity(ids.len());
        let names = {
            let t = self.packs.read();
            for (k, id) in ids.iter().enumerate() {
                if let Some(l) = t.objects.get(id) {
                    wanted.push((l.pack, l.offset, l.len, k));
                }
            }
            let mut packs: Vec<u32> = wanted.iter().map(|w| w.0).collect();
            packs.sort_unstable();
            packs.dedup();
            packs
                .into_iter()
                .map(|p| (p, t.names[p as usize].clone()))
                .collect::<HashMap<u32, String>>()
        };
        wanted.sort_unstable();
        // Runs: neighbours in one pack, gaps under RUN_GAP, at most RUN_MAX.
        let mut runs: Vec<&[(u32, u64, u32, usize)]> = Vec::new();
        let mut start = 0;
        for i in 1..=wanted.len() {
            let breaks = i == wanted.len() || {
                let (a, b) = (&wanted[i - 1], &wanted[i]);
                let end = a.1 + a.2 as u64;
                b.0 != a.0
                    || b.1 < end
                    || b.1 - end > RUN_GAP
                    || b.1 + b.2 as u64 - wanted[start].1 > RUN_MAX
            };
            if breaks {
                runs.push(&wanted[start..i]);
                start = i;
            }
        }
        let dir = self.packs_path();
        let read: Vec<Vec<(usize, Vec<u8>)>> = runs
            .par_iter()
            .map(|run| {
                let (first, last) = (run[0], run[run.len() - 1]);
                let span = (last.1 + last.2 as u64 - first.1) as usize;
                let mut buf = vec![0u8; span];
                let ok = File::open(dir.join(&names[&first.0]))
                    .and_then(|f| f.read_exact_at(&mut buf, first.1));
                match ok {
                    Ok(()) => run
                        .iter()
                        .map(|&(_, off, len, k)| {
                            let at = (off - first.1) as usize;
                            (k, buf[at..at + len as usize].to_vec())
                        })
                        .collect(),
                    // Repacked, truncated or unreadable: one by one, with
                    // `get`'s rescans and errors.
                    Err(_) => Vec::new(),
                }
            })
            .collect();
        let mut out: Vec<Option<Vec<u8>>> = vec![None; ids.len()];
        for (k, v) in read.into_iter().flatten() {
            out[k] = Some(v);
        }
        Ok(out)
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
    fn a_batch_read_is_read_in_runs_and_falls_back_one_by_one() {
        let (_d, s) = store();
        let mut objs = packed(&s, 300);
        // More packs, and objects not in the table yet (another process's).
        let other = LocalStore::open(s.root(), None).unwrap();
        other.get(&objs[0].0).unwrap();
        let codec = s.config().codec();
        let more: Vec<(ChunkId, Vec<u8>)> = (1000u32..1040)
            .map(|i| {
                let sealed = codec.seal(&i.to_le_bytes().repeat(100), false);
                (sealed.id, sealed.object)
            })
            .collect();
        let items: Vec<(ChunkId, &[u8])> = more.iter().map(|(id, b)| (*id, &b[..])).collect();
        s.put_many(&items).unwrap();
        s.sync().unwrap();
        objs.extend(more);
        let absent = ChunkId([7; 32]);
        // Every third object, backwards, the absent one, one twice.
        let mut ask: Vec<ChunkId> = objs.iter().rev().step_by(3).map(|(id, _)| *id).collect();
        ask.push(absent);
        ask.push(objs[5].0);
        ask.push(objs[5].0);
        let bytes = |id: &ChunkId| objs.iter().find(|(i, _)| i == id).map(|(_, b)| b.clone());
        for reader in [&s, &other] {
            let got = reader.get_many(&ask);
            assert_eq!(got.len(), ask.len());
            for (id, g) in ask.iter().zip(&got) {
                match bytes(id) {
                    Some(b) => assert_eq!(g.as_ref().unwrap(), &b),
                    None => assert_eq!(g.as_ref().unwrap_err().kind(), ErrorKind::NotFound),
                }
            }
        }
        // A pack cut short: its objects past the cut are read one by one
        // and reported, the others still come back.
        let p = &pack_files(&s)[0];
        let index = s.read_pack_index(p).unwrap();
        let at = index[index.len() / 2].offset;
        fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(at)
            .unwrap();
        let got = s.get_many(&ask);
        let cut: Vec<ChunkId> = index
            .iter()
            .filter(|e| e.offset + e.len as u64 > at)
            .map(|e| e.id)
            .collect();
        assert!(!cut.is_empty() && cut.len() < index.len());
        for (id, g) in ask.iter().zip(&got) {
            if cut.contains(id) || *id == absent {
                assert!(g.is_err(), "{id}");
            } else {
                assert_eq!(g.as_ref().unwrap(), &bytes(id).unwrap());
            }
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
}
