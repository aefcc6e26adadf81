//! The client of an HTTP chunk server (`roamdisk store serve`): GET, HEAD
//! and PUT of objects by name, batch gets and batch puts (many objects in
//! one request; object by object from a server that does not know them), a batch
//! "which of these do you have", refs with compare-and-swap (ETag /
//! If-Match), leases and gc operations. Requests run in parallel on a
//! pool of `parallel` connections; transport errors and 5xx answers are
//! retried with exponential backoff and jitter. For a session (a store
//! opened with `known_config`: its caches can serve it offline) a server
//! that cannot be reached at all (nothing listening, no route) gets one
//! quick second try; then the store counts as down: requests fail at once
//! with an error that says what to do, and one request a second tries
//! again, so fetching resumes by itself when the server is back. Others
//! (commit, checkout, gc) ride out a server restart on the retries.
//! `https://` stores are checked against the system's roots or a CA file;
//! a token file makes every request carry `Authorization: Bearer`.
//! Protocol: `docs/formats/cas-http.md`; manual: `docs/store-server.md`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rayon::prelude::*;
use roamdisk_blockdev::{ErrorKind, Op, Result};
use ureq::tls::{PemItem, RootCerts, TlsConfig, TlsProvider};

use super::api::OpenOptions;
use super::api::{
    check_ref_name, ChunkPrune, ChunkRead, ChunkWrite, Freed, Lease, LeaseStore, ObjectEntry,
    ObjectParts, PutOutcome, RefStore, StoreLayer,
};
use super::config::StoreConfig;
use super::wire;
use crate::chunk::{HEADER_SIZE, MAX_OBJECT};
use crate::error::{bad_arg, context, corrupt, err, io, not_found};
use crate::hash::ChunkId;
use crate::token::Token;

/// Attempts per request (the first plus retries).
const ATTEMPTS: u32 = 6;
/// First retry delay; doubles each time.
const BACKOFF: Duration = Duration::from_millis(100);
/// Attempts when the server cannot be reached at all: then it is down.
const CONNECT_ATTEMPTS: u32 = 2;
/// While the store is down, one request this often tries the server
/// again; the others fail at once.
const DOWN_PROBE: Duration = Duration::from_secs(1);
/// Ids per have request.
const HAVE_BATCH: usize = 16384;
/// Fewest ids per batch get request when a list is split over several
/// (a shorter list goes in one request).
const GET_BATCH_MIN: usize = 16;
pub use super::api::Credentials;

/// A chunk store behind `roamdisk store serve`.
pub struct HttpStore {
    base: String,
    agent: ureq::Agent,
    config: StoreConfig,
    pool: rayon::ThreadPool,
    token: Option<Token>,
    /// The server answers batch gets (until it says it does not know them).
    batch_get: AtomicBool,
    /// The server takes batch puts (until it says it does not know them).
    batch_put: AtomicBool,
    /// Whether an unreachable server makes the store down at once (a
    /// session, which can work from its caches).
    offline_ok: bool,
    /// Set while the server cannot be reached.
    down: parking_lot::Mutex<Option<Down>>,
}

/// A store found unreachable.
struct Down {
    since: Instant,
    /// When a request last tried the server.
    tried: Instant,
    why: String,
}

/// Whether `e` says the server cannot be reached at all (as opposed to a
/// server that answered badly or slowly).
fn unreachable(e: &ureq::Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => matches!(
            io.kind(),
            K::ConnectionRefused
                | K::NotConnected
                | K::AddrNotAvailable
                | K::HostUnreachable
                | K::NetworkUnreachable
        ),
        _ => false,
    }
}

/// An answer: status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
    /// What the request did: read (GET, HEAD) or write (the rest), for
    /// the error's label.
    op: Op,
}

/// The operation an HTTP method performs on the store.
fn op_of(method: &str) -> Op {
    match method {
        "GET" | "HEAD" => Op::Read,
        _ => Op::Write,
    }
}

