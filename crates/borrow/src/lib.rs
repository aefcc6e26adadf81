//! Borrowed transient disks (seed: Smaldone et al., "Optimizing Storage
//! Performance for VM-Based Mobile Computing", ACM TOCS 2013 — TransPart):
//! a virtual disk made only of the free blocks of a host's file systems.
//!
//! - [`scan`]: find partitions, check each file system read-only, collect
//!   free extents (at least `min_extent`, the largest `max_extents`),
//!   sort them by partition and offset, and make a [`Plan`];
//! - [`Plan`]: the JSON plan file (`docs/formats/borrow-plan.md`), its
//!   device-mapper `linear` table and human summary;
//! - [`BorrowDev`] and the `borrow:PLAN` layer kind ([`layer::BORROW`]):
//!   the extents served as one block device, every I/O mapped through the
//!   plan and checked to stay inside it, XTS-encrypted with a key held
//!   only in memory, optional zero-scrub at release, refusing to open when
//!   the host changed since the scan (`docs/layers/borrow.md`);
//! - [`free`]: every free extent of some disks, before any filter;
//! - [`session`]: `roamdisk borrow run`: scan, copy the VM state in
//!   (whole or on demand), serve, copy modified blocks back, release.

mod bits;
pub mod dev;
pub mod free;
pub mod layer;
pub mod ondemand;
pub mod plan;
pub mod scan;
pub mod session;
mod summary;
pub mod verify;

pub use dev::{BorrowDev, BorrowOptions, Verify};
pub use plan::{Plan, PlanExtent, Status, UNIT};
pub use scan::{scan, ScanOptions};

use roamdisk_blockdev::{Error, ErrorKind, Op};

/// An error about a plan (malformed, inconsistent, or not matching the
/// host any more).
pub(crate) fn bad_plan(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, Op::Open, "borrow", msg)
}

/// Where long work reports how far it got (the project's one progress
/// trait): the engine never draws, the CLI chooses bars, lines or nothing.
pub use roamdisk_blockdev::progress::{NoProgress, Progress};
