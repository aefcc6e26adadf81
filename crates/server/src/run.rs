//! Running the server (`roamdisk server CONFIG`): [`Server::open`] reads
//! the config, takes the state directory's lock, opens the golden images
//! (behind the cache), starts the metrics endpoint and sets up TLS by the
//! NBD crate's one policy; [`Server::serve`] then serves every client's
//! grants until SIGINT or SIGTERM, flushes the views and lets the lock go.
//! What to announce is the caller's: the config ([`Server::config`]), the
//! metrics address and the bound listeners.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::Registry;
use roamdisk_nbd::{
    Bound, Listen, ServeError, ServeOptions, TlsAcceptor, TlsError, TlsMode, TlsOptions, Until,
};

use crate::config::{ServerConfig, ServerConfigError};
use crate::http::MetricsServer;
use crate::state::StateLock;
use crate::views::{Views, ViewsError};

/// How many requests, connections and I/O threads the server allows.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Requests processed at once per connection.
    pub max_in_flight: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Threads doing block I/O.
    pub io_threads: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            max_in_flight: 64,
            max_connections: 256,
            io_threads: 64,
        }
    }
}

/// Why the server cannot start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The config file cannot be read or is wrong.
    #[error(transparent)]
    Config(#[from] ServerConfigError),
    /// The state directory cannot be made or is locked by another server.
    #[error(transparent)]
    State(std::io::Error),
    /// A golden image, the cache or a view does not open.
    #[error("{}: {error}", path.display())]
    Views { path: PathBuf, error: ViewsError },
    /// The metrics endpoint cannot listen.
    #[error(transparent)]
    Metrics(std::io::Error),
    /// The TLS credentials cannot be used.
    #[error("{}: {error}", path.display())]
    Tls { path: PathBuf, error: TlsError },
    /// Binding, serving or the final flush failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// A server ready to serve: its state directory locked, its images open,
/// its metrics endpoint up.
pub struct Server {
    cfg: Arc<ServerConfig>,
    // Dropped in this order: the endpoint stops before the lock goes.
    metrics: Option<MetricsServer>,
    views: Views,
    lock: StateLock,
    tls_mode: TlsMode,
    tls: Option<TlsAcceptor>,
}

impl Server {
    /// Read the config at `path` and open everything it names (its stacks
    /// through `reg`); errors name the file.
    pub fn open(path: &Path, reg: &Registry) -> Result<Server, ServerError> {
        let cfg = Arc::new(ServerConfig::read(path)?);
        let lock = StateLock::take(&cfg.state).map_err(ServerError::State)?;
        let views =
            Views::open(cfg.clone(), &lock.dir, reg).map_err(|error| ServerError::Views {
                path: path.to_path_buf(),
                error,
            })?;
        let metrics = match cfg.metrics {
            Some(addr) => Some(
                crate::http::serve(addr, views.metrics().clone()).map_err(ServerError::Metrics)?,
            ),
            None => None,
        };
        let tls = TlsOptions {
            cert: cfg.tls_cert.clone(),
            key: cfg.tls_key.clone(),
            verify_ca: cfg.tls_verify_ca.clone(),
            psk_file: cfg.tls_psk.clone(),
        };
        let (tls_mode, tls) = TlsMode::resolve(None, &tls).map_err(|error| ServerError::Tls {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(Server {
            cfg,
            metrics,
            views,
            lock,
            tls_mode,
            tls,
        })
    }

    /// The config being served.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Where the metrics endpoint listens, if the config has one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr)
    }

    /// Serve until SIGINT or SIGTERM; `bound` is called with the bound
    /// listeners before the first client is served. TCP clients must use
    /// TLS (the config refuses `listen` without credentials); Unix-socket
    /// clients, known by their uid, need not.
    pub fn serve(self, o: RunOptions, bound: impl FnOnce(&Bound)) -> Result<(), ServerError> {
        let mut listen = Vec::new();
        if let Some(s) = &self.cfg.socket {
            listen.push(Listen::Unix(s.clone()));
        }
        listen.extend(self.cfg.listen.iter().copied().map(Listen::Tcp));
        let opts = ServeOptions {
            tls: self.tls,
            tls_mode: self.tls_mode,
            max_in_flight: o.max_in_flight,
            max_connections: o.max_connections,
            io_threads: o.io_threads,
            busy_poll: Duration::from_micros(100),
            resolver: Some(Arc::new(self.views)),
            unix_without_tls: true,
            ..ServeOptions::default()
        };
        roamdisk_nbd::serve(Vec::new(), listen, opts, Until::Signal, bound)?;
        // The endpoint stops before the state directory is let go.
        drop(self.metrics);
        drop(self.lock);
        Ok(())
    }
}
