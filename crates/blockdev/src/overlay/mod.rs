//! The overlay-map engine: which units (clusters, sectors) of a disk are
//! in which state, in memory and on disk, for every layer that keeps its
//! own data over a base (`cow:`, the `cas:` session).
//!
//! * In memory: 2 bits a unit, packed four to a byte in atomics, so reads
//!   check a state without a lock.
//! * On disk: an append-only log of state runs closed by COMMIT records
//!   ([`log`], `docs/formats/overlay-map.md`). [`OverlayMap::commit`] is
//!   the flush: it takes the changes recorded since the last one, has the
//!   caller make the data durable, then appends and syncs their records.
//!   [`OverlayMap::compact`] rewrites the map through a temporary file and
//!   an atomic rename (at every writable open, past 2^20 records, and when
//!   the header changes).
//! * Lock stripes for the read-modify-write of one unit
//!   ([`OverlayMap::stripe`]).
//!
//! The rule that makes it crash-safe: a layer records a state change with
//! [`OverlayMap::set`] only *after* the data the new state claims has been
//! written; the flush syncs that data before the record reaches the log.

pub mod log;

use parking_lot::{Mutex, MutexGuard};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Op, Result};
use crate::vfs::{VFile, Vfs};
pub use log::{MapError, MapHeader, Run};

/// Number of lock stripes.
pub const LOCK_STRIPES: usize = 256;
/// Compact the map when its log would grow past this many records.
pub const COMPACT_RECORDS: u64 = 1 << 20;

/// A run's length is a `u32` in the log.
const MAX_RUN: u64 = u32::MAX as u64;

/// 2-bit states of `units` units, packed in atomics.
pub struct StateTable {
    bytes: Vec<AtomicU8>,
    units: u64,
}

impl StateTable {
    /// All units in state 0.
    pub fn new(units: u64) -> StateTable {
        StateTable {
            bytes: (0..units.div_ceil(4)).map(|_| AtomicU8::new(0)).collect(),
            units,
        }
    }

    /// Number of units.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The state of unit `u`.
    pub fn get(&self, u: u64) -> u8 {
        (self.bytes[(u / 4) as usize].load(Ordering::Acquire) >> ((u % 4) * 2)) & 3
    }

    /// Set units `[a, b)` to `v`.
    pub fn set(&self, a: u64, b: u64, v: u8) {
        debug_assert!(v <= 3 && b <= self.units);
        let mut u = a;
        while u < b {
            if u.is_multiple_of(4) && u + 4 <= b {
                self.bytes[(u / 4) as usize].store(v * 0x55, Ordering::Release);
                u += 4;
                continue;
            }
            let shift = (u % 4) * 2;
            let _ = self.bytes[(u / 4) as usize].fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                |x| Some((x & !(3 << shift)) | (v << shift)),
            );
            u += 1;
        }
    }

    /// The end of the run that starts at `a` and stops before `limit`:
    /// the first unit whose `key(state)` differs from unit `a`'s.
    pub fn run_end<K: PartialEq>(&self, a: u64, limit: u64, key: impl Fn(u8) -> K) -> u64 {
        let k = key(self.get(a));
        // Whole bytes (four units) at a time where they fit, each byte
        // value judged once: a 64 MiB stretch of 512-byte units is 32 Ki
        // loads, not 128 Ki.
        let mut same = [0u8; 256]; // 0 unknown, 1 all four units match, 2 not
        let mut e = a + 1;
        while e < limit {
            if e.is_multiple_of(4) && e + 4 <= limit {
                let b = self.bytes[(e / 4) as usize].load(Ordering::Acquire);
                let v = &mut same[b as usize];
                if *v == 0 {
                    *v = if (0..4).all(|j| key((b >> (2 * j)) & 3) == k) {
                        1
                    } else {
                        2
                    };
                }
                if *v == 1 {
                    e += 4;
                    continue;
                }
            }
            if key(self.get(e)) != k {
                break;
            }
            e += 1;
        }
        e
    }

    /// Whether every unit of `[a, b)` is in state `v` (true when empty).
    pub fn all(&self, a: u64, b: u64, v: u8) -> bool {
        a >= b || (self.get(a) == v && self.run_end(a, b, |x| x) >= b)
    }

    /// The current states of `[a, b)` as runs (at most `u32::MAX` units
    /// each), calling `f` for each; runs in state 0 only when `zeros`.
    fn runs(&self, a: u64, b: u64, zeros: bool, mut f: impl FnMut(Run)) {
        let mut s = a;
        while s < b {
            let v = self.get(s);
            let e = self.run_end(s, b.min(s + MAX_RUN), |x| x);
            if v != 0 || zeros {
                f(Run {
                    start: s,
                    count: (e - s) as u32,
                    state: v,
                });
            }
            s = e;
        }
    }

    /// How many units are in each state.
    pub fn usage(&self) -> [u64; 4] {
        let mut c = [0u64; 4];
        for u in 0..self.units {
            c[self.get(u) as usize] += 1;
        }
        c
    }
}

