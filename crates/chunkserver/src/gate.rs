//! The chunk server's gate, one middleware in front of every route: it
//! authenticates the request's token against the users file (when the
//! server has one), decides from the method and path what the request
//! needs ([`need`]) and whether the user may, hands the handlers the
//! [`Caller`], and logs every refusal — its own 401/403s and the
//! handlers' 4xx answers (a chunk that does not match its name, a bad
//! request) — at warn with user, peer, method, path and reason. Every
//! request a handler answered is logged at debug (`-vv`: an access log).
//!
//! The users file is checked on every request (one `stat`): when it was
//! replaced or changed it is read again, so `roamdisk store user revoke`
//! takes effect on the next request, without a restart. [`UsersWatch::reload`]
//! (SIGHUP) forces a re-read. A file that no longer parses shuts the gate
//! (503 to everyone) until it is fixed: a broken edit never keeps a revoked
//! token working.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::users::{Need, Users};
use roamdisk_blockdev::Result;

/// Handlers' answers the gate logs as refusals (besides its own).
const REFUSALS: [StatusCode; 5] = [
    StatusCode::BAD_REQUEST,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::UNPROCESSABLE_ENTITY,
    StatusCode::PRECONDITION_REQUIRED,
    StatusCode::FORBIDDEN,
];
/// Most bytes of a refusal's message kept for the log.
const MAX_REASON: usize = 4096;
/// Most bytes of a refusal's answer the gate reads (they are one line).
const MAX_ANSWER: usize = 1 << 20;

/// What identifies a users file's version on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

struct Loaded {
    stamp: Option<Stamp>,
    users: std::result::Result<Arc<Users>, String>,
}

/// A users file, read again whenever it changes.
pub struct UsersWatch {
    path: PathBuf,
    loaded: Mutex<Loaded>,
    force: AtomicBool,
}

impl UsersWatch {
    /// Read the users file at `path` (it must parse now).
    pub fn open(path: &Path) -> Result<Arc<UsersWatch>> {
        let stamp = Stamp::of(path);
        let users = Users::load(path)?;
        if users.users.is_empty() {
            tracing::warn!(
                "the users file {} names no user: every request will be refused",
                path.display()
            );
        }
        Ok(Arc::new(UsersWatch {
            path: path.to_path_buf(),
            loaded: Mutex::new(Loaded {
                stamp,
                users: Ok(Arc::new(users)),
            }),
            force: AtomicBool::new(false),
        }))
    }

    /// Read the file again before the next request (SIGHUP).
    pub fn reload(&self) {
        self.force.store(true, Ordering::SeqCst);
    }

    /// The users as the file says now; an error if it does not parse.
    pub fn current(&self) -> std::result::Result<Arc<Users>, String> {
        let stamp = Stamp::of(&self.path);
        let mut l = self.loaded.lock();
        if self.force.swap(false, Ordering::SeqCst) || stamp != l.stamp {
            l.stamp = stamp;
            l.users = match Users::load(&self.path) {
                Ok(u) => {
                    tracing::info!(
                        "read the users file {} again: {} users",
                        self.path.display(),
                        u.users.len()
                    );
                    Ok(Arc::new(u))
                }
                Err(e) => {
                    tracing::error!(
                        "the users file cannot be used ({e}): every request is refused until it is fixed"
                    );
                    Err(format!("the store's users file is broken: {e}"))
                }
            };
        }
        l.users.clone()
    }
}

/// Who sent a request (a request extension set by the gate).
#[derive(Clone)]
pub enum Caller {
    /// A server without a users file: everyone may do everything.
    Open,
    /// An authenticated user.
    User { name: String, users: Arc<Users> },
}

impl Caller {
    /// The name logged for the caller.
    pub fn name(&self) -> &str {
        match self {
            Caller::Open => "anonymous",
            Caller::User { name, .. } => name,
        }
    }

    /// Whether the caller may read `catalog` (listing shows only those).
    pub fn may_read(&self, catalog: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::User { name, users } => users.may_read(name, catalog),
        }
    }
}

/// What a request needs, from its method and path (before any handler
/// runs). Requests the table does not know need an admin.
pub fn need<'a>(method: &Method, path: &'a str) -> Need<'a> {
    let admin = Need::Admin("make this request");
    let Some(rest) = path.strip_prefix('/') else {
        return admin;
    };
    let segs: Vec<&str> = rest.split('/').collect();
    let m = method.as_str();
    let read = matches!(m, "GET" | "HEAD");
    match (segs.as_slice(), m) {
        (["v1", "store" | "time"], _) if read => Need::User,
        (["v1", "objects", "get" | "put"], "POST") => Need::User,
        (["v1", "objects", _], "PUT") => Need::User,
        (["v1", "objects", _], _) if read => Need::User,
        (["v1", "objects", _], "DELETE") => Need::Admin("remove objects"),
        (["v1", "objects"], _) if read => Need::Admin("list objects"),
        (["v1", "have" | "sync" | "leases"], "POST") => Need::User,
        (["v1", "leases", _], "PUT" | "DELETE") => Need::User,
        (["v1", "leases"], _) if read => Need::Admin("list leases"),
        (["v1", "recover"], "POST") => Need::Admin("recover after a crashed gc"),
        (["v1", "refs"], _) if read => Need::User,
        (["v1", "refs", _, _], _) => {
            let catalog = &path["/v1/refs/".len()..];
            if read {
                Need::Read(catalog)
            } else {
                Need::Write(catalog)
            }
        }
        _ => admin,
    }
}

