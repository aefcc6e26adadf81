//! A store behind an emulated network link ([`roamdisk_blockdev::throttle`]):
//! objects read cross the link's down direction, objects written its up
//! direction, and every call waits the link's latency once (the requests
//! of one `get_many` are in flight together, as an HTTP client sends
//! them; a `get_many_within` is one batch request of the chunk server). `roamdisk store serve --limit RATE --latency DELAY` puts it in
//! front of the store it serves, so a client on loopback sees the store
//! as if it were across a WAN.

use std::time::SystemTime;

use roamdisk_blockdev::throttle::{Link, LinkSpec};
use roamdisk_blockdev::Result;

use super::{ChunkPrune, ChunkRead, ChunkWrite, DynStore, ObjectParts, PutOutcome, StoreConfig};
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

impl ChunkRead for ThrottleStore {
    fn describe(&self) -> String {
        let s = self.down.spec();
        format!(
            "{} (throttled: {} B/s, latency {:?})",
            self.inner.describe(),
            s.rate,
            s.latency
        )
    }
    fn config(&self) -> &StoreConfig {
        self.inner.config()
    }
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
    forward_sync_and_leases!();
    fn ref_update(
        &self,
        name: &str,
        expected: Option<ChunkId>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.up.pass(new.map_or(0, |b| b.len() as u64));
        self.inner.ref_update(name, expected, new)
    }
}

impl ChunkPrune for ThrottleStore {
    forward_prune_listings!();
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        self.inner.remove_if_older(id, cutoff)
    }
    fn remove_many_if_older(
        &self,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<Vec<Option<u64>>> {
        self.inner.remove_many_if_older(ids, cutoff)
    }
}
