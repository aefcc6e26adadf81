//! Turning chunk contents into stored objects: hash (on all cores), ask
//! the store which it lacks, seal (compress, encrypt) and upload only
//! those, in parallel, and fill in the index. Used by every commit.
//! Batches ([`Uploader::upload`]) suit remote stores (one "which do you
//! have" per batch); with a local store, [`Uploader::upload_each`] takes
//! each chunk from read to write on one thread while it is in that CPU's
//! cache (memory bandwidth, not the hash, limits a commit of new data).
//!
//! An [`Uploader`] holds a lease in the store for as long as it lives, and
//! touches every object it references (new or reused), so that a gc
//! running at the same time keeps them all (`docs/formats/cas-store.md`,
//! "gc and commits").

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::chunk::{ChunkCodec, Key, HEADER_SIZE};
use crate::error::context;
use crate::hash::ChunkId;
use crate::index::Index;
use crate::store::{ChunkWrite, Lease, LeaseStore, ObjectParts, PutGroup, PutOutcome};
use roamdisk_blockdev::Result;

/// How often a commit refreshes its lease.
const LEASE_REFRESH: Duration = Duration::from_secs(20);

/// What a commit did with the store (`a - b`: what was done between two
/// copies of it).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, derive_more::Sub, derive_more::AddAssign,
)]
pub struct UploadStats {
    /// Chunks looked at.
    pub chunks: u64,
    /// Of those, all-zero chunks (stored as no chunk).
    pub zero_chunks: u64,
    /// Objects the store did not have (uploaded).
    pub new_objects: u64,
    /// Objects the store already had (reused).
    pub reused_objects: u64,
    /// Chunk bytes uploaded (stored sizes, after compression; the
    /// version package is not counted).
    pub uploaded_bytes: u64,
    /// Bytes of chunk content hashed.
    pub hashed_bytes: u64,
}

enum Prep {
    Zero,
    Plain {
        id: ChunkId,
        states: Vec<u8>,
    },
    Sealed {
        id: ChunkId,
        key: Key,
        object: Vec<u8>,
        states: Vec<u8>,
    },
}

/// What became of one chunk in [`Uploader::upload_each`].
struct Each {
    prep: Prep,
    len: usize,
    /// The store had it (touched).
    found: bool,
    /// Handed to the put group: the stored size.
    written: Option<u64>,
}

impl Each {
    fn zero(len: usize) -> Each {
        Each {
            prep: Prep::Zero,
            len,
            found: false,
            written: None,
        }
    }
}

/// How a missing chunk is stored.
enum Stored {
    /// Plain, uncompressed: this header, then chunk `.1` of the batch as
    /// it is.
    Header([u8; HEADER_SIZE], usize),
    /// A sealed envelope.
    Object(Vec<u8>),
}

impl Stored {
    fn parts<'p>(&'p self, chunks: &[(usize, &'p [u8])]) -> [&'p [u8]; 2] {
        match self {
            Stored::Header(h, k) => [h, chunks[*k].1],
            Stored::Object(v) => [v, &[]],
        }
    }

    fn len(&self, chunks: &[(usize, &[u8])]) -> usize {
        self.parts(chunks).iter().map(|p| p.len()).sum()
    }
}

/// A batch hashed, asked about and sealed ([`Uploader::prepare`]),
/// waiting for its puts.
pub struct Prepared {
    preps: Vec<Prep>,
    /// The objects the store lacks, in the order they are put.
    sealed: Vec<(ChunkId, Stored)>,
    /// Distinct objects the store had (touched).
    found: u64,
}

impl Prepared {
    /// The objects this batch puts.
    pub fn ids(&self) -> impl Iterator<Item = &ChunkId> {
        self.sealed.iter().map(|(id, _)| id)
    }

