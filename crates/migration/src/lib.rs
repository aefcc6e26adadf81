//! QEMU's migration stream, the parts roamdisk reads and writes: the
//! precopy stream of a stopped VM taken apart into RAM pages and device
//! state ([`stream`]), the postcopy source's frames and the precopy
//! stream rebuilt from pages ([`write`]), and the return path a
//! destination answers on ([`rp`]). Constants in [`proto`]. No sockets
//! here: readers take any `Read`, writers fill byte vectors. Byte by byte
//! in `docs/formats/qemu-migration.md`.

pub mod error;
pub mod proto;
pub mod rp;
pub mod stream;
pub mod write;

pub use error::{Error, Result};
