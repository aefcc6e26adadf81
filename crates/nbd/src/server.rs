//! Listeners, exports and the connection life cycle, with clean shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::BlockDev;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::handshake::{negotiate, HandshakeEnd};
use crate::tls::TlsAcceptor;

/// Any byte stream a connection runs over (TCP, Unix, TLS).
pub trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}
/// A boxed connection stream.
pub type BoxStream = Box<dyn AsyncStream>;

/// One named export.
pub struct Export {
    pub name: String,
    pub description: String,
    /// The stack, already wrapped in `Checked` (validation happens there).
    pub dev: Arc<dyn BlockDev>,
}

/// How TLS is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused.
    Off,
    /// Clients may upgrade; plain clients are served too.
    Optional,
    /// Every option but STARTTLS and ABORT is refused until TLS is up.
    Require,
}

/// Where to listen.
#[derive(Debug, Clone)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "nbd+unix:///?socket={}", p.display()),
            Listen::Tcp(a) => write!(f, "nbd://{a}"),
        }
    }
}

/// Server configuration.
pub struct ServerConfig {
    /// The first export is also the default one (empty name).
    pub exports: Vec<Export>,
    pub listen: Vec<Listen>,
    pub tls: Option<TlsAcceptor>,
    pub tls_mode: TlsMode,
    /// Requests processed at once per connection.
    pub max_in_flight: usize,
    /// Most connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// How long a client may take to finish the handshake.
    pub handshake_timeout: Duration,
}

/// State every connection shares.
pub struct Shared {
    pub exports: Vec<Arc<Export>>,
    pub tls: Option<TlsAcceptor>,
    pub tls_mode: TlsMode,
    pub max_in_flight: usize,
    shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// The export of that name; the empty name is the first export.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() {
            return self.exports.first().cloned();
        }
        self.exports.iter().find(|e| e.name == name).cloned()
    }
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }
}

/// Bind every listener. Unix sockets left over by a crashed server are
/// replaced only if nothing answers on them.
async fn bind(listen: &[Listen]) -> std::io::Result<(Vec<UnixListener>, Vec<TcpListener>)> {
    let mut unix = Vec::new();
    let mut tcp = Vec::new();
    for l in listen {
        match l {
            Listen::Unix(p) => {
                if p.exists() {
                    if tokio::net::UnixStream::connect(p).await.is_ok() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            format!("{} is in use by a running server", p.display()),
                        ));
                    }
                    std::fs::remove_file(p)?;
                }
                unix.push(UnixListener::bind(p).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", p.display()))
                })?);
            }
            Listen::Tcp(a) => {
                tcp.push(TcpListener::bind(a).await.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot listen on {a}: {e}"))
                })?);
            }
        }
    }
    Ok((unix, tcp))
}

/// A bound server, ready to run.
pub struct Server {
    shared: Arc<Shared>,
    unix: Vec<UnixListener>,
    tcp: Vec<TcpListener>,
    listen: Vec<Listen>,
    shutdown_tx: watch::Sender<bool>,
    max_connections: usize,
    handshake_timeout: Duration,
}

impl Server {
    /// Bind the listeners. Errors here (address in use, bad path) are the
    /// user's to fix, so they are reported before anything runs.
    pub async fn bind(cfg: ServerConfig) -> std::io::Result<Server> {
        if cfg.exports.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no export configured",
            ));
        }
        let (unix, tcp) = bind(&cfg.listen).await?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            exports: cfg.exports.into_iter().map(Arc::new).collect(),
            tls: cfg.tls,
            tls_mode: cfg.tls_mode,
            max_in_flight: cfg.max_in_flight.max(1),
            shutdown: shutdown_rx,
        });
        Ok(Server {
            shared,
            unix,
            tcp,
            listen: cfg.listen,
            shutdown_tx,
            max_connections: cfg.max_connections.max(1),
            handshake_timeout: cfg.handshake_timeout,
        })
    }

    /// The actual TCP addresses bound (port 0 resolved).
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.tcp
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serve until `stop` resolves; then stop accepting, let connections
    /// finish their in-flight requests, flush every export and remove Unix
    /// sockets.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> std::io::Result<()> {
        let Server {
            shared,
            unix,
            tcp,
            listen,
            shutdown_tx,
            max_connections,
            handshake_timeout,
        } = self;
        let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<BoxStream>(64);
        let mut acceptors = JoinSet::new();
        for l in unix {
            let tx = conn_tx.clone();
            acceptors.spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            if tx.send(Box::new(s) as BoxStream).await.is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        for l in tcp {
            let tx = conn_tx.clone();
            acceptors.spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, peer)) => {
                            let _ = s.set_nodelay(true);
                            tracing::debug!(%peer, "connection");
                            if tx.send(Box::new(s) as BoxStream).await.is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        drop(conn_tx);
        let active = Arc::new(AtomicUsize::new(0));
        let limit = Arc::new(tokio::sync::Semaphore::new(max_connections));
        let mut conns = JoinSet::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                Some(s) = conn_rx.recv() => {
                    let Ok(permit) = limit.clone().acquire_owned().await else { break };
                    let shared = shared.clone();
                    let active = active.clone();
                    conns.spawn(async move {
                        active.fetch_add(1, Ordering::Relaxed);
                        handle_connection(s, shared, handshake_timeout).await;
                        active.fetch_sub(1, Ordering::Relaxed);
                        drop(permit);
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        tracing::info!(
            connections = active.load(Ordering::Relaxed),
            "shutting down: finishing in-flight requests"
        );
        acceptors.abort_all();
        let _ = shutdown_tx.send(true);
        let drain = async { while conns.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(30), drain)
            .await
            .is_err()
        {
            tracing::warn!("connections did not finish within 30 s; closing them");
            conns.abort_all();
        }
        let mut result = Ok(());
        for e in &shared.exports {
            let dev = e.dev.clone();
            let name = e.name.clone();
            match tokio::task::spawn_blocking(move || dev.flush()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::error!(export = %name, error = %err, "final flush failed");
                    result = Err(std::io::Error::other(err.to_string()));
                }
                Err(err) => result = Err(std::io::Error::other(err.to_string())),
            }
        }
        for l in &listen {
            if let Listen::Unix(p) = l {
                let _ = std::fs::remove_file(p);
            }
        }
        result
    }
}

async fn handle_connection(s: BoxStream, shared: Arc<Shared>, timeout: Duration) {
    let negotiated = tokio::time::timeout(timeout, negotiate(s, &shared)).await;
    let (stream, session) = match negotiated {
        Err(_) => {
            tracing::info!("handshake timed out");
            return;
        }
        Ok(Err(HandshakeEnd::Closed(why))) => {
            tracing::debug!(why, "handshake ended");
            return;
        }
        Ok(Err(HandshakeEnd::Error(e))) => {
            tracing::debug!(error = %e, "handshake failed");
            return;
        }
        Ok(Ok(x)) => x,
    };
    tracing::debug!(export = %session.export.name, structured = session.structured, tls = session.tls, "transmission");
    if let Err(e) = crate::transmission::serve(stream, session, shared).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
