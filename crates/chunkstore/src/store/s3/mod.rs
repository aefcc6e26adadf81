//! A chunk store in an S3 bucket (`s3://BUCKET/PREFIX`), through the
//! `object_store` crate: AWS S3, Garage, MinIO, Ceph, OpenStack Swift's
//! s3api. Layout, catalog and gc protocol: `docs/formats/cas-s3.md`.
//!
//! * Chunks travel in packs (the local store's `RDPK` files, 32 MiB per
//!   commit group), uploaded in one PUT or a multipart upload, read with
//!   ranged GETs; single objects (version packages) are objects of their
//!   own. Every pack's index is loaded once per process (one suffix GET per
//!   pack), so asking "which of these chunks does the store have" costs no
//!   request.
//! * Nothing is overwritten in place except markers: a catalog update is a
//!   new object per generation (`refs.rs`), so two concurrent commits to
//!   one image both stay; a version removed is recorded by a tombstone.
//! * A commit that reuses a pack *touches* it (a small marker object); gc
//!   removes a pack only after writing a *trash* marker and reading the
//!   touch marker again, and a commit checks for the trash marker after
//!   its touch — whichever comes second sees the other.
//! * Every request is retried with backoff on 5xx answers and timeouts
//!   (`object_store`'s retry policy); many are in flight at once.

pub mod location;
pub mod refs;

use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use roamdisk_blockdev::{ErrorKind, Op, Result};

pub use location::{is_s3, S3Location};

use super::pack::{self, is_pack_name, Entry};
use super::{
    check_ref_name, ChunkPrune, ChunkRead, ChunkWrite, Lease, LeaseStore, ObjectEntry, PutGroup,
    PutOutcome, RefStore, StoreConfig, StoreLayer,
};
use crate::catalog::Catalog;
use crate::error::{bad_arg, corrupt, err, not_found};
use crate::hash::ChunkId;

/// Packs larger than this go up as a multipart upload.
const MULTIPART_FROM: usize = 16 << 20;
/// Part size of a multipart upload.
const PART: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// Bytes fetched from the end of a pack to read its index (and trailer)
/// in one request when it fits.
const INDEX_PROBE: u64 = 64 << 10;
/// How many times a reader lists the packs again, with growing waits,
/// before it calls an object missing (a listing may lag a new pack).
const RESCANS: u32 = 3;
/// Lease body's first line.
const LEASE_MAGIC: &str = "roamdisk-lease 1";

/// Where a known object is.
#[derive(Debug, Clone, Copy)]
enum Where {
    Packed { pack: u32, offset: u64, len: u32 },
    Loose { len: u64 },
}

/// The packs and loose objects this process has seen.
#[derive(Default)]
struct Table {
    scanned: Option<Instant>,
    /// Pack names by number, with their entries and modification times.
    names: Vec<String>,
    entries: Vec<Vec<Entry>>,
    modified: Vec<SystemTime>,
    by_name: HashMap<String, u32>,
    /// Packs removed by a gc (their numbers stay, unused).
    gone: HashSet<u32>,
    objects: HashMap<ChunkId, Where>,
    loose_modified: HashMap<ChunkId, SystemTime>,
    damaged: HashSet<String>,
}

impl Table {
    fn add_pack(&mut self, name: String, entries: Vec<Entry>, modified: SystemTime) {
        if self.by_name.contains_key(&name) {
            return;
        }
        let n = self.names.len() as u32;
        for e in &entries {
            self.objects.entry(e.id).or_insert(Where::Packed {
                pack: n,
                offset: e.offset,
                len: e.len,
            });
        }
        self.by_name.insert(name.clone(), n);
        self.names.push(name);
        self.entries.push(entries);
        self.modified.push(modified);
    }

    /// Forget a pack (gone from the bucket): its objects may be in another.
    fn forget_pack(&mut self, n: u32) {
        if !self.gone.insert(n) {
            return;
        }
        self.by_name.remove(&self.names[n as usize]);
        for e in std::mem::take(&mut self.entries[n as usize]) {
            if matches!(self.objects.get(&e.id), Some(Where::Packed { pack, .. }) if *pack == n) {
                self.objects.remove(&e.id);
                // Another loaded pack may hold it too.
                if let Some((m, x)) = self.entries.iter().enumerate().find_map(|(m, es)| {
                    es.binary_search_by_key(&e.id, |x| x.id)
                        .ok()
                        .map(|i| (m as u32, es[i]))
                }) {
                    self.objects.insert(
                        e.id,
                        Where::Packed {
                            pack: m,
                            offset: x.offset,
                            len: x.len,
                        },
                    );
                }
            }
        }
    }
}

/// An S3 chunk store.
pub struct S3Store {
    rt: Option<tokio::runtime::Runtime>,
    os: Arc<dyn ObjectStore>,
    loc: S3Location,
    config: StoreConfig,
    table: RwLock<Table>,
    /// Containers (packs, loose objects) touched, and when.
    touched: Mutex<HashMap<String, Instant>>,
    /// When this process last began a lease: a touch before it does not
    /// count for that lease.
    epoch: Mutex<Instant>,
    /// Leases begun by this process (ended by a marker, not deleted).
    mine: Mutex<HashSet<String>>,
    /// Allowance for listings that lag writes (`gc-margin=`).
    margin: Duration,
    /// Where pack indexes are kept between runs (packs never change).
    index_cache: Option<PathBuf>,
    /// Single objects put at once by several threads, gathered.
    batcher: Batcher,
    /// When an object was last found missing after every retry.
    last_missing: Mutex<Option<Instant>>,
}

/// How long the first of several single puts waits for others to join
/// its pack.
const GATHER: Duration = Duration::from_millis(5);

/// Single objects put at the same time from several threads (the uploads
/// a chunk server receives) go up together as one pack, one request
/// instead of one each: the first waits [`GATHER`] for others, uploads
/// them, and wakes them; every put returns only once its pack is stored.
#[derive(Default)]
struct Batcher {
    state: Mutex<Gathering>,
    cv: Condvar,
}

/// Objects gathered, as (id, bytes).
type Gathered = Vec<(ChunkId, Vec<u8>)>;

#[derive(Default)]
struct Gathering {
    /// The batch open to newcomers: its number and objects.
    open: Option<(u64, Gathered)>,
    next: u64,
    /// Uploaded batches whose waiters have not all seen the outcome:
    /// number → (the error, if it failed; waiters left).
    done: HashMap<u64, (Option<(ErrorKind, String)>, usize)>,
}