fn kind_of(status: u16) -> ErrorKind {
    match status {
        404 => ErrorKind::NotFound,
        422 => ErrorKind::Corrupt,
        507 => ErrorKind::NoSpace,
        400 => ErrorKind::InvalidArgument,
        401 | 403 => ErrorKind::PermissionDenied,
        _ => ErrorKind::Io,
    }
}

fn jitter() -> u64 {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (n as u64 * 2654435761) % 50
}

/// TLS settings: the certificates of `ca` as the only roots, else the
/// system's.
fn tls_config(ca: Option<&Path>) -> Result<TlsConfig> {
    let roots = match ca {
        None => RootCerts::PlatformVerifier,
        Some(p) => {
            let pem =
                std::fs::read(p).map_err(|e| io(Op::Open, e, p).msg("cannot read the CA file"))?;
            let mut certs = Vec::new();
            for item in ureq::tls::parse_pem(&pem) {
                match item {
                    Ok(PemItem::Certificate(c)) => certs.push(c),
                    Ok(_) => {}
                    Err(e) => {
                        return Err(bad_arg(format!("the CA file {}: {e}", p.display())).path(p))
                    }
                }
            }
            if certs.is_empty() {
                return Err(bad_arg(format!(
                    "the CA file {} holds no PEM certificate",
                    p.display()
                )));
            }
            RootCerts::from(certs)
        }
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(roots)
        .build())
}

/// Whether a transport error is TLS refusing the server (a certificate
/// not trusted, a failed handshake) rather than the network failing.
fn tls_refusal(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Rustls(_) | ureq::Error::Tls(_) => true,
        ureq::Error::Io(io) => io.get_ref().is_some_and(|i| i.is::<rustls::Error>()),
        _ => false,
    }
}

/// `q` with `headers` added.
fn headed<B>(mut q: ureq::RequestBuilder<B>, headers: &[(&str, &str)]) -> ureq::RequestBuilder<B> {
    for (k, v) in headers {
        q = q.header(*k, *v);
    }
    q
}

