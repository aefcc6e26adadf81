//! What every chunk store is: the narrow traits a consumer picks from
//! ([`ChunkRead`], [`ChunkWrite`], [`ChunkPrune`], [`RefStore`],
//! [`LeaseStore`] over [`StoreLayer`]; [`Store`] is all of them), the
//! types they trade in, and the helpers on top of them: [`fetch`] (get and
//! verify), ref tags and names. The stores and decorators build on this
//! file; `mod.rs` opens one by location.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::chunk::{ChunkCodec, Key};
use crate::error::{bad_arg, context, err};
use crate::hash::ChunkId;
use roamdisk_blockdev::{Op, Result};

use super::config::StoreConfig;

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object was new and is now stored.
    Stored,
    /// The store already had it (its reference time was refreshed).
    Existed,
}

/// An object to store as two pieces written back to back: usually the
/// envelope header and the chunk's content (`ChunkCodec::plain_header`).
pub type ObjectParts<'a> = (ChunkId, [&'a [u8]; 2]);

/// A commit in progress, registered so that a concurrent gc keeps every
/// object it references (see `docs/formats/cas-store.md`, "gc and commits").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: String,
    /// When the lease was taken, by the store's clock.
    pub started: SystemTime,
    /// When it was last refreshed, by the store's clock.
    pub refreshed: SystemTime,
    /// Its commit has finished; the lease is kept a while only because
    /// the store's listings may lag (S3 stores).
    pub ended: bool,
}

impl Lease {
    /// A lease `id` taken at `started` and not refreshed since.
    pub fn new(id: impl Into<String>, started: SystemTime) -> Lease {
        Lease {
            id: id.into(),
            started,
            refreshed: started,
            ended: false,
        }
    }
}

/// One stored object, as listed for gc.
#[derive(Debug, Clone, Copy)]
pub struct ObjectEntry {
    pub id: ChunkId,
    /// Last time the object was stored or referenced by a commit.
    pub mtime: SystemTime,
    /// Stored bytes.
    pub size: u64,
}

/// What every store and decorator is: a description, its settings, and the
/// store it wraps (if any) that every operation not overridden passes
/// through to. A store at the bottom gives its description and settings; a
/// decorator gives `next` and whatever it changes.
pub trait StoreLayer: Send + Sync {
    /// The store this one decorates (`None`: a store at the bottom).
    fn next(&self) -> Option<&dyn Store> {
        None
    }
    /// One line naming the store (a path or URL) for messages.
    fn describe(&self) -> String {
        self.next()
            .map_or_else(|| "a chunk store".into(), |n| n.describe())
    }
    /// The store's settings (hash function, compression).
    fn config(&self) -> &StoreConfig {
        self.next()
            .expect("a store at the bottom gives its own settings")
            .config()
    }
    /// The next store, or an `unsupported` error naming what was asked.
    #[doc(hidden)]
    fn pass(&self, op: Op, what: &str) -> Result<&dyn Store> {
        self.next().ok_or_else(|| {
            err(
                roamdisk_blockdev::ErrorKind::Unsupported,
                op,
                format!("store {} cannot {what}", self.describe()),
            )
        })
    }
}

/// Fetch objects by name.
pub trait ChunkRead: StoreLayer {
    /// The stored bytes of one object; `not-found` if absent. Unverified:
    /// use [`fetch`].
    fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.pass(Op::Read, "read objects")?.get(id)
    }
    /// Several objects at once (in parallel where the store can).
    fn get_many(&self, ids: &[ChunkId]) -> Vec<Result<Vec<u8>>> {
        match self.next() {
            Some(n) => n.get_many(ids),
            None => ids.iter().map(|id| self.get(id)).collect(),
        }
    }
    /// [`ChunkRead::get_many`] of `ids` in order while the objects read
    /// add up to at most `budget` bytes: the first that would pass it and
    /// every later one are `None` (what a chunk server sends in one batch
    /// answer). Stores that charge per call (the throttle) override it to
    /// charge once.
    fn get_many_within(&self, ids: &[ChunkId], budget: u64) -> Vec<Option<Result<Vec<u8>>>> {
        match self.next() {
            Some(n) => n.get_many_within(ids, budget),
            None => get_within(self, ids, budget),
        }
    }
    /// Which of `ids` the store holds. With `touch`, every object found
    /// has its reference time refreshed (a commit that reuses an object
    /// must touch it, so a concurrent gc keeps it).
    fn has_many(&self, ids: &[ChunkId], touch: bool) -> Result<Vec<bool>> {
        self.pass(Op::Read, "look up objects")?.has_many(ids, touch)
    }
}