impl Drop for S3Store {
    fn drop(&mut self) {
        // A runtime may not be dropped inside another's async context
        // (a store server holds this store).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn system_time(t: impl Into<SystemTime>) -> SystemTime {
    t.into()
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut r = vec![0u8; bytes];
    crate::secret::fill_random(&mut r, "an object name")?;
    Ok(r.iter().map(|b| format!("{b:02x}")).collect())
}

fn random_u64() -> Result<u64> {
    let mut r = [0u8; 8];
    crate::secret::fill_random(&mut r, "an object name")?;
    Ok(u64::from_le_bytes(r))
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// The entries of a pack of `size` bytes from its index followed by its
/// trailer (`tail`). The header is not needed: the trailer's checksum
/// covers the header a store using `hash` writes.
fn parse_index_tail(hash: crate::hash::HashKind, size: u64, tail: &[u8]) -> Result<Vec<Entry>> {
    let t_len = pack::TRAILER_SIZE;
    if tail.len() < t_len {
        return Err(corrupt("a pack index is truncated"));
    }
    let (index, t) = tail.split_at(tail.len() - t_len);
    let trailer = pack::Trailer::parse(t, size)?;
    trailer.parse_index(&pack::header(hash), index)
}

/// `$ROAMDISK_S3_INDEX_CACHE` (`off`: none), else
/// `$XDG_CACHE_HOME/roamdisk/s3-index/KEY` (else under `~/.cache`), KEY
/// naming the endpoint, bucket and prefix.
fn index_cache_dir(endpoint: &str, loc: &S3Location) -> Option<PathBuf> {
    let base = match std::env::var("ROAMDISK_S3_INDEX_CACHE") {
        Ok(s) if s == "off" => return None,
        Ok(s) if !s.is_empty() => PathBuf::from(s),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("roamdisk/s3-index"),
    };
    let id = blake3::hash(format!("{endpoint}\n{}\n{}", loc.bucket, loc.prefix).as_bytes());
    Some(base.join(&id.to_hex()[..32]))
}

impl S3Store {
    /// Connect to the store at `location` (`s3://BUCKET/PREFIX?...`) and
    /// read its settings (`store.toml`).
    pub fn open(location: &str) -> Result<S3Store> {
        let mut s = Self::connect(location)?;
        let text = s.block(s.get_text("store.toml"));
        let text = match text {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Err(not_found(format!(
                    "no chunk store at {}: create one with `roamdisk store init {}` (the bucket must exist)",
                    s.loc.describe(),
                    s.loc.describe()
                )))
            }
            Err(e) => return Err(e),
        };
        let (config, _) = StoreConfig::parse_versioned(&text)
            .map_err(|e| crate::error::context(e, format!("store.toml of {}", s.loc.describe())))?;
        s.config = config;
        Ok(s)
    }

    /// Create a store at `location` (refused if one is there).
    pub fn init(location: &str, config: &StoreConfig) -> Result<()> {
        let s = Self::connect(location)?;
        if s.block(s.get_text("store.toml"))?.is_some() {
            return Err(err(
                ErrorKind::InvalidArgument,
                Op::Write,
                format!("{} already holds a chunk store", s.loc.describe()),
            ));
        }
        if config.quota.is_some() {
            return Err(bad_arg(
                "--quota is for local stores; limit an S3 bucket with the object store's own quotas",
            ));
        }
        let mut text = config.to_toml();
        text = text.replace("version = 1\n", "version = 2\n");
        s.block(s.put("store.toml", text.into_bytes()))
    }

    fn connect(location: &str) -> Result<S3Store> {
        // reqwest is built without a default TLS provider: use ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let loc = S3Location::parse(location)?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&loc.bucket);
        for (k, v) in &loc.settings {
            let key: object_store::aws::AmazonS3ConfigKey = k
                .parse()
                .map_err(|_| bad_arg(format!("{location}: unknown S3 setting '{k}'")))?;
            b = b.with_config(key, v);
        }
        let endpoint = b
            .get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint)
            .unwrap_or_default();
        let client = object_store::ClientOptions::new()
            .with_allow_http(endpoint.starts_with("http://"))
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(60));
        let mut client = client;
        for (k, v) in &loc.settings {
            if let Ok(ck) = k.parse::<object_store::ClientConfigKey>() {
                client = client.with_config(ck, v);
            }
        }
        b = b
            .with_client_options(client)
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: loc.retries,
                retry_timeout: loc.retry_timeout,
            });
        let os = b.build().map_err(|e| {
            bad_arg(format!(
                "cannot use {}: {e} (set AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ?endpoint=...&region=...)",
                loc.describe()
            ))
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("roamdisk-s3")
            .enable_all()
            .build()
            .map_err(|e| {
                err(
                    ErrorKind::Io,
                    Op::Open,
                    format!("cannot start the S3 client: {e}"),
                )
            })?;
        Ok(S3Store {
            rt: Some(rt),
            os: Arc::new(os),
            config: StoreConfig::default(),
            table: RwLock::new(Table::default()),
            touched: Mutex::new(HashMap::new()),
            epoch: Mutex::new(Instant::now()),
            mine: Mutex::new(HashSet::new()),
            margin: loc.gc_margin,
            index_cache: index_cache_dir(&endpoint, &loc),
            batcher: Batcher::default(),
            last_missing: Mutex::new(None),
            loc,
        })
    }

    /// The allowance for listings that lag writes: gc removes nothing
    /// younger, and a finished commit's lease stays this long.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    fn block<F: Future + Send>(&self, f: F) -> F::Output
    where
        F::Output: Send,
    {
        let rt = self.rt.as_ref().expect("runtime");
        if tokio::runtime::Handle::try_current().is_err() {
            return rt.block_on(f);
        }
        // Called from a task of another runtime (the NBD server reads a
        // session's chunks there), where block_on panics ("Cannot start a
        // runtime from within a runtime"): wait from a thread outside it.
        std::thread::scope(|s| {
            s.spawn(|| rt.block_on(f))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn key(&self, rel: &str) -> Key {
        Key::from(self.loc.key(rel))
    }

    /// The name of `key` relative to the store's prefix.
    fn rel<'k>(&self, key: &'k str) -> &'k str {
        if self.loc.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.loc.prefix)
                .and_then(|k| k.strip_prefix('/'))
                .unwrap_or(key)
        }
    }

    /// A roamdisk error for a failed request about `what`.
    fn fail(&self, e: object_store::Error, op: Op, what: &str) -> roamdisk_blockdev::Error {
        use object_store::Error as E;
        let store = self.loc.describe();
        match &e {
            E::NotFound { .. } => not_found(format!("{what} is missing from store {store}")),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => err(
                ErrorKind::PermissionDenied,
                op,
                format!(
                    "{store} refused access to {what}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({e})"
                ),
            ),
            _ => {
                // The first line, without the XML body some servers add.
                let full = e.to_string();
                let mut text: String = full.lines().next().unwrap_or_default().to_string();
                if let Some(i) = text.find("<?xml") {
                    text.truncate(i);
                }
                if text.len() > 400 {
                    let mut cut = 400;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push('…');
                }
                let text = text.trim_end().to_string();
                let hint = if text.contains("403") || text.contains("SignatureDoesNotMatch") || text.contains("InvalidAccessKeyId") || text.contains("AccessDenied") {
                    return err(
                        ErrorKind::PermissionDenied,
                        op,
                        format!("{store} refused access to {what}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({text})"),
                    );
                } else if text.contains("timed out") || text.contains("timeout") {
                    " (the endpoint did not answer in time; retried with backoff, then gave up)"
                } else {
                    ""
                };
                err(ErrorKind::Io, op, format!("{what} in store {store}: {text}{hint}"))
            }
        }
    }

    async fn get_bytes(&self, rel: &str, what: &str) -> Result<Vec<u8>> {
        let r = self
            .os
            .get(&self.key(rel))
            .await
            .map_err(|e| self.fail(e, Op::Read, what))?;
        Ok(r.bytes()
            .await
            .map_err(|e| self.fail(e, Op::Read, what))?
            .to_vec())
    }

    async fn get_text(&self, rel: &str) -> Result<Option<String>> {
        match self.os.get(&self.key(rel)).await {
            Ok(r) => {
                let b = r.bytes().await.map_err(|e| self.fail(e, Op::Read, rel))?;
                String::from_utf8(b.to_vec())
                    .map(Some)
                    .map_err(|_| corrupt(format!("{rel} of {} is not text", self.loc.describe())))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.fail(e, Op::Read, rel)),
        }
    }

    async fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        self.os
            .put(&self.key(rel), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.fail(e, Op::Write, rel))
    }

    /// Upload a pack: one PUT, or a multipart upload of large ones.
    async fn put_large(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        if bytes.len() < MULTIPART_FROM {
            return self.put(rel, bytes).await;
        }
        let up = self
            .os
            .put_multipart(&self.key(rel))
            .await
            .map_err(|e| self.fail(e, Op::Write, rel))?;
        let mut w = WriteMultipart::new_with_chunk_size(up, PART);
        for part in bytes.chunks(PART) {
            if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                let _ = w.abort().await;
                return Err(self.fail(e, Op::Write, rel));
            }
            w.write(part);
        }
        w.finish()
            .await
            .map(|_| ())
            .map_err(|e| self.fail(e, Op::Write, rel))
    }

    /// Modification time of `rel`, `None` if it does not exist.
    async fn time_of(&self, rel: &str) -> Result<Option<(SystemTime, u64)>> {
        match self.os.head(&self.key(rel)).await {
            Ok(m) => Ok(Some((system_time(m.last_modified), m.size))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.fail(e, Op::Read, rel)),
        }
    }

    async fn delete(&self, rel: &str) -> Result<()> {
        match self.os.delete(&self.key(rel)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.fail(e, Op::Write, rel)),
        }
    }

    /// Every object under `dir/` (relative names, sizes, times).
    async fn list(&self, dir: &str) -> Result<Vec<(String, u64, SystemTime)>> {
        let prefix = self.key(dir);
        let metas: Vec<object_store::ObjectMeta> = self
            .os
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.fail(e, Op::Read, &format!("the listing of {dir}/")))?;
        Ok(metas
            .into_iter()
            .map(|m| {
                (
                    self.rel(m.location.as_ref()).to_string(),
                    m.size,
                    system_time(m.last_modified),
                )
            })
            .collect())
    }

    /// Read a pack's index with one suffix GET (two if the index is
    /// larger than the probe).
    async fn load_index(&self, name: &str) -> Result<Vec<Entry>> {
        if let Some(entries) = self.cached_index(name) {
            return Ok(entries);
        }
        let (size, tail) = self.fetch_index(name).await?;
        let entries = parse_index_tail(self.config.hash, size, &tail)?;
        if let Some(dir) = &self.index_cache {
            // Best effort: a cache that cannot be written is fetched again.
            let _ = std::fs::create_dir_all(dir).and_then(|()| {
                let tmp = dir.join(format!(".{name}.{}", std::process::id()));
                let mut b = size.to_le_bytes().to_vec();
                b.extend_from_slice(&tail);
                std::fs::write(&tmp, &b)?;
                std::fs::rename(&tmp, dir.join(name))
            });
        }
        Ok(entries)
    }

    /// A pack's index from the local cache, if there and intact (its
    /// checksum is verified as when fetched).
    fn cached_index(&self, name: &str) -> Option<Vec<Entry>> {
        let b = std::fs::read(self.index_cache.as_ref()?.join(name)).ok()?;
        let size = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        parse_index_tail(self.config.hash, size, &b[8..]).ok()
    }

    /// The size of pack `name` and its index and trailer: one suffix GET
    /// (two if the index is larger than the probe).
    async fn fetch_index(&self, name: &str) -> Result<(u64, Vec<u8>)> {
        let rel = format!("packs/{name}");
        let what = format!("pack {name}");
        let r = self
            .os
            .get_opts(
                &self.key(&rel),
                GetOptions {
                    range: Some(GetRange::Suffix(INDEX_PROBE)),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.fail(e, Op::Read, &what))?;
        let size = r.meta.size;
        let start = r.range.start;
        let tail = r.bytes().await.map_err(|e| self.fail(e, Op::Read, &what))?;
        let t_len = pack::TRAILER_SIZE;
        if tail.len() < t_len || start + tail.len() as u64 != size {
            return Err(corrupt(format!("{what} is too short for its trailer")));
        }
        let trailer = pack::Trailer::parse(&tail[tail.len() - t_len..], size)?;
        let idx_end = size - t_len as u64;
        if trailer.index_offset >= start {
            return Ok((
                size,
                tail[(trailer.index_offset - start) as usize..].to_vec(),
            ));
        }
        let mut index = self
            .os
            .get_range(&self.key(&rel), trailer.index_offset..idx_end)
            .await
            .map_err(|e| self.fail(e, Op::Read, &what))?
            .to_vec();
        index.extend_from_slice(&tail[tail.len() - t_len..]);
        Ok((size, index))
    }

    /// List the packs and loose objects; load the indexes of packs not
    /// loaded yet.
    async fn scan(&self) -> Result<()> {
        let (packs, loose) = futures::try_join!(self.list("packs"), self.list("objects"))?;
        let new: Vec<(String, SystemTime)> = {
            let t = self.table.read();
            packs
                .into_iter()
                .filter_map(|(rel, _, m)| {
                    let n = rel.strip_prefix("packs/")?.to_string();
                    (is_pack_name(&n) && !t.by_name.contains_key(&n) && !t.damaged.contains(&n))
                        .then_some((n, m))
                })
                .collect()
        };
        let loaded: Vec<(String, SystemTime, Result<Vec<Entry>>)> = futures::stream::iter(new)
            .map(|(n, m)| async move {
                let r = self.load_index(&n).await;
                (n, m, r)
            })
            .buffer_unordered(self.loc.parallel)
            .collect()
            .await;
        let mut t = self.table.write();
        for (n, m, r) in loaded {
            match r {
                Ok(entries) => t.add_pack(n, entries, m),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) if e.kind() == ErrorKind::Corrupt => {
                    tracing::warn!(pack = %n, store = %self.loc.describe(), error = %e, "a pack's index is damaged: its objects look missing");
                    t.damaged.insert(n);
                }
                Err(e) => return Err(e),
            }
        }
        for (rel, size, m) in loose {
            if let Some(id) = rel.strip_prefix("objects/").and_then(ChunkId::from_hex) {
                t.objects.entry(id).or_insert(Where::Loose { len: size });
                t.loose_modified.insert(id, m);
            }
        }
        t.scanned = Some(Instant::now());
        Ok(())
    }

    fn ensure_scanned(&self) -> Result<()> {
        if self.table.read().scanned.is_none() {
            self.block(self.scan())?;
        }
        Ok(())
    }

    fn locate(&self, id: &ChunkId) -> Option<Where> {
        self.table.read().objects.get(id).copied()
    }

    fn pack_name(&self, n: u32) -> String {
        self.table.read().names[n as usize].clone()
    }

    /// The container (`packs/NAME` or `objects/HEX`) of a known object.
    fn container(&self, id: &ChunkId, w: Where) -> String {
        match w {
            Where::Packed { pack, .. } => format!("packs/{}", self.pack_name(pack)),
            Where::Loose { .. } => format!("objects/{}", id.to_hex()),
        }
    }

    async fn read_where(&self, id: &ChunkId, w: Where) -> Result<Vec<u8>> {
        let what = format!("object {id}");
        match w {
            Where::Packed { pack, offset, len } => Ok(self
                .os
                .get_range(
                    &self.key(&format!("packs/{}", self.pack_name(pack))),
                    offset..offset + len as u64,
                )
                .await
                .map_err(|e| self.fail(e, Op::Read, &what))?
                .to_vec()),
            Where::Loose { .. } => {
                self.get_bytes(&format!("objects/{}", id.to_hex()), &what)
                    .await
            }
        }
    }

    /// A pack or loose object was not where the table says: forget it.
    fn forget(&self, id: &ChunkId, w: Where) {
        let mut t = self.table.write();
        match w {
            Where::Packed { pack, .. } => t.forget_pack(pack),
            Where::Loose { .. } => {
                t.objects.remove(id);
            }
        }
    }

    /// Touch `rel` (a pack or loose object) for a commit: write its touch
    /// marker, then check that no gc has marked it for removal and that it
    /// is still there. False: treat its objects as missing.
    async fn touch(&self, rel: &str) -> Result<bool> {
        self.put(&format!("touch/{rel}"), Vec::new()).await?;
        if self.time_of(&format!("trash/{rel}")).await?.is_some() {
            return Ok(false);
        }
        Ok(self.time_of(rel).await?.is_some())
    }

    /// The reference time of a container: its own time or its touch
    /// marker's, whichever is later (`None`: it is gone).
    async fn reference_time(&self, rel: &str) -> Result<Option<(SystemTime, u64)>> {
        let touch_rel = format!("touch/{rel}");
        let (own, touch) = futures::try_join!(self.time_of(rel), self.time_of(&touch_rel))?;
        Ok(own.map(|(t, size)| (touch.map_or(t, |(u, _)| t.max(u)), size)))
    }

    /// gc's removal of a container unless referenced at or after
    /// `cutoff`: write the trash marker, read the touch marker again, then
    /// delete. Returns its size if removed.
    async fn remove_container(&self, rel: &str, cutoff: SystemTime) -> Result<Option<u64>> {
        let trash = format!("trash/{rel}");
        self.put(&trash, Vec::new()).await?;
        let r = match self.reference_time(rel).await? {
            Some((t, size)) if t < cutoff => {
                self.delete(rel).await?;
                self.delete(&format!("touch/{rel}")).await?;
                Some(size)
            }
            _ => None,
        };
        self.delete(&trash).await?;
        Ok(r)
    }

    /// gc: rewrite pack `n` without `dead` (see the local store's
    /// `repack_without`): the live objects, each verified, go to a new
    /// pack first; then the old pack is removed unless touched. Returns
    /// the objects removed and their sizes.
    async fn repack_without(
        &self,
        n: u32,
        dead: &HashSet<ChunkId>,
        cutoff: SystemTime,
    ) -> Result<Vec<(ChunkId, u64)>> {
        let (name, entries) = {
            let t = self.table.read();
            (t.names[n as usize].clone(), t.entries[n as usize].clone())
        };
        let rel = format!("packs/{name}");
        match self.reference_time(&rel).await? {
            Some((t, _)) if t < cutoff => {}
            _ => return Ok(Vec::new()),
        }
        let (gone, live): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| dead.contains(&e.id));
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        if !live.is_empty() {
            let ranges: Vec<std::ops::Range<u64>> = live
                .iter()
                .map(|e| e.offset..e.offset + e.len as u64)
                .collect();
            let bufs = match self.os.get_ranges(&self.key(&rel), &ranges).await {
                Ok(b) => b,
                Err(e) if is_not_found(&e) => return Ok(Vec::new()),
                Err(e) => return Err(self.fail(e, Op::Read, &format!("pack {name}"))),
            };
            let codec = self.config.codec();
            let mut group = S3Group::new(self);
            for (e, b) in live.iter().zip(&bufs) {
                if let Err(bad) = codec.verify(&e.id, b) {
                    tracing::warn!(pack = %name, error = %bad, "a pack holds a damaged object: gc keeps the whole pack");
                    return Ok(Vec::new());
                }
                group.add(&e.id, [b, &[]]);
            }
            group.upload().await?;
        }
        match self.remove_container(&rel, cutoff).await? {
            Some(_) => {
                self.table.write().forget_pack(n);
                if let Some(d) = &self.index_cache {
                    let _ = std::fs::remove_file(d.join(&name));
                }
                Ok(gone.iter().map(|e| (e.id, e.len as u64)).collect())
            }
            None => Ok(Vec::new()),
        }
    }

    /// Every update of catalog `name` (`refs/USER/IMAGE/GEN-RANDOM`) and
    /// its removed versions (`refs/USER/IMAGE/removed/HEX`).
    async fn ref_objects(&self, name: &str) -> Result<(Vec<refs::RefObject>, HashSet<ChunkId>)> {
        let mut objs = Vec::new();
        let mut removed = HashSet::new();
        for (rel, size, modified) in self.list(&format!("refs/{name}")).await? {
            let Some(tail) = rel.strip_prefix(&format!("refs/{name}/")) else {
                continue;
            };
            if let Some(hex) = tail.strip_prefix("removed/") {
                if let Some(id) = ChunkId::from_hex(hex) {
                    removed.insert(id);
                }
            } else if let Some(generation) = refs::parse_name(tail) {
                objs.push(refs::RefObject {
                    generation,
                    name: tail.to_string(),
                    size,
                    modified,
                });
            }
        }
        Ok((objs, removed))
    }

    /// The current catalog of `name` (merged from concurrent updates,
    /// without removed versions) and its generation.
    async fn ref_head(&self, name: &str) -> Result<(Option<Vec<u8>>, u64)> {
        let (objs, removed) = self.ref_objects(name).await?;
        let heads = refs::heads(&objs);
        let mut generation = heads.first().map_or(0, |h| h.generation);
        let mut bodies = Vec::new();
        for h in heads {
            if h.size == 0 {
                bodies.push(Vec::new());
                continue;
            }
            bodies.push(
                self.get_bytes(
                    &format!("refs/{name}/{}", h.name),
                    &format!("catalog {name}"),
                )
                .await?,
            );
        }
        // A listing may miss the newest updates (a container replica that
        // missed them): follow the per-generation copies by key, which a
        // GET sees as soon as their PUT returned.
        loop {
            let at = format!("refs/{name}/at/{:016x}", generation + 1);
            match self.os.get(&self.key(&at)).await {
                Ok(r) => {
                    let b = r
                        .bytes()
                        .await
                        .map_err(|e| self.fail(e, Op::Read, &format!("catalog {name}")))?;
                    generation += 1;
                    bodies = vec![b.to_vec()];
                }
                Err(e) if is_not_found(&e) => break,
                Err(e) => return Err(self.fail(e, Op::Read, &format!("catalog {name}"))),
            }
        }
        if bodies.is_empty() {
            return Ok((None, 0));
        }
        let merged = refs::merge(name, &bodies)?;
        let merged = match merged {
            Some(b) if !removed.is_empty() => {
                let mut c = Catalog::parse(&b)?;
                let n = c.entries.len();
                c.entries.retain(|e| !removed.contains(&e.version));
                if c.entries.len() == n {
                    Some(b)
                } else if c.entries.is_empty() {
                    None
                } else {
                    Some(c.encode())
                }
            }
            other => other,
        };
        Ok((merged, generation))
    }
}

