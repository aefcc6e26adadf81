//! Listeners, exports and the connection life cycle, with clean shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use crate::access::{ExportResolver, Peer};
use crate::export::Export;
use crate::handshake::{negotiate_peer, HandshakeEnd};
use crate::shared::Shared;
use crate::stream::BoxStream;
use crate::tls::{TlsAcceptor, TlsMode};

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

/// How to serve, apart from the exports and the listeners.
pub struct ServeOptions {
    pub tls: Option<TlsAcceptor>,
    pub tls_mode: TlsMode,
    /// Requests processed at once per connection.
    pub max_in_flight: usize,
    /// Most connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// How long a client may take to finish the handshake.
    pub handshake_timeout: Duration,
    /// How long a connection's thread polls for the next request before it
    /// sleeps, when its client sends requests back to back (see
    /// `transmission::spin`); zero never polls.
    pub busy_poll: Duration,
    /// Threads doing block I/O: the blocking pool of the runtime
    /// [`crate::serve_until`] starts.
    pub io_threads: usize,
    /// When set, decides per connection which exports a client sees and
    /// may open (the fixed export list is then not used and may be empty).
    pub resolver: Option<Arc<dyn ExportResolver>>,
    /// Under [`TlsMode::Require`], let Unix-socket clients skip TLS (the
    /// resolver knows them by their uid).
    pub unix_without_tls: bool,
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
            resolver: None,
            unix_without_tls: false,
        }
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
    /// The first export is also the default one (empty name).
    pub async fn bind(
        exports: Vec<Export>,
        listen: Vec<Listen>,
        opts: ServeOptions,
    ) -> std::io::Result<Server> {
        if exports.is_empty() && opts.resolver.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no export configured",
            ));
        }
        let (unix, tcp) = bind(&listen).await?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut shared = Shared::new(
            exports,
            opts.tls,
            opts.tls_mode,
            opts.max_in_flight,
            opts.busy_poll,
            shutdown_rx,
        );
        shared.resolver = opts.resolver;
        shared.unix_without_tls = opts.unix_without_tls;
        let shared = Arc::new(shared);
        Ok(Server {
            shared,
            unix,
            tcp,
            listen,
            shutdown_tx,
            max_connections: opts.max_connections.max(1),
            handshake_timeout: opts.handshake_timeout,
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
        let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<Accepted>(64);
        let mut acceptors = JoinSet::new();
        for l in unix {
            let tx = conn_tx.clone();
            acceptors.spawn(async move { while hand_over(&tx, Accepted::unix(&l).await).await {} });
        }
        for l in tcp {
            let tx = conn_tx.clone();
            acceptors.spawn(async move { while hand_over(&tx, Accepted::tcp(&l).await).await {} });
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
                    // Over the connection limit a connection waits in its
                    // own task: this loop must keep watching for a stop.
                    let limit = limit.clone();
                    let shared = shared.clone();
                    let active = active.clone();
                    conns.spawn(async move {
                        let Ok(permit) = limit.acquire_owned().await else { return };
                        let (rt, done) = match connection_thread() {
                            Ok(t) => t,
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot start a connection thread");
                                return;
                            }
                        };
                        let mut conn = AbortOnDrop(rt.spawn(async move {
                            let _done = done;
                            let peer = s.peer();
                            match s.register() {
                                Ok(s) => handle_connection(s, peer, shared, handshake_timeout).await,
                                Err(e) => tracing::warn!(error = %e, "cannot set up a connection"),
                            }
                        }));
                        active.fetch_add(1, Ordering::Relaxed);
                        let _ = (&mut conn.0).await;
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
        for e in &shared.opened() {
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

/// An accepted connection on its way to an I/O thread, not yet registered
/// with any runtime, with its peer for the log.
enum Accepted {
    Unix(std::os::unix::net::UnixStream, String, Option<u32>),
    Tcp(std::net::TcpStream, SocketAddr),
}

/// Hand an accepted connection to the serve loop; false once the loop is
/// gone. A failed accept is logged and the next one comes after a pause.
async fn hand_over(
    tx: &tokio::sync::mpsc::Sender<Accepted>,
    accepted: std::io::Result<Accepted>,
) -> bool {
    match accepted {
        Ok(a) => tx.send(a).await.is_ok(),
        Err(e) => {
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            true
        }
    }
}

impl Accepted {
    /// The next connection on a Unix socket.
    async fn unix(l: &UnixListener) -> std::io::Result<Accepted> {
        let (s, _) = l.accept().await?;
        // Unix peers have no address; their process says which VM or tool
        // a client id belongs to.
        let (peer, uid) = match s.peer_cred() {
            Ok(c) => match c.pid() {
                Some(pid) => (format!("unix pid {pid} uid {}", c.uid()), Some(c.uid())),
                None => (format!("unix uid {}", c.uid()), Some(c.uid())),
            },
            Err(_) => ("unix".to_string(), None),
        };
        Ok(Accepted::Unix(s.into_std()?, peer, uid))
    }

    /// The next connection on a TCP listener.
    async fn tcp(l: &TcpListener) -> std::io::Result<Accepted> {
        let (s, peer) = l.accept().await?;
        let _ = s.set_nodelay(true);
        tracing::debug!(%peer, "connection");
        Ok(Accepted::Tcp(s.into_std()?, peer))
    }

    /// Who is on the other end, before any TLS.
    fn peer(&self) -> Peer {
        match self {
            Accepted::Unix(_, p, uid) => Peer {
                addr: p.clone(),
                unix: true,
                uid: *uid,
                tls: None,
            },
            Accepted::Tcp(_, a) => Peer {
                addr: a.to_string(),
                unix: false,
                uid: None,
                tls: None,
            },
        }
    }

    /// Register with the current runtime's reactor.
    fn register(self) -> std::io::Result<BoxStream> {
        Ok(match self {
            Accepted::Unix(s, _, _) => Box::new(UnixStream::from_std(s)?),
            Accepted::Tcp(s, _) => Box::new(TcpStream::from_std(s)?),
        })
    }
}

/// Start the thread a connection runs on: a single-threaded runtime with
/// its own epoll, until the returned sender is dropped. A request then
/// wakes just that thread, which reads it, runs it (inline when small, see
/// `transmission`) and writes the reply. In a work-stealing pool the
/// workers pass connections between them, and on a busy machine every
/// hand-off waits for a CPU (4 KiB reads at queue depth 1 got 1.8 times
/// the IOPS this way); a connection per thread also keeps one client's
/// slow request from delaying another's. Blocking work still goes to the
/// server's blocking pool.
fn connection_thread() -> std::io::Result<(Handle, oneshot::Sender<()>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let (done, stopped) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("roamdisk-conn".into())
        .spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            })
        })?;
    Ok((handle, done))
}

/// A task that is cancelled when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn handle_connection(s: BoxStream, mut peer: Peer, shared: Arc<Shared>, timeout: Duration) {
    let negotiated = tokio::time::timeout(timeout, negotiate_peer(s, &shared, &mut peer)).await;
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
    let client = shared.new_client(&session.export);
    let name = session.export.name.clone();
    let _guard = shared.connected(&peer, &session.export);
    tracing::info!(
        export = %name,
        client,
        %peer,
        structured = session.structured,
        tls = session.tls,
        "client connected"
    );
    if let Err(e) = crate::transmission::serve(stream, session, shared, client).await {
        tracing::debug!(export = %name, client, error = %e, "connection ended with an error");
    }
    tracing::info!(export = %name, client, "client disconnected");
}
