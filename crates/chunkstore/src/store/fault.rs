//! A store that fails on purpose, for tests. In front of any store it
//! injects errors — half of them before the operation runs, half after it
//! ran (its effect stays, its answer is lost: a put that landed, a catalog
//! update that happened, reported as failed, as a timed-out request is) —
//! latency, and short reads (an object cut short, which verification must
//! catch). With [`MemStore`](super::mem::MemStore) underneath, whose
//! crashes lose unsynced puts, it is the world commit, checkout, gc and
//! sessions are tested against (`crates/roam/tests/model.rs`).
//!
//! It also counts calls, and makes something happen at the N-th call from
//! now ([`FaultStore::schedule`], an I/O countdown as redb's fuzzers and
//! `roamdisk_blockdev::testkit::Countdown` have): a power cut (the test
//! crashes the store underneath; that call and every later one fail, so
//! what the process held — a put group not yet stored — is lost with it)
//! or another process's work between two calls (a gc in the middle of a
//! commit).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::api::{
    ChunkPrune, ChunkRead, ChunkWrite, DynStore, Freed, Lease, LeaseStore, ObjectEntry,
    ObjectParts, PutGroup, PutOutcome, RefStore, Store, StoreLayer,
};
use crate::error::err;
use crate::hash::ChunkId;

/// What to inject, per call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Chance of an error per call (per object for reads), per mille.
    pub error_permille: u32,
    /// Chance of an object read coming back cut short, per mille.
    pub short_read_permille: u32,
    /// Added to every call.
    pub latency: Duration,
}

impl Faults {
    /// No faults.
    pub const NONE: Faults = Faults {
        error_permille: 0,
        short_read_permille: 0,
        latency: Duration::ZERO,
    };
}

/// What happens at a scheduled call ([`FaultStore::schedule`]).
pub enum Event {
    /// The power fails: the function runs once (the test crashes the store
    /// underneath, e.g. [`MemStore::crash`](super::mem::MemStore::crash)),
    /// then that call and every later one fail until
    /// [`FaultStore::power_on`].
    PowerCut(Box<dyn FnOnce() + Send>),
    /// Something else happens in the world (another process's gc, the
    /// clock moving on): the function runs, then the call goes on.
    Meanwhile(Box<dyn FnOnce() + Send>),
}

/// The error of every call while the power is off.
fn power_cut(op: Op) -> roamdisk_blockdev::Error {
    err(
        ErrorKind::Io,
        op,
        "injected power cut: the store is gone until the power is back",
    )
}

/// A store with injected faults.
pub struct FaultStore {
    inner: DynStore,
    faults: Mutex<Faults>,
    rng: Mutex<Rng>,
    injected: AtomicU64,
    /// Calls so far.
    calls: AtomicU64,
    /// The call number an event is due at, and the event.
    scheduled: Mutex<Option<(u64, Event)>>,
    /// The power is off: every call fails.
    off: AtomicBool,
}

impl FaultStore {
    /// `inner` behind `faults`, drawn from a generator seeded with `seed`.
    pub fn new(inner: DynStore, faults: Faults, seed: u64) -> FaultStore {
        FaultStore {
            inner,
            faults: Mutex::new(faults),
            rng: Mutex::new(Rng::new(seed)),
            injected: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            scheduled: Mutex::new(None),
            off: AtomicBool::new(false),
        }
    }

    /// Make `event` happen at the `n`-th call from now (1-based; reads,
    /// writes, each object of a put group alike), replacing an event not
    /// yet due.
    pub fn schedule(&self, n: u64, event: Event) {
        let at = self.calls.load(Ordering::SeqCst) + n.max(1);
        *self.scheduled.lock() = Some((at, event));
    }

    /// Drop an event not yet due; whether there was one.
    pub fn unschedule(&self) -> bool {
        self.scheduled.lock().take().is_some()
    }

    /// Restore the power after a [`Event::PowerCut`]; whether it was off.
    pub fn power_on(&self) -> bool {
        self.off.swap(false, Ordering::SeqCst)
    }

