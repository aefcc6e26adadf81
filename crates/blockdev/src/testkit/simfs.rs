//! A simulated file system for crash tests of whole-file writes.
//!
//! [`SimFs`] implements [`FileSystem`], the calls `durable` makes, so a
//! test runs the very write production runs. It keeps a live and a durable
//! image of files and directory entries and loses power at the N-th call (a
//! shared [`Countdown`]); [`SimFs::after_crash`] is what a reboot finds.
//! [`check_power_cuts`] cuts the power at every step of a write in turn and
//! checks that a reboot finds the old file or the new one. It also
//! implements [`Vfs`] (positional I/O: [`SimVFile`]), which the layers
//! keep their files through, so their crash harnesses run on it too.
//!
//! The model, no kinder than ext4 or XFS:
//!
//! * a file's data and size are durable only after the file's `fsync`.
//!   Since then, any of it may be lost: the reboot finds the durable
//!   length, the live one or one in between; each sector that changed and
//!   held durable bytes holds its durable bytes or its live ones (written
//!   in place), and one wholly past the durable length, or of a file
//!   truncated since its last `fsync`, its live bytes or zeroes;
//! * creates and renames are durable only after an `fsync` of their
//!   directory. They are kept in order, as a journal would: the `fsync`
//!   of a directory makes every change up to the last one in that
//!   directory durable, and a crash keeps any prefix of the later ones.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::durable::{parent_of, FileSystem};
use crate::testkit::{Countdown, Rng, SECTOR};
use crate::vfs::{VFile, Vfs};

/// One file's bytes: what a reader sees and what the disk holds.
#[derive(Debug, Default, Clone)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Truncated (re-created) since its last sync: its old sectors are
    /// gone, a reboot may find zeroes where they were.
    truncated: bool,
}

impl Inode {
    /// The bytes a reboot finds (see the module's model).
    fn after_crash(&self, rng: &mut Rng) -> Vec<u8> {
        if self.live == self.durable {
            return self.durable.clone();
        }
        let (short, long) = if self.live.len() < self.durable.len() {
            (self.live.len(), self.durable.len())
        } else {
            (self.durable.len(), self.live.len())
        };
        let len = match rng.below(3) {
            0 => self.durable.len(),
            1 => self.live.len(),
            _ => short + rng.below((long - short) as u64 + 1) as usize,
        };
        let mut out = vec![0u8; len];
        // A sector that held durable bytes holds its old bytes or its new
        // ones (rewritten in place: no free block is exposed there); one
        // wholly past the durable size, or in a file truncated since, may
        // also be zeroes.
        let in_place = if self.truncated {
            0
        } else {
            self.durable.len()
        };
        for start in (0..len).step_by(SECTOR) {
            let end = (start + SECTOR).min(len);
            let sector = |v: &[u8]| v.get(start..end.min(v.len())).map(<[u8]>::to_vec);
            let (old, new) = (sector(&self.durable), sector(&self.live));
            let src = if old == new {
                old
            } else if start < in_place {
                if rng.chance(1, 2) {
                    old
                } else {
                    new
                }
            } else {
                match rng.below(3) {
                    0 => old,
                    1 => new,
                    _ => None,
                }
            };
            if let Some(s) = src {
                out[start..start + s.len()].copy_from_slice(&s);
            }
        }
        out
    }
}

/// A change to the namespace, durable once its directory is synced.
#[derive(Debug, Clone)]
enum Change {
    Create { path: PathBuf, inode: usize },
    Rename { from: PathBuf, to: PathBuf },
    Remove { path: PathBuf },
}