    /// Put the objects the store lacks; `chunks` as given to
    /// [`Uploader::prepare`]. Runs on any thread.
    pub fn put<S: ChunkWrite + ?Sized>(
        &self,
        store: &S,
        chunks: &[(usize, &[u8])],
    ) -> Result<Vec<PutOutcome>> {
        if self.sealed.is_empty() {
            return Ok(Vec::new());
        }
        let items: Vec<ObjectParts<'_>> = self
            .sealed
            .iter()
            .map(|(id, o)| (*id, o.parts(chunks)))
            .collect();
        store.put_many_parts(&items)
    }
}

/// Uploads chunks for one commit.
pub struct Uploader<'a, S: ChunkWrite + LeaseStore + ?Sized> {
    store: &'a S,
    codec: ChunkCodec,
    encrypt: bool,
    lease: Lease,
    last_refresh: Mutex<Instant>,
    pub stats: UploadStats,
    /// The part of `stats` that was the memory image.
    pub memory: UploadStats,
}

impl<'a, S: ChunkWrite + LeaseStore + ?Sized> Uploader<'a, S> {
    /// Take a lease and get ready. `encrypt`: convergent encryption.
    pub fn begin(store: &'a S, encrypt: bool) -> Result<Self> {
        let lease = store.lease_begin()?;
        Ok(Uploader {
            store,
            codec: store.config().codec(),
            encrypt,
            lease,
            last_refresh: Mutex::new(Instant::now()),
            stats: UploadStats::default(),
            memory: UploadStats::default(),
        })
    }

    /// The store's hash function.
    pub fn hash(&self) -> crate::hash::HashKind {
        self.codec.hash
    }

    fn refresh(&self) -> Result<()> {
        let mut last = self.last_refresh.lock();
        if last.elapsed() > LEASE_REFRESH {
            self.store.lease_refresh(&self.lease.id)?;
            *last = Instant::now();
        }
        Ok(())
    }

    /// Refresh the lease now, however recently it was: an error if it is
    /// gone — a gc took the commit for dead (it was stopped for longer
    /// than the lease timeout) and may have removed what it uploaded.
    pub fn confirm_lease(&self) -> Result<()> {
        self.store.lease_refresh(&self.lease.id)?;
        *self.last_refresh.lock() = Instant::now();
        Ok(())
    }

    /// Touch `ids` (uploaded earlier, by another uploader) under this
    /// uploader's lease, so that a gc keeps them until the version naming
    /// them is in the catalog; an error if any is gone.
    pub fn claim(&self, ids: &[ChunkId]) -> Result<()> {
        self.refresh()?;
        let ids: Vec<ChunkId> = ids.iter().filter(|id| !id.is_zero()).copied().collect();
        let have = self.store.has_many(&ids, true)?;
        if let Some((id, _)) = ids.iter().zip(&have).find(|(_, h)| !**h) {
            return Err(crate::error::corrupt(format!(
                "object {id}, uploaded earlier in this commit, is gone from the store (a gc removed it?)"
            )));
        }
        Ok(())
    }

    /// Store `chunks` (record number, content) and set their records in
    /// `index`. Content shorter than the chunk size is allowed only for
    /// the last record.
    pub fn upload(&mut self, index: &mut Index, chunks: &[(usize, &[u8])]) -> Result<()> {
        let prepared = self.prepare(index, chunks, &HashSet::new())?;
        let outcomes = prepared.put(self.store, chunks);
        self.account_batch(index, chunks, prepared, outcomes)
    }

