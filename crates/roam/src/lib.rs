//! Roaming a disk (seeds: Machine Bank sections 3.1-3.4; ISR lookaside
//! caching): a user's disk, stored once as versions in a chunk store
//! (`roamdisk-chunkstore`), fetched on demand to whichever host runs it.
//!
//! A [`view`] reads a committed version as a disk, fetching each chunk
//! through one chain of sources: this host's shared [`cache`], lookaside
//! media ([`lookaside`]: a USB key, an old image, a resume set) and then
//! the store, every chunk verified against its name. A [`session`] is a
//! writable disk over a version (the `cas:` [`layer`]): a private cache of
//! the sectors it wrote, a recorded working set, read-ahead, and the
//! update commit that keeps only the useful changes ([`guest`] finds the
//! free and swap space a commit leaves out). [`suspend`] commits a session
//! and writes the set of chunks it carries to the next host; [`resume`]
//! starts it there. [`checkout`] materialises a version, [`hoard`] keeps a
//! whole version on this host.
//!
//! Formats: `docs/formats/cas-session.md`, `cas-shared-cache.md`,
//! `cas-lookaside-index.md`, `cas-working-set.md`. Manual:
//! `docs/layers/cas.md`, `docs/roaming.md`.

pub mod cache;
pub mod checkout;
pub mod fetch;
pub mod guest;
pub mod hoard;
pub mod layer;
pub mod live;
pub mod lookaside;
pub mod memory;
mod private_dir;
pub mod qemu;
pub mod readahead;
pub mod resume;
pub mod session;
pub mod suspend;
pub mod view;
