//! roamdisk's workload tools: the trace format and its converters, the
//! `trace:` recorder layer, replay (blksim/IOEmu), the sperf I/O-pattern
//! benchmark, trace statistics, generators of the seeds' workloads and the
//! `flashsim:` SD-card model layer.
//!
//! | module | what |
//! |---|---|
//! | [`trace`] | the record, binary and CSV readers/writers, payload sidecar |
//! | [`convert`] | blkparse text and MSR-Cambridge CSV to records |
//! | [`recorder`] | the `trace:FILE:NEXT` layer |
//! | [`stats`] | LBS Table 3 columns, mix, sizes, working sets, reuse |
//! | [`synth`] | Android (LBS Table 3), desktop (TransCom), boot storm |
//! | [`replay`] | streams per partition or client, barrier semantics |
//! | [`sperf`] | sequential/strided/partitioned/random bandwidth |
//! | [`flashsim`] | the SD-card model and its layer |
//! | [`target`] | what replay and sperf drive (NBD exports through `roamdisk_nbd::client`) |

pub mod convert;
pub mod flashsim;
pub mod recorder;
pub mod replay;
pub mod sperf;
pub mod stats;
pub mod synth;
pub mod target;
pub mod trace;

/// The layer kinds of this crate, for a registry.
pub static LAYERS: &[&roamdisk_blockdev::LayerKind] = &[&recorder::TRACE, &flashsim::FLASHSIM];