impl HttpStore {
    /// Connect to `url` (e.g. `https://store.example:8700`) with
    /// `opts.credentials` (and the environment's) and read the store's
    /// settings. If the server does not answer and `opts.known_config`
    /// (its settings as last seen) is given, the store opens anyway: every
    /// request then fails, and readers are served by their caches.
    pub fn connect(url: &str, opts: &OpenOptions) -> Result<HttpStore> {
        let creds = opts.credentials.clone();
        let token = creds
            .token_file
            .as_deref()
            .map(Token::read_file)
            .transpose()?;
        let tls = tls_config(creds.ca_file.as_deref())?;
        let parallel = opts.parallel.unwrap_or(8).clamp(1, 256);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(300)))
            .max_idle_connections(parallel * 2)
            .max_idle_connections_per_host(parallel * 2)
            .build()
            .into();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(parallel)
            .thread_name(|i| format!("cas-http-{i}"))
            .build()
            .map_err(|e| {
                err(
                    ErrorKind::Io,
                    Op::Open,
                    format!("cannot start request threads: {e}"),
                )
            })?;
        let mut s = HttpStore {
            base: url.trim_end_matches('/').to_string(),
            agent,
            config: StoreConfig::default(),
            pool,
            token,
            batch_get: AtomicBool::new(true),
            batch_put: AtomicBool::new(true),
            offline_ok: opts.known_config.is_some(),
            down: parking_lot::Mutex::new(None),
        };
        let a = match (s.call("GET", "/v1/store", None, &[]), &opts.known_config) {
            (Ok(a), _) => a,
            (Err(e), Some(c)) if e.kind() == ErrorKind::Io => {
                tracing::warn!("{e}; working offline: only chunks in the caches and on lookaside media can be read");
                s.config = c.clone();
                return Ok(s);
            }
            (Err(e), _) => return Err(e),
        };
        s.expect(&a, &[200], "read the store settings")?;
        let text =
            String::from_utf8(a.body).map_err(|_| corrupt("store settings are not UTF-8"))?;
        s.config = StoreConfig::parse(&text)?;
        Ok(s)
    }

    /// One request with retries. `headers` are extra request headers.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, String)],
    ) -> Result<Answer> {
        let url = format!("{}{}", self.base, path);
        let bearer = self
            .token
            .as_ref()
            .map(|t| format!("Bearer {}", t.as_str()));
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(bearer.as_deref().map(|b| ("authorization", b)))
            .collect();
        // Known down: fail at once, but let one request a second try.
        let probing = {
            let mut d = self.down.lock();
            match d.as_mut() {
                Some(d) if d.tried.elapsed() < DOWN_PROBE => {
                    return Err(self.down_error(d, method, path));
                }
                Some(d) => {
                    d.tried = Instant::now();
                    true
                }
                None => false,
            }
        };
        let mut last = String::new();
        let mut cannot_reach = 0;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                let d = BACKOFF * (1 << (attempt - 1)) + Duration::from_millis(jitter());
                std::thread::sleep(d);
            }
            let r = match method {
                "GET" => headed(self.agent.get(&url), &headers).call(),
                "HEAD" => headed(self.agent.head(&url), &headers).call(),
                "DELETE" => headed(self.agent.delete(&url), &headers).call(),
                "PUT" => headed(self.agent.put(&url), &headers).send(body.unwrap_or(&[])),
                _ => headed(self.agent.post(&url), &headers).send(body.unwrap_or(&[])),
            };
            match r {
                Ok(mut resp) => {
                    let status = resp.status().as_u16();
                    let body = match resp
                        .body_mut()
                        .with_config()
                        .limit((MAX_OBJECT + HEADER_SIZE) as u64)
                        .read_to_vec()
                    {
                        Ok(b) => b,
                        Err(e) => {
                            last = format!("reading the answer failed: {e}");
                            continue;
                        }
                    };
                    self.up();
                    if matches!(status, 500 | 502 | 503 | 504) {
                        last = format!("HTTP {status}: {}", String::from_utf8_lossy(&body));
                        continue;
                    }
                    return Ok(Answer {
                        status,
                        body,
                        op: op_of(method),
                    });
                }
                // A certificate the client does not trust is not a network
                // hiccup: no retry, and say what to do.
                Err(e) if tls_refusal(&e) => {
                    let todo = if e.to_string().contains("CaUsedAsEndEntity") {
                        "the server's certificate is a CA certificate serving as its own: rustls refuses that; sign a server certificate with a CA and give the CA with --ca FILE (docs/store-server.md)"
                    } else {
                        "if its certificate is signed by a private CA, give that CA's certificate with --ca FILE (or $ROAMDISK_STORE_CA)"
                    };
                    return Err(err(
                        ErrorKind::Io,
                        Op::Open,
                        format!(
                            "no TLS connection to chunk server {}: {e}; {todo}",
                            self.base
                        ),
                    ));
                }
                Err(e) if unreachable(&e) => {
                    last = e.to_string();
                    cannot_reach += 1;
                    if self.offline_ok && (probing || cannot_reach >= CONNECT_ATTEMPTS) {
                        return Err(self.went_down(last, method, path));
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(err(
            ErrorKind::Io,
            op_of(method),
            format!(
                "chunk server {} did not answer {method} {path} after {ATTEMPTS} attempts: {last}",
                self.base
            ),
        ))
    }

    /// The server answered: if it was down, it is back.
    fn up(&self) {
        if let Some(d) = self.down.lock().take() {
            tracing::info!(
                "chunk server {} answers again (unreachable for {:.1} s)",
                self.base,
                d.since.elapsed().as_secs_f64()
            );
        }
    }

    /// The server cannot be reached: mark the store down (saying so once)
    /// and the error of this request.
    fn went_down(&self, why: String, method: &str, path: &str) -> roamdisk_blockdev::Error {
        let mut d = self.down.lock();
        let now = Instant::now();
        let d = d.get_or_insert_with(|| {
            tracing::warn!(
                "chunk server {} cannot be reached ({why}): working offline; only chunks on this host or on lookaside media can be read, and the store is tried again each second",
                self.base
            );
            Down {
                since: now,
                tried: now,
                why: why.clone(),
            }
        });
        d.tried = now;
        d.why = why;
        self.down_error(d, method, path)
    }

    fn down_error(&self, d: &Down, method: &str, path: &str) -> roamdisk_blockdev::Error {
        err(
            ErrorKind::Io,
            op_of(method),
            format!(
                "chunk server {} cannot be reached ({}, for {:.0} s), so {method} {path} failed: only chunks on this host or on lookaside media can be read until it is back; start `roamdisk store serve` or restore the network (fetching resumes by itself), or hoard what you need offline beforehand with `roamdisk hoard`",
                self.base,
                d.why,
                d.since.elapsed().as_secs_f64()
            ),
        )
    }

    fn expect(&self, a: &Answer, ok: &[u16], what: &str) -> Result<()> {
        if ok.contains(&a.status) {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&a.body);
        let msg = match (a.status, &self.token) {
            (401, Some(t)) => format!(
                "the store {} refused the token for {}: check --token-file (or $ROAMDISK_STORE_TOKEN_FILE); it says: {}",
                self.base,
                t.user(),
                said.trim()
            ),
            (401, None) => format!(
                "the store {} needs a token: give --token-file FILE (or set $ROAMDISK_STORE_TOKEN_FILE); its admin makes one with `roamdisk store user add`",
                self.base
            ),
            (status, _) => format!(
                "chunk server {} could not {what} (HTTP {status}): {}",
                self.base,
                said.trim()
            ),
        };
        Err(err(kind_of(a.status), a.op, msg))
    }

    fn text(a: &Answer) -> String {
        String::from_utf8_lossy(&a.body).trim().to_string()
    }

    /// Objects by name, one GET each, in parallel.
    fn get_each(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        self.pool
            .install(|| ids.par_iter().map(|id| self.get(id)).collect())
    }

    /// One batch get of at most `wire::MAX_GET` ids: what the answer did
    /// not send is asked for again while answers make progress, then
    /// alone (a GET of one object says why it cannot be had).
    fn get_batch(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        let mut out: Vec<Option<Result<Vec<u8>>>> = ids.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..ids.len()).collect();
        while !todo.is_empty() {
            let ask: Vec<ChunkId> = todo.iter().map(|&k| ids[k]).collect();
            let got = match self.post_get(&ask) {
                Ok(Some(got)) => got,
                // A server without batch gets: object by object, below.
                Ok(None) => break,
                Err(e) => {
                    for &k in &todo {
                        out[k] = Some(Err(err(e.kind(), Op::Read, e.message())));
                    }
                    todo.clear();
                    break;
                }
            };
            let mut again = Vec::new();
            for (&k, g) in todo.iter().zip(got) {
                out[k] = match g {
                    wire::Got::Found(b) => Some(Ok(b)),
                    wire::Got::Missing => Some(Err(not_found(format!(
                        "chunk server {} does not hold object {}",
                        self.base, ids[k]
                    )))),
                    wire::Got::NotSent => {
                        again.push(k);
                        None
                    }
                };
            }
            if again.len() == todo.len() {
                break;
            }
            todo = again;
        }
        let rest: Vec<ChunkId> = todo.iter().map(|&k| ids[k]).collect();
        for (&k, r) in todo.iter().zip(self.get_each(&rest)) {
            out[k] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every object answered"))
            .collect()
    }

    /// Objects by name, one PUT each, in parallel.
    fn put_each(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        self.pool.install(|| {
            items
                .par_iter()
                .map(|(id, bytes)| {
                    let a = self.call("PUT", &format!("/v1/objects/{id}"), Some(bytes), &[])?;
                    self.expect(&a, &[200, 201], &format!("store object {id}"))?;
                    Ok(if a.status == 201 {
                        PutOutcome::Stored
                    } else {
                        PutOutcome::Existed
                    })
                })
                .collect()
        })
    }

    /// One batch put (`POST /v1/objects/put`) of at most `wire::MAX_PUT`
    /// objects and `wire::MAX_PUT_BYTES`, no id twice; object by object
    /// when the server does not know the request (as for batch gets: 403,
    /// 404, 405 or 501) or the object is too large for one.
    fn put_batch(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        let bytes: u64 = items
            .iter()
            .map(|(_, [a, b])| (a.len() + b.len()) as u64)
            .sum();
        if bytes > wire::MAX_PUT_BYTES || !self.batch_put.load(Ordering::Relaxed) {
            return self.put_each_parts(items);
        }
        let body = wire::encode_put_request_parts(items);
        let Some(a) = self.post_batch(
            "/v1/objects/put",
            &body,
            &self.batch_put,
            "take batch puts",
            "storing",
        )?
        else {
            return self.put_each_parts(items);
        };
        self.expect(
            &a,
            &[200],
            &format!("store a batch of {} objects", items.len()),
        )?;
        wire::parse_put_answer(&a.body, items.len())
            .map_err(|e| context(e, format!("chunk server {}", self.base)))
    }

    /// [`HttpStore::put_each`] of objects in two pieces.
    fn put_each_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        super::api::joined(items, |items| self.put_each(items))
    }

    /// A batch request (`POST path`): its answer, or `None` from a server
    /// that does not know the request — 404 or 405 as routers answer an
    /// unknown one, or 403 from the gate of a server with users, which
    /// takes an unknown request for an admin's (a server that knows it lets
    /// every user make it) — after which `known` is cleared and the client
    /// goes object by object (said once).
    fn post_batch(
        &self,
        path: &str,
        body: &[u8],
        known: &AtomicBool,
        does: &str,
        instead: &str,
    ) -> Result<Option<Answer>> {
        let a = self.call("POST", path, Some(body), &[])?;
        if matches!(a.status, 403 | 404 | 405 | 501) {
            if known.swap(false, Ordering::Relaxed) {
                tracing::info!(
                    "chunk server {} does not {does} (HTTP {}): {instead} objects one by one",
                    self.base,
                    a.status
                );
            }
            return Ok(None);
        }
        Ok(Some(a))
    }

    /// `POST /v1/objects/get`: the answer's entries, or `None` from a
    /// server that does not know the request ([`HttpStore::post_batch`]).
    fn post_get(&self, ids: &[ChunkId]) -> Result<Option<Vec<wire::Got>>> {
        let body = wire::encode_get_request(ids);
        let Some(a) = self.post_batch(
            "/v1/objects/get",
            &body,
            &self.batch_get,
            "answer batch gets",
            "fetching",
        )?
        else {
            return Ok(None);
        };
        self.expect(&a, &[200], "send a batch of objects")?;
        wire::parse_get_answer(&a.body, ids.len())
            .map(Some)
            .map_err(|e| context(e, format!("chunk server {}", self.base)))
    }
}