    /// Calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Change what is injected from now on ([`Faults::NONE`]: nothing).
    pub fn set(&self, faults: Faults) {
        *self.faults.lock() = faults;
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    fn roll(&self, permille: u32) -> bool {
        permille > 0 && self.rng.lock().chance(permille as u64, 1000)
    }

    fn fault(&self, op: Op, when: &str) -> roamdisk_blockdev::Error {
        self.injected.fetch_add(1, Ordering::Relaxed);
        err(ErrorKind::Io, op, format!("injected fault {when}"))
    }

    /// The start of every call: count it, run an event that is due, fail
    /// if the power is off, wait the latency.
    fn enter(&self, op: Op) -> Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let due = {
            let mut s = self.scheduled.lock();
            match &*s {
                Some((at, _)) if *at <= n => s.take().map(|(_, e)| e),
                _ => None,
            }
        };
        match due {
            Some(Event::PowerCut(cut)) => {
                self.off.store(true, Ordering::SeqCst);
                cut();
            }
            Some(Event::Meanwhile(f)) => f(),
            None => {}
        }
        if self.off.load(Ordering::SeqCst) {
            return Err(power_cut(op));
        }
        let l = self.faults.lock().latency;
        if !l.is_zero() {
            std::thread::sleep(l);
        }
        Ok(())
    }

    /// Run `f` after [`FaultStore::enter`], maybe with an error before or
    /// after it.
    fn wrap<T>(&self, op: Op, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.enter(op)?;
        let fl = *self.faults.lock();
        if self.roll(fl.error_permille / 2) {
            return Err(self.fault(op, "before the call"));
        }
        let r = f()?;
        if self.roll(fl.error_permille.div_ceil(2)) {
            return Err(self.fault(op, "after the call ran"));
        }
        Ok(r)
    }

    /// One object read: maybe an error, maybe cut short.
    fn spoil(&self, r: Result<Vec<u8>>) -> Result<Vec<u8>> {
        let fl = *self.faults.lock();
        let mut b = r?;
        if self.roll(fl.error_permille) {
            return Err(self.fault(Op::Read, "in a read"));
        }
        if !b.is_empty() && self.roll(fl.short_read_permille) {
            self.injected.fetch_add(1, Ordering::Relaxed);
            let n = self.rng.lock().below(b.len() as u64) as usize;
            b.truncate(n);
        }
        Ok(b)
    }
}

impl StoreLayer for FaultStore {
    fn describe(&self) -> String {
        format!("{} (with injected faults)", self.inner.describe())
    }
    fn next(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

impl ChunkRead for FaultStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.enter(Op::Read)?;
        self.spoil(self.inner.get(id))
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        if self.enter(Op::Read).is_err() {
            return ids.iter().map(|_| Err(power_cut(Op::Read))).collect();
        }
        self.inner
            .get_many(ids)
            .into_iter()
            .map(|r| self.spoil(r))
            .collect()
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        if self.enter(Op::Read).is_err() {
            return ids.iter().map(|_| Some(Err(power_cut(Op::Read)))).collect();
        }
        self.inner
            .get_many_within(ids, budget)
            .into_iter()
            .map(|r| r.map(|r| self.spoil(r)))
            .collect()
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.wrap(Op::Read, || self.inner.has_many(ids, touch))
    }
}

impl ChunkWrite for FaultStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        self.wrap(Op::Write, || self.inner.put_many(items))
    }
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        self.wrap(Op::Write, || self.inner.put_many_parts(items))
    }
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        Box::new(FaultGroup {
            store: self,
            inner: self.inner.put_group(),
        })
    }
    fn sync(&self) -> Result<()> {
        self.wrap(Op::Flush, || self.inner.sync())
    }
}

/// A put group whose writes and finish may fail.
struct FaultGroup<'a> {
    store: &'a FaultStore,
    inner: Box<dyn PutGroup + 'a>,
}

impl PutGroup for FaultGroup<'_> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        self.store.wrap(Op::Write, || self.inner.write(id, parts))
    }
    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let FaultGroup { store, inner } = *self;
        store.wrap(Op::Write, || inner.finish())
    }
}

impl ChunkPrune for FaultStore {
    fn now(&self) -> Result<SystemTime> {
        self.wrap(Op::Read, || self.inner.now())
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        self.wrap(Op::Read, || self.inner.list_objects(f))
    }
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        self.wrap(Op::Trim, || self.inner.remove_many_if_older(ids, cutoff))
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        self.wrap(Op::Write, || self.inner.recover(cutoff))
    }
}

impl RefStore for FaultStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.wrap(Op::Read, || self.inner.ref_get(name))
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        self.wrap(Op::Read, || self.inner.ref_list())
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        self.wrap(Op::Write, || self.inner.ref_update(name, old, new))
    }
}

