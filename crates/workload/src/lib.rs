//! roamdisk's workload tools: what drives a disk with a workload, and the
//! `flashsim:` SD-card model layer. Traces themselves (format, converters,
//! the `trace:` recorder, statistics, generators) are `roamdisk_trace`.
//!
//! | module | what |
//! |---|---|
//! | [`replay`] | streams per partition or client, barrier semantics (blksim, IOEmu) |
//! | [`sperf`] | sequential/strided/partitioned/random bandwidth |
//! | [`flashsim`] | the SD-card model and its layer |
//! | [`target`], [`nbdclient`] | what replay and sperf drive |

pub mod flashsim;
pub mod nbdclient;
pub mod replay;
pub mod sperf;
pub mod target;

/// The layer kinds of this crate, for a registry.
pub static LAYERS: &[&roamdisk_blockdev::LayerKind] = &[&flashsim::FLASHSIM];
