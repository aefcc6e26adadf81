//! The metrics endpoint (`metrics = "ADDR:PORT"` or `"unix:PATH"` in the
//! config), on its own thread, so that a scrape never competes with the
//! NBD connections' threads for a runtime:
//!
//! - `GET /metrics`: Prometheus' text exposition format, version 0.0.4;
//! - `GET /status.json`: the [`Status`] document, which
//!   [`fetch_status`] (`roamdisk server status`) reads.
//!
//! Who may read them: on a Unix socket, whoever the socket's file mode
//! (0660) lets connect; with `metrics-token-file`, only requests that
//! carry `Authorization: Bearer TOKEN` (the file is read again for each
//! request, so a new token takes effect without a restart); with
//! `metrics-tls = true`, HTTPS with the server's `tls-cert` and `tls-key`.
//! An address other hosts reach needs both (the config refuses it
//! otherwise). Every refusal is logged (docs/server.md lists the lines).

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::{MetricsAddr, ServerConfig, ServerConfigError};
use crate::metrics::Metrics;
use crate::status::{Status, STATUS_FORMAT, STATUS_VERSION};

/// The shortest token a token file may hold.
pub const MIN_TOKEN: usize = 16;

/// A running metrics endpoint; told to stop when dropped (not waited
/// for: a scraper holding its connection open must not hold up the
/// server's exit). Its Unix socket, if any, is removed then.
pub struct MetricsServer {
    /// Where it serves: `http://ADDR`, `https://ADDR` or `unix:PATH`.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    socket: Option<PathBuf>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What the handlers share.
struct App {
    metrics: Arc<Metrics>,
    token_file: Option<PathBuf>,
}

/// The token in `path`: one line of at least [`MIN_TOKEN`] printable
/// ASCII characters without spaces, in a file other users cannot read.
pub fn read_token(path: &Path) -> std::io::Result<String> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let meta = std::fs::metadata(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot read the metrics token file {}: {e}", path.display()),
        )
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o004 != 0 {
        return Err(bad(format!(
            "the metrics token file {} is readable by every user (mode {:04o}): chmod o-r it",
            path.display(),
            mode & 0o7777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot read the metrics token file {}: {e}", path.display()),
        )
    })?;
    let token = text.trim();
    if token.len() < MIN_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "the metrics token file {} must hold one token of at least {MIN_TOKEN} printable characters without spaces (openssl rand -hex 32 makes one)",
            path.display()
        )));
    }
    Ok(token.to_string())
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `None` if the request may be answered, else the refusal.
fn refusal(app: &App, headers: &HeaderMap) -> Option<Response> {
    let path = app.token_file.as_ref()?;
    let want = match read_token(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "metrics: refused a request: the token file cannot be used");
            return Some(
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the server's metrics token file cannot be used (see its log)\n",
                )
                    .into_response(),
            );
        }
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if same(g.trim().as_bytes(), want.as_bytes()) => None,
        Some(_) => {
            tracing::warn!("metrics: refused a request with a wrong token");
            Some(unauthorized("the token is not the server's"))
        }
        None => {
            tracing::warn!("metrics: refused a request without a token");
            Some(unauthorized(
                "this endpoint needs Authorization: Bearer TOKEN",
            ))
        }
    }
}

fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(WWW_AUTHENTICATE, "Bearer realm=\"roamdisk-server\"")],
        format!("{why} (the server's metrics-token-file)\n"),
    )
        .into_response()
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&app, &headers) {
        return r;
    }
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.metrics.prometheus(),
    )
        .into_response()
}

async fn status(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&app, &headers) {
        return r;
    }
    axum::Json(app.metrics.status()).into_response()
}

async fn index(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = refusal(&app, &headers) {
        return r;
    }
    "roamdisk server: GET /metrics (Prometheus), GET /status.json\n".into_response()
}

fn io_err(e: impl std::fmt::Display, what: String) -> std::io::Error {
    std::io::Error::other(format!("{what}: {e}"))
}

