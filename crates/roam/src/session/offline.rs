//! The copies a session keeps so that it opens, and reads what is cached
//! or on lookaside media, when its store cannot be reached: the store's
//! settings (`store.toml`) and the base version's package as stored
//! (`base.version`), checked against the version id like any object.

use std::path::Path;

use roamdisk_blockdev::Result;
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::error::context;
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::store::DynStore;
use roamdisk_chunkstore::version::Version;

/// The session's copy of its store's settings.
pub const STORE_COPY: &str = "store.toml";
/// The session's copy of its base version package (the stored object).
pub const BASE_COPY: &str = "base.version";

/// Write a copy the session can do without (best effort: a failure is
/// logged, and the session reads from the store as before).
pub fn keep_copy(path: &Path, bytes: &[u8]) {
    if let Err(e) = roamdisk_blockdev::durable::write_atomically(path, bytes) {
        tracing::warn!("cannot keep {}: {e}", path.display());
    }
}

/// Give a new session its copies of the store's settings and of its base
/// version's package (`package`, as stored), so it opens and reads what is
/// cached with no network.
pub fn keep_offline_copies(dir: &Path, store: &DynStore, package: &[u8]) {
    keep_copy(&dir.join(STORE_COPY), store.config().to_toml().as_bytes());
    keep_copy(&dir.join(BASE_COPY), package);
}

/// The session's base version: from its own copy (checked against the
/// version id like any object from a store), else from the store, and then
/// copied, so the session opens with no network next time.
pub fn load_base(
    dir: &Path,
    store: &DynStore,
    id: &ChunkId,
    key: Option<&Key>,
    read_only: bool,
) -> Result<Version> {
    let codec = store.config().codec();
    let copy = dir.join(BASE_COPY);
    let raw = match std::fs::read(&copy) {
        Ok(raw) if codec.open(id, None, &raw).is_ok() => raw,
        _ => {
            let raw = store
                .get(id)
                .map_err(|e| context(e, format!("version {id}")))?;
            if !read_only {
                keep_copy(&copy, &raw);
            }
            raw
        }
    };
    let bytes = codec
        .open(id, None, &raw)
        .map_err(|e| context(e, format!("version {id}")))?;
    Version::decode(&bytes, key).map_err(|e| context(e, format!("version {id}")))
}