struct LogFile {
    file: Arc<dyn VFile>,
    chain: u32,
    seq: u64,
    records: u64,
    /// Where the next commit goes: the end of the committed records (a
    /// commit that failed half-way may have left bytes after it).
    end: u64,
}

/// How an opened map was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of an uncommitted or torn tail that were dropped.
    pub discarded: usize,
}

/// A map file and the states it holds, for one overlay.
pub struct OverlayMap<H: MapHeader> {
    fs: Arc<dyn Vfs>,
    path: PathBuf,
    layer: &'static str,
    header: Mutex<H>,
    states: StateTable,
    /// Changes since the last commit, in order; each pushed after its data
    /// was written.
    pending: Mutex<Vec<Run>>,
    log: Mutex<LogFile>,
    stripes: Vec<Mutex<()>>,
}

impl<H: MapHeader> OverlayMap<H> {
    /// Write a new map holding only `header` (every unit in state 0),
    /// crash-safely.
    pub fn create(path: &Path, header: &H, layer: &'static str) -> Result<()> {
        Self::create_in(&crate::vfs::Os, path, header, layer)
    }

    /// [`OverlayMap::create`] on the file system `fs`.
    pub fn create_in(fs: &dyn Vfs, path: &Path, header: &H, layer: &'static str) -> Result<()> {
        fs.write_atomically(path, &log::encode_header(header))
            .map_err(|e| Error::io(Op::Open, layer, e).path(path))
    }

    /// Open an existing map: validate and replay it (the committed prefix;
    /// a torn or uncommitted tail is dropped and logged). A writable user
    /// calls [`OverlayMap::compact`] next, once its data file is open, so
    /// that every session starts from a clean file with no torn tail.
    pub fn open(
        path: &Path,
        layer: &'static str,
        read_only: bool,
    ) -> Result<(OverlayMap<H>, Opened)> {
        Self::open_in(crate::vfs::os(), path, layer, read_only)
    }

