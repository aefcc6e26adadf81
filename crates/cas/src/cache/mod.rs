//! Client-side chunk caches (seed: Machine Bank section 3.1-3.3): the
//! host's [`shared::SharedCache`], used by every session on the host, and
//! the pin sets ([`pins`]) through which running sessions keep the chunks
//! they still need. Formats: `docs/formats/cas-shared-cache.md`.

pub mod hoard;
pub mod journal;
pub mod pins;
pub mod shared;

pub use shared::{Admission, CacheOptions, CacheStats, SharedCache, SharedChoice};

#[cfg(test)]
mod tests;