impl S3Store {
    /// Store one object; gathered with others put at the same moment
    /// ([`Batcher`]).
    fn put_single(&self, id: ChunkId, bytes: &[u8]) -> Result<()> {
        let b = &self.batcher;
        let mut st = b.state.lock();
        let (n, leader) = match &mut st.open {
            Some((n, items)) => {
                items.push((id, bytes.to_vec()));
                (*n, false)
            }
            None => {
                let n = st.next;
                st.next += 1;
                st.open = Some((n, vec![(id, bytes.to_vec())]));
                (n, true)
            }
        };
        if !leader {
            loop {
                if let Some(d) = st.done.get_mut(&n) {
                    d.1 -= 1;
                    let failed = d.0.clone();
                    if d.1 == 0 {
                        st.done.remove(&n);
                    }
                    return match failed {
                        None => Ok(()),
                        Some((kind, msg)) => Err(err(kind, Op::Write, msg)),
                    };
                }
                b.cv.wait(&mut st);
            }
        }
        drop(st);
        std::thread::sleep(GATHER);
        let items = {
            let mut st = b.state.lock();
            st.open.take().expect("the leader's batch").1
        };
        let r = if items.len() == 1 {
            let (id, bytes) = &items[0];
            self.block(self.put(&format!("objects/{}", id.to_hex()), bytes.clone()))
                .map(|()| {
                    let mut t = self.table.write();
                    t.objects.entry(*id).or_insert(Where::Loose {
                        len: bytes.len() as u64,
                    });
                })
        } else {
            let mut g = S3Group::new(self);
            for (id, bytes) in &items {
                g.add(id, [bytes, &[]]);
            }
            self.block(g.upload()).map(|_| ())
        };
        let mut st = b.state.lock();
        if items.len() > 1 {
            let failed = r.as_ref().err().map(|e| (e.kind(), e.to_string()));
            st.done.insert(n, (failed, items.len() - 1));
            b.cv.notify_all();
        }
        r
    }
}

