//! A store in memory, for tests: objects, refs and leases in maps, a
//! clock of its own, and simulated power cuts. A put is acknowledged at
//! once but durable only after [`ChunkWrite::sync`]: [`MemStore::crash`]
//! loses every object put since (as a real store may lose them), while a
//! ref update and a lease are durable when they return (as every store
//! makes them). The model commit, gc and sessions must be safe against:
//! `docs/formats/cas-store.md`, "gc and commits".
//!
//! The clock starts at a fixed time and moves a millisecond at every
//! reading and as far as a test says ([`MemStore::advance`]), never with
//! the wall clock: a test that replays the same calls sees the same times.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::api::{
    ref_tag, ChunkPrune, ChunkRead, ChunkWrite, Freed, Lease, LeaseStore, ObjectEntry, PutOutcome,
    RefStore, StoreLayer,
};
use super::config::StoreConfig;
use crate::error::err;
use crate::hash::ChunkId;

/// An object and when it was last stored or referenced.
struct Object {
    bytes: Vec<u8>,
    mtime: SystemTime,
}

struct State {
    objects: HashMap<ChunkId, Object>,
    /// Put since the last sync: lost by a crash.
    unsynced: HashSet<ChunkId>,
    refs: BTreeMap<String, Vec<u8>>,
    leases: BTreeMap<String, Lease>,
    next_lease: u64,
    /// The store's clock ([`MemStore::advance`]).
    now: SystemTime,
}

/// When a memory store's clock starts (2024-01-01T00:00:00Z).
const EPOCH: Duration = Duration::from_secs(1_704_067_200);

/// How far the clock moves at every reading: objects touched one after
/// the other have distinct, increasing times, as on a real store.
const TICK: Duration = Duration::from_millis(1);

/// A chunk store held in memory.
pub struct MemStore {
    config: StoreConfig,
    state: Mutex<State>,
}

impl MemStore {
    /// An empty store with these settings.
    pub fn new(config: StoreConfig) -> MemStore {
        MemStore {
            config,
            state: Mutex::new(State {
                objects: HashMap::new(),
                unsynced: HashSet::new(),
                refs: BTreeMap::new(),
                leases: BTreeMap::new(),
                next_lease: 0,
                now: SystemTime::UNIX_EPOCH + EPOCH,
            }),
        }
    }

    /// Move the store's clock forward (objects and leases age).
    pub fn advance(&self, by: Duration) {
        self.state.lock().now += by;
    }

    /// A power cut: objects put since the last sync are gone. Returns how
    /// many were lost.
    pub fn crash(&self) -> usize {
        let mut st = self.state.lock();
        let lost: Vec<ChunkId> = st.unsynced.drain().collect();
        for id in &lost {
            st.objects.remove(id);
        }
        lost.len()
    }

    /// Objects held (synced or not).
    pub fn objects(&self) -> usize {
        self.state.lock().objects.len()
    }

    /// Which of `ids` are held and synced: those a crash now would keep.
    pub fn durable(&self, ids: &[ChunkId]) -> Vec<bool> {
        let st = self.state.lock();
        ids.iter()
            .map(|id| st.objects.contains_key(id) && !st.unsynced.contains(id))
            .collect()
    }

    /// Read the clock (it ticks).
    fn clock(st: &mut State) -> SystemTime {
        st.now += TICK;
        st.now
    }
}

impl StoreLayer for MemStore {
    fn describe(&self) -> String {
        "memory store".into()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

impl ChunkRead for MemStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        match self.state.lock().objects.get(id) {
            Some(o) => Ok(o.bytes.clone()),
            None => Err(err(
                ErrorKind::NotFound,
                Op::Read,
                format!("object {id} is not in the memory store"),
            )),
        }
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        let mut st = self.state.lock();
        let now = Self::clock(&mut st);
        Ok(ids
            .iter()
            .map(|id| match st.objects.get_mut(id) {
                Some(o) => {
                    if touch {
                        o.mtime = now;
                    }
                    true
                }
                None => false,
            })
            .collect())
    }
}

impl ChunkWrite for MemStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        let mut st = self.state.lock();
        let now = Self::clock(&mut st);
        Ok(items
            .iter()
            .map(|(id, bytes)| match st.objects.get_mut(id) {
                Some(o) => {
                    o.mtime = now;
                    PutOutcome::Existed
                }
                None => {
                    st.objects.insert(
                        *id,
                        Object {
                            bytes: bytes.to_vec(),
                            mtime: now,
                        },
                    );
                    st.unsynced.insert(*id);
                    PutOutcome::Stored
                }
            })
            .collect())
    }
    fn cheap_lookups(&self) -> bool {
        true
    }
    fn sync(&self) -> Result<()> {
        self.state.lock().unsynced.clear();
        Ok(())
    }
}

