//! Running the server (`roamdisk server CONFIG`): [`Server::open`] reads
//! the config, takes the state directory's lock, opens the golden images
//! (behind the cache), starts the metrics endpoint and sets up TLS by the
//! NBD crate's one policy; [`Server::serve`] then serves every client's
//! grants until SIGINT or SIGTERM (reading the config's clients again on
//! SIGHUP, [`reload`]), flushes the views and lets the lock go.
//! What to announce is the caller's: the config ([`Server::config`]), the
//! metrics address and the bound listeners.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use roamdisk_blockdev::Registry;
use roamdisk_nbd::{
    Bound, Listen, ServeError, ServeOptions, TlsAcceptor, TlsError, TlsMode, TlsOptions,
};

use crate::config::{ServerConfig, ServerConfigError};
use crate::http::MetricsServer;
use crate::state::StateLock;
use crate::views::{ReloadError, Reloaded, Views, ViewsError};

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
    /// The config file, read again on SIGHUP.
    path: PathBuf,
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
            Some(_) => Some(
                crate::http::serve(&cfg, views.metrics().clone()).map_err(ServerError::Metrics)?,
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
            path: path.to_path_buf(),
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

    /// Where the metrics endpoint serves (`http://ADDR`, `https://ADDR`
    /// or `unix:PATH`), if the config has one.
    pub fn metrics_url(&self) -> Option<&str> {
        self.metrics.as_ref().map(|m| m.url.as_str())
    }

    /// Serve until SIGINT or SIGTERM, reloading the config on SIGHUP
    /// ([`reload`]); `bound` is called with the bound listeners before the
    /// first client is served. TCP clients must use TLS (the config refuses
    /// `listen` without credentials); Unix-socket clients, known by their
    /// uid, need not.
    pub fn serve(
        self,
        o: RunOptions,
        bound: impl FnOnce(&Bound),
        reloaded: impl Fn(&Path, &Result<Reloaded, ReloadError>) + Send + Sync + 'static,
    ) -> Result<(), ServerError> {
        let mut listen = Vec::new();
        if let Some(s) = &self.cfg.socket {
            listen.push(Listen::Unix(s.clone()));
        }
        listen.extend(self.cfg.listen.iter().copied().map(Listen::Tcp));
        let views = Arc::new(self.views);
        let tls = self.tls.clone();
        let opts = ServeOptions {
            tls: self.tls,
            tls_mode: self.tls_mode,
            max_in_flight: o.max_in_flight,
            max_connections: o.max_connections,
            io_threads: o.io_threads,
            busy_poll: Duration::from_micros(100),
            resolver: Some(views.clone()),
            unix_without_tls: true,
            ..ServeOptions::default()
        };
        let path = self.path.clone();
        roamdisk_nbd::serve_until(Vec::new(), listen, opts, |b| {
            bound(b);
            until_stopped(path, views, tls, Arc::new(reloaded))
        })
        .map_err(ServeError::from)?;
        // The endpoint stops before the state directory is let go.
        drop(self.metrics);
        drop(self.lock);
        Ok(())
    }
}

/// What is told of each reload: the config file and the outcome.
type OnReload = Arc<dyn Fn(&Path, &Result<Reloaded, ReloadError>) + Send + Sync>;

/// Serve until SIGINT or SIGTERM; on each SIGHUP, [`reload`] the config
/// and tell `reloaded` how it went (a refused reload leaves the config
/// served before in force).
async fn until_stopped(
    path: PathBuf,
    views: Arc<Views>,
    tls: Option<TlsAcceptor>,
    reloaded: OnReload,
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "cannot catch SIGHUP: the config is not reloaded while the server runs");
            return roamdisk_nbd::signalled().await;
        }
    };
    let stop = roamdisk_nbd::signalled();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = hup.recv() => {
                let (path, views, tls) = (path.clone(), views.clone(), tls.clone());
                let told = reloaded.clone();
                let done = tokio::task::spawn_blocking(move || {
                    told(&path, &reload(&path, &views, tls.as_ref()));
                });
                let _ = done.await;
            }
        }
    }
}

/// Read the config at `path` again and serve its clients from now on
/// (`SIGHUP`): who they are, how they prove it (the PSK file is read again
/// too) and what they may open. Connections already open keep the export
/// they opened until they end; every new connection, and every export a
/// connection opens, is checked against the new config. A config that
/// changes anything else (images, cache, listeners, state, TLS files,
/// metrics) is refused whole: those need a restart.
pub fn reload(
    path: &Path,
    views: &Views,
    tls: Option<&TlsAcceptor>,
) -> Result<Reloaded, ReloadError> {
    views.reload(ServerConfig::read(path)?, tls)
}