impl StoreLayer for HttpStore {
    fn describe(&self) -> String {
        self.base.clone()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

impl ChunkRead for HttpStore {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        let a = self.call("GET", &format!("/v1/objects/{id}"), None, &[])?;
        self.expect(&a, &[200], &format!("send object {id}"))?;
        Ok(a.body)
    }
    /// Several objects: a list of one, or any list when the server does
    /// not answer batch gets, one GET each; else batch gets of at least
    /// `GET_BATCH_MIN` and at most `wire::MAX_GET` ids, as many in flight
    /// as the pool has connections.
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        if ids.len() <= 1 || !self.batch_get.load(Ordering::Relaxed) {
            return self.get_each(ids);
        }
        let per = ids
            .len()
            .div_ceil(self.pool.current_num_threads())
            .clamp(GET_BATCH_MIN, wire::MAX_GET);
        let parts: Vec<&[ChunkId]> = ids.chunks(per).collect();
        let answers: Vec<Vec<Result<Vec<u8>>>> = self
            .pool
            .install(|| parts.par_iter().map(|p| self.get_batch(p)).collect());
        answers.into_iter().flatten().collect()
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        let parts: Vec<&[ChunkId]> = ids.chunks(HAVE_BATCH).collect();
        let answers: Vec<Result<Vec<bool>>> = self.pool.install(|| {
            parts
                .par_iter()
                .map(|part| {
                    let path = format!("/v1/have?touch={}", u8::from(touch));
                    let a =
                        self.call("POST", &path, Some(&wire::encode_have_request(part)), &[])?;
                    self.expect(&a, &[200], "answer a have request")?;
                    wire::parse_have_answer(&a.body, part.len())
                })
                .collect()
        });
        let mut out = Vec::with_capacity(ids.len());
        for a in answers {
            out.extend(a?);
        }
        Ok(out)
    }
}

