//! roamdisk's cache science: replacement policies, a trace-driven cache
//! simulator and the capacity models of the TransCom and Machine Bank
//! seeds.
//!
//! - [`policy`]: FMPQ, LRU, 2Q, FBR, MQ, ARC and S3-FIFO behind one
//!   [`Policy`](policy::Policy) trait, generic over the block key, used by
//!   the simulator and by a running server's memory cache alike;
//! - [`stack`]: one-pass LRU stack distances (exact LRU hit ratio for
//!   every cache size, O(log n) per reference);
//! - [`sharded`]: the cache engine — a policy cut into locked shards —
//!   shared by `roamdisk sim --shards` and the `cache` layer;
//! - [`layer`]: the `cache` layer, a memory cache in front of any stack
//!   on that engine;
//! - [`sim`]: the block-granular simulator with TransCom's sharing model,
//!   temporal-distance split (the seed's Table 2) and two-level runs;
//! - [`run`]: a whole simulation of a trace file (working-set pass, sizes
//!   resolved against it, one simulating pass), as `roamdisk sim` runs it;
//! - [`blocksize`]: Machine Bank's block-size latency model;
//! - [`mva`]: exact mean value analysis of TransCom's closed queueing
//!   network, and [`qnsim`], a discrete-event simulator of the same
//!   network used to check it; [`sweep`], the model's sweeps against the
//!   number of clients and the hit ratio.
//!
//! The engine never draws progress: it is fed request by request
//! (`feed`), and the caller reports how far it got through
//! `roamdisk_blockdev::Progress`.

pub mod blocksize;
pub mod index;
pub mod layer;
mod list;
pub mod mva;
pub mod policy;
pub mod qnsim;
pub mod run;
pub mod sharded;
pub mod sim;
pub mod stack;
pub mod sweep;
#[cfg(test)]
mod testkit;

pub use index::{DenseIndex, HashIndex, KeyIndex};
pub use policy::{Outcome, Policy, PolicyKind, PolicySpec};
pub use sharded::{shard_hint, ShardedCache};