/// A pack being filled in memory ([`ChunkWrite::put_group`]).
struct S3Group<'a> {
    store: &'a S3Store,
    buf: Vec<u8>,
    entries: Vec<Entry>,
    seen: HashSet<ChunkId>,
    order: Vec<(ChunkId, PutOutcome)>,
}

impl<'a> S3Group<'a> {
    fn new(store: &'a S3Store) -> S3Group<'a> {
        S3Group {
            store,
            buf: pack::header(store.config.hash).to_vec(),
            entries: Vec::new(),
            seen: HashSet::new(),
            order: Vec::new(),
        }
    }

    fn add(&mut self, id: &ChunkId, parts: [&[u8]; 2]) {
        if !self.seen.insert(*id) {
            self.order.push((*id, PutOutcome::Existed));
            return;
        }
        let offset = self.buf.len() as u64;
        self.buf.extend_from_slice(parts[0]);
        self.buf.extend_from_slice(parts[1]);
        self.entries.push(Entry {
            id: *id,
            offset,
            len: (parts[0].len() + parts[1].len()) as u32,
        });
        self.order.push((*id, PutOutcome::Stored));
    }

    /// Seal and upload the pack (nothing if empty); the table learns it.
    async fn upload(mut self) -> Result<Vec<(ChunkId, PutOutcome)>> {
        if self.entries.is_empty() {
            return Ok(self.order);
        }
        let header = pack::header(self.store.config.hash);
        let at = self.buf.len() as u64;
        let tail = pack::encode_tail(&header, &mut self.entries, at);
        self.buf.extend_from_slice(&tail);
        let name = format!("{}.pack", random_hex(16)?);
        self.store
            .put_large(&format!("packs/{name}"), std::mem::take(&mut self.buf))
            .await?;
        self.store
            .table
            .write()
            .add_pack(name, self.entries, SystemTime::now());
        Ok(self.order)
    }
}

/// The put group handed to commits: objects gathered from any thread.
struct SharedGroup<'a>(Mutex<Option<S3Group<'a>>>, &'a S3Store);

impl PutGroup for SharedGroup<'_> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        let mut g = self.0.lock();
        g.as_mut().expect("group open").add(id, parts);
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let g = self.0.into_inner().expect("group open");
        self.1.block(g.upload())
    }
}