/// Listen on a Unix socket at `path` that only the server's user and group
/// may connect to: bound under a temporary name, given mode 0660, then
/// renamed into place, so there is no moment it is open to more. A stale
/// socket at `path` is replaced; any other file there is an error.
fn bind_unix(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    let what = || format!("metrics: cannot listen on unix:{}", path.display());
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => {
            return Err(io_err(
                "something that is not a socket is there; remove it or pick another path",
                what(),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e, what())),
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| io_err(e, what()))?;
    // A socket holds no data: nothing to make durable, and a stale one at
    // `path` is meant to be replaced.
    #[allow(clippy::disallowed_methods)]
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(e, what()));
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Serve the metrics endpoint `cfg` asks for (which must have a `metrics`
/// address) until the returned value is dropped. Errors are the user's:
/// address in use, unreadable token file or certificate...
pub fn serve(cfg: &ServerConfig, metrics: Arc<Metrics>) -> std::io::Result<MetricsServer> {
    let addr = cfg
        .metrics
        .clone()
        .ok_or_else(|| std::io::Error::other("no metrics address in the config"))?;
    if let Some(t) = &cfg.metrics_token_file {
        read_token(t)?;
    }
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(self::metrics))
        .route("/status.json", get(status))
        .with_state(Arc::new(App {
            metrics,
            token_file: cfg.metrics_token_file.clone(),
        }))
        .into_make_service();
    let tls = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(cert), Some(key)) if cfg.metrics_tls => Some(
            axum_server::tls_openssl::OpenSSLConfig::from_pem_chain_file(cert, key).map_err(
                |e| {
                    io_err(
                        e,
                        format!(
                            "metrics: cannot serve HTTPS with {} and {}",
                            cert.display(),
                            key.display()
                        ),
                    )
                },
            )?,
        ),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // The listeners are registered with this runtime's reactor.
    let entered = rt.enter();
    let (url, socket, run): (
        String,
        Option<PathBuf>,
        Pin<Box<dyn Future<Output = _> + Send>>,
    ) = match addr {
        MetricsAddr::Tcp(a) => {
            let l = std::net::TcpListener::bind(a)
                .map_err(|e| io_err(e, format!("metrics: cannot listen on {a}")))?;
            l.set_nonblocking(true)?;
            let bound = l.local_addr()?;
            let handle = axum_server::Handle::new();
            let h = handle.clone();
            let stop = async move {
                let _ = rx.await;
                h.shutdown();
            };
            match tls {
                Some(tls) => {
                    let s = axum_server::from_tcp(l)?
                        .acceptor(axum_server::tls_openssl::OpenSSLAcceptor::new(tls))
                        .handle(handle);
                    (
                        format!("https://{bound}"),
                        None,
                        Box::pin(async move {
                            tokio::spawn(stop);
                            s.serve(app).await
                        }),
                    )
                }
                None => {
                    let s = axum_server::from_tcp(l)?.handle(handle);
                    (
                        format!("http://{bound}"),
                        None,
                        Box::pin(async move {
                            tokio::spawn(stop);
                            s.serve(app).await
                        }),
                    )
                }
            }
        }
        MetricsAddr::Unix(p) => {
            let l = bind_unix(&p)?;
            let handle = axum_server::Handle::new();
            let h = handle.clone();
            let s = axum_server::from_unix(l)?.handle(handle);
            (
                format!("unix:{}", p.display()),
                Some(p),
                Box::pin(async move {
                    tokio::spawn(async move {
                        let _ = rx.await;
                        h.shutdown();
                    });
                    s.serve(app).await
                }),
            )
        }
    };
    drop(entered);
    std::thread::Builder::new()
        .name("roamdisk-metrics".into())
        .spawn(move || {
            if let Err(e) = rt.block_on(run) {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        })?;
    Ok(MetricsServer {
        url,
        stop: Some(tx),
        socket,
    })
}

/// Why the status of a running server cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The config cannot be read.
    #[error(transparent)]
    Config(#[from] ServerConfigError),
    /// The config has no metrics endpoint to ask.
    #[error("{} has no metrics key: add metrics = \"127.0.0.1:PORT\" (or \"unix:PATH\") and restart the server", .0.display())]
    NoMetrics(PathBuf),
    /// Nothing listens at the metrics address.
    #[error("nothing answers at {0} (the config's metrics address): is the server running?")]
    NotRunning(String),
    /// The token file cannot be used.
    #[error(transparent)]
    Token(std::io::Error),
    /// The endpoint refused the request (401).
    #[error("{url} refused the request: {why}")]
    Refused { url: String, why: String },
    /// The request failed.
    #[error("cannot fetch {url}: {error}")]
    Fetch { url: String, error: String },
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

/// How to reach a server's metrics endpoint, from its config.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: MetricsAddr,
    /// HTTPS, trusting this certificate (the server's own `tls-cert`).
    pub tls_cert: Option<PathBuf>,
    /// Send the token in this file.
    pub token_file: Option<PathBuf>,
}

