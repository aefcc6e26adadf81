//! A chunk store in an S3 bucket (`s3://BUCKET/PREFIX`), through the
//! `object_store` crate: AWS S3, Garage, MinIO, Ceph, OpenStack Swift's
//! s3api. Layout, catalog and gc protocol: `docs/formats/cas-s3.md`.
//!
//! * Chunks travel in packs (the local store's `RDPK` files, 32 MiB per
//!   commit group), uploaded in one PUT (never a multipart upload), read with
//!   ranged GETs; single objects (version packages) are objects of their
//!   own. Every pack's index is loaded once per process (one suffix GET per
//!   pack), so asking "which of these chunks does the store have" costs no
//!   request.
//! * Nothing is overwritten in place except markers: a catalog update is a
//!   new object per generation (`refs.rs`), so two concurrent commits to
//!   one image both stay; a version removed is recorded by a tombstone.
//! * A commit that reuses a pack *touches* it (a small marker object); gc
//!   removes a pack only after writing a *trash* marker and reading the
//!   touch marker again, and a commit checks for the trash marker after
//!   its touch — whichever comes second sees the other.
//! * Every request is retried with backoff on 5xx answers and timeouts
//!   (`object_store`'s retry policy); many are in flight at once.
//!
//! The files, shaped like the local store's (`../local/`):
//!
//! * `store.rs` — [`S3Store`]: its state, `open`, `init`, the connection;
//! * `objects.rs` — reading, looking up, touching and writing objects
//!   ([`ChunkRead`](crate::store::api::ChunkRead),
//!   [`ChunkWrite`](crate::store::api::ChunkWrite));
//! * `packs.rs` — packs: the listing that finds them, their indexes;
//!   `pack_writer.rs` — the writer of a new pack; `table.rs` — where each
//!   known object is;
//! * `gc.rs` — listing, removal (trash and touch markers), repacking and
//!   recovery ([`ChunkPrune`](crate::store::api::ChunkPrune));
//! * `refs.rs` — catalogs ([`RefStore`](crate::store::api::RefStore));
//! * `leases.rs` — leases ([`LeaseStore`](crate::store::api::LeaseStore));
//! * S3 only: `bridge.rs` (the tokio runtime and the requests),
//!   `batch.rs` (single puts of several threads gathered into one pack),
//!   `index_cache.rs` (pack indexes kept on local disk between runs),
//!   `location.rs` (the `s3://` location).

mod batch;
mod bridge;
mod gc;
mod index_cache;
mod leases;
pub mod location;
mod objects;
mod pack_writer;
mod packs;
#[cfg(test)]
mod power;
pub mod refs;
mod store;
mod table;
#[cfg(test)]
mod testing;

pub use super::api::S3Env;
pub use leases::parse_lease;
pub use location::{is_s3, S3Location};
pub use store::S3Store;
