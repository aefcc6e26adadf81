//! The roamdisk block-I/O trace and everything that only needs traces:
//! no NBD, no async runtime, no crypto, so the cache simulator and the
//! models depend on it alone.
//!
//! | module | what |
//! |---|---|
//! | [`format`] | the record, binary and CSV readers/writers, payload sidecar (`docs/formats/trace.md`) |
//! | [`convert`] | blkparse text and MSR-Cambridge CSV to records |
//! | [`recorder`] | the `trace:FILE:NEXT` layer |
//! | [`stats`] | LBS Table 3 columns, mix, sizes, working sets, reuse |
//! | [`synth`] | Android (LBS Table 3), desktop (TransCom), boot storm, Machine Bank's Virtual PC traces |
//!
//! The format's main types are re-exported here: `roamdisk_trace::{Record, Reader, Writer}`.

pub mod convert;
pub mod format;
pub mod recorder;
pub mod stats;
pub mod synth;
#[cfg(test)]
mod testkit;

pub use format::{Format, Reader, Record, TraceError, TraceOp, Writer};

/// The layer kinds of this crate, for a registry.
pub static LAYERS: &[&roamdisk_blockdev::LayerKind] = &[&recorder::TRACE];