impl LeaseStore for FaultStore {
    fn lease_begin(&self) -> Result<Lease> {
        self.wrap(Op::Write, || self.inner.lease_begin())
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        self.wrap(Op::Write, || self.inner.lease_refresh(id))
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        self.wrap(Op::Write, || self.inner.lease_end(id))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        self.wrap(Op::Read, || self.inner.leases())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::config::StoreConfig;
    use crate::store::mem::MemStore;
    use std::sync::Arc;

    #[test]
    fn faults_are_injected_before_and_after_and_reads_come_short() {
        let mem = Arc::new(MemStore::new(StoreConfig::default()));
        let codec = mem.config().codec();
        let objs: Vec<_> = (0..50u8).map(|k| codec.seal(&[k; 300], false)).collect();
        let f = FaultStore::new(
            mem.clone(),
            Faults {
                error_permille: 500,
                short_read_permille: 0,
                latency: Duration::ZERO,
            },
            7,
        );
        let (mut failed, mut landed_anyway) = (0, 0);
        for o in &objs {
            if f.put_many(&[(o.id, &o.object)]).is_err() {
                failed += 1;
                landed_anyway += mem.has_many(&[o.id], false).unwrap()[0] as u32;
            }
        }
        assert!(
            failed > 10 && landed_anyway > 0 && landed_anyway < failed,
            "{failed} {landed_anyway}"
        );
        f.set(Faults {
            short_read_permille: 1000,
            ..Faults::NONE
        });
        let ids: Vec<ChunkId> = objs.iter().map(|o| o.id).collect();
        let stored: Vec<ChunkId> = ids
            .iter()
            .copied()
            .filter(|id| mem.has_many(&[*id], false).unwrap()[0])
            .collect();
        for r in f.get_many(&stored) {
            let b = r.unwrap();
            assert!(b.len() < 300, "every read cut short");
        }
        // Verification catches a short object: an error, never data.
        assert!(crate::store::api::fetch(&f, &stored[0], None).is_err());
        f.set(Faults::NONE);
        assert!(crate::store::api::fetch(&f, &stored[0], None).is_ok());
        assert!(f.injected() > 0);
    }

    #[test]
    fn a_power_cut_comes_at_the_nth_call_and_lasts_until_power_on() {
        let mem = Arc::new(MemStore::new(StoreConfig::default()));
        let f = FaultStore::new(mem.clone(), Faults::NONE, 1);
        let codec = mem.config().codec();
        let objs: Vec<_> = (0..4u8).map(|k| codec.seal(&[k; 100], false)).collect();
        f.put_many(&[(objs[0].id, &objs[0].object)]).unwrap();
        f.sync().unwrap();
        let cuts = Arc::new(AtomicU64::new(0));
        let (m, c) = (mem.clone(), cuts.clone());
        f.schedule(
            2,
            Event::PowerCut(Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
                m.crash();
            })),
        );
        // The first call from now runs; the second is cut, with the store
        // crashed under it (the unsynced put is lost).
        f.put_many(&[(objs[1].id, &objs[1].object)]).unwrap();
        assert!(f.sync().is_err());
        assert!(
            f.get(&objs[0].id).is_err(),
            "everything fails after the cut"
        );
        assert!(f.get_many(&[objs[0].id])[0].is_err());
        assert_eq!(cuts.load(Ordering::SeqCst), 1);
        assert_eq!(
            mem.has_many(&[objs[0].id, objs[1].id], false).unwrap(),
            [true, false]
        );
        assert!(f.power_on());
        assert!(!f.power_on());
        assert!(f.get(&objs[0].id).is_ok());
        // Something else happens before the chosen call, which then runs.
        let m = mem.clone();
        let (id, obj) = (objs[2].id, objs[2].object.clone());
        f.schedule(
            1,
            Event::Meanwhile(Box::new(move || {
                m.put_many(&[(id, &obj)]).unwrap();
            })),
        );
        assert_eq!(f.has_many(&[objs[2].id], false).unwrap(), [true]);
        // An event not due by the end is cancelled.
        f.schedule(5, Event::PowerCut(Box::new(|| {})));
        assert!(f.unschedule());
        assert!(!f.unschedule());
        assert_eq!(f.calls(), 8);
    }
}
