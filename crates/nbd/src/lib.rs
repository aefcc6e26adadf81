//! roamdisk's NBD side: the wire format ([`proto`], no I/O, fuzzed), a
//! server that exports any [`roamdisk_blockdev::BlockDev`] stack to real
//! clients (qemu, qemu-img, qemu-io, nbdinfo, nbdcopy, fio, nbd-client),
//! and a [`client`] that is the `nbd:URI` layer.
//!
//! Every command serves through [`serve`] (until SIGINT/SIGTERM or the
//! exit of an `--exec` command; the caller announces the bound URIs), with
//! TLS decided by the one policy, [`TlsMode::resolve`].

pub mod access;
pub mod client;
pub mod config;
mod export;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
pub mod proto;
mod run;
mod server;
mod shared;
mod stream;
mod tls;
mod transmission;

pub use access::{ExportResolver, Peer, Refusal, TlsPeer};
pub use export::Export;
pub use run::{serve, serve_until, signalled, Bound, Ended, ServeError, Until};
pub use server::{Listen, ServeOptions, Server};
pub use tls::{TlsAcceptor, TlsError, TlsMode, TlsOptions};
pub use transmission::errno;
