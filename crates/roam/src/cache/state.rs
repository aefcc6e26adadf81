//! The shared cache's replicated state machine: the resident set and the
//! replacement policy, as the journal says, applied in journal order by
//! every process that opens the cache ([`Journal::locked`] catches up
//! with what others appended, under the directory's `flock`), and the
//! journal's compaction. Record format: `journal.rs`;
//! `docs/formats/cas-shared-cache.md`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use parking_lot::Mutex;
use roamdisk_blockdev::{durable, Op, Result};
use roamdisk_cachesim::{HashIndex, Policy, PolicySpec};
use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::hash::ChunkId;

use super::files::read_full_at;
use super::journal::{self, Kind, Record, HEADER_LEN};

/// The replicated state: what the journal says, applied in order.
pub(super) struct State {
    journal: Option<File>,
    ino: u64,
    pos: u64,
    pub(super) records: u64,
    policy: Box<dyn Policy<ChunkId>>,
    /// Resident chunks: size and the sequence number of their last
    /// reference (compaction writes them back oldest first).
    pub(super) resident: HashMap<ChunkId, (u32, u64)>,
    pub(super) bytes: u64,
    seq: u64,
}

impl State {
    fn new(spec: &PolicySpec, capacity: usize) -> State {
        State {
            journal: None,
            ino: 0,
            pos: HEADER_LEN as u64,
            records: 0,
            policy: spec.build::<ChunkId, HashIndex<ChunkId>>(capacity),
            resident: HashMap::new(),
            bytes: 0,
            seq: 0,
        }
    }

    /// Apply one record; returns the key the policy evicted, if any.
    pub(super) fn apply(&mut self, r: &Record) -> Option<ChunkId> {
        self.seq += 1;
        self.records += 1;
        let evicted = |o: roamdisk_cachesim::Outcome<ChunkId>| match o {
            roamdisk_cachesim::Outcome::Miss { evicted } => evicted,
            roamdisk_cachesim::Outcome::Hit => None,
        };
        match r.kind {
            Kind::Insert(size) => {
                if let Some((old, _)) = self.resident.insert(r.id, (size, self.seq)) {
                    self.bytes -= old as u64;
                }
                self.bytes += size as u64;
                evicted(self.policy.access(r.id))
            }
            Kind::Touch => match self.resident.get_mut(&r.id) {
                Some(e) => {
                    e.1 = self.seq;
                    evicted(self.policy.access(r.id))
                }
                None => None,
            },
            Kind::Evict => {
                if let Some((size, _)) = self.resident.remove(&r.id) {
                    self.bytes -= size as u64;
                }
                self.policy.remove(&r.id);
                None
            }
        }
    }
}

/// Journal records written by one holder of the lock.
pub(super) struct Batch<'a> {
    pub(super) state: &'a mut State,
    pub(super) bytes: Vec<u8>,
}

impl Batch<'_> {
    pub(super) fn emit(&mut self, kind: Kind, id: ChunkId) -> Option<ChunkId> {
        let r = Record { kind, id };
        self.bytes.extend_from_slice(&r.encode());
        self.state.apply(&r)
    }
}

impl<'a> Batch<'a> {
    /// A batch of records to append, applied to `state` as they are made.
    pub(super) fn new(state: &'a mut State) -> Batch<'a> {
        Batch {
            state,
            bytes: Vec::new(),
        }
    }

    /// The records made so far, taken out to be appended.
    pub(super) fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }
}

/// The journal file, the lock that orders its appends, and this process's
/// copy of the state it describes.
pub(super) struct Journal {
    path: PathBuf,
    lock_path: PathBuf,
    lock: File,
    state: Mutex<State>,
    spec: PolicySpec,
    capacity: usize,
}

impl Journal {
    /// The journal of the cache in `dir` (read at the first
    /// [`Journal::locked`]), kept with `spec`'s policy over `capacity`
    /// chunks.
    pub(super) fn new(dir: &std::path::Path, spec: PolicySpec, capacity: usize) -> Result<Journal> {
        let lock_path = dir.join("lock");
        let lock = roamdisk_chunkstore::error::open_lock_file(&lock_path)?;
        Ok(Journal {
            path: dir.join("journal"),
            lock_path,
            lock,
            state: Mutex::new(State::new(&spec, capacity)),
            spec,
            capacity,
        })
    }

