//! Content-addressed, versioned VM images (seeds: Machine Bank, IPDPS'07,
//! sections 2-3.5 and 5.2; ISR lookaside caching for the content-addressed
//! view).
//!
//! A disk is split into chunks (64 KiB by default) named by their hash and
//! kept once in a chunk [`store`] (a local directory, or an HTTP chunk
//! server). A version is an [`index`] (each chunk's name and the 2-bit
//! state of each sector) packed with the VM configuration file into a
//! [`version`] package, itself stored by hash; per-user [`catalog`]s list
//! the versions with their times, so any of them can be checked out again
//! (time travel). The `cas:` layer ([`layer`]) runs a session over a
//! version with a private cache of this session's sectors; [`commit`] turns
//! a whole disk or a session's useful updates into a new version; [`gc`]
//! removes chunks no version needs, safely while commits run. Sessions
//! roam: a host [`cache`] shared by its sessions, [`lookaside`] media, a
//! recorded working set fetched ahead on resume, and the [`resume`] set a
//! suspended session carries to the next host.
//!
//! Formats: `docs/formats/cas-*.md`. Manual: `docs/layers/cas.md`.

pub mod bytes;
pub mod cache;
pub mod catalog;
pub mod chunk;
pub mod commit;
pub mod error;
pub mod gc;
pub mod guest;
pub mod hash;
pub mod index;
pub mod layer;
pub mod lookaside;
pub mod repo;
pub mod resume;
pub mod secret;
pub mod server;
pub mod session;
pub mod store;
pub mod token;
pub mod upload;
pub mod version;
pub mod view;

pub use hash::{ChunkId, HashKind};
pub use roamdisk_blockdev::progress::{NoProgress, Progress};