/// [`ChunkRead::get_many_within`] from `get_many`: reads in growing
/// groups, so it holds little more than `budget` in memory whatever the
/// objects' sizes.
fn get_within<S: ChunkRead + ?Sized>(
    store: &S,
    ids: &[ChunkId],
    budget: u64,
) -> Vec<Option<Result<Vec<u8>>>> {
    /// Objects read first, to learn their size.
    const FIRST: usize = 8;
    /// Most objects read together.
    const MOST: usize = 64;
    let mut out: Vec<Option<Result<Vec<u8>>>> = Vec::with_capacity(ids.len());
    let mut used = 0u64;
    let mut group = FIRST;
    while out.len() < ids.len() {
        let part = &ids[out.len()..(out.len() + group).min(ids.len())];
        let mut full = false;
        for r in store.get_many(part) {
            let n = r.as_ref().map_or(0, |b| b.len() as u64);
            // Past the budget: this one and the rest are not sent.
            full = full || n > budget - used;
            if full {
                out.push(None);
            } else {
                used += n;
                out.push(Some(r));
            }
        }
        if full {
            out.resize_with(ids.len(), || None);
            break;
        }
        let avg = (used / out.len() as u64).max(1);
        group = (((budget - used) / avg) as usize).clamp(1, MOST);
    }
    out
}

/// Add objects.
pub trait ChunkWrite: ChunkRead {
    /// Store objects (already sealed envelopes) under their names. Each is
    /// written under a temporary name, made durable and renamed, so a crash
    /// never leaves a partial object under a real name.
    fn put_many(&self, items: &[(ChunkId, &[u8])]) -> Result<Vec<PutOutcome>> {
        self.pass(Op::Write, "store objects")?.put_many(items)
    }
    /// [`ChunkWrite::put_many`] with each object given as two pieces
    /// stored back to back (the envelope header and the payload), so a
    /// caller need not concatenate them. Stores that write files override
    /// it with one vectored write per object.
    fn put_many_parts(&self, items: &[ObjectParts<'_>]) -> Result<Vec<PutOutcome>> {
        if let Some(n) = self.next() {
            return n.put_many_parts(items);
        }
        joined(items, |items| self.put_many(items))
    }
    /// Start a group of puts: objects handed to [`PutGroup::write`] (from
    /// any thread, as they are ready) are stored by [`PutGroup::finish`]
    /// with the guarantees of `put_many` (a local store writes the group as
    /// one pack). A store at the bottom without groups collects copies and
    /// calls `put_many` ([`collect_group`]).
    fn put_group(&self) -> Box<dyn PutGroup + '_> {
        match self.next() {
            Some(n) => n.put_group(),
            None => collect_group(self),
        }
    }
    /// Whether asking about one object (`has_many` of one id) is cheap — a
    /// local lookup, not a round trip: a commit then checks and writes each
    /// chunk as soon as it is hashed, while it is still in the CPU's cache.
    fn cheap_lookups(&self) -> bool {
        self.next().is_some_and(|n| n.cheap_lookups())
    }
    /// How many groups a commit may have being stored at once while it
    /// fills the next (a local store: one, the disk writes while the CPUs
    /// hash; an object store: several uploads overlap their latency).
    fn groups_in_flight(&self) -> usize {
        self.next().map_or(1, |n| n.groups_in_flight())
    }
    /// Make every earlier put durable (directory entries included).
    fn sync(&self) -> Result<()> {
        self.pass(Op::Flush, "sync")?.sync()
    }
}

/// `f` of `items` with each object's two pieces joined into one buffer.
pub fn joined<R>(items: &[ObjectParts<'_>], f: impl FnOnce(&[(ChunkId, &[u8])]) -> R) -> R {
    let joined: Vec<Vec<u8>> = items.iter().map(|(_, p)| p.concat()).collect();
    let items: Vec<(ChunkId, &[u8])> = items
        .iter()
        .zip(&joined)
        .map(|((id, _), b)| (*id, b.as_slice()))
        .collect();
    f(&items)
}

/// Objects written one by one and stored together
/// ([`ChunkWrite::put_group`]).
pub trait PutGroup: Send + Sync {
    /// Hand over one object as two pieces written back to back.
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()>;
    /// Store everything handed over (durable, named); the outcomes in the
    /// order the objects were handed over.
    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>>;
}

/// A [`PutGroup`] that collects copies and stores them with one
/// `put_many` of `store` at the end (stores without a grouped write, and
/// decorators that see each `put_many`).
pub fn collect_group<'a, S: ChunkWrite + ?Sized>(store: &'a S) -> Box<dyn PutGroup + 'a> {
    Box::new(CollectGroup {
        store,
        items: parking_lot::Mutex::new(Vec::new()),
    })
}

