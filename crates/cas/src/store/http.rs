//! The client of an HTTP chunk server (`roamdisk store serve`): GET, HEAD
//! and PUT of objects by name, a batch "which of these do you have", refs
//! with compare-and-swap (ETag / If-Match), leases and gc operations.
//! Requests run in parallel on a pool of `parallel` connections; transport
//! errors and 5xx answers are retried with exponential backoff and jitter.
//! Protocol: `docs/formats/cas-http.md`.

use std::time::{Duration, SystemTime};

use rayon::prelude::*;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::wire;
use super::{
    check_ref_name, ChunkPrune, ChunkRead, ChunkWrite, Lease, ObjectEntry, PutOutcome, StoreConfig,
};
use crate::chunk::{HEADER_SIZE, MAX_OBJECT};
use crate::error::{bad_arg, corrupt, err};
use crate::hash::ChunkId;

/// Attempts per request (the first plus retries).
const ATTEMPTS: u32 = 6;
/// First retry delay; doubles each time.
const BACKOFF: Duration = Duration::from_millis(100);
/// Ids per have request.
const HAVE_BATCH: usize = 16384;

/// A chunk store behind `roamdisk store serve`.
pub struct HttpStore {
    base: String,
    agent: ureq::Agent,
    config: StoreConfig,
    pool: rayon::ThreadPool,
}

/// An answer: status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
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

impl HttpStore {
    /// Connect to `url` (e.g. `http://127.0.0.1:8700`) and read the store's
    /// settings.
    /// Connect to `url`. If the server does not answer and `known` (its
    /// settings as last seen) is given, the store opens anyway: every
    /// request then fails, and readers are served by their caches.
    pub fn connect(url: &str, parallel: usize, known: Option<&StoreConfig>) -> Result<HttpStore> {
        if url.starts_with("https://") {
            return Err(bad_arg(
                "https chunk stores are not built in: put `roamdisk store serve` behind a TLS proxy and use an SSH tunnel or a loopback URL",
            ));
        }
        let parallel = parallel.clamp(1, 256);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
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
        };
        let a = match (s.call("GET", "/v1/store", None, &[]), known) {
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
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                let d = BACKOFF * (1 << (attempt - 1)) + Duration::from_millis(jitter());
                std::thread::sleep(d);
            }
            let r = match (method, body) {
                ("GET", _) => {
                    let mut q = self.agent.get(&url);
                    for (k, v) in headers {
                        q = q.header(*k, v);
                    }
                    q.call()
                }
                ("HEAD", _) => self.agent.head(&url).call(),
                ("DELETE", _) => {
                    let mut q = self.agent.delete(&url);
                    for (k, v) in headers {
                        q = q.header(*k, v);
                    }
                    q.call()
                }
                (m, b) => {
                    let mut q = if m == "PUT" {
                        self.agent.put(&url)
                    } else {
                        self.agent.post(&url)
                    };
                    for (k, v) in headers {
                        q = q.header(*k, v);
                    }
                    q.send(b.unwrap_or(&[]))
                }
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
                    if matches!(status, 500 | 502 | 503 | 504) {
                        last = format!("HTTP {status}: {}", String::from_utf8_lossy(&body));
                        continue;
                    }
                    return Ok(Answer { status, body });
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(err(
            ErrorKind::Io,
            Op::Read,
            format!(
                "chunk server {} did not answer {method} {path} after {ATTEMPTS} attempts: {last}",
                self.base
            ),
        ))
    }

    fn expect(&self, a: &Answer, ok: &[u16], what: &str) -> Result<()> {
        if ok.contains(&a.status) {
            return Ok(());
        }
        Err(err(
            kind_of(a.status),
            Op::Read,
            format!(
                "chunk server {} could not {what} (HTTP {}): {}",
                self.base,
                a.status,
                String::from_utf8_lossy(&a.body).trim()
            ),
        ))
    }

    fn text(a: &Answer) -> String {
        String::from_utf8_lossy(&a.body).trim().to_string()
    }
}

impl ChunkRead for HttpStore {
    fn describe(&self) -> String {
        self.base.clone()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        let a = self.call("GET", &format!("/v1/objects/{id}"), None, &[])?;
        self.expect(&a, &[200], &format!("send object {id}"))?;
        Ok(a.body)
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        self.pool
            .install(|| ids.par_iter().map(|id| self.get(id)).collect())
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
}

impl ChunkWrite for HttpStore {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
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
    fn sync(&self) -> Result<()> {
        let a = self.call("POST", "/v1/sync", Some(&[]), &[])?;
        self.expect(&a, &[200], "sync")
    }
    fn ref_update(
        &self,
        name: &str,
        expected: Option<ChunkId>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        check_ref_name(name)?;
        let cond = match expected {
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
        Ok(Lease {
            id,
            started,
            refreshed: started,
        })
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let a = self.call("PUT", &format!("/v1/leases/{id}"), Some(&[]), &[])?;
        self.expect(&a, &[200], &format!("refresh lease {id}"))
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let a = self.call("DELETE", &format!("/v1/leases/{id}"), None, &[])?;
        self.expect(&a, &[200, 404], &format!("end lease {id}"))
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
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        let path = format!("/v1/objects/{id}?older-than={}", wire::nanos(cutoff));
        let a = self.call("DELETE", &path, None, &[])?;
        match a.status {
            200 => Ok(Some(Self::text(&a).parse().unwrap_or(0))),
            409 | 404 => Ok(None),
            _ => self
                .expect(&a, &[200], &format!("remove object {id}"))
                .map(|_| None),
        }
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
                        id: id.to_string(),
                        started: wire::from_nanos(s),
                        refreshed: wire::from_nanos(r),
                    });
                }
            }
        }
        Ok(out)
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
