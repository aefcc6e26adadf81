//! The NBD client and the `nbd:URI` layer (manual: `docs/layers/nbd.md`).
//!
//! | module | job |
//! |---|---|
//! | `uri` | `nbd[s]://[USER@]HOST[:PORT]/EXPORT`, `nbd[s]+unix:///EXPORT?socket=PATH`, TLS parameters |
//! | `sock` | the socket (TCP or Unix) and the layer's error helpers |
//! | `conn` | connecting and the handshake (STARTTLS, structured replies, `base:allocation`, `OPT_GO`) |
//! | `tls` | the client's TLS credentials (certificates folder or PSK file) and handshake |
//! | `relay` | the thread that owns a TLS stream and gives the pipeline a plain socket |
//! | `pipeline` | many requests in flight on one connection, replies matched by cookie |
//! | `dev` | the layer: splitting, FUA, block status, reconnecting with backoff |
//!
//! Wire constants and structs are [`crate::proto`]'s, shared with the server.

mod conn;
mod dev;
mod pipeline;
mod relay;
mod sock;
#[cfg(test)]
mod tests;
mod tls;
mod uri;

use std::sync::Arc;

use roamdisk_blockdev::{BlockDev, LayerKind, OpenCtx, Registry, Result};

pub use dev::{NbdDev, NbdOptions};
pub use uri::{NbdAddr, NbdUri, TlsParams, UriError};

/// `nbd:URI`.
pub static NBD: LayerKind = LayerKind {
    name: "nbd",
    summary: "an export of any NBD server (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH; TLS: nbds://[USER@]HOST/EXPORT?tls-certificates=DIR or ?tls-psk-file=FILE), reconnecting when the connection drops",
    args: &["uri"],
    options: &[(
        "timeout",
        "longest wait for the server: a request's reply, or a connection's handshake (default 60s for a reply, 30s for a handshake); past it the connection is made again, and the request fails if that keeps failing. `off`: wait for ever",
    )],
    open: open_layer,
    ..LayerKind::BOTTOM
};

fn open_layer(ctx: &OpenCtx<'_>, _next: Option<Arc<dyn BlockDev>>) -> Result<Arc<dyn BlockDev>> {
    let uri = NbdUri::parse(ctx.get(NBD.name, "uri")?)?;
    let mut opts = NbdOptions::default();
    if ctx.opt("timeout") == Some("off") {
        opts.request_timeout = None;
    } else if let Some(t) = ctx.duration_opt(NBD.name, "timeout")? {
        opts.request_timeout = Some(t);
        opts.handshake_timeout = t;
    }
    Ok(Arc::new(NbdDev::connect_with(&uri, opts, ctx.read_only)?))
}

/// Add the `nbd` layer to `r`, and read bare NBD URIs as `nbd:URI`.
pub fn register(r: &mut Registry) {
    r.add(&NBD);
    r.add_scheme("nbd://", NBD.name);
    r.add_scheme("nbd+unix://", NBD.name);
    r.add_scheme("nbds://", NBD.name);
    r.add_scheme("nbds+unix://", NBD.name);
}