struct CollectGroup<'a, S: ChunkWrite + ?Sized> {
    store: &'a S,
    items: parking_lot::Mutex<Vec<(ChunkId, Vec<u8>)>>,
}

impl<S: ChunkWrite + ?Sized> PutGroup for CollectGroup<'_, S> {
    fn write(&self, id: &ChunkId, parts: [&[u8]; 2]) -> Result<()> {
        let bytes = parts.concat();
        self.items.lock().push((*id, bytes));
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<Vec<(ChunkId, PutOutcome)>> {
        let items = self.items.into_inner();
        let refs: Vec<(ChunkId, &[u8])> = items.iter().map(|(id, b)| (*id, &b[..])).collect();
        let out = self.store.put_many(&refs)?;
        Ok(items.iter().map(|(id, _)| *id).zip(out).collect())
    }
}

/// What [`ChunkPrune::remove_many_if_older`] did with each id: the bytes
/// it freed, or `None` where the object was kept (or absent).
pub type Freed = Vec<Option<u64>>;

/// List and remove objects (garbage collection).
pub trait ChunkPrune: ChunkRead {
    /// The store's clock (object times and lease times use it).
    fn now(&self) -> Result<SystemTime> {
        self.pass(Op::Read, "tell the time")?.now()
    }
    /// Call `f` for every stored object.
    fn list_objects(&self, f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
        self.pass(Op::Read, "list objects")?.list_objects(f)
    }
    /// Remove each of `ids` unless it was stored or referenced at or
    /// after `cutoff` (what gc sweeps); atomic with respect to a concurrent
    /// touch (an object is first moved aside, its time re-read, and moved
    /// back if recent). Returns the bytes each freed, or `None` where it
    /// was kept. Stores that keep objects together (packs) rewrite each
    /// pack once.
    fn remove_many_if_older(&self, ids: &[ChunkId], cutoff: SystemTime) -> Result<Freed> {
        self.pass(Op::Trim, "remove objects")?
            .remove_many_if_older(ids, cutoff)
    }
    /// [`ChunkPrune::remove_many_if_older`] of one object.
    fn remove_if_older(&self, id: &ChunkId, cutoff: SystemTime) -> Result<Option<u64>> {
        Ok(self
            .remove_many_if_older(std::slice::from_ref(id), cutoff)?
            .pop()
            .flatten())
    }
    /// The least margin gc must leave before its cutoff with this store
    /// (an S3 store: how much its listings may lag its writes).
    fn min_margin(&self) -> std::time::Duration {
        self.next()
            .map_or(std::time::Duration::ZERO, |n| n.min_margin())
    }
    /// Undo what a crashed gc left half done (objects moved aside are put
    /// back) and remove temporary files older than `cutoff`. Returns
    /// (objects restored, temporary files removed).
    fn recover(&self, cutoff: SystemTime) -> Result<(u64, u64)> {
        self.pass(Op::Write, "recover")?.recover(cutoff)
    }
}

/// Named refs: the catalogs (`USER/IMAGE`), updated by compare-and-swap.
pub trait RefStore: StoreLayer {
    /// A named ref, or `None`.
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.pass(Op::Read, "read catalogs")?.ref_get(name)
    }
    /// Every ref name.
    fn ref_list(&self) -> Result<Vec<String>> {
        self.pass(Op::Read, "list catalogs")?.ref_list()
    }
    /// Compare-and-swap a ref: succeeds (true) only if its current content
    /// hashes to `old` (`None`: the ref must not exist). `new = None`
    /// deletes it. False means someone else changed it: re-read and retry.
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        self.pass(Op::Write, "update catalogs")?
            .ref_update(name, old, new)
    }
    /// Whether catalogs here keep their oldest entries in segment objects
    /// (`docs/formats/cas-catalog.md`): stores whose refs are replaced by
    /// a true compare-and-swap. An S3 store, whose concurrent updates are
    /// merged, keeps each catalog whole (and unseals a catalog it is given
    /// with segments, as through a chunk server).
    fn ref_segments(&self) -> bool {
        self.next().is_none_or(|n| n.ref_segments())
    }
}