impl StoreLayer for S3Store {
    fn describe(&self) -> String {
        self.loc.describe()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}

impl ChunkRead for S3Store {
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.ensure_scanned()?;
        // After an object was found missing, others are given one more
        // listing, not the patient retries: a checkout of a version whose
        // pack is gone fails at once, not after seconds per chunk.
        let patient = self
            .last_missing
            .lock()
            .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let rescans = if patient { RESCANS } else { 1 };
        for attempt in 0..=rescans {
            if let Some(w) = self.locate(id) {
                match self.block(self.read_where(id, w)) {
                    Ok(b) => return Ok(b),
                    Err(e) if e.kind() == ErrorKind::NotFound => self.forget(id, w),
                    Err(e) => return Err(e),
                }
            }
            if attempt < rescans {
                if attempt > 0 {
                    std::thread::sleep(Duration::from_millis(250 << attempt));
                }
                self.block(self.scan())?;
            }
        }
        *self.last_missing.lock() = Some(Instant::now());
        Err(not_found(format!(
            "object {id} is missing from store {}",
            self.loc.describe()
        )))
    }
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        if let Err(e) = self.ensure_scanned() {
            return ids
                .iter()
                .map(|_| Err(err(e.kind(), Op::Read, e.to_string())))
                .collect();
        }
        // Objects of one pack are fetched together (ranges close to each
        // other are merged into one request).
        let mut by_pack: HashMap<u32, Vec<usize>> = HashMap::new();
        let mut single: Vec<usize> = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            match self.locate(id) {
                Some(Where::Packed { pack, .. }) => by_pack.entry(pack).or_default().push(k),
                _ => single.push(k),
            }
        }
        let mut out: Vec<Option<Result<Vec<u8>>>> = ids.iter().map(|_| None).collect();
        // (positions in `ids`, their bytes if the pack answered)
        type Fetched = (Vec<usize>, Option<Vec<Vec<u8>>>);
        let fetched: Vec<Fetched> = self.block(async {
            futures::stream::iter(by_pack.into_values())
                .map(|ks| async move {
                    let mut name = None;
                    let ranges: Vec<std::ops::Range<u64>> = ks
                        .iter()
                        .filter_map(|&k| match self.locate(&ids[k]) {
                            Some(Where::Packed { pack, offset, len }) => {
                                name.get_or_insert(pack);
                                Some(offset..offset + len as u64)
                            }
                            _ => None,
                        })
                        .collect();
                    let (Some(pack), true) = (name, ranges.len() == ks.len()) else {
                        return (ks, None);
                    };
                    let rel = format!("packs/{}", self.pack_name(pack));
                    match self.os.get_ranges(&self.key(&rel), &ranges).await {
                        Ok(b) => (ks, Some(b.into_iter().map(|x| x.to_vec()).collect())),
                        // Each is read alone (and reported) below.
                        Err(_) => (ks, None),
                    }
                })
                .buffer_unordered(self.loc.parallel)
                .collect()
                .await
        });
        for (ks, bufs) in fetched {
            match bufs {
                Some(bufs) => {
                    for (k, b) in ks.into_iter().zip(bufs) {
                        out[k] = Some(Ok(b));
                    }
                }
                None => single.extend(ks),
            }
        }
        for k in single {
            out[k] = Some(self.get(&ids[k]));
        }
        out.into_iter()
            .map(|r| r.expect("every object answered"))
            .collect()
    }
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        // The sizes are known from the indexes: one get_many of the prefix
        // that fits (the default reads in growing groups, one round trip
        // each).
        if self.ensure_scanned().is_err() {
            return self.get_many(ids).into_iter().map(Some).collect();
        }
        let mut used = 0u64;
        let mut take = 0;
        for id in ids {
            let len = match self.locate(id) {
                Some(Where::Packed { len, .. }) => len as u64,
                Some(Where::Loose { len }) => len,
                None => 0,
            };
            if len > budget - used {
                break;
            }
            used += len;
            take += 1;
        }
        let mut out: Vec<Option<Result<Vec<u8>>>> =
            self.get_many(&ids[..take]).into_iter().map(Some).collect();
        out.resize_with(ids.len(), || None);
        out
    }
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.ensure_scanned()?;
        let mut have: Vec<bool> = Vec::with_capacity(ids.len());
        let mut to_touch: HashMap<String, Vec<usize>> = HashMap::new();
        let epoch = *self.epoch.lock();
        for (k, id) in ids.iter().enumerate() {
            match self.locate(id) {
                None => have.push(false),
                Some(w) => {
                    have.push(true);
                    if touch {
                        let c = self.container(id, w);
                        let fresh = self.touched.lock().get(&c).is_some_and(|t| *t > epoch);
                        if !fresh {
                            to_touch.entry(c).or_default().push(k);
                        }
                    }
                }
            }
        }
        if to_touch.is_empty() {
            return Ok(have);
        }
        let results: Vec<(String, Vec<usize>, Result<bool>)> = self.block(
            futures::stream::iter(to_touch)
                .map(|(c, ks)| async move {
                    let r = self.touch(&c).await;
                    (c, ks, r)
                })
                .buffer_unordered(self.loc.parallel)
                .collect(),
        );
        for (c, ks, r) in results {
            if r? {
                self.touched.lock().insert(c, Instant::now());
            } else {
                // Being removed by a gc (or gone): the commit writes these
                // objects again.
                for k in ks {
                    have[k] = false;
                    if let Some(w) = self.locate(&ids[k]) {
                        self.forget(&ids[k], w);
                    }
                }
            }
        }
        Ok(have)
    }
}

