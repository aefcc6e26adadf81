//! roamdisk's block-device stack: the [`BlockDev`] trait, one error type,
//! the generic layers (`raw`, `mem`, `cow`, `throttle`), the factory that builds a
//! stack from a spec string or TOML table, the overlay-map engine
//! ([`overlay`]) that `cow:` and the `cas:` session keep their states in,
//! durable file writes ([`durable`]), single-flight fetches ([`flight`])
//! and the frame of file headers
//! ([`header`]).
//!
//! Operations carry no caller; the front end that receives a request runs
//! it inside [`context::with_context`], and a layer that needs to know who
//! issued it (the `trace` recorder's client ids) reads
//! [`context::current`]. A layer that hands part of a request to another
//! thread carries the context there itself (see [`context`]).
//!
//! ```
//! use roamdisk_blockdev::{Access, BlockDev, Registry, WriteFlags};
//! let reg = Registry::with_builtin();
//! let dev = reg.build("mem:1M", Access::ReadWrite).unwrap();
//! dev.write_at(b"hello", 0, WriteFlags::default()).unwrap();
//! let mut buf = [0u8; 5];
//! dev.read_at(&mut buf, 0).unwrap();
//! assert_eq!(&buf, b"hello");
//! ```

mod checked;
pub mod context;
pub mod copy;
mod dev;
pub mod durable;
mod error;
pub mod flight;
pub mod header;
pub mod layers;
pub mod overlay;
pub mod progress;
pub mod spec;
pub mod testkit;
pub mod throttle;
pub mod units;
pub mod vfs;

pub use checked::Checked;
pub use copy::{copy_sparse, CopyOptions, Zeroes};
pub use dev::{
    extents_covering, find_layer, find_layers, push_extent, write_zero_buffers, Access, Alloc,
    BlockDev, Caps, Extent, WriteFlags, ZeroFlags,
};
pub use error::{Error, ErrorKind, Op, Result};
pub use progress::{NoProgress, Progress};
pub use spec::{LayerKind, LayerSpec, OpenCtx, OptionalArg, Registry};
