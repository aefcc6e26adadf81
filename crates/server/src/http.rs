//! The metrics endpoint (`metrics = "ADDR:PORT"` in the config): plain
//! HTTP on its own thread, so that a scrape never competes with the NBD
//! connections' threads for a runtime.
//!
//! - `GET /metrics`: Prometheus' text exposition format, version 0.0.4;
//! - `GET /status.json`: the [`Status`] document, which
//!   [`fetch_status`] (`roamdisk server status`) reads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::config::{ServerConfig, ServerConfigError};
use crate::metrics::Metrics;
use crate::status::{Status, STATUS_FORMAT, STATUS_VERSION};

/// A running metrics endpoint; told to stop when dropped (not waited
/// for: a scraper holding its connection open must not hold up the
/// server's exit).
pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        m.prometheus(),
    )
}

async fn status(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    axum::Json(m.status())
}

async fn index() -> &'static str {
    "roamdisk server: GET /metrics (Prometheus), GET /status.json\n"
}

/// Bind `addr` (errors are the user's: address in use...) and serve
/// `metrics` there until the returned value is dropped.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<MetricsServer> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        std::io::Error::new(e.kind(), format!("metrics: cannot listen on {addr}: {e}"))
    })?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(self::metrics))
        .route("/status.json", get(status))
        .with_state(metrics);
    std::thread::Builder::new()
        .name("roamdisk-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                let l = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "metrics endpoint failed");
                        return;
                    }
                };
                let stop = async {
                    let _ = rx.await;
                };
                if let Err(e) = axum::serve(l, app).with_graceful_shutdown(stop).await {
                    tracing::error!(error = %e, "metrics endpoint failed");
                }
            })
        })?;
    Ok(MetricsServer {
        addr: bound,
        stop: Some(tx),
    })
}

/// Why the status of a running server cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The config cannot be read.
    #[error(transparent)]
    Config(#[from] ServerConfigError),
    /// The config has no metrics endpoint to ask.
    #[error("{} has no metrics key: add metrics = \"127.0.0.1:PORT\" and restart the server", .0.display())]
    NoMetrics(PathBuf),
    /// Nothing listens at the metrics address.
    #[error("nothing answers at {0} (the config's metrics address): is the server running?")]
    NotRunning(SocketAddr),
    /// The request failed.
    #[error("cannot fetch {url}: {error}")]
    Fetch { url: String, error: ureq::Error },
    /// The answer could not be read.
    #[error("cannot read {url}: {error}")]
    Read { url: String, error: ureq::Error },
    /// The answer is not a status document.
    #[error(
        "{url} is not a roamdisk server's status ({error}); is something else listening there?"
    )]
    NotStatus {
        url: String,
        error: serde_json::Error,
    },
    /// A status document of another format or version.
    #[error("{url}: a '{format}' document version {version}, this roamdisk reads '{STATUS_FORMAT}' version {STATUS_VERSION}")]
    Version {
        url: String,
        format: String,
        version: u32,
    },
}

/// The status of the server running with the config at `path`, from its
/// metrics endpoint.
pub fn status_of(path: &Path) -> Result<Status, StatusError> {
    let cfg = ServerConfig::read(path)?;
    let addr = cfg
        .metrics
        .ok_or_else(|| StatusError::NoMetrics(path.to_path_buf()))?;
    fetch_status(addr)
}

/// `GET http://ADDR/status.json` of a running server.
pub fn fetch_status(addr: SocketAddr) -> Result<Status, StatusError> {
    let url = format!("http://{addr}/status.json");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut resp = agent.get(&url).call().map_err(|e| match e {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            StatusError::NotRunning(addr)
        }
        error => StatusError::Fetch {
            url: url.clone(),
            error,
        },
    })?;
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|error| StatusError::Read {
            url: url.clone(),
            error,
        })?;
    let st: Status = serde_json::from_str(&text).map_err(|error| StatusError::NotStatus {
        url: url.clone(),
        error,
    })?;
    if st.format != STATUS_FORMAT || st.version != STATUS_VERSION {
        return Err(StatusError::Version {
            url,
            format: st.format,
            version: st.version,
        });
    }
    Ok(st)
}