impl Change {
    fn touches(&self, dir: &Path) -> bool {
        match self {
            Change::Create { path, .. } | Change::Remove { path } => parent_of(path) == dir,
            Change::Rename { from, to } => parent_of(from) == dir || parent_of(to) == dir,
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, usize>) {
        match self {
            Change::Create { path, inode } => {
                names.insert(path.clone(), *inode);
            }
            Change::Rename { from, to } => {
                if let Some(i) = names.remove(from) {
                    names.insert(to.clone(), i);
                }
            }
            Change::Remove { path } => {
                names.remove(path);
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    inodes: Vec<Inode>,
    /// The names a reader sees.
    live: BTreeMap<PathBuf, usize>,
    /// The names on disk.
    durable: BTreeMap<PathBuf, usize>,
    /// Changes to the names not yet durable, in order.
    journal: Vec<Change>,
}

/// Spend one I/O of `countdown`; an error once the power is off.
fn power(countdown: &Countdown) -> io::Result<()> {
    if countdown.spend() {
        Ok(())
    } else {
        Err(io::Error::other("simulated power loss"))
    }
}

/// A file system in memory with a live and a durable image. Every call of
/// [`FileSystem`] and every `write` of a [`SimFile`] spends one I/O of its
/// countdown.
#[derive(Clone)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
    countdown: Arc<Countdown>,
}

impl SimFs {
    /// An empty file system whose power fails as `countdown` says.
    pub fn new(countdown: Arc<Countdown>) -> SimFs {
        SimFs {
            state: Arc::default(),
            countdown,
        }
    }

    /// Make `path` a durable file holding `bytes` (no I/O is counted: the
    /// state a test starts from).
    pub fn put(&self, path: &Path, bytes: &[u8]) {
        let mut st = self.state.lock();
        let inode = st.inodes.len();
        st.inodes.push(Inode {
            live: bytes.to_vec(),
            durable: bytes.to_vec(),
            truncated: false,
        });
        st.live.insert(path.to_owned(), inode);
        st.durable.insert(path.to_owned(), inode);
    }

    /// What a reader sees at `path` now (`None`: no such file).
    pub fn read(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        st.live.get(path).map(|&i| st.inodes[i].live.clone())
    }

    /// Every file name a reader sees now.
    pub fn files(&self) -> Vec<PathBuf> {
        self.state.lock().live.keys().cloned().collect()
    }

    /// Whether the power failed.
    pub fn crashed(&self) -> bool {
        self.countdown.crashed()
    }

    /// The file system a reboot finds, on fresh power counted by
    /// `countdown`: the durable image plus, as `rng` chooses, a prefix of
    /// the unsynced changes to names and some of the unsynced data.
    pub fn after_crash(&self, rng: &mut Rng, countdown: Arc<Countdown>) -> SimFs {
        let st = self.state.lock();
        let mut names = st.durable.clone();
        let keep = rng.below(st.journal.len() as u64 + 1) as usize;
        for c in &st.journal[..keep] {
            c.apply(&mut names);
        }
        let inodes = st
            .inodes
            .iter()
            .map(|i| {
                let bytes = i.after_crash(rng);
                Inode {
                    live: bytes.clone(),
                    durable: bytes,
                    truncated: false,
                }
            })
            .collect();
        SimFs {
            state: Arc::new(Mutex::new(State {
                inodes,
                live: names.clone(),
                durable: names,
                journal: Vec::new(),
            })),
            countdown,
        }
    }
}

/// A file of a [`SimFs`] open for writing. One `write` stores at most up
/// to the next sector boundary, so the power can fail between the sectors
/// of one `write_all`.
pub struct SimFile {
    state: Arc<Mutex<State>>,
    countdown: Arc<Countdown>,
    inode: usize,
    pos: usize,
}

impl io::Write for SimFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        power(&self.countdown)?;
        let n = buf.len().min(SECTOR - self.pos % SECTOR);
        let mut st = self.state.lock();
        let data = &mut st.inodes[self.inode].live;
        if data.len() < self.pos + n {
            data.resize(self.pos + n, 0);
        }
        data[self.pos..self.pos + n].copy_from_slice(&buf[..n]);
        self.pos += n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl FileSystem for SimFs {
    type File = SimFile;
    fn create(&self, path: &Path) -> io::Result<SimFile> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let inode = match st.live.get(path) {
            Some(&i) => {
                st.inodes[i].live.clear();
                st.inodes[i].truncated = true;
                i
            }
            None => {
                let i = st.inodes.len();
                st.inodes.push(Inode::default());
                st.live.insert(path.to_owned(), i);
                st.journal.push(Change::Create {
                    path: path.to_owned(),
                    inode: i,
                });
                i
            }
        };
        Ok(SimFile {
            state: self.state.clone(),
            countdown: self.countdown.clone(),
            inode,
            pos: 0,
        })
    }
    fn create_new(&self, path: &Path) -> io::Result<SimFile> {
        if self.state.lock().live.contains_key(path) {
            power(&self.countdown)?;
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        self.create(path)
    }
    fn sync_file(&self, file: &mut SimFile) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let i = &mut st.inodes[file.inode];
        i.durable = i.live.clone();
        i.truncated = false;
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let i = st
            .live
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        st.live.insert(to.to_owned(), i);
        st.journal.push(Change::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        });
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let State {
            journal, durable, ..
        } = &mut *st;
        if let Some(last) = journal.iter().rposition(|c| c.touches(dir)) {
            for c in journal.drain(..=last) {
                c.apply(durable);
            }
        }
        Ok(())
    }
}

/// A file of a [`SimFs`] open for positional I/O ([`VFile`]). One
/// sector of a write is stored per I/O, so the power can fail between the
/// sectors of one write.
pub struct SimVFile {
    state: Arc<Mutex<State>>,
    countdown: Arc<Countdown>,
    inode: usize,
}

impl VFile for SimVFile {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let st = self.state.lock();
        let data = &st.inodes[self.inode].live;
        let off = off as usize;
        let src = data
            .get(off..off + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut pos = off as usize;
        let mut rest = buf;
        while !rest.is_empty() {
            power(&self.countdown)?;
            let n = rest.len().min(SECTOR - pos % SECTOR);
            let mut st = self.state.lock();
            let data = &mut st.inodes[self.inode].live;
            if data.len() < pos + n {
                data.resize(pos + n, 0);
            }
            data[pos..pos + n].copy_from_slice(&rest[..n]);
            pos += n;
            rest = &rest[n..];
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let i = &mut st.inodes[self.inode];
        i.durable = i.live.clone();
        i.truncated = false;
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        power(&self.countdown)?;
        self.state.lock().inodes[self.inode]
            .live
            .resize(len as usize, 0);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.state.lock().inodes[self.inode].live.len() as u64)
    }
    fn punch_hole(&self, off: u64, len: u64) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        let data = &mut st.inodes[self.inode].live;
        let a = (off as usize).min(data.len());
        let b = (off.saturating_add(len) as usize).min(data.len());
        data[a..b].fill(0);
        Ok(())
    }
}