    /// The store this uploader writes to.
    pub fn store(&self) -> &'a S {
        self.store
    }

    /// The first part of [`Uploader::upload`]: hash `chunks`, ask the
    /// store which it lacks and seal those. Objects in `in_flight` (being
    /// put by a batch prepared earlier and not yet accounted) are not
    /// asked about nor put again. [`Prepared::put`] then stores the batch
    /// (on any thread) and [`Uploader::account_batch`] sets its records,
    /// so the next batch can be hashed while this one is uploaded.
    pub fn prepare(
        &self,
        index: &Index,
        chunks: &[(usize, &[u8])],
        in_flight: &HashSet<ChunkId>,
    ) -> Result<Prepared> {
        self.refresh()?;
        let codec = self.codec;
        let encrypt = self.encrypt;
        let mut preps: Vec<Prep> = chunks
            .par_iter()
            .map(|(_, data)| {
                let (all_zero, states) = index.content_states(data);
                if all_zero {
                    return Prep::Zero;
                }
                if encrypt {
                    let s = codec.seal(data, true);
                    Prep::Sealed {
                        id: s.id,
                        key: s.key.expect("encrypted chunk has a key"),
                        object: s.object,
                        states,
                    }
                } else {
                    Prep::Plain {
                        id: codec.hash.hash(data),
                        states,
                    }
                }
            })
            .collect();
        // Which distinct objects does the store lack?
        let mut wanted: Vec<ChunkId> = Vec::new();
        let mut first: HashMap<ChunkId, usize> = HashMap::new();
        for (k, p) in preps.iter().enumerate() {
            if let Prep::Plain { id, .. } | Prep::Sealed { id, .. } = p {
                if !in_flight.contains(id) && !first.contains_key(id) {
                    first.insert(*id, k);
                    wanted.push(*id);
                }
            }
        }
        let have = self.store.has_many(&wanted, true)?;
        let missing: Vec<usize> = wanted
            .iter()
            .zip(&have)
            .filter(|(_, h)| !**h)
            .map(|(id, _)| first[id])
            .collect();
        // A plain chunk stored uncompressed is written as a 16-byte header
        // and the chunk itself, straight from the caller's buffer; others
        // are sealed (compressed, encrypted) first.
        let mut sealed: Vec<(ChunkId, Stored)> = missing
            .par_iter()
            .map(|&k| match &preps[k] {
                Prep::Plain { id, .. } => {
                    let data = chunks[k].1;
                    let object = match codec.zstd_level {
                        None => Stored::Header(codec.plain_header(data.len()), k),
                        Some(_) => Stored::Object(codec.seal_plain(*id, data).object),
                    };
                    (*id, object)
                }
                Prep::Sealed { id, .. } => (*id, Stored::Object(Vec::new())),
                Prep::Zero => unreachable!("zero chunks are never uploaded"),
            })
            .collect();
        // Encrypted envelopes move out of the preps (sealed while hashing).
        for ((_, o), &k) in sealed.iter_mut().zip(&missing) {
            if let Prep::Sealed { object, .. } = &mut preps[k] {
                *o = Stored::Object(std::mem::take(object));
            }
        }
        Ok(Prepared {
            found: (wanted.len() - sealed.len()) as u64,
            preps,
            sealed,
        })
    }

    /// The last part of [`Uploader::upload`]: count what the batch's puts
    /// did (`outcomes`, from [`Prepared::put`]) and set its records.
    pub fn account_batch(
        &mut self,
        index: &mut Index,
        chunks: &[(usize, &[u8])],
        prepared: Prepared,
        outcomes: Result<Vec<PutOutcome>>,
    ) -> Result<()> {
        let outcomes = outcomes.map_err(|e| {
            context(
                e,
                "commit stopped while uploading chunks; the previous version is intact",
            )
        })?;
        for ((_, o), out) in prepared.sealed.iter().zip(&outcomes) {
            if *out == PutOutcome::Stored {
                self.stats.new_objects += 1;
                self.stats.uploaded_bytes += o.len(chunks) as u64;
            } else {
                self.stats.reused_objects += 1;
            }
        }
        self.stats.reused_objects += prepared.found;
        for ((i, data), p) in chunks.iter().zip(prepared.preps) {
            self.stats.chunks += 1;
            if !matches!(p, Prep::Zero) {
                self.stats.hashed_bytes += data.len() as u64;
            }
            match p {
                Prep::Zero => {
                    self.stats.zero_chunks += 1;
                    index.set_zero(*i);
                }
                Prep::Plain { id, states } => index.set_record_states(*i, id, None, &states),
                Prep::Sealed {
                    id, key, states, ..
                } => index.set_record_states(*i, id, Some(key), &states),
            }
        }
        Ok(())
    }

    /// Whether [`Uploader::upload_each`] suits the store.
    pub fn per_chunk(&self) -> bool {
        self.store.cheap_lookups()
    }

    /// Store the chunks `records`, each read by `read(record, buf)` on
    /// the worker thread that then hashes it, asks the store about it and
    /// writes it if new — so a chunk stays in that CPU's cache from the
    /// read to the write. For stores with cheap lookups
    /// ([`ChunkWrite::cheap_lookups`]). Every `group_len` records form one
    /// group of puts (a pack in a local store); a group is made durable
    /// and named on its own thread while the workers go on with the next
    /// one (so the disk writes while the CPUs hash), at most
    /// [`ChunkWrite::groups_in_flight`] groups behind. Returns when every
    /// group is stored.
    pub fn upload_each(
        &mut self,
        index: &mut Index,
        records: &[usize],
        group_len: usize,
        chunk_size: usize,
        read: &(dyn Fn(usize, &mut Vec<u8>) -> Result<()> + Sync),
    ) -> Result<()> {
        let stopped = |e| {
            context(
                e,
                "commit stopped while uploading chunks; the previous version is intact",
            )
        };
        let store = self.store;
        let limit = store.groups_in_flight().max(1);
        std::thread::scope(|scope| -> Result<()> {
            // The groups being sealed, oldest first: their records, what
            // became of each, the thread making the group durable and
            // naming it, and the ids it claimed.
            type Sealing<'s> =
                std::thread::ScopedJoinHandle<'s, Result<Vec<(ChunkId, PutOutcome)>>>;
            type Behind<'r, 's> = (&'r [usize], Vec<Each>, Sealing<'s>, HashSet<ChunkId>);
            let mut behind: std::collections::VecDeque<Behind<'_, '_>> =
                std::collections::VecDeque::new();
            // Ids claimed by a chunk of a group being sealed: a duplicate
            // in a later group is not written again (the store cannot
            // answer for a group it has not named yet).
            let mut sealing_ids: HashSet<ChunkId> = HashSet::new();
            for recs in records.chunks(group_len.max(1)) {
                self.refresh()?;
                let group = store.put_group();
                let claimed: Mutex<HashSet<ChunkId>> = Mutex::new(HashSet::new());
                let done = self
                    .each_of_group(
                        index,
                        recs,
                        chunk_size,
                        read,
                        &*group,
                        &sealing_ids,
                        &claimed,
                    )
                    .map_err(stopped)?;
                while behind.len() >= limit {
                    let (recs, done, h, ids) = behind.pop_front().expect("a group behind");
                    let outcomes = h.join().expect("sealing thread").map_err(stopped)?;
                    self.account(index, recs, &done, outcomes);
                    for id in &ids {
                        sealing_ids.remove(id);
                    }
                }
                let claimed = claimed.into_inner();
                sealing_ids.extend(claimed.iter().copied());
                behind.push_back((recs, done, scope.spawn(move || group.finish()), claimed));
            }
            while let Some((recs, done, h, _)) = behind.pop_front() {
                let outcomes = h.join().expect("sealing thread").map_err(stopped)?;
                self.account(index, recs, &done, outcomes);
            }
            Ok(())
        })
    }

    /// The workers' part of [`Uploader::upload_each`] for one group: read,
    /// hash, ask, write each chunk into `group`.
    #[allow(clippy::too_many_arguments)]
    fn each_of_group(
        &self,
        index: &Index,
        records: &[usize],
        chunk_size: usize,
        read: &(dyn Fn(usize, &mut Vec<u8>) -> Result<()> + Sync),
        group: &dyn PutGroup,
        sealing: &HashSet<ChunkId>,
        claimed: &Mutex<HashSet<ChunkId>>,
    ) -> Result<Vec<Each>> {
        let codec = self.codec;
        let encrypt = self.encrypt;
        let store = self.store;
        records
            .par_iter()
            .map_init(
                || Vec::with_capacity(chunk_size),
                |buf, &i| -> Result<Each> {
                    // A group can take long at a low --limit-rate.
                    self.refresh()?;
                    read(i, buf)?;
                    let data = &buf[..];
                    let (all_zero, states) = index.content_states(data);
                    if all_zero {
                        return Ok(Each::zero(data.len()));
                    }
                    let (prep, sealed) = if encrypt {
                        let s = codec.seal(data, true);
                        let prep = Prep::Sealed {
                            id: s.id,
                            key: s.key.expect("encrypted chunk has a key"),
                            object: Vec::new(),
                            states,
                        };
                        (prep, Some(s.object))
                    } else {
                        let id = codec.hash.hash(data);
                        (Prep::Plain { id, states }, None)
                    };
                    let id = match &prep {
                        Prep::Plain { id, .. } | Prep::Sealed { id, .. } => *id,
                        Prep::Zero => unreachable!(),
                    };
                    let mut each = Each {
                        prep,
                        len: data.len(),
                        found: false,
                        written: None,
                    };
                    if sealing.contains(&id) || !claimed.lock().insert(id) {
                        return Ok(each);
                    }
                    if store.has_many(&[id], true)?[0] {
                        each.found = true;
                        return Ok(each);
                    }
                    let size = match (sealed, codec.zstd_level) {
                        (Some(object), _) => {
                            group.write(&id, [&object, &[]])?;
                            object.len()
                        }
                        (None, None) => {
                            let header = codec.plain_header(data.len());
                            group.write(&id, [&header, data])?;
                            header.len() + data.len()
                        }
                        (None, Some(_)) => {
                            let object = codec.seal_plain(id, data).object;
                            group.write(&id, [&object, &[]])?;
                            object.len()
                        }
                    };
                    each.written = Some(size as u64);
                    Ok(each)
                },
            )
            .collect()
    }

    /// Set the index records of a stored group and count what it did.
    fn account(
        &mut self,
        index: &mut Index,
        records: &[usize],
        done: &[Each],
        outcomes: Vec<(ChunkId, PutOutcome)>,
    ) {
        let mut stored: HashMap<ChunkId, PutOutcome> = HashMap::new();
        for (id, o) in outcomes {
            stored.entry(id).or_insert(o);
        }
        for (&i, e) in records.iter().zip(done) {
            self.stats.chunks += 1;
            match &e.prep {
                Prep::Zero => {
                    self.stats.zero_chunks += 1;
                    index.set_zero(i);
                    continue;
                }
                Prep::Plain { id, states } => index.set_record_states(i, *id, None, states),
                Prep::Sealed {
                    id, key, states, ..
                } => index.set_record_states(i, *id, Some(*key), states),
            }
            self.stats.hashed_bytes += e.len as u64;
            if e.found {
                self.stats.reused_objects += 1;
            }
            if let (Some(size), Prep::Plain { id, .. } | Prep::Sealed { id, .. }) =
                (e.written, &e.prep)
            {
                if stored.get(id) == Some(&PutOutcome::Stored) {
                    self.stats.new_objects += 1;
                    self.stats.uploaded_bytes += size;
                } else {
                    self.stats.reused_objects += 1;
                }
            }
        }
    }

    /// Store a version package (or any whole object); returns its name.
    pub fn put_object(&mut self, bytes: &[u8]) -> Result<ChunkId> {
        self.refresh()?;
        put_plain_object(self.store, bytes, false)
    }

    /// Make everything uploaded so far durable.
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }
}

/// Store `bytes` as one plain object (compressed if the store compresses)
/// and return its name. `touch_existing`: ask first, and only touch an
/// object already stored (its time renewed, so a gc running now keeps it).
pub fn put_plain_object<S: ChunkWrite + ?Sized>(
    store: &S,
    bytes: &[u8],
    touch_existing: bool,
) -> Result<ChunkId> {
    let codec = store.config().codec();
    let id = codec.hash.hash(bytes);
    if touch_existing && store.has_many(&[id], true)?[0] {
        return Ok(id);
    }
    match codec.zstd_level {
        None => {
            let header = codec.plain_header(bytes.len());
            store.put_many_parts(&[(id, [&header, bytes])])?;
        }
        Some(_) => {
            let sealed = codec.seal_plain(id, bytes);
            store.put_many(&[(id, &sealed.object)])?;
        }
    }
    Ok(id)
}

impl<S: ChunkWrite + LeaseStore + ?Sized> Drop for Uploader<'_, S> {
    fn drop(&mut self) {
        if let Err(e) = self.store.lease_end(&self.lease.id) {
            tracing::warn!(error = %e, lease = %self.lease.id, "cannot end the commit lease; gc will expire it");
        }
    }
}