    /// This process's copy of the state as of its last look at the
    /// journal (no lock on the directory: it may be behind).
    pub(super) fn peek<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock())
    }

    /// Run `f` holding this process's state and the directory's lock,
    /// with the state caught up with the journal.
    pub(super) fn locked<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut st = self.state.lock();
        rustix::fs::flock(&self.lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(Op::Write, e.into(), &self.lock_path))?;
        let out = self.catch_up(&mut st).and_then(|()| f(&mut st));
        let _ = rustix::fs::flock(&self.lock, rustix::fs::FlockOperation::Unlock);
        out
    }

    /// Apply the records other processes appended since we last looked
    /// (all of them if the journal was replaced by a compaction), and cut
    /// a torn tail left by a writer that died mid-append.
    fn catch_up(&self, st: &mut State) -> Result<()> {
        let path = &self.path;
        let ino = match std::fs::metadata(path) {
            Ok(m) => m.ino(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                durable::write_atomically(path, &journal::encode_header())
                    .map_err(|e| io(Op::Write, e, path))?;
                std::fs::metadata(path)
                    .map_err(|e| io(Op::Open, e, path))?
                    .ino()
            }
            Err(e) => return Err(io(Op::Open, e, path)),
        };
        if st.journal.is_none() || st.ino != ino {
            *st = State::new(&self.spec, self.capacity);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| io(Op::Open, e, path))?;
            let mut h = [0u8; HEADER_LEN];
            let n = read_full_at(&f, &mut h, 0).map_err(|e| io(Op::Read, e, path))?;
            journal::check_header(&h[..n]).map_err(|e| {
                corrupt(format!(
                    "{e}: remove the shared cache folder to start it afresh"
                ))
                .path(path)
            })?;
            st.journal = Some(f);
            st.ino = ino;
        }
        let f = st.journal.as_ref().expect("opened above");
        let len = f.metadata().map_err(|e| io(Op::Read, e, path))?.len();
        if len > st.pos {
            let mut body = vec![0u8; (len - st.pos) as usize];
            let n = read_full_at(f, &mut body, st.pos).map_err(|e| io(Op::Read, e, path))?;
            let (recs, used) = journal::decode_records(&body[..n]);
            if used < n {
                f.set_len(st.pos + used as u64)
                    .map_err(|e| io(Op::Write, e, path))?;
            }
            st.pos += used as u64;
            for r in &recs {
                st.apply(r);
            }
        }
        Ok(())
    }

    /// Append a batch; on failure the state no longer matches the journal
    /// and is reloaded from it next time.
    pub(super) fn commit(&self, st: &mut State, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let path = &self.path;
        let f = st.journal.as_ref().expect("caught up");
        match f.write_all_at(bytes, st.pos) {
            Ok(()) => {
                st.pos += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                st.journal = None;
                Err(io(Op::Write, e, path))
            }
        }
    }

    /// Rewrite the journal once it is mostly history: one insert record
    /// per resident chunk, oldest reference first (the policy restarts
    /// from that order in every process).
    pub(super) fn maybe_compact(&self, st: &mut State) -> Result<()> {
        let live = st.resident.len() as u64;
        if st.records < 4096.max(8 * live) {
            return Ok(());
        }
        self.rewrite(st)
    }

    fn rewrite(&self, st: &mut State) -> Result<()> {
        let mut order: Vec<(u64, ChunkId, u32)> = st
            .resident
            .iter()
            .map(|(id, &(size, seq))| (seq, *id, size))
            .collect();
        order.sort_unstable();
        let mut bytes = journal::encode_header().to_vec();
        for (_, id, size) in order {
            bytes.extend_from_slice(
                &Record {
                    kind: Kind::Insert(size),
                    id,
                }
                .encode(),
            );
        }
        durable::write_atomically(&self.path, &bytes).map_err(|e| io(Op::Write, e, &self.path))?;
        // Reload from the new file, as every other process will.
        st.journal = None;
        self.catch_up(st)
    }
}