impl ChunkWrite for S3Store {
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        if items.len() == 1 {
            self.put_single(items[0].0, items[0].1)?;
            return Ok(vec![PutOutcome::Stored]);
        }
        let mut g = S3Group::new(self);
        for (id, b) in items {
            g.add(id, [b, &[]]);
        }
        Ok(self
            .block(g.upload())?
            .into_iter()
            .map(|(_, o)| o)
            .collect())
    }
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        Box::new(SharedGroup(Mutex::new(Some(S3Group::new(self))), self))
    }
    fn cheap_lookups(&self) -> bool {
        true
    }
    fn groups_in_flight(&self) -> usize {
        3
    }
    fn sync(&self) -> Result<()> {
        // An S3 PUT is durable when it is acknowledged.
        Ok(())
    }
}

impl ChunkPrune for S3Store {
    fn now(&self) -> Result<SystemTime> {
        let rel = format!("clock/{}", random_hex(8)?);
        self.block(async {
            self.put(&rel, Vec::new()).await?;
            let t = self.time_of(&rel).await?;
            self.delete(&rel).await?;
            t.map(|(t, _)| t)
                .ok_or_else(|| not_found(format!("{rel} vanished as it was written")))
        })
    }
    fn min_margin(&self) -> Duration {
        self.margin
    }
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        *self.table.write() = Table::default();
        let touches = self.block(async {
            self.scan().await?;
            self.list("touch").await
        })?;
        let touch: HashMap<String, SystemTime> = touches
            .into_iter()
            .filter_map(|(rel, _, m)| Some((rel.strip_prefix("touch/")?.to_string(), m)))
            .collect();
        let t = self.table.read();
        for (n, name) in t.names.iter().enumerate() {
            if t.gone.contains(&(n as u32)) {
                continue;
            }
            let mut m = t.modified[n];
            if let Some(u) = touch.get(&format!("packs/{name}")) {
                m = m.max(*u);
            }
            for e in &t.entries[n] {
                f(ObjectEntry {
                    id: e.id,
                    mtime: m,
                    size: e.len as u64,
                });
            }
        }
        for (id, w) in &t.objects {
            if let Where::Loose { len } = w {
                let mut m = t
                    .loose_modified
                    .get(id)
                    .copied()
                    .unwrap_or(SystemTime::now());
                if let Some(u) = touch.get(&format!("objects/{}", id.to_hex())) {
                    m = m.max(*u);
                }
                f(ObjectEntry {
                    id: *id,
                    mtime: m,
                    size: *len,
                });
            }
        }
        Ok(())
    }
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        Ok(self.remove_many_if_older(&[*id], cutoff)?[0])
    }
    fn remove_many_if_older(
        &self,
        ids: &[ChunkId],
        cutoff: SystemTime,
    ) -> Result<Vec<Option<u64>>> {
        self.ensure_scanned()?;
        let mut out = vec![None; ids.len()];
        let mut by_pack: HashMap<u32, HashSet<ChunkId>> = HashMap::new();
        let mut loose: Vec<usize> = Vec::new();
        let mut at: HashMap<ChunkId, usize> = HashMap::new();
        for (k, id) in ids.iter().enumerate() {
            at.insert(*id, k);
            match self.locate(id) {
                Some(Where::Packed { pack, .. }) => {
                    by_pack.entry(pack).or_default().insert(*id);
                }
                Some(Where::Loose { .. }) => loose.push(k),
                None => {}
            }
        }
        let removed: Vec<Result<Vec<(ChunkId, u64)>>> = self.block(async {
            let packs = futures::stream::iter(by_pack)
                .map(|(n, dead)| async move { self.repack_without(n, &dead, cutoff).await })
                .buffer_unordered(4);
            let singles = futures::stream::iter(loose)
                .map(|k| async move {
                    let id = ids[k];
                    let r = self
                        .remove_container(&format!("objects/{}", id.to_hex()), cutoff)
                        .await?;
                    Ok(r.map(|n| vec![(id, n)]).unwrap_or_default())
                })
                .buffer_unordered(self.loc.parallel);
            packs.chain(singles).collect().await
        });
        for r in removed {
            for (id, n) in r? {
                if let Some(&k) = at.get(&id) {
                    out[k] = Some(n);
                    let mut t = self.table.write();
                    if matches!(t.objects.get(&id), Some(Where::Loose { .. })) {
                        t.objects.remove(&id);
                    }
                }
            }
        }
        Ok(out)
    }
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        self.block(async {
            let mut restored = 0;
            let mut removed = 0;
            // Trash markers of a gc that died (older than the lease
            // timeout: a running gc's are recent).
            for (rel, _, m) in self.list("trash").await? {
                if m < cutoff {
                    self.delete(&rel).await?;
                    restored += 1;
                }
            }
            for (rel, _, m) in self.list("clock").await? {
                if m < cutoff {
                    self.delete(&rel).await?;
                    removed += 1;
                }
            }
            // Catalog updates superseded by one older than the cutoff.
            let (by_name, at_copies) = refs::group(self.list("refs").await?);
            for (name, objs) in &by_name {
                let settled = objs
                    .iter()
                    .filter(|o| o.modified < cutoff)
                    .map(|o| o.generation)
                    .max();
                if let Some(g) = settled {
                    for o in objs.iter().filter(|o| o.generation < g) {
                        self.delete(&format!("refs/{name}/{}", o.name)).await?;
                        removed += 1;
                    }
                    for (rel, at) in at_copies.get(name).into_iter().flatten() {
                        if *at < g {
                            self.delete(rel).await?;
                            removed += 1;
                        }
                    }
                }
            }
            Ok((restored, removed))
        })
    }
}

