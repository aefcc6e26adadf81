//! `roamdisk store serve DIR --listen ADDR`: the HTTP chunk server. It
//! serves a local store (quota included) over the protocol in
//! `docs/formats/cas-http.md`, verifies every object it is sent against
//! its name before storing it, and refuses what does not match (422).
//!
//! Over a network it speaks TLS ([`tls`], rustls) and lets in only the
//! users of a users file ([`users`]), each with a token, reading and
//! writing their own catalogs and those shared with them; the [`gate`]
//! decides every request before a handler runs and logs every refusal.
//! Without a users file the server is open to whoever reaches it, so it
//! refuses to listen on anything but loopback unless told `insecure`.
//! Manual: `docs/store-server.md`.

pub mod gate;
pub mod run;
pub mod tls;
pub mod users;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use roamdisk_blockdev::{Error, ErrorKind, Op};

use gate::{Caller, Gate, UsersWatch};
use roamdisk_chunkstore::chunk::{HEADER_SIZE, MAX_OBJECT};
use roamdisk_chunkstore::error::{bad_arg, err};
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::store::{ref_tag, wire, DynStore, PutOutcome};
use tls::TlsFiles;

type St = Arc<DynStore>;

fn status_of(e: &Error) -> StatusCode {
    match e.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Corrupt => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn fail(e: Error) -> Response {
    (status_of(&e), e.to_string()).into_response()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> roamdisk_blockdev::Result<T> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(fail(e)),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()),
    }
}

fn parse_id(hex: &str) -> Result<ChunkId, (StatusCode, String)> {
    ChunkId::from_hex(hex).ok_or_else(|| {
        (
            StatusCode::BAD_REQUEST,
            format!("'{hex}' is not an object name"),
        )
    })
}

async fn store_settings(State(s): State<St>) -> Response {
    s.config().to_toml().into_response()
}

async fn time(State(s): State<St>) -> Response {
    match blocking(move || s.now()).await {
        Ok(t) => wire::nanos(t).to_string().into_response(),
        Err(r) => r,
    }
}

async fn get_object(State(s): State<St>, Path(hex): Path<String>) -> Response {
    let id = match parse_id(&hex) {
        Ok(i) => i,
        Err(r) => return r.into_response(),
    };
    match blocking(move || s.get(&id)).await {
        Ok(b) => b.into_response(),
        Err(r) => r,
    }
}

