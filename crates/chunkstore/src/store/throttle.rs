//! A store behind an emulated network link ([`roamdisk_blockdev::throttle`]):
//! objects read cross the link's down direction, objects written its up
//! direction, and every call waits the link's latency once (the requests
//! of one `get_many` are in flight together, as an HTTP client sends
//! them; a `get_many_within` is one batch request of the chunk server). `roamdisk store serve --limit RATE --latency DELAY` puts it in
//! front of the store it serves, so a client on loopback sees the store
//! as if it were across a WAN.

use roamdisk_blockdev::throttle::{Link, LinkSpec};
use roamdisk_blockdev::Result;

use super::api::{
    collect_group, ChunkPrune, ChunkRead, ChunkWrite, DynStore, LeaseStore, ObjectParts, PutGroup,
    PutOutcome, RefStore, Store, StoreLayer,
};
use crate::hash::ChunkId;

pub struct ThrottleStore {
    inner: DynStore,
    down: Link,
    up: Link,
}

impl ThrottleStore {
    pub fn new(inner: DynStore, spec: LinkSpec) -> ThrottleStore {
        ThrottleStore {
            inner,
            down: Link::new(spec),
            up: Link::new(spec),
        }
    }
}

impl StoreLayer for ThrottleStore {
    fn describe(&self) -> String {
        let s = self.down.spec();
        format!(
            "{} (throttled: {} B/s, latency {:?})",
            self.inner.describe(),
            s.rate,
            s.latency
        )
    }
    fn next(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

impl ChunkRead for ThrottleStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        let r = self.inner.get(id);
        self.down.pass(r.as_ref().map_or(0, |b| b.len() as u64));
        r
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        let r = self.inner.get_many(ids);
        let bytes: u64 = r.iter().flatten().map(|b| b.len() as u64).sum();
        self.down.pass(bytes);
        r
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        let r = self.inner.get_many_within(ids, budget);
        let bytes: u64 = r.iter().flatten().flatten().map(|b| b.len() as u64).sum();
        self.down.pass(bytes);
        r
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.down.pass(0);
        self.inner.has_many(ids, touch)
    }
}

impl ChunkWrite for ThrottleStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        self.up
            .pass(items.iter().map(|(_, b)| b.len() as u64).sum());
        self.inner.put_many(items)
    }
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        self.up.pass(
            items
                .iter()
                .map(|(_, p)| (p[0].len() + p[1].len()) as u64)
                .sum(),
        );
        self.inner.put_many_parts(items)
    }
    /// A group crosses the link as one upload when it is finished.
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        collect_group(self)
    }
}

impl ChunkPrune for ThrottleStore {}

impl RefStore for ThrottleStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let r = self.inner.ref_get(name);
        self.down.pass(
            r.as_ref()
                .ok()
                .and_then(|o| o.as_ref())
                .map_or(0, |b| b.len() as u64),
        );
        r
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        self.down.pass(0);
        self.inner.ref_list()
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        self.up.pass(new.map_or(0, |b| b.len() as u64));
        self.inner.ref_update(name, old, new)
    }
}

impl LeaseStore for ThrottleStore {}