impl Vfs for SimFs {
    fn open(&self, path: &Path, _write: bool) -> io::Result<Arc<dyn VFile>> {
        let inode = *self
            .state
            .lock()
            .live
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Arc::new(SimVFile {
            state: self.state.clone(),
            countdown: self.countdown.clone(),
            inode,
        }))
    }
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn VFile>> {
        let f = FileSystem::create_new(self, path)?;
        Ok(Arc::new(SimVFile {
            state: self.state.clone(),
            countdown: self.countdown.clone(),
            inode: f.inode,
        }))
    }
    fn exists(&self, path: &Path) -> bool {
        self.state.lock().live.contains_key(path)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        SimFs::read(self, path).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        crate::durable::write_atomically_in(self, path, bytes)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        power(&self.countdown)?;
        let mut st = self.state.lock();
        st.live
            .remove(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        st.journal.push(Change::Remove {
            path: path.to_owned(),
        });
        Ok(())
    }
}

/// A reboot that found what a durable whole-file write must not leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The I/O at which the power failed (1-based); one past the write's
    /// last I/O means after the write returned.
    pub cut_at: u64,
    /// The seed of the reboot's choices (what of the unsynced state
    /// survived).
    pub seed: u64,
    /// Whether the write had returned before the power failed.
    pub completed: bool,
    /// What the reboot found at the target (`None`: no file).
    pub found: Option<Vec<u8>>,
    /// What is wrong with it.
    pub what: &'static str,
}