async fn put_object(State(s): State<St>, Path(hex): Path<String>, body: Bytes) -> Response {
    let id = match parse_id(&hex) {
        Ok(i) => i,
        Err(r) => return r.into_response(),
    };
    let r = blocking(move || {
        s.config().codec().verify(&id, &body)?;
        s.put_many(&[(id, &body)])
    })
    .await;
    match r {
        Ok(o) if o[0] == PutOutcome::Stored => StatusCode::CREATED.into_response(),
        Ok(_) => StatusCode::OK.into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/objects/get`: many objects in one answer, read as one batch
/// (a throttled store charges one latency and every byte), at most
/// `wire::MAX_GET_BYTES` of them; what does not fit or cannot be read is
/// "not sent" and the client asks again.
async fn get_objects(State(s): State<St>, body: Bytes) -> Response {
    let r = blocking(move || {
        let ids = wire::parse_get_request(&body)?;
        let got: Vec<wire::Got> = s
            .get_many_within(&ids, wire::MAX_GET_BYTES)
            .into_iter()
            .zip(&ids)
            .map(|(r, id)| match r {
                Some(Ok(b)) => wire::Got::Found(b),
                Some(Err(e)) if e.kind() == ErrorKind::NotFound => wire::Got::Missing,
                Some(Err(e)) => {
                    tracing::warn!("batch get: object {id} not sent: {e}");
                    wire::Got::NotSent
                }
                None => wire::Got::NotSent,
            })
            .collect();
        let count = |f: fn(&wire::Got) -> bool| got.iter().filter(|g| f(g)).count();
        tracing::debug!(
            asked = ids.len(),
            found = count(|g| matches!(g, wire::Got::Found(_))),
            missing = count(|g| matches!(g, wire::Got::Missing)),
            not_sent = count(|g| matches!(g, wire::Got::NotSent)),
            "batch get"
        );
        Ok(wire::encode_get_answer(&got))
    })
    .await;
    match r {
        Ok(b) => b.into_response(),
        Err(r) => r,
    }
}

/// `POST /v1/objects/put`: many objects in one request, each verified
/// against its name (422 names the first that is not), stored with one
/// `put_many` (an object store behind the server writes them as one
/// pack), one status per object in the answer.
async fn put_objects(State(s): State<St>, body: Bytes) -> Response {
    let r = blocking(move || {
        let items = wire::parse_put_request(&body)?;
        let codec = s.config().codec();
        for (id, b) in &items {
            codec.verify(id, b)?;
        }
        let out = s.put_many(&items)?;
        tracing::debug!(
            objects = items.len(),
            bytes = items.iter().map(|(_, b)| b.len()).sum::<usize>(),
            stored = out.iter().filter(|o| **o == PutOutcome::Stored).count(),
            "batch put"
        );
        Ok(wire::encode_put_answer(&out))
    })
    .await;
    match r {
        Ok(b) => b.into_response(),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct OlderThan {
    #[serde(rename = "older-than")]
    older_than: u64,
}

async fn delete_object(
    State(s): State<St>,
    Path(hex): Path<String>,
    Query(q): Query<OlderThan>,
) -> Response {
    let id = match parse_id(&hex) {
        Ok(i) => i,
        Err(r) => return r.into_response(),
    };
    match blocking(move || s.remove_if_older(&id, wire::from_nanos(q.older_than))).await {
        Ok(Some(n)) => n.to_string().into_response(),
        Ok(None) => (StatusCode::CONFLICT, "kept: recently referenced or absent").into_response(),
        Err(r) => r,
    }
}

async fn list_objects(State(s): State<St>) -> Response {
    match blocking(move || {
        let mut out = wire::encode_list_header();
        s.list_objects(&mut |e| wire::encode_list_entry(&mut out, &e))?;
        Ok(out)
    })
    .await
    {
        Ok(b) => b.into_response(),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct Touch {
    touch: Option<u8>,
}

async fn have(State(s): State<St>, Query(q): Query<Touch>, body: Bytes) -> Response {
    match blocking(move || {
        let ids = wire::parse_have_request(&body)?;
        let have = s.has_many(&ids, q.touch == Some(1))?;
        Ok(wire::encode_have_answer(&have))
    })
    .await
    {
        Ok(b) => b.into_response(),
        Err(r) => r,
    }
}

async fn sync(State(s): State<St>) -> Response {
    match blocking(move || s.sync()).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(r) => r,
    }
}

async fn list_refs(State(s): State<St>, Extension(caller): Extension<Caller>) -> Response {
    match blocking(move || s.ref_list()).await {
        Ok(v) => v
            .into_iter()
            .filter(|name| caller.may_read(name))
            .collect::<Vec<_>>()
            .join("\n")
            .into_response(),
        Err(r) => r,
    }
}

async fn get_ref(State(s): State<St>, Path((user, image)): Path<(String, String)>) -> Response {
    let name = format!("{user}/{image}");
    match blocking(move || s.ref_get(&name)).await {
        Ok(Some(b)) => {
            let tag = format!("\"{}\"", ref_tag(&b));
            ([("etag", tag)], b).into_response()
        }
        Ok(None) => (StatusCode::NOT_FOUND, "no such catalog").into_response(),
        Err(r) => r,
    }
}

fn expected_tag(h: &HeaderMap) -> Result<Option<ChunkId>, (StatusCode, &'static str)> {
    if let Some(v) = h.get("if-match").and_then(|v| v.to_str().ok()) {
        return ChunkId::from_hex(v.trim().trim_matches('"'))
            .map(Some)
            .ok_or((StatusCode::BAD_REQUEST, "bad If-Match"));
    }
    if h.get("if-none-match").and_then(|v| v.to_str().ok()) == Some("*") {
        return Ok(None);
    }
    Err((
        StatusCode::PRECONDITION_REQUIRED,
        "a ref update needs If-Match or If-None-Match: *",
    ))
}

async fn put_ref(
    State(s): State<St>,
    Path((user, image)): Path<(String, String)>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    update_ref(s, format!("{user}/{image}"), &h, Some(body)).await
}

async fn delete_ref(
    State(s): State<St>,
    Path((user, image)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    update_ref(s, format!("{user}/{image}"), &h, None).await
}

/// Replace (a valid catalog) or remove the ref `name`, if it still has the
/// tag the request's If-Match / If-None-Match names.
async fn update_ref(s: St, name: String, h: &HeaderMap, body: Option<Bytes>) -> Response {
    let exp = match expected_tag(h) {
        Ok(e) => e,
        Err(r) => return r.into_response(),
    };
    match blocking(move || {
        if let Some(b) = &body {
            roamdisk_chunkstore::catalog::Catalog::parse(b)?;
        }
        s.ref_update(&name, exp, body.as_deref())
    })
    .await
    {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => (
            StatusCode::PRECONDITION_FAILED,
            "the catalog changed; re-read it",
        )
            .into_response(),
        Err(r) => r,
    }
}

async fn begin_lease(State(s): State<St>) -> Response {
    match blocking(move || s.lease_begin()).await {
        Ok(l) => format!("{} {}", l.id, wire::nanos(l.started)).into_response(),
        Err(r) => r,
    }
}

fn lease_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

async fn refresh_lease(State(s): State<St>, Path(id): Path<String>) -> Response {
    on_lease(s, id, |s, id| s.lease_refresh(id)).await
}

async fn end_lease(State(s): State<St>, Path(id): Path<String>) -> Response {
    on_lease(s, id, |s, id| s.lease_end(id)).await
}

/// Run `op` on lease `id` once the id is checked: 200 when it succeeds.
async fn on_lease(
    s: St,
    id: String,
    op: fn(&DynStore, &str) -> roamdisk_blockdev::Result<()>,
) -> Response {
    if !lease_id_ok(&id) {
        return (StatusCode::BAD_REQUEST, "bad lease id").into_response();
    }
    match blocking(move || op(&s, &id)).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(r) => r,
    }
}

async fn list_leases(State(s): State<St>) -> Response {
    match blocking(move || s.leases()).await {
        Ok(v) => v
            .iter()
            .map(|l| {
                format!(
                    "{} {} {}",
                    l.id,
                    wire::nanos(l.started),
                    wire::nanos(l.refreshed)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
            .into_response(),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct Cutoff {
    cutoff: u64,
}

async fn recover(State(s): State<St>, Query(q): Query<Cutoff>) -> Response {
    match blocking(move || s.recover(wire::from_nanos(q.cutoff))).await {
        Ok((a, b)) => format!("{a} {b}").into_response(),
        Err(r) => r,
    }
}

/// The router of the chunk server over `store`, behind `gate`; without
/// `batch` it answers `POST /v1/objects/get` and `POST /v1/objects/put`
/// as a server from before those requests did (405), so clients' fallback
/// can be tested.
pub fn router(store: DynStore, gate: Gate, batch: bool) -> Router {
    let st: St = Arc::new(store);
    let r = Router::new();
    let r = if batch {
        r.route("/v1/objects/get", post(get_objects))
            .route("/v1/objects/put", post(put_objects))
    } else {
        r
    };
    r.route("/v1/store", get(store_settings))
        .route("/v1/time", get(time))
        .route("/v1/objects", get(list_objects))
        .route(
            "/v1/objects/{hex}",
            get(get_object).put(put_object).delete(delete_object),
        )
        .route("/v1/have", post(have))
        .route("/v1/sync", post(sync))
        .route("/v1/refs", get(list_refs))
        .route(
            "/v1/refs/{user}/{image}",
            get(get_ref).put(put_ref).delete(delete_ref),
        )
        .route("/v1/leases", post(begin_lease).get(list_leases))
        .route("/v1/leases/{id}", put(refresh_lease).delete(end_lease))
        .route("/v1/recover", post(recover))
        .layer(DefaultBodyLimit::max(MAX_OBJECT + HEADER_SIZE))
        .layer(axum::middleware::from_fn_with_state(gate, gate::gate))
        .with_state(st)
}

/// How the chunk server listens and whom it lets in.
#[derive(Clone)]
pub struct ServerOptions {
    /// Address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// Speak TLS with this certificate and key.
    pub tls: Option<TlsFiles>,
    /// Let in only these users (each with a token).
    pub users: Option<Arc<UsersWatch>>,
    /// Serve without TLS, or without users, on a non-loopback address.
    pub insecure: bool,
    /// Answer batch gets and puts (`POST /v1/objects/get`, `.../put`); off
    /// only to stand in for an older server.
    pub batch: bool,
}

impl ServerOptions {
    /// Plain HTTP, open, on `listen`.
    pub fn new(listen: SocketAddr) -> ServerOptions {
        ServerOptions {
            listen,
            tls: None,
            users: None,
            insecure: false,
            batch: true,
        }
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Refuse to put a store on a network without users and TLS, unless
    /// `insecure` says the network is trusted.
    pub fn check(&self) -> roamdisk_blockdev::Result<()> {
        if self.listen.ip().is_loopback() {
            return Ok(());
        }
        let what = match (&self.users, &self.tls) {
            (None, _) => "without authentication: anyone who reaches it could read chunks and rewrite catalogs. Give --users FILE and --tls-cert/--tls-key (see docs/store-server.md)",
            (Some(_), None) => "without TLS: tokens and chunks would cross the network in clear. Give --tls-cert and --tls-key",
            (Some(_), Some(_)) => return Ok(()),
        };
        if self.insecure {
            tracing::warn!(addr = %self.listen, "serving a chunk store {}", what.split(':').next().unwrap_or(what));
            return Ok(());
        }
        Err(bad_arg(format!(
            "refusing to serve on {} {what}, listen on a loopback address, or pass --insecure on a network you trust",
            self.listen
        )))
    }
}

fn io_err(what: String, e: std::io::Error) -> Error {
    err(ErrorKind::Io, Op::Open, format!("{what}: {e}"))
}

/// Serve `store` as `opts` say until `stop` completes. `on_ready` gets the
/// bound address (port 0 picks one).
pub async fn serve(
    store: DynStore,
    opts: &ServerOptions,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> roamdisk_blockdev::Result<()> {
    opts.check()?;
    let tls = opts.tls.as_ref().map(tls::server_config).transpose()?;
    let listener = std::net::TcpListener::bind(opts.listen)
        .map_err(|e| io_err(format!("cannot listen on {}", opts.listen), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| io_err("no local address".into(), e))?;
    let app = router(
        store,
        Gate {
            users: opts.users.clone(),
        },
        opts.batch,
    )
    .into_make_service_with_connect_info::<SocketAddr>();
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        stop.await;
        h.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    on_ready(addr);
    let served = match tls {
        Some(cfg) => {
            let cfg = axum_server::tls_rustls::RustlsConfig::from_config(cfg);
            axum_server::from_tcp_rustls(listener, cfg)
                .map_err(|e| io_err("cannot serve".into(), e))?
                .handle(handle)
                .accept_error_handler(|peer, e| {
                    tracing::info!("TLS handshake with {peer:?} failed: {e}");
                })
                .serve(app)
                .await
        }
        None => {
            axum_server::from_tcp(listener)
                .map_err(|e| io_err("cannot serve".into(), e))?
                .handle(handle)
                .serve(app)
                .await
        }
    };
    served.map_err(|e| io_err(format!("serving on {addr} failed"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_address_needs_users_and_tls_or_insecure() {
        let (_t, path) = roamdisk_blockdev::testkit::scratch("users.toml");
        users::edit(&path, true, |_| Ok(())).unwrap();
        let watch = UsersWatch::open(&path).unwrap();
        let tls = TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
        };
        let mut o = ServerOptions::new("127.0.0.1:0".parse().unwrap());
        o.check().unwrap();
        o.listen = "0.0.0.0:8700".parse().unwrap();
        let e = o.check().unwrap_err().to_string();
        assert!(
            e.contains("without authentication") && e.contains("--insecure"),
            "{e}"
        );
        o.users = Some(watch);
        assert!(o.check().unwrap_err().to_string().contains("without TLS"));
        o.tls = Some(tls);
        o.check().unwrap();
        o.users = None;
        assert!(o.check().is_err(), "TLS without users is still open");
        o.insecure = true;
        o.check().unwrap();
    }
}