impl ChunkWrite for HttpStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        let parts: Vec<ObjectParts<'_>> = items.iter().map(|(id, b)| (*id, [*b, &[]])).collect();
        self.put_many_parts(&parts)
    }
    /// Several objects: one PUT each when the server does not take batch
    /// puts, else batch puts of runs of the list (each at most
    /// `wire::MAX_PUT` objects and `wire::MAX_PUT_BYTES`, an object past
    /// the byte limit alone in a PUT), in parallel on the pool's
    /// connections. A server in front of an object store writes each batch
    /// as one pack, so runs are as long as the limits allow (a 16 MiB
    /// commit batch is one request, one pack; splitting it over the
    /// connections made 2 MiB packs and halved a commit's speed through
    /// `store serve s3://`): a commit keeps several batches in flight
    /// instead ([`ChunkWrite::groups_in_flight`]).
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        if items.len() <= 1 || !self.batch_put.load(Ordering::Relaxed) {
            return self.put_each_parts(items);
        }
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        let (mut start, mut bytes) = (0, 0u64);
        let mut ids = std::collections::HashSet::new();
        for (k, (id, [a, b])) in items.iter().enumerate() {
            let len = (a.len() + b.len()) as u64;
            let full =
                k - start >= wire::MAX_PUT || bytes + len > wire::MAX_PUT_BYTES || ids.contains(id);
            if k > start && full {
                runs.push(start..k);
                (start, bytes) = (k, 0);
                ids.clear();
            }
            bytes += len;
            ids.insert(*id);
        }
        runs.push(start..items.len());
        let answers: Vec<Result<Vec<PutOutcome>>> = self.pool.install(|| {
            runs.par_iter()
                .map(|r| self.put_batch(&items[r.clone()]))
                .collect()
        });
        let mut out = Vec::with_capacity(items.len());
        for a in answers {
            out.extend(a?);
        }
        Ok(out)
    }
    /// A commit has up to three batches being put while it hashes and
    /// asks about the next (`store serve s3://` in front of Swift, 512 MiB
    /// commit: 1 in flight 0.55x of a direct commit, 2 0.87x, 3 0.89-0.95x
    /// at ~200 MB peak memory, 4 no faster).
    fn groups_in_flight(&self) -> usize {
        3
    }
    fn sync(&self) -> Result<()> {
        let a = self.call("POST", "/v1/sync", Some(&[]), &[])?;
        self.expect(&a, &[200], "sync")
    }
}