impl ChunkPrune for MemStore {
    fn now(&self) -> Result<SystemTime> {
        Ok(Self::clock(&mut self.state.lock()))
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        let entries: Vec<ObjectEntry> = self
            .state
            .lock()
            .objects
            .iter()
            .map(|(id, o)| ObjectEntry {
                id: *id,
                mtime: o.mtime,
                size: o.bytes.len() as u64,
            })
            .collect();
        entries.into_iter().for_each(f);
        Ok(())
    }
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        let mut st = self.state.lock();
        Ok(ids
            .iter()
            .map(|id| match st.objects.get(id) {
                Some(o) if o.mtime < cutoff => {
                    let n = o.bytes.len() as u64;
                    st.objects.remove(id);
                    st.unsynced.remove(id);
                    Some(n)
                }
                _ => None,
            })
            .collect())
    }
    fn recover(&self, _cutoff: SystemTime) -> Result<(u64, u64)> {
        Ok((0, 0))
    }
}

impl RefStore for MemStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.state.lock().refs.get(name).cloned())
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        Ok(self.state.lock().refs.keys().cloned().collect())
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        super::api::check_ref_name(name)?;
        let mut st = self.state.lock();
        if st.refs.get(name).map(|b| ref_tag(b)) != old {
            return Ok(false);
        }
        match new {
            Some(b) => st.refs.insert(name.to_string(), b.to_vec()),
            None => st.refs.remove(name),
        };
        Ok(true)
    }
}

impl LeaseStore for MemStore {
    fn lease_begin(&self) -> Result<Lease> {
        let mut st = self.state.lock();
        st.next_lease += 1;
        let now = Self::clock(&mut st);
        let lease = Lease {
            id: format!("mem-{}", st.next_lease),
            started: now,
            refreshed: now,
            ended: false,
        };
        st.leases.insert(lease.id.clone(), lease.clone());
        Ok(lease)
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let mut st = self.state.lock();
        let now = Self::clock(&mut st);
        match st.leases.get_mut(id) {
            Some(l) => {
                l.refreshed = now;
                Ok(())
            }
            // As a local store answers: the commit must stop.
            None => Err(err(
                ErrorKind::NotFound,
                Op::Write,
                format!("lease {id} vanished (a gc took it for dead: its commit was idle longer than the lease timeout)"),
            )),
        }
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        self.state.lock().leases.remove(id);
        Ok(())
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        Ok(self.state.lock().leases.values().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_puts_are_lost_by_a_crash_refs_are_not() {
        let s = MemStore::new(StoreConfig::default());
        let codec = s.config().codec();
        let a = codec.seal(&[1u8; 100], false);
        let b = codec.seal(&[2u8; 100], false);
        s.put_many(&[(a.id, &a.object)]).unwrap();
        s.sync().unwrap();
        s.put_many(&[(b.id, &b.object)]).unwrap();
        assert!(s.ref_update("u/i", None, Some(b"cat")).unwrap());
        assert!(!s.ref_update("u/i", None, Some(b"other")).unwrap());
        assert_eq!(s.crash(), 1);
        assert_eq!(s.has_many(&[a.id, b.id], false).unwrap(), [true, false]);
        assert_eq!(s.ref_get("u/i").unwrap().as_deref(), Some(&b"cat"[..]));
        // Old enough, the synced object goes to gc; a touched one stays.
        s.advance(Duration::from_secs(10));
        let cutoff = s.now().unwrap() - Duration::from_secs(5);
        assert_eq!(
            s.remove_if_older(&a.id, cutoff).unwrap(),
            Some(a.object.len() as u64)
        );
        assert_eq!(s.objects(), 0);
    }

    #[test]
    fn the_clock_is_the_stores_own_and_a_vanished_lease_cannot_be_refreshed() {
        let s = MemStore::new(StoreConfig::default());
        let t0 = s.now().unwrap();
        assert_eq!(s.now().unwrap(), t0 + TICK, "a reading moves it a tick");
        assert_eq!(
            MemStore::new(StoreConfig::default()).now().unwrap(),
            t0,
            "every store starts at the same time"
        );
        let codec = s.config().codec();
        let a = codec.seal(&[3u8; 64], false);
        s.put_many(&[(a.id, &a.object)]).unwrap();
        assert_eq!(s.durable(&[a.id]), [false]);
        s.sync().unwrap();
        assert_eq!(s.durable(&[a.id]), [true]);
        let l = s.lease_begin().unwrap();
        s.lease_refresh(&l.id).unwrap();
        s.lease_end(&l.id).unwrap();
        let e = s.lease_refresh(&l.id).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
}
