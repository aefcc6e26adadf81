//! `roamdisk server`: one NBD server for many clients (TransCom's diskless
//! clients). Golden images are opened once, read-only; each client is
//! identified at connect (TLS certificate, TLS-PSK identity or Unix uid)
//! and sees only the images it is granted: either the golden image itself,
//! read-only, or its own view of it, the golden image under a private
//! copy-on-write overlay kept in the state directory across restarts.
//!
//! - [`config`]: the config file (`docs/formats/server-config.md`)
//! - [`access`]: who a connection is, and what it may open
//! - [`views`]: golden images, per-client views, the NBD export resolver
//! - [`state`]: the state directory: its lock, reset and promote

pub mod access;
pub mod config;
pub mod state;
pub mod views;

pub use config::{ServerConfig, ServerConfigError};
pub use views::Views;