impl ChunkPrune for HttpStore {
    fn now(&self) -> Result<SystemTime> {
        let a = self.call("GET", "/v1/time", None, &[])?;
        self.expect(&a, &[200], "tell the time")?;
        Self::text(&a)
            .parse::<u64>()
            .map(wire::from_nanos)
            .map_err(|_| corrupt("time answer is malformed"))
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        let a = self.call("GET", "/v1/objects", None, &[])?;
        self.expect(&a, &[200], "list objects")?;
        wire::parse_list(&a.body, f)
    }
    /// One DELETE per object (the server rewrites packs as its store
    /// does).
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        ids.iter()
            .map(|id| {
                let path = format!("/v1/objects/{id}?older-than={}", wire::nanos(cutoff));
                let a = self.call("DELETE", &path, None, &[])?;
                match a.status {
                    200 => Ok(Some(Self::text(&a).parse().unwrap_or(0))),
                    409 | 404 => Ok(None),
                    _ => self
                        .expect(&a, &[200], &format!("remove object {id}"))
                        .map(|_| None),
                }
            })
            .collect()
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        let path = format!("/v1/recover?cutoff={}", wire::nanos(cutoff));
        let a = self.call("POST", &path, Some(&[]), &[])?;
        self.expect(&a, &[200], "recover")?;
        let t = Self::text(&a);
        let mut it = t.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
        Ok((it.next().unwrap_or(0), it.next().unwrap_or(0)))
    }
}

