//! roamdisk's workload tools: what drives a disk with a workload, and the
//! `flashsim:` SD-card model layer. Traces themselves (format, converters,
//! the `trace:` recorder, statistics, generators) are `roamdisk_trace`.
//!
//! | module | what |
//! |---|---|
//! | [`replay`] | streams per partition or client, barrier semantics (blksim, IOEmu) |
//! | [`sperf`] | sequential/strided/partitioned/random bandwidth |
//! | [`flashsim`] | the SD-card model and its layer |
//! | [`target`] | what replay and sperf drive (NBD exports through `roamdisk_nbd::client`) |

pub mod flashsim;
pub mod replay;
pub mod sperf;
pub mod target;

/// The layer kinds of this crate, for a registry.
pub static LAYERS: &[&roamdisk_blockdev::LayerKind] = &[&flashsim::FLASHSIM];
