//! Chunk stores, as narrow traits a consumer picks from (desync layers
//! them the same way): [`ChunkRead`] fetches objects by name,
//! [`ChunkWrite`] adds objects, [`ChunkPrune`] lists and removes them for
//! garbage collection, [`RefStore`] holds the named refs (catalogs, updated
//! by compare-and-swap) and [`LeaseStore`] the leases of commits in
//! progress. [`Store`] is all of them: what [`open`] returns.
//!
//! Every trait builds on [`StoreLayer`]: a decorator names the store it
//! wraps with [`StoreLayer::next`], and every operation it does not
//! override passes through to that store (as a `BlockDev` layer passes
//! through `next()`), so a decorator implements only what it changes and a
//! forgotten method cannot silently take a slower or different path. A
//! store at the bottom overrides what it can do; the rest answers
//! `unsupported`.
//!
//! Stores: [`local::LocalStore`] (a directory: the embedded default),
//! [`s3::S3Store`] (an S3 bucket), [`http::HttpStore`] (the client of
//! `roamdisk store serve`), [`mem::MemStore`] (in memory, with simulated
//! crashes that lose unsynced writes: for tests), [`offline::OfflineStore`]
//! (a store that cannot be reached, known by the settings a session kept). Decorators:
//! [`quota::QuotaStore`] (a size limit: writes past it fail with
//! `no-space`, exactly like a full disk), [`throttle::ThrottleStore`] (an
//! emulated network link), [`cached::CachedStore`] (objects kept in
//! memory), [`fault::FaultStore`] (injected errors, latency and short
//! reads: for tests). Layout of a local store: `docs/formats/cas-store.md`;
//! HTTP protocol: `docs/formats/cas-http.md`.
//!
//! A store returns the stored bytes as they are; callers verify every
//! object against its name with [`fetch`] (or [`crate::chunk::ChunkCodec`]).

pub mod api;
pub mod cached;
pub mod config;
pub mod fault;
pub mod http;
pub mod local;
pub mod mem;
pub mod offline;
pub mod pack;
pub mod quota;
pub mod s3;
pub mod throttle;
pub mod wire;

use std::sync::Arc;

use roamdisk_blockdev::Result;

pub use api::*;
pub use config::StoreConfig;

/// Whether a store location is the URL of a `roamdisk store serve`.
pub fn is_url(location: &str) -> bool {
    location.starts_with("http://") || location.starts_with("https://")
}

/// Whether a store location is not a local folder (an HTTP chunk server
/// or an S3 bucket).
pub fn is_remote(location: &str) -> bool {
    is_url(location) || s3::is_s3(location)
}

/// The scheme of a location written as a URL that no store speaks
/// (`gopher://x`, `file:///srv/store`), which would otherwise be taken as
/// a folder named `gopher:`.
fn unknown_scheme(location: &str) -> Option<&str> {
    let (scheme, _) = location.split_once("://")?;
    let url_like = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    (url_like && !is_remote(location)).then_some(scheme)
}

/// Open a store from a location: a directory path, an `http://` or
/// `https://` URL of a `roamdisk store serve`, or `s3://BUCKET/PREFIX`.
pub fn open(location: &str, opts: &OpenOptions) -> Result<DynStore> {
    if let Some(scheme) = unknown_scheme(location) {
        return Err(crate::error::bad_arg(format!(
            "{location}: a store is a folder, an http:// or https:// chunk server, or s3://BUCKET/PREFIX, not {scheme}:// (for a folder of that name, write ./{location})"
        )));
    }
    let opened: Result<DynStore> = if s3::is_s3(location) {
        s3::S3Store::open(location, &opts.s3).map(|s| Arc::new(s) as DynStore)
    } else if is_url(location) {
        // It goes offline by itself (and comes back) with known settings.
        return Ok(Arc::new(http::HttpStore::connect(location, opts)?));
    } else {
        let path = std::path::Path::new(location);
        local::LocalStore::open(path, opts.create.as_ref()).map(|s| Arc::new(s) as DynStore)
    };
    let store = match (opened, &opts.known_config) {
        (Ok(s), _) => s,
        // What a session (or a hoarded version) needs with its store gone:
        // a folder that went away (an unplugged disk, an unmounted share:
        // no settings there) or an endpoint that does not answer.
        (Err(e), Some(known)) if offline_cause(location, &e) && opts.create.is_none() => {
            let why = if is_remote(location) {
                e.to_string()
            } else {
                "the folder holds no store: unplugged or unmounted?".to_string()
            };
            return Ok(Arc::new(offline::OfflineStore::new(
                location,
                known.clone(),
                why,
            )));
        }
        (Err(e), _) => return Err(e),
    };
    match store.config().quota {
        Some(q) if !is_remote(location) => {
            Ok(Arc::new(quota::QuotaStore::new(store, q)?) as DynStore)
        }
        _ => Ok(store),
    }
}

/// Whether opening `location` failed the way a store that went away does:
/// a folder without its settings, an S3 endpoint that cannot be reached.
fn offline_cause(location: &str, e: &roamdisk_blockdev::Error) -> bool {
    use roamdisk_blockdev::ErrorKind;
    if s3::is_s3(location) {
        e.kind() == ErrorKind::Io
    } else {
        e.kind() == ErrorKind::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_of_an_unknown_scheme_is_refused_not_taken_as_a_folder() {
        assert_eq!(unknown_scheme("gopher://x"), Some("gopher"));
        assert_eq!(unknown_scheme("file:///srv/store"), Some("file"));
        for ok in [
            "/srv/store",
            "./gopher://x",
            "store",
            "http://127.0.0.1:8700",
            "https://h",
            "s3://bucket/p",
            "a b://c",
        ] {
            assert_eq!(unknown_scheme(ok), None, "{ok}");
        }
        let e = open("gopher://x", &OpenOptions::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("not gopher://") && e.contains("./gopher://x"),
            "{e}"
        );
    }
}
