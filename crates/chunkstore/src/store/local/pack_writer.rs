//! The writer of a new pack in a local store ([`PackGroup`], the store's
//! put group): objects are written at reserved offsets from any thread
//! into one unnamed file per writing thread, then the index and trailer,
//! one fsync, and one name (a new random name that must be free), so
//! nothing names an object of the pack before its data is on disk. The
//! first pack of a store written by an older build first records the pack
//! layout in `store.toml`.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use roamdisk_blockdev::durable::{rename_noreplace_at, Renamed};
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::files::{open_unnamed, pwrite_parts, Unnamed};
use super::store::LocalStore;
use crate::error::{err, io};
use crate::hash::ChunkId;
use crate::store::pack::{self, Entry};
use crate::store::{PutGroup, PutOutcome};

/// A fresh random pack name.
fn new_pack_name() -> std::io::Result<String> {
    let mut r = [0u8; 16];
    roamdisk_crypto::fill_random(&mut r).map_err(std::io::Error::other)?;
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{hex}.pack"))
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
    /// An empty group of `store`: one lane per worker thread, each pack
    /// file made on the lane's first write.
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
    /// Step 1 of writing a pack: an unnamed file in `packs/` holding the
    /// pack header (a named one in `tmp/` where there are no unnamed files).
    fn create_pack_file(&self) -> std::io::Result<Unnamed> {
        let header = pack::header(self.config.hash);
        if !self.naming.tmp_dir_only() {
            let dir = self.packs_dir(true)?;
            match open_unnamed(&dir) {
                Ok(file) => {
                    file.write_all_at(&header, 0)?;
                    return Ok(Unnamed { file, tmp: None });
                }
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR) => {
                    self.naming.use_tmp_dir();
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

    /// [`LocalStore::create_pack_file`] where there are no unnamed files:
    /// a new named file in `tmp/` holding `header`.
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
                None => self.naming.link(dir.as_fd(), &b.file, &name)?,
                Some(tmp) => match rename_noreplace_at(tmp, &*dir, &name)? {
                    Renamed::Moved => Some(true),
                    Renamed::TargetExists => Some(false),
                    Renamed::SourceMissing => return Err(rustix::io::Errno::NOENT.into()),
                },
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
                    self.naming.use_tmp_dir();
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
}

#[cfg(test)]
mod tests {
    use super::super::store::testing::{pack_files, packed, store};
    use super::*;
    use crate::store::fetch;
    use crate::store::prelude::*;
    use std::fs;

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