impl RefStore for S3Store {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_ref_name(name)?;
        Ok(self.block(self.ref_head(name))?.0)
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        let (by_name, _) = refs::group(self.block(self.list("refs"))?);
        let mut names: Vec<String> = by_name
            .into_iter()
            .filter(|(_, objs)| refs::heads(objs).iter().any(|h| h.size > 0))
            .map(|(n, _)| n)
            .collect();
        names.sort();
        Ok(names)
    }
    fn ref_update(
        &self,
        name: &str,
        expected: Option<ChunkId>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        check_ref_name(name)?;
        self.block(async {
            let (cur, generation) = self.ref_head(name).await?;
            if cur.as_deref().map(super::ref_tag) != expected {
                return Ok(false);
            }
            // Versions this update removes are recorded first, so that a
            // concurrent update made from an older catalog cannot bring
            // them back (gc may free their chunks).
            if let Some(cur) = &cur {
                let keep: HashSet<ChunkId> = match new {
                    Some(b) => Catalog::parse(b)?
                        .entries
                        .iter()
                        .map(|e| e.version)
                        .collect(),
                    None => HashSet::new(),
                };
                for e in Catalog::parse(cur)?.entries {
                    if !keep.contains(&e.version) {
                        self.put(
                            &format!("refs/{name}/removed/{}", e.version.to_hex()),
                            Vec::new(),
                        )
                        .await?;
                    }
                }
            }
            let rel = format!(
                "refs/{name}/{}",
                refs::new_name(generation + 1, random_u64()?)
            );
            let body = new.map(<[u8]>::to_vec).unwrap_or_default();
            self.put(&rel, body.clone()).await?;
            // The same catalog under a key readers can find without a
            // listing (overwritten if two updates race; the unique object
            // above keeps both for the merge).
            self.put(&format!("refs/{name}/at/{:016x}", generation + 1), body)
                .await?;
            Ok(true)
        })
    }
}