    /// [`OverlayMap::open`] on the file system `fs`.
    pub fn open_in(
        fs: Arc<dyn Vfs>,
        path: &Path,
        layer: &'static str,
        read_only: bool,
    ) -> Result<(OverlayMap<H>, Opened)> {
        let open_err = |e| Error::io(Op::Open, layer, e).path(path);
        let bytes = fs.read(path).map_err(open_err)?;
        let replay = log::replay::<H>(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                Op::Open,
                layer,
                format!("{} is unusable: {e}", H::WHAT),
            )
            .path(path)
        })?;
        if replay.discarded > 0 {
            tracing::warn!(map = %path.display(), bytes = replay.discarded, "discarded an uncommitted or torn tail of the {} (writes after the last flush)", H::WHAT);
        }
        let states = StateTable::new(replay.header.units());
        for r in &replay.runs {
            states.set(r.start, r.start + r.count as u64, r.state);
        }
        let file = fs.open(path, !read_only).map_err(open_err)?;
        let map = OverlayMap {
            fs,
            path: path.to_path_buf(),
            layer,
            header: Mutex::new(replay.header.clone()),
            states,
            pending: Mutex::new(Vec::new()),
            log: Mutex::new(LogFile {
                file,
                chain: replay.chain,
                seq: replay.last_seq,
                records: replay.records(),
                end: replay.valid_len as u64,
            }),
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
        };
        Ok((
            map,
            Opened {
                discarded: replay.discarded,
            },
        ))
    }

    /// The map file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current header.
    pub fn header(&self) -> H {
        self.header.lock().clone()
    }

    /// The in-memory states.
    pub fn states(&self) -> &StateTable {
        &self.states
    }

    /// The state of unit `u`.
    pub fn get(&self, u: u64) -> u8 {
        self.states.get(u)
    }

    /// Set units `[a, b)` to `v` and record the change for the next commit.
    /// Call it only once the data the new state claims is written.
    pub fn set(&self, a: u64, b: u64, v: u8) {
        // Units already in `v` (a rewrite of data the map already claims)
        // need no record: the flush still syncs their data.
        if self.states.all(a, b, v) {
            return;
        }
        self.states.set(a, b, v);
        push_runs(&mut self.pending.lock(), a, b, v);
    }

    /// How many changes wait for the next commit.
    pub fn pending_len(&self) -> usize {
        self.pending.lock().len()
    }

    /// The lock stripe of `key` (callers choose the key: a cluster, a
    /// group of sectors), for a read-modify-write that must not interleave
    /// with another on the same unit.
    pub fn stripe(&self, key: u64) -> MutexGuard<'_, ()> {
        self.stripes[(key % LOCK_STRIPES as u64) as usize].lock()
    }

    /// The flush: take the changes recorded so far, call `sync_data` (the
    /// overlay's data durable before any record claims it), then append
    /// their runs (coalesced, later changes winning) and a COMMIT, and sync
    /// the map. A commit that would pass [`COMPACT_RECORDS`] compacts
    /// instead (calling `sync_data` again: the compacted map holds every
    /// current state, also those recorded after the changes were taken).
    pub fn commit(&self, sync_data: impl Fn() -> Result<()>) -> Result<()> {
        let mut log = self.log.lock();
        let changes = std::mem::take(&mut *self.pending.lock());
        // On any failure nothing was logged: the changes wait for the next
        // flush, before those recorded since.
        let put_back = |changes: Vec<Run>| {
            let mut p = self.pending.lock();
            let later = std::mem::replace(&mut *p, changes);
            p.extend(later);
        };
        if let Err(e) = sync_data() {
            put_back(changes);
            return Err(e);
        }
        if changes.is_empty() {
            return Ok(());
        }
        if log.records + changes.len() as u64 > COMPACT_RECORDS {
            let done = self.compact_locked(&mut log, |_| {}, sync_data);
            if done.is_err() {
                put_back(changes);
            }
            return done;
        }
        let runs = coalesce(changes.clone());
        let (buf, chain) = log::encode_commit(&runs, log.seq + 1, log.chain);
        let err = |e| Error::io(Op::Flush, self.layer, e).path(&self.path);
        let end = log.end;
        let written = log
            .file
            .write_all_at(&buf, end)
            .and_then(|()| log.file.sync_data());
        if let Err(e) = written {
            put_back(changes);
            return Err(err(e));
        }
        log.records += (buf.len() / log::RECORD_SIZE) as u64;
        log.end += buf.len() as u64;
        log.chain = chain;
        log.seq += 1;
        Ok(())
    }

    /// Rewrite the map as one run per non-zero state stretch plus COMMIT 1,
    /// through `MAP.tmp`, fsync and an atomic rename; `update` may change
    /// the header on the way (a compaction generation, a new base).
    /// `sync_data` runs after the states are read and before the new map
    /// can become visible, so the data they claim is durable first.
    pub fn compact(
        &self,
        update: impl FnOnce(&mut H),
        sync_data: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut log = self.log.lock();
        self.compact_locked(&mut log, update, sync_data)
    }

    /// Apply `changes` (`[a, b)` to a state) and `update` to the header as
    /// one atomic step on disk: the changes recorded so far are dropped
    /// (they are part of the new states) and the map is compacted. A crash
    /// leaves either the old map or the new one.
    pub fn replace(
        &self,
        changes: &[(u64, u64, u8)],
        update: impl FnOnce(&mut H),
        sync_data: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut log = self.log.lock();
        for &(a, b, v) in changes {
            self.states.set(a, b, v);
        }
        self.pending.lock().clear();
        self.compact_locked(&mut log, update, sync_data)
    }

    fn compact_locked(
        &self,
        log: &mut LogFile,
        update: impl FnOnce(&mut H),
        sync_data: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut header = self.header();
        update(&mut header);
        header.compacted();
        let hb = log::encode_header(&header);
        let mut runs = Vec::new();
        self.states
            .runs(0, self.states.units(), false, |r| runs.push(r));
        let (body, chain) = log::encode_commit(&runs, 1, log::chain_seed(&hb));
        let mut buf = hb.to_vec();
        buf.extend_from_slice(&body);
        let err = |e| Error::io(Op::Flush, self.layer, e).path(&self.path);
        // Data must be durable before a map that claims it replaces the old one.
        sync_data()?;
        self.fs.write_atomically(&self.path, &buf).map_err(err)?;
        log.file = self.fs.open(&self.path, true).map_err(err)?;
        log.chain = chain;
        log.seq = 1;
        log.records = runs.len() as u64 + 1;
        log.end = buf.len() as u64;
        *self.header.lock() = header;
        Ok(())
    }
}

