//! A chunk store in a local directory (the embedded default).
//!
//! ```text
//! STORE/store.toml          settings (hash, compression, quota)
//! STORE/packs/NAME.pack     objects stored together: a commit's chunks
//! STORE/objects/4e/4e11…    objects stored one at a time, a file each,
//!                           named by its hex id, under a folder named by
//!                           the first two digits
//! STORE/refs/USER/IMAGE     catalogs (compare-and-swap under refs/.lock)
//! STORE/leases/ID           commits in progress
//! STORE/tmp/                objects being written
//! STORE/trash/              objects and packs a running gc is about to delete
//! ```
//!
//! A group of objects (a put group, or a `put_many` of more than one) is
//! written as packs (`pack_writer.rs`, one per writing thread): each an
//! unnamed file, made durable, then named. A single object is a file of
//! its own: written to an unnamed file in its folder (`O_TMPFILE`; a named
//! file in `tmp/` where the file system has none), made durable, then given
//! its name (a link that fails if the name exists). The folders that
//! received names are fsynced by [`ChunkWrite::sync`](crate::store::api::ChunkWrite::sync)
//! before any version refers to them. Details and the crash argument:
//! `docs/formats/cas-store.md`.
//!
//! The files, shaped like the S3 store's (`../s3/`):
//!
//! * `store.rs` — [`LocalStore`]: its state, `open`, `init`, its paths;
//! * `objects.rs` — reading, looking up, touching and writing objects
//!   ([`ChunkRead`](crate::store::api::ChunkRead),
//!   [`ChunkWrite`](crate::store::api::ChunkWrite)), single objects as files of
//!   their own;
//! * `packs.rs` — packs: the folder, their indexes, reads and touches of
//!   packed objects; `pack_writer.rs` — the writer of a new pack;
//!   `table.rs` — where each packed object is;
//! * `gc.rs` — listing, remove-if-older, repacking and recovery
//!   ([`ChunkPrune`](crate::store::api::ChunkPrune));
//! * `refs.rs` — catalogs ([`RefStore`](crate::store::api::RefStore));
//! * `leases.rs` — leases ([`LeaseStore`](crate::store::api::LeaseStore));
//! * local only: `files.rs` (unnamed files and how they get a name,
//!   vectored writes, touches).

mod files;
mod gc;
mod leases;
mod objects;
mod pack_writer;
mod packs;
mod refs;
mod store;
mod table;

#[cfg(test)]
pub(crate) use store::testing;
pub use store::LocalStore;
