//! The shared cache's settings (`cache.toml`: fixed when it is created)
//! and the figures it reports.

use std::collections::HashMap;

use roamdisk_chunkstore::hash::ChunkId;
use serde::{Deserialize, Serialize};

pub const CONFIG_MAGIC: &str = "roamdisk-shared-cache";
/// The `cache.toml` version new caches get. Version 2 adds hoard marks
/// (`hoards/`): a cache of version 1 is upgraded when its first version is
/// hoarded, so that builds which would ignore the marks refuse it instead
/// of evicting hoarded chunks.
pub const CONFIG_VERSION: u32 = 2;
/// The oldest `cache.toml` version this build opens.
pub const CONFIG_MIN_VERSION: u32 = 1;

/// `cache.toml`: fixed when the cache is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CacheConfig {
    pub magic: String,
    pub version: u32,
    /// The byte cap.
    pub size: u64,
    /// The largest chunk the cache holds, in bytes; the cap holds
    /// `size / unit` chunks.
    pub unit: u32,
    /// The replacement policy (`roamdisk sim` syntax: `lru`, `fmpq`, ...).
    pub policy: String,
}

/// Settings for a cache created by [`SharedCache::open`].
#[derive(Debug, Clone)]
pub struct CacheOptions {
    pub size: u64,
    pub unit: u32,
    pub policy: String,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            size: 4 << 30,
            unit: 64 << 10,
            policy: "lru".into(),
        }
    }
}

/// Counters since the cache was opened by this process.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub hit_bytes: u64,
    pub inserted: u64,
    pub refused: u64,
    pub evicted: u64,
}

/// The cache's contents by its journal, at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Resident chunks and their sizes.
    pub resident: HashMap<ChunkId, u32>,
    pub bytes: u64,
    /// Records in the journal since it was last rewritten.
    pub journal_records: u64,
}

/// What [`SharedCache::evict`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Evicted {
    pub chunks: u64,
    pub bytes: u64,
    /// Resident chunks kept: a running session pins them.
    pub kept_pinned: u64,
    /// Resident chunks kept: a hoarded version holds them.
    pub kept_hoarded: u64,
    /// Hoard marks released (`all`).
    pub released: u64,
}