/// Cut the power at every I/O of `write` in turn (and once after it
/// returned) and reboot `reboots` times each: `write` runs on a [`SimFs`]
/// holding the durable file `old` at `path` (`None`: no file) and should
/// replace it with `new`. Returns every reboot that found, at `path`,
///
/// * anything but exactly `old` or exactly `new` (an empty, short or mixed
///   file, or a stray temporary under the target's name);
/// * anything but `new` once `write` had returned;
///
/// or after which running `write` again did not leave exactly `new` at
/// `path` and no other file. Empty: the write is crash-safe.
pub fn check_power_cuts(
    path: &Path,
    old: Option<&[u8]>,
    new: &[u8],
    reboots: u64,
    mut write: impl FnMut(&SimFs),
) -> Vec<Violation> {
    let start = |countdown: Arc<Countdown>| {
        let fs = SimFs::new(countdown);
        if let Some(old) = old {
            fs.put(path, old);
        }
        fs
    };
    let counter = Countdown::unarmed();
    write(&start(counter.clone()));
    let ios = counter.spent();
    let mut bad = Vec::new();
    for cut_at in 1..=ios + 1 {
        let fs = start(Countdown::crash_at(cut_at));
        write(&fs);
        let completed = !fs.crashed();
        for seed in 0..reboots {
            let mut rng = Rng::new((cut_at << 32) | seed);
            let after = fs.after_crash(&mut rng, Countdown::unarmed());
            let found = after.read(path);
            let what = if completed && found.as_deref() != Some(new) {
                Some("a completed write was lost")
            } else if found.as_deref() != old && found.as_deref() != Some(new) {
                Some("neither the old file nor the new one")
            } else {
                write(&after);
                (after.read(path).as_deref() != Some(new) || after.files() != [path])
                    .then_some("the next write did not leave the new file alone")
            };
            if let Some(what) = what {
                bad.push(Violation {
                    cut_at,
                    seed,
                    completed,
                    found,
                    what,
                });
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn synced_data_and_names_survive_and_unsynced_may_not() {
        let fs = SimFs::new(Countdown::unarmed());
        let (dir, a, b) = (Path::new("/d"), Path::new("/d/a"), Path::new("/d/b"));
        let mut f = fs.create(a).unwrap();
        f.write_all(&[1; 1024]).unwrap();
        fs.sync_file(&mut f).unwrap();
        fs.sync_dir(dir).unwrap();
        f.write_all(&[2; 1024]).unwrap();
        fs.rename(a, b).unwrap();
        let (mut lost, mut kept, mut torn) = (false, false, false);
        for seed in 0..64 {
            let after = fs.after_crash(&mut Rng::new(seed), Countdown::unarmed());
            let name = match (after.read(a), after.read(b)) {
                (Some(x), None) | (None, Some(x)) => x,
                other => panic!("one name, not {other:?}"),
            };
            // The synced kilobyte is always there; what followed, by sector.
            assert_eq!(name[..1024], [1; 1024]);
            for s in name[1024..].chunks(SECTOR) {
                assert!(s.iter().all(|&x| x == 2) || s.iter().all(|&x| x == 0));
            }
            lost |= name.len() == 1024;
            kept |= name.len() == 2048 && name[1024..].iter().all(|&x| x == 2);
            torn |= name.len() > 1024 && name[1024..].contains(&0);
        }
        assert!(lost && kept && torn);
    }

    #[test]
    fn a_directory_sync_makes_earlier_changes_durable() {
        let fs = SimFs::new(Countdown::unarmed());
        let (x, y) = (Path::new("/x/f"), Path::new("/y/f"));
        fs.sync_file(&mut fs.create(x).unwrap()).unwrap();
        fs.sync_file(&mut fs.create(y).unwrap()).unwrap();
        fs.sync_dir(Path::new("/y")).unwrap();
        for seed in 0..16 {
            let after = fs.after_crash(&mut Rng::new(seed), Countdown::unarmed());
            assert_eq!(after.files(), [x, y]);
        }
    }

    #[test]
    fn the_power_fails_at_the_countdown() {
        let fs = SimFs::new(Countdown::crash_at(3));
        let p = Path::new("f");
        let mut f = fs.create(p).unwrap();
        f.write_all(b"x").unwrap();
        assert!(fs.sync_file(&mut f).is_err());
        assert!(fs.crashed());
        assert!(fs.sync_dir(Path::new(".")).is_err());
        assert_eq!(fs.read(p).unwrap(), b"x");
    }
}
