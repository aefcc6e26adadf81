//! [`serve_until`]: the one way a command serves opened exports: start a
//! runtime, bind, serve until a stop future resolves, then finish in-flight
//! requests, flush every export and remove Unix sockets.

use std::future::Future;
use std::time::Duration;

use crate::server::{Export, Listen, Server, ServerConfig, TlsMode};
use crate::tls::TlsAcceptor;

/// How to serve, apart from the exports and the listeners.
pub struct ServeOptions {
    pub tls: Option<TlsAcceptor>,
    pub tls_mode: TlsMode,
    /// Requests processed at once per connection.
    pub max_in_flight: usize,
    /// Connections served at once.
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// See [`ServerConfig::busy_poll`].
    pub busy_poll: Duration,
    /// Threads doing block I/O.
    pub io_threads: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            tls: None,
            tls_mode: TlsMode::Off,
            max_in_flight: 64,
            max_connections: 256,
            handshake_timeout: Duration::from_secs(30),
            busy_poll: Duration::from_micros(100),
            io_threads: 64,
        }
    }
}

/// What was bound, for the caller to announce.
pub struct Bound {
    /// Each listener as a client would name it (`nbd+unix:///?socket=P`,
    /// `nbd://ADDR` with port 0 resolved).
    pub uris: Vec<String>,
}

/// Serve `exports` on `listen` until the future `stop` makes resolves.
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
        let cfg = ServerConfig {
            exports,
            listen: listen.clone(),
            tls: opts.tls,
            tls_mode: opts.tls_mode,
            max_in_flight: opts.max_in_flight,
            max_connections: opts.max_connections,
            handshake_timeout: opts.handshake_timeout,
            busy_poll: opts.busy_poll,
        };
        let server = Server::bind(cfg).await?;
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
