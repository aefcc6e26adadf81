//! `roamdisk store serve DIR --listen ADDR`: the HTTP chunk server. It
//! serves a local store (quota included) over the protocol in
//! `docs/formats/cas-http.md`, verifies every object it is sent against
//! its name before storing it, and refuses what does not match (422).
//! No authentication or TLS: bind it to loopback or a trusted network,
//! or put it behind a TLS proxy.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use roamdisk_blockdev::{Error, ErrorKind};

use crate::chunk::{HEADER_SIZE, MAX_OBJECT};
use crate::hash::ChunkId;
use crate::store::{ref_tag, wire, DynStore, PutOutcome};

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

async fn list_refs(State(s): State<St>) -> Response {
    match blocking(move || s.ref_list()).await {
        Ok(v) => v.join("\n").into_response(),
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
            crate::catalog::Catalog::parse(b)?;
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

/// The router of the chunk server over `store`.
pub fn router(store: DynStore) -> Router {
    let st: St = Arc::new(store);
    Router::new()
        .route("/v1/store", get(store_settings))
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
        .with_state(st)
}

/// Serve `store` on `addr` until `stop` completes. `on_ready` gets the
/// bound address (port 0 picks one).
pub async fn serve(
    store: DynStore,
    addr: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_ready(listener.local_addr()?);
    axum::serve(listener, router(store))
        .with_graceful_shutdown(stop)
        .await
}