impl RefStore for HttpStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_ref_name(name)?;
        let a = self.call("GET", &format!("/v1/refs/{name}"), None, &[])?;
        if a.status == 404 {
            return Ok(None);
        }
        self.expect(&a, &[200], &format!("send catalog {name}"))?;
        Ok(Some(a.body))
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        let a = self.call("GET", "/v1/refs", None, &[])?;
        self.expect(&a, &[200], "list catalogs")?;
        Ok(Self::text(&a)
            .lines()
            .filter(|l| check_ref_name(l).is_ok())
            .map(str::to_string)
            .collect())
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        check_ref_name(name)?;
        let cond = match old {
            Some(t) => ("if-match", format!("\"{t}\"")),
            None => ("if-none-match", "*".to_string()),
        };
        let path = format!("/v1/refs/{name}");
        let a = match new {
            Some(b) => self.call("PUT", &path, Some(b), &[cond])?,
            None => self.call("DELETE", &path, None, &[cond])?,
        };
        if a.status == 412 {
            return Ok(false);
        }
        self.expect(&a, &[200], &format!("update catalog {name}"))?;
        Ok(true)
    }
}

impl LeaseStore for HttpStore {
    fn lease_begin(&self) -> Result<Lease> {
        let a = self.call("POST", "/v1/leases", Some(&[]), &[])?;
        self.expect(&a, &[200], "take a lease")?;
        let t = Self::text(&a);
        let mut it = t.split_whitespace();
        let id = it.next().unwrap_or_default().to_string();
        let started = it
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .map(wire::from_nanos)
            .ok_or_else(|| corrupt("lease answer is malformed"))?;
        Ok(Lease::new(id, started))
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let a = self.call("PUT", &format!("/v1/leases/{id}"), Some(&[]), &[])?;
        self.expect(&a, &[200], &format!("refresh lease {id}"))
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let a = self.call("DELETE", &format!("/v1/leases/{id}"), None, &[])?;
        self.expect(&a, &[200, 404], &format!("end lease {id}"))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        let a = self.call("GET", "/v1/leases", None, &[])?;
        self.expect(&a, &[200], "list leases")?;
        let mut out = Vec::new();
        for l in Self::text(&a).lines() {
            let p: Vec<&str> = l.split_whitespace().collect();
            if let [id, s, r] = p[..] {
                if let (Ok(s), Ok(r)) = (s.parse(), r.parse()) {
                    out.push(Lease {
                        ended: false,
                        id: id.to_string(),
                        started: wire::from_nanos(s),
                        refreshed: wire::from_nanos(r),
                    });
                }
            }
        }
        Ok(out)
    }
}
