//! The Logging Block Store (seed: Tuch et al., "Block Storage
//! Virtualization with Commodity Secure Digital Cards", VEE'12): a
//! log-structured, write-buffered, checksummed, encrypted, crash-safe,
//! garbage-collected image format made of a data file (`.lbsd`) and a
//! metadata log (`.lbsm`).
//!
//! Format: `docs/formats/lbs.md`. Manual: `docs/layers/lbs.md`.

pub mod checksum;
pub mod create;
pub mod format;
pub mod gc;
pub mod image;
pub mod inspect;
pub mod layer;
pub mod maintain;
pub mod replay;
pub mod storage;
#[doc(hidden)]
pub mod testkit;
pub mod transfer;
pub mod victims;

pub use checksum::ChecksumKind;
pub use create::{create, CreateOptions, Encryption, Paths};
pub use image::{Lbs, LbsOptions, StatsSnapshot};
