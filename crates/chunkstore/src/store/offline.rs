//! A store that cannot be reached: what a session opens when its store
//! folder is gone (an unplugged disk, an unmounted network share) or its
//! S3 endpoint does not answer, from the copy of the store's settings it
//! keeps. Every request fails with an `io` error that says where the
//! store was and why it is not there, so the layers above serve what the
//! host's shared cache, the session's private cache and lookaside media
//! hold (a hoarded version: everything), exactly as over a chunk server
//! that went down ([`super::http::HttpStore`]'s offline mode).

use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::api::*;
use super::config::StoreConfig;
use crate::error::err;
use crate::hash::ChunkId;

/// The store at `location`, known only by its settings.
pub struct OfflineStore {
    location: String,
    config: StoreConfig,
    why: String,
}

impl OfflineStore {
    /// `why`: what opening it said (the folder is missing, the endpoint
    /// refused the connection).
    pub fn new(location: &str, config: StoreConfig, why: String) -> OfflineStore {
        tracing::warn!(
            "store {location} cannot be reached ({why}): working offline; only chunks on this host or on lookaside media can be read"
        );
        OfflineStore {
            location: location.to_string(),
            config,
            why,
        }
    }

    fn gone(&self, op: Op, what: &str) -> roamdisk_blockdev::Error {
        err(
            ErrorKind::Io,
            op,
            format!(
                "store {} cannot be reached ({}), so it cannot {what}: only chunks on this host or on lookaside media can be read; reconnect the store (plug the disk in, mount the share, start the server) and open again, or hoard what you need offline beforehand with `roamdisk hoard`",
                self.location, self.why
            ),
        )
    }
}

impl StoreLayer for OfflineStore {
    fn describe(&self) -> String {
        format!("{} (offline)", self.location)
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

impl ChunkRead for OfflineStore {
    fn get(&self, _id: &ChunkId) -> Result<Vec<u8>> {
        Err(self.gone(Op::Read, "read objects"))
    }
    fn has_many(&self, _ids: &[ChunkId], _touch: bool) -> Result<Vec<bool>> {
        Err(self.gone(Op::Read, "look up objects"))
    }
}

impl ChunkWrite for OfflineStore {
    fn put_many(&self, _items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        Err(self.gone(Op::Write, "store objects"))
    }
    fn sync(&self) -> Result<()> {
        Err(self.gone(Op::Flush, "sync"))
    }
}

impl ChunkPrune for OfflineStore {
    fn now(&self) -> Result<std::time::SystemTime> {
        Err(self.gone(Op::Read, "tell the time"))
    }
    fn list_objects(&self, _f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        Err(self.gone(Op::Read, "list objects"))
    }
    fn remove_many_if_older(
        &self,
        _ids: &[ChunkId],
        _cutoff: std::time::SystemTime,
    ) -> Result<Freed> {
        Err(self.gone(Op::Trim, "remove objects"))
    }
    fn recover(&self, _cutoff: std::time::SystemTime) -> Result<(u64, u64)> {
        Err(self.gone(Op::Write, "recover"))
    }
}

impl RefStore for OfflineStore {
    fn ref_get(&self, _name: &str) -> Result<Option<Vec<u8>>> {
        Err(self.gone(Op::Read, "read catalogs"))
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        Err(self.gone(Op::Read, "list catalogs"))
    }
    fn ref_update(&self, _name: &str, _old: Option<ChunkId>, _new: Option<&[u8]>) -> Result<bool> {
        Err(self.gone(Op::Write, "update catalogs"))
    }
}

impl LeaseStore for OfflineStore {
    fn lease_begin(&self) -> Result<Lease> {
        Err(self.gone(Op::Write, "take leases"))
    }
    fn lease_refresh(&self, _id: &str) -> Result<()> {
        Err(self.gone(Op::Write, "refresh leases"))
    }
    fn lease_end(&self, _id: &str) -> Result<()> {
        Err(self.gone(Op::Write, "end leases"))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        Err(self.gone(Op::Read, "list leases"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_fails_as_io_and_names_the_store_and_why() {
        let s = OfflineStore::new(
            "/media/usb/store",
            StoreConfig::default(),
            "the folder is not there".into(),
        );
        let id = ChunkId::default();
        let errors = [
            s.get(&id).unwrap_err(),
            s.has_many(&[id], false).unwrap_err(),
            s.put_many(&[]).unwrap_err(),
            s.ref_get("u/a").unwrap_err(),
            s.lease_begin().unwrap_err(),
            s.list_objects(&mut |_| {}).unwrap_err(),
        ];
        for e in errors {
            assert_eq!(e.kind(), ErrorKind::Io, "{e}");
            let m = e.to_string();
            assert!(
                m.contains("/media/usb/store") && m.contains("the folder is not there"),
                "{m}"
            );
            assert!(!m.contains("store init"), "{m}");
        }
        assert_eq!(s.describe(), "/media/usb/store (offline)");
    }
}
