//! Content-addressed chunk stores (seeds: Machine Bank, IPDPS'07, sections
//! 2-3.5 and 5.2).
//!
//! A disk is split into chunks (64 KiB by default) named by their hash and
//! kept once in a chunk [`store`]: a local directory, an S3 bucket, or a
//! `roamdisk store serve` reached over HTTP. A version is an [`index`]
//! (each chunk's name and the 2-bit state of each sector) packed with the
//! VM configuration file into a [`version`] package, itself stored by hash;
//! per-user [`catalog`]s list the versions with their times, so any of them
//! can be checked out again (time travel). [`commit`] turns a whole disk
//! into a new version ([`upload`] stores only the chunks the store lacks);
//! [`gc`] removes chunks no version needs, safely while commits run.
//!
//! The crate is the storage half of content addressing; sessions, caches
//! and roaming are `roamdisk-roam`, the HTTP server `roamdisk-chunkserver`.
//! Formats: `docs/formats/cas-*.md`.

pub mod bytes;
pub mod catalog;
pub mod chunk;
pub mod commit;
pub mod error;
pub mod gc;
pub mod hash;
pub mod index;
pub mod memimage;
pub mod repo;
pub mod secret;
pub mod store;
pub mod token;
pub mod upload;
pub mod usage;
pub mod verify;
pub mod version;

pub use hash::{ChunkId, HashKind};
pub use roamdisk_blockdev::progress::{NoProgress, Progress};