/// Leases: commits in progress, which a concurrent gc must respect.
pub trait LeaseStore: StoreLayer {
    /// Register a commit in progress.
    fn lease_begin(&self) -> Result<Lease> {
        self.pass(Op::Write, "take leases")?.lease_begin()
    }
    /// Tell gc the commit is still alive.
    fn lease_refresh(&self, id: &str) -> Result<()> {
        self.pass(Op::Write, "refresh leases")?.lease_refresh(id)
    }
    /// The commit is over (its version is in a catalog, or it failed).
    fn lease_end(&self, id: &str) -> Result<()> {
        self.pass(Op::Write, "end leases")?.lease_end(id)
    }
    /// Every registered lease.
    fn leases(&self) -> Result<Vec<Lease>> {
        self.pass(Op::Read, "list leases")?.leases()
    }
}

/// A whole store: objects (read, write, prune), refs and leases.
pub trait Store: ChunkWrite + ChunkPrune + RefStore + LeaseStore {}

impl<T: ChunkWrite + ChunkPrune + RefStore + LeaseStore + ?Sized> Store for T {}

/// Ref tag used for compare-and-swap: the BLAKE3 hash of the ref's bytes.
pub fn ref_tag(bytes: &[u8]) -> ChunkId {
    ChunkId(*blake3::hash(bytes).as_bytes())
}

/// Fetch one object and verify it against its name (and decrypt it with
/// its convergent key). Errors name the object and the store.
pub fn fetch<S: ChunkRead + ?Sized>(store: &S, id: &ChunkId, key: Option<&Key>) -> Result<Vec<u8>> {
    let raw = store.get(id)?;
    store
        .config()
        .codec()
        .open(id, key, &raw)
        .map_err(|e| context(e, format!("in store {}", store.describe())))
}

/// The codec of a store.
pub fn codec<S: ChunkRead + ?Sized>(store: &S) -> ChunkCodec {
    store.config().codec()
}

/// Whether `p` may be a user or image name: 1-64 of `[A-Za-z0-9._-]`,
/// not starting with a dot.
pub fn is_name_part(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && !p.starts_with('.')
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Validate a ref (catalog) name: `USER/IMAGE`, each part
/// [`is_name_part`].
pub fn check_ref_name(name: &str) -> Result<()> {
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() != 2 || !parts.iter().all(|p| is_name_part(p)) {
        return Err(bad_arg(format!(
            "'{name}' is not USER/IMAGE (each part 1-64 letters, digits, '.', '_' or '-', not starting with '.')"
        )));
    }
    Ok(())
}

/// A store of any kind.
pub type DynStore = Arc<dyn Store>;

/// Who the client is to a chunk server, and which servers it trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// A token file (`USER.SECRET`, made by `roamdisk store user add`).
    pub token_file: Option<PathBuf>,
    /// PEM certificates trusted for `https://` stores instead of the
    /// system's roots: the private CA that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
}

impl Credentials {
    /// These, with what is missing taken from `other`.
    pub fn or(&self, other: &Credentials) -> Credentials {
        Credentials {
            token_file: self.token_file.clone().or_else(|| other.token_file.clone()),
            ca_file: self.ca_file.clone().or_else(|| other.ca_file.clone()),
        }
    }
}

/// What reaches S3 besides a store's location, as the program resolved it
/// (the library reads no environment): the `AWS_*` settings (endpoint,
/// region, keys: `("AWS_REGION", "garage")`...), and where pack indexes are
/// kept across processes (`None`: in memory only).
#[derive(Debug, Clone, Default)]
pub struct S3Env {
    pub aws: Vec<(String, String)>,
    pub index_cache: Option<std::path::PathBuf>,
}

/// Options for opening a store by location (`super::open`).
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Create a local store with this configuration if the directory has
    /// none (never for HTTP stores).
    pub create: Option<StoreConfig>,
    /// Parallel requests for HTTP stores (default 8).
    pub parallel: Option<usize>,
    /// The store's settings as last seen (a session keeps a copy): an
    /// HTTP store that cannot be reached opens with them, so what is
    /// cached or on lookaside media stays readable with no network.
    pub known_config: Option<StoreConfig>,
    /// The token and CA of an HTTP store.
    pub credentials: Credentials,
    /// How an S3 store is reached besides its location: the program's
    /// `AWS_*` settings and where pack indexes are kept.
    pub s3: S3Env,
}

/// The store traits, to bring their methods into scope at once (as
/// `std::io::prelude` does for readers and writers).
pub mod prelude {
    pub use crate::store::api::{
        ChunkPrune, ChunkRead, ChunkWrite, LeaseStore, RefStore, Store, StoreLayer,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names_are_checked() {
        check_ref_name("alice/desktop-1.0").unwrap();
        for bad in ["alice", "a/b/c", "../x", "a/.hidden", "a/b c", "/x", "a/"] {
            assert!(check_ref_name(bad).is_err(), "{bad}");
        }
    }
}
