//! Client-side chunk caches (seed: Machine Bank section 3.1-3.3): the
//! host's [`shared::SharedCache`], used by every session on the host, and
//! the pin sets ([`pins`]) through which running sessions keep the chunks
//! they still need, the hoard marks ([`hoard_marks`]) through which
//! `roamdisk hoard` keeps whole versions, and the upkeep `roamdisk cache`
//! runs ([`admin`]). The cache is the first source of a version view's
//! fetch chain (`source.rs`). Formats: `docs/formats/cas-shared-cache.md`.

pub mod admin;
pub mod alloc;
mod config;
mod files;
pub mod gens;
pub mod hoard_marks;
mod inner;
pub mod journal;
pub mod journal2;
pub mod pins;
pub mod shared;
mod source;
mod state;

pub use shared::{CacheOptions, CacheStats, Evicted, SharedCache, SharedChoice, Snapshot};

#[cfg(test)]
mod tests;