/// Sort recorded changes into runs: per unit the last change wins;
/// adjacent units with one state merge.
fn coalesce(changes: Vec<Run>) -> Vec<Run> {
    // Sweep the changes in log order over a map of unit ranges.
    let mut latest: std::collections::BTreeMap<u64, (u64, u8)> = std::collections::BTreeMap::new();
    for c in changes {
        let (a, b) = (c.start, c.start + c.count as u64);
        // Split any range overlapping [a, b) and drop the overlapped part.
        let overlapping: Vec<(u64, (u64, u8))> = latest
            .range(..b)
            .rev()
            .take_while(|(_, &(e, _))| e > a)
            .map(|(&s, &v)| (s, v))
            .collect();
        for (s, (e, v)) in overlapping {
            latest.remove(&s);
            if s < a {
                latest.insert(s, (a, v));
            }
            if e > b {
                latest.insert(b, (e, v));
            }
        }
        latest.insert(a, (b, c.state));
    }
    let mut out: Vec<Run> = Vec::new();
    for (s, (e, v)) in latest {
        let mut s = s;
        if let Some(last) = out.last_mut() {
            if last.state == v && last.start + last.count as u64 == s {
                let room = (MAX_RUN - last.count as u64).min(e - s);
                last.count += room as u32;
                s += room;
            }
        }
        push_runs(&mut out, s, e, v);
    }
    out
}

/// Append units `[s, e)` in state `v` as runs of at most `MAX_RUN` units.
fn push_runs(out: &mut Vec<Run>, mut s: u64, e: u64, v: u8) {
    while s < e {
        let n = (e - s).min(MAX_RUN);
        out.push(Run {
            start: s,
            count: n as u32,
            state: v,
        });
        s += n;
    }
}

#[cfg(test)]
mod tests {
    use super::log::TestHeader;
    use super::*;

    /// A new map of `units` units in a temporary folder (kept while the
    /// folder is) and its path.
    fn new_map(units: u64) -> (tempfile::TempDir, PathBuf) {
        let (d, p) = crate::testkit::scratch("map");
        OverlayMap::create(&p, &TestHeader { units }, "test").unwrap();
        (d, p)
    }

    fn open_rw(p: &Path) -> (OverlayMap<TestHeader>, Opened) {
        let (m, o) = OverlayMap::<TestHeader>::open(p, "test", false).unwrap();
        m.compact(|_| {}, || Ok(())).unwrap();
        (m, o)
    }

    fn run(start: u64, count: u32, state: u8) -> Run {
        Run {
            start,
            count,
            state,
        }
    }

    /// The model: a plain array, changes applied in order.
    fn model(units: usize, changes: &[Run]) -> Vec<u8> {
        let mut m = vec![0u8; units];
        for c in changes {
            m[c.start as usize..(c.start + c.count as u64) as usize].fill(c.state);
        }
        m
    }

    #[test]
    fn coalesce_keeps_the_last_change_per_unit() {
        let changes = vec![
            run(0, 10, 1),
            run(5, 10, 2),
            run(3, 1, 3),
            run(14, 1, 1),
            run(20, 2, 1),
            run(22, 2, 1),
        ];
        let got = coalesce(changes.clone());
        // Runs are sorted, disjoint, merged where adjacent and equal.
        for w in got.windows(2) {
            let end = w[0].start + w[0].count as u64;
            assert!(end <= w[1].start);
            assert!(!(end == w[1].start && w[0].state == w[1].state));
        }
        // Applying them to the states before the changes gives the same as
        // applying the changes themselves (every touched unit is covered).
        let mut before = vec![9u8; 30];
        let want = {
            let mut m = before.clone();
            for c in &changes {
                m[c.start as usize..(c.start + c.count as u64) as usize].fill(c.state);
            }
            m
        };
        for c in &got {
            before[c.start as usize..(c.start + c.count as u64) as usize].fill(c.state);
        }
        assert_eq!(before, want);
        assert_eq!(got[0], run(0, 3, 1));
    }

    #[test]
    fn state_table_packs_and_runs() {
        let t = StateTable::new(23);
        t.set(1, 7, 2);
        t.set(4, 12, 3);
        t.set(22, 23, 1);
        let mut m = vec![0u8; 23];
        m[1..7].fill(2);
        m[4..12].fill(3);
        m[22] = 1;
        assert_eq!((0..23).map(|u| t.get(u)).collect::<Vec<_>>(), m);
        assert_eq!(t.run_end(4, 23, |x| x), 12);
        assert_eq!(t.run_end(1, 23, |x| x != 0), 12);
        assert_eq!(t.usage(), [11, 1, 3, 8]);
    }

