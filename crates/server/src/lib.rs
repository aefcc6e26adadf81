//! `roamdisk server`: one NBD server for many clients (TransCom's diskless
//! clients). Golden images are opened once, read-only, optionally behind
//! one memory cache (the seed's server cache, FMPQ by default); each
//! client is identified at connect (TLS certificate, TLS-PSK identity or
//! Unix uid) and sees only the images it is granted: either the golden
//! image itself, read-only, or its own view of it, the golden image under
//! a private copy-on-write overlay kept in the state directory across
//! restarts. What it does is counted per client and image and served over
//! HTTP.
//!
//! - [`run`]: opening everything the config names and serving it
//! - [`config`]: the config file (`docs/formats/server-config.md`)
//! - [`access`]: who a connection is, and what it may open
//! - [`views`]: golden images, the cache, per-client views, the NBD export
//!   resolver
//! - [`metered`]: the layer counting each client's requests
//! - [`metrics`]: the counters, `/metrics` and `/status.json`
//! - [`status`]: the status document and the rows of `server status`
//! - [`http`]: the metrics endpoint, and the client `server status` uses
//! - [`state`]: the state directory: its lock, reset and promote
//! - [`promote`]: a client's view made a new golden image

pub mod access;
pub mod config;
pub mod http;
pub mod metered;
pub mod metrics;
pub mod promote;
pub mod run;
pub mod state;
pub mod status;
pub mod views;

pub use config::{ServerConfig, ServerConfigError};
pub use run::{RunOptions, Server, ServerError};
pub use views::Views;