/// The gate's state: the users file, if the server has one.
#[derive(Clone)]
pub struct Gate {
    pub users: Option<Arc<UsersWatch>>,
}

/// A request the gate turns away.
struct Refused {
    /// The user, or "anonymous".
    who: String,
    status: StatusCode,
    /// Why, for the log (may say more than the answer).
    reason: String,
    /// What the client is told.
    answer: String,
}

impl Refused {
    fn new(who: &str, status: StatusCode, reason: String, answer: String) -> Refused {
        Refused {
            who: who.to_string(),
            status,
            reason,
            answer,
        }
    }

    fn into_response(self) -> Response {
        let mut r = (self.status, self.answer).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"roamdisk-store\""),
            );
        }
        r
    }
}

/// The caller of a request, or why it is refused.
fn admit(g: &Gate, req: &Request) -> std::result::Result<Caller, Refused> {
    let Some(watch) = &g.users else {
        return Ok(Caller::Open);
    };
    let users = watch
        .current()
        .map_err(|e| Refused::new("anonymous", StatusCode::SERVICE_UNAVAILABLE, e.clone(), e))?;
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let name = users
        .authenticate(bearer)
        .map_err(|d| Refused::new("anonymous", StatusCode::UNAUTHORIZED, d.reason, d.answer))?
        .to_string();
    users
        .authorize(&name, need(req.method(), req.uri().path()))
        .map_err(|why| Refused::new(&name, StatusCode::FORBIDDEN, why.0.clone(), why.0))?;
    Ok(Caller::User { name, users })
}

fn peer_of(req: &Request) -> String {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// One log line for a refused request.
fn log_refusal(
    who: &str,
    peer: &str,
    method: &Method,
    path: &str,
    status: StatusCode,
    reason: &str,
) {
    tracing::warn!(
        user = %who,
        peer = %peer,
        method = %method,
        path = %path,
        status = status.as_u16(),
        reason = %reason.trim(),
        "request refused"
    );
}

/// The middleware: admit or refuse, run the handler, log refusals.
pub async fn gate(State(g): State<Gate>, mut req: Request, next: Next) -> Response {
    let peer = peer_of(&req);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let caller = match admit(&g, &req) {
        Ok(c) => c,
        Err(r) => {
            log_refusal(&r.who, &peer, &method, &path, r.status, &r.reason);
            return r.into_response();
        }
    };
    let who = caller.name().to_string();
    req.extensions_mut().insert(caller);
    let resp = next.run(req).await;
    // The access log (-vv): one line per request a handler answered.
    tracing::debug!(
        user = %who,
        method = %method,
        path = %path,
        status = resp.status().as_u16(),
        "request served"
    );
    if !REFUSALS.contains(&resp.status()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ANSWER)
        .await
        .unwrap_or_default();
    log_refusal(
        &who,
        &peer,
        &method,
        &path,
        parts.status,
        &String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_REASON)]),
    );
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_need() {
        let get = Method::GET;
        let id = "/v1/objects/00";
        assert_eq!(need(&get, "/v1/store"), Need::User);
        assert_eq!(need(&Method::HEAD, id), Need::User);
        assert_eq!(need(&Method::PUT, id), Need::User);
        assert_eq!(need(&Method::POST, "/v1/objects/get"), Need::User);
        assert_eq!(need(&Method::POST, "/v1/objects/put"), Need::User);
        assert!(matches!(
            need(&Method::POST, "/v1/objects/00"),
            Need::Admin(_)
        ));
        assert!(matches!(need(&Method::DELETE, id), Need::Admin(_)));
        assert!(matches!(need(&get, "/v1/objects"), Need::Admin(_)));
        assert!(matches!(need(&get, "/v1/leases"), Need::Admin(_)));
        assert_eq!(need(&Method::POST, "/v1/leases"), Need::User);
        assert_eq!(need(&Method::DELETE, "/v1/leases/ab"), Need::User);
        assert!(matches!(need(&Method::POST, "/v1/recover"), Need::Admin(_)));
        assert_eq!(need(&get, "/v1/refs"), Need::User);
        assert_eq!(need(&get, "/v1/refs/bob/vm"), Need::Read("bob/vm"));
        assert_eq!(need(&Method::PUT, "/v1/refs/bob/vm"), Need::Write("bob/vm"));
        assert_eq!(
            need(&Method::DELETE, "/v1/refs/bob/vm"),
            Need::Write("bob/vm")
        );
        assert!(matches!(need(&get, "/v1/refs/bob/../x/y"), Need::Admin(_)));
        assert!(matches!(need(&Method::POST, "/v1/nothing"), Need::Admin(_)));
        assert!(matches!(need(&get, "//v1/refs/bob/vm"), Need::Admin(_)));
        assert!(matches!(need(&get, "v1/refs/bob/vm"), Need::Admin(_)));
    }
}