    proptest::proptest! {
        /// `run_end` (which skips whole bytes) and `all` agree with a
        /// unit-by-unit scan of a model, for any states, start and limit.
        #[test]
        fn run_end_matches_a_unit_scan(
            states in proptest::collection::vec(0u8..4, 1..300),
            a in 0usize..300,
            len in 0usize..300,
        ) {
            let n = states.len();
            let t = StateTable::new(n as u64);
            for (u, &v) in states.iter().enumerate() {
                t.set(u as u64, u as u64 + 1, v);
            }
            let a = a % n;
            let limit = (a + 1 + len).min(n);
            for key in [|x: u8| x, |x: u8| u8::from(x >= 2)] {
                let k = key(states[a]);
                let mut e = a + 1;
                while e < limit && key(states[e]) == k {
                    e += 1;
                }
                proptest::prop_assert_eq!(t.run_end(a as u64, limit as u64, key), e as u64);
            }
            for v in 0..4u8 {
                let want = states[a..limit].iter().all(|&x| x == v);
                proptest::prop_assert_eq!(t.all(a as u64, limit as u64, v), want);
            }
        }
    }

    #[test]
    fn setting_a_unit_to_its_state_logs_nothing() {
        let (_d, p) = new_map(100);
        let (m, _) = open_rw(&p);
        m.set(8, 24, 2);
        m.commit(|| Ok(())).unwrap();
        let len = std::fs::metadata(&p).unwrap().len();
        // Rewriting data the map already claims: no record, no sync of
        // the map, but the data is still synced.
        m.set(10, 20, 2);
        let synced = std::cell::Cell::new(0);
        m.commit(|| {
            synced.set(synced.get() + 1);
            Ok(())
        })
        .unwrap();
        assert_eq!(synced.get(), 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        // A run that changes any unit is logged whole.
        m.set(20, 30, 2);
        m.commit(|| Ok(())).unwrap();
        assert!(std::fs::metadata(&p).unwrap().len() > len);
        drop(m);
        let (m, _) = open_rw(&p);
        assert!((0..40).all(|u| m.get(u) == u8::from((8..30).contains(&u)) * 2));
    }

    #[test]
    fn commits_replay_and_compaction_keeps_states() {
        let (_d, p) = new_map(1000);
        let mut all = Vec::new();
        {
            let (m, o) = open_rw(&p);
            assert_eq!(o.discarded, 0);
            for (i, c) in [run(0, 10, 1), run(5, 100, 2), run(990, 10, 3)]
                .into_iter()
                .enumerate()
            {
                m.set(c.start, c.start + c.count as u64, c.state);
                all.push(c);
                if i != 1 {
                    m.commit(|| Ok(())).unwrap();
                }
            }
            m.set(500, 510, 1); // never committed: lost
        }
        let (m, _) = OverlayMap::<TestHeader>::open(&p, "test", true).unwrap();
        let got: Vec<u8> = (0..1000).map(|u| m.get(u)).collect();
        assert_eq!(got, model(1000, &all));
        drop(m);
        // A writable open compacts: same states, one COMMIT.
        let (m, _) = open_rw(&p);
        let got: Vec<u8> = (0..1000).map(|u| m.get(u)).collect();
        assert_eq!(got, model(1000, &all));
        let r = log::replay::<TestHeader>(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(r.last_seq, 1);
        // replace(): new states and header in one step.
        m.replace(&[(0, 1000, 0), (7, 9, 3)], |h| h.units = 1000, || Ok(()))
            .unwrap();
        drop(m);
        let (m, _) = OverlayMap::<TestHeader>::open(&p, "test", true).unwrap();
        assert_eq!(m.states().usage(), [998, 0, 0, 2]);
    }

    #[test]
    fn sync_data_runs_before_the_records_are_written() {
        let (_d, p) = new_map(64);
        let (m, _) = open_rw(&p);
        m.set(0, 4, 2);
        let len_before = std::fs::metadata(&p).unwrap().len();
        let e = m
            .commit(|| {
                assert_eq!(std::fs::metadata(&p).unwrap().len(), len_before);
                Err(Error::new(ErrorKind::Io, Op::Flush, "test", "disk gone"))
            })
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len_before);
        // The change is kept and logged by the next flush that succeeds.
        m.commit(|| Ok(())).unwrap();
        drop(m);
        let (m, _) = OverlayMap::<TestHeader>::open(&p, "test", true).unwrap();
        assert_eq!(m.states().usage(), [60, 0, 4, 0]);
    }
}