impl Endpoint {
    /// The endpoint `cfg` serves, if any.
    pub fn of(cfg: &ServerConfig) -> Option<Endpoint> {
        Some(Endpoint {
            addr: cfg.metrics.clone()?,
            tls_cert: cfg.tls_cert.clone().filter(|_| cfg.metrics_tls),
            token_file: cfg.metrics_token_file.clone(),
        })
    }

    /// The URL of `path` there, for messages.
    pub fn url(&self, path: &str) -> String {
        match (&self.addr, &self.tls_cert) {
            (MetricsAddr::Tcp(a), None) => format!("http://{a}{path}"),
            (MetricsAddr::Tcp(a), Some(_)) => format!("https://{a}{path}"),
            (MetricsAddr::Unix(p), _) => format!("unix:{}:{path}", p.display()),
        }
    }
}

/// The status of the server running with the config at `path`, from its
/// metrics endpoint.
pub fn status_of(path: &Path) -> Result<Status, StatusError> {
    let cfg = ServerConfig::read(path)?;
    let ep = Endpoint::of(&cfg).ok_or_else(|| StatusError::NoMetrics(path.to_path_buf()))?;
    fetch_status(&ep)
}

/// `GET /status.json` of a running server.
pub fn fetch_status(ep: &Endpoint) -> Result<Status, StatusError> {
    let url = ep.url("/status.json");
    let token = ep
        .token_file
        .as_deref()
        .map(read_token)
        .transpose()
        .map_err(StatusError::Token)?;
    let fetch = |error: String| StatusError::Fetch {
        url: url.clone(),
        error,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fetch(e.to_string()))?;
    let got = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            get_from(ep, "/status.json", token.as_deref()),
        )
        .await
    });
    let (code, body) = match got {
        Err(_) => return Err(fetch("no answer within 10 s".into())),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(StatusError::NotRunning(ep.addr.to_string()))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StatusError::NotRunning(ep.addr.to_string()))
        }
        Ok(Err(e)) => return Err(fetch(e.to_string())),
        Ok(Ok(r)) => r,
    };
    if code == StatusCode::UNAUTHORIZED {
        let why = match &ep.token_file {
            None => "it needs a token; give metrics-token-file in the config".to_string(),
            Some(f) => format!(
                "the token in {} is not the server's (was the file changed?)",
                f.display()
            ),
        };
        return Err(StatusError::Refused { url, why });
    }
    if !code.is_success() {
        return Err(fetch(format!(
            "HTTP {code}: {}",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    let st: Status = serde_json::from_slice(&body).map_err(|error| StatusError::NotStatus {
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

/// One GET of `path` at `ep`: the status code and the body.
async fn get_from(
    ep: &Endpoint,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(StatusCode, Bytes)> {
    match (&ep.addr, &ep.tls_cert) {
        (MetricsAddr::Unix(p), _) => {
            let s = tokio::net::UnixStream::connect(p).await?;
            request(s, "localhost", path, token).await
        }
        (MetricsAddr::Tcp(a), None) => {
            let s = tokio::net::TcpStream::connect(a).await?;
            request(s, &a.to_string(), path, token).await
        }
        (MetricsAddr::Tcp(a), Some(cert)) => {
            let s = tokio::net::TcpStream::connect(a).await?;
            let ssl = pinned(cert).map_err(|e| io_err(e, format!("TLS to {a}")))?;
            let mut s = tokio_openssl::SslStream::new(ssl, s).map_err(std::io::Error::other)?;
            Pin::new(&mut s)
                .connect()
                .await
                .map_err(|e| io_err(e, format!("TLS to {a} (trusting {})", cert.display())))?;
            request(s, &a.to_string(), path, token).await
        }
    }
}

/// A TLS client session that trusts exactly the certificates in `cert`
/// (the server's own; the leaf is enough, no chain to a root needed).
fn pinned(cert: &Path) -> Result<openssl::ssl::Ssl, openssl::error::ErrorStack> {
    use openssl::ssl::{SslConnector, SslMethod};
    use openssl::x509::verify::X509VerifyFlags;
    let mut b = SslConnector::builder(SslMethod::tls_client())?;
    b.set_ca_file(cert)?;
    b.verify_param_mut()
        .set_flags(X509VerifyFlags::PARTIAL_CHAIN)?;
    b.build()
        .configure()?
        .verify_hostname(false)
        .into_ssl("localhost")
}

async fn request<S>(
    s: S,
    host: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(StatusCode, Bytes)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(s);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let mut req = hyper::Request::get(path).header(HOST, host);
    if let Some(t) = token {
        req = req.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(std::io::Error::other)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)?;
    let code = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((code, body))
}