impl LeaseStore for S3Store {
    fn lease_begin(&self) -> Result<Lease> {
        let id = random_hex(12)?;
        *self.epoch.lock() = Instant::now();
        let rel = format!("leases/{id}");
        let started = self.block(async {
            self.put(
                &rel,
                format!(
                    "{LEASE_MAGIC}\nstarted 0\nended 0\npid {}\n",
                    std::process::id()
                )
                .into_bytes(),
            )
            .await?;
            self.time_of(&rel).await
        })?;
        let started = started.map(|(t, _)| t).ok_or_else(|| {
            not_found(format!(
                "lease {id} vanished from {} as it was written",
                self.loc.describe()
            ))
        })?;
        self.mine.lock().insert(id.clone());
        self.write_lease(&id, started, None)?;
        Ok(Lease {
            ended: false,
            id,
            started,
            refreshed: started,
        })
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let rel = format!("leases/{id}");
        let text = self.block(self.get_text(&rel))?.ok_or_else(|| {
            not_found(format!("lease {id} vanished (a gc took it for dead: its commit was idle longer than the lease timeout)"))
        })?;
        let (started, _) =
            parse_lease(&text).ok_or_else(|| corrupt(format!("lease {id} is damaged")))?;
        self.write_lease(id, started, None)
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let mine = self.mine.lock().remove(id);
        if !mine {
            // gc ending a dead (or long finished) commit's lease.
            return self.block(self.delete(&format!("leases/{id}")));
        }
        // Our commit is over: the lease stays, marked ended, until the
        // catalog entry it protected is surely in every listing.
        let rel = format!("leases/{id}");
        let text = self.block(self.get_text(&rel))?;
        let started = text
            .as_deref()
            .and_then(parse_lease)
            .map(|(s, _)| s)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let now = self.now()?;
        self.write_lease(id, started, Some(now))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        let now = self.now()?;
        self.block(async {
            let list = self.list("leases").await?;
            let mut out = Vec::new();
            for (rel, _, modified) in list {
                let Some(id) = rel.strip_prefix("leases/") else {
                    continue;
                };
                let Some(text) = self.get_text(&rel).await? else {
                    continue;
                };
                let (started, ended) = parse_lease(&text).unwrap_or((modified, None));
                let started = if started == SystemTime::UNIX_EPOCH {
                    modified
                } else {
                    started
                };
                let refreshed = match ended {
                    // Ended long enough ago for its catalog entry to be
                    // in every listing: report it over, gc removes it.
                    Some(e) if now.duration_since(e).unwrap_or_default() > self.margin => {
                        SystemTime::UNIX_EPOCH
                    }
                    _ => modified,
                };
                out.push(Lease {
                    ended: ended.is_some(),
                    id: id.to_string(),
                    started,
                    refreshed,
                });
            }
            Ok(out)
        })
    }
}

/// `(started, ended)` from a lease body.
pub fn parse_lease(text: &str) -> Option<(SystemTime, Option<SystemTime>)> {
    let mut lines = text.lines();
    if lines.next()? != LEASE_MAGIC {
        return None;
    }
    let mut started = None;
    let mut ended = None;
    for l in lines {
        let (k, v) = l.split_once(' ')?;
        let t = || {
            v.parse::<u64>()
                .ok()
                .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n))
        };
        match k {
            "started" => started = t(),
            "ended" => ended = t().filter(|x| *x != SystemTime::UNIX_EPOCH),
            _ => {}
        }
    }
    Some((started?, ended))
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl S3Store {
    fn write_lease(&self, id: &str, started: SystemTime, ended: Option<SystemTime>) -> Result<()> {
        let text = format!(
            "{LEASE_MAGIC}\nstarted {}\nended {}\npid {}\n",
            nanos(started),
            ended.map_or(0, nanos),
            std::process::id()
        );
        self.block(self.put(&format!("leases/{id}"), text.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_index_is_read_from_its_tail_alone_and_checked() {
        let hash = crate::hash::HashKind::Blake3;
        let h = pack::header(hash);
        let mut b = h.to_vec();
        let mut entries = Vec::new();
        for k in 0..3u8 {
            let codec = StoreConfig::default().codec();
            let s = codec.seal(&[k; 100], false);
            entries.push(Entry {
                id: s.id,
                offset: b.len() as u64,
                len: s.object.len() as u32,
            });
            b.extend_from_slice(&s.object);
        }
        let at = b.len();
        b.extend(pack::encode_tail(&h, &mut entries, at as u64));
        let size = b.len() as u64;
        let got = parse_index_tail(hash, size, &b[at..]).unwrap();
        assert_eq!(got, entries);
        // A flipped index byte, a wrong size or another hash: refused.
        let mut bad = b[at..].to_vec();
        bad[5] ^= 1;
        assert!(parse_index_tail(hash, size, &bad).is_err());
        assert!(parse_index_tail(hash, size + 1, &b[at..]).is_err());
        assert!(parse_index_tail(crate::hash::HashKind::Sha256, size, &b[at..]).is_err());
        assert!(parse_index_tail(hash, size, &b[b.len() - 10..]).is_err());
    }

    #[test]
    fn lease_bodies_parse() {
        let (s, e) = parse_lease("roamdisk-lease 1\nstarted 2000000000\nended 0\npid 7\n").unwrap();
        assert_eq!(s, SystemTime::UNIX_EPOCH + Duration::from_secs(2));
        assert_eq!(e, None);
        let (_, e) = parse_lease("roamdisk-lease 1\nstarted 1\nended 3000000000\n").unwrap();
        assert_eq!(e, Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3)));
        assert!(parse_lease("junk").is_none());
        assert!(parse_lease("roamdisk-lease 1\nended 1\n").is_none());
    }
}
