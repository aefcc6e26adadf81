//! [`serve_until`]: the one way a command serves opened exports: start a
//! runtime, bind, serve until a stop future resolves, then finish in-flight
//! requests, flush every export and remove Unix sockets.

use crate::server::{Export, Listen, ServeOptions, Server};
use std::future::Future;

/// What was bound, for the caller to announce.
pub struct Bound {
    /// Each listener as a client would name it (`nbd+unix:///?socket=P`,
    /// `nbd://ADDR` with port 0 resolved).
    pub uris: Vec<String>,
}

/// Serve `exports` on `listen` until the future `stop` returns resolves.
/// `stop` is called once the listeners are bound, inside the server's
/// runtime (so it may spawn tokio tasks and processes); [`signalled`] is
/// the usual one. Binding errors (address in use, no export) come back
/// before anything is served.
pub fn serve_until<F, Fut>(
    exports: Vec<Export>,
    listen: Vec<Listen>,
    opts: ServeOptions,
    stop: F,
) -> std::io::Result<()>
where
    F: FnOnce(&Bound) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(opts.io_threads.max(1))
        .thread_name("roamdisk")
        .build()?;
    rt.block_on(async move {
        let server = Server::bind(exports, listen.clone(), opts).await?;
        let mut uris: Vec<String> = listen
            .iter()
            .filter(|l| matches!(l, Listen::Unix(_)))
            .map(|l| l.to_string())
            .collect();
        uris.extend(server.tcp_addrs().iter().map(|a| format!("nbd://{a}")));
        let stop = stop(&Bound { uris });
        server.run(stop).await
    })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn signalled() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
