//! Turning chunk contents into stored objects: hash (on all cores), ask
//! the store which it lacks, seal (compress, encrypt) and upload only
//! those, in parallel, and fill in the index. Used by every commit.
//!
//! An [`Uploader`] holds a lease in the store for as long as it lives, and
//! touches every object it references (new or reused), so that a gc
//! running at the same time keeps them all (`docs/formats/cas-store.md`,
//! "gc and commits").

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::chunk::{ChunkCodec, Key};
use crate::error::context;
use crate::hash::ChunkId;
use crate::index::Index;
use crate::store::{ChunkWrite, Lease, PutOutcome};
use roamdisk_blockdev::Result;

/// How often a commit refreshes its lease.
const LEASE_REFRESH: Duration = Duration::from_secs(20);

/// What a commit did with the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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

/// Uploads chunks for one commit.
pub struct Uploader<'a, S: ChunkWrite + ?Sized> {
    store: &'a S,
    codec: ChunkCodec,
    encrypt: bool,
    lease: Lease,
    last_refresh: Mutex<Instant>,
    pub stats: UploadStats,
}

impl<'a, S: ChunkWrite + ?Sized> Uploader<'a, S> {
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
        })
    }

    /// The store's hash function.
    pub fn hash(&self) -> crate::hash::HashKind {
        self.codec.hash
    }

    fn refresh(&self) -> Result<()> {
        let mut last = self.last_refresh.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() > LEASE_REFRESH {
            self.store.lease_refresh(&self.lease.id)?;
            *last = Instant::now();
        }
        Ok(())
    }

    /// Store `chunks` (record number, content) and set their records in
    /// `index`. Content shorter than the chunk size is allowed only for
    /// the last record.
    pub fn upload(&mut self, index: &mut Index, chunks: &[(usize, &[u8])]) -> Result<()> {
        self.refresh()?;
        let codec = self.codec;
        let encrypt = self.encrypt;
        let preps: Vec<Prep> = chunks
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
                if !first.contains_key(id) {
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
        let sealed: Vec<(ChunkId, Vec<u8>)> = missing
            .par_iter()
            .map(|&k| match &preps[k] {
                Prep::Plain { id, .. } => (*id, codec.seal_plain(*id, chunks[k].1).object),
                Prep::Sealed { id, object, .. } => (*id, object.clone()),
                Prep::Zero => unreachable!("zero chunks are never uploaded"),
            })
            .collect();
        let items: Vec<(ChunkId, &[u8])> =
            sealed.iter().map(|(id, o)| (*id, o.as_slice())).collect();
        let outcomes = self.store.put_many(&items).map_err(|e| {
            context(
                e,
                "commit stopped while uploading chunks; the previous version is intact",
            )
        })?;
        for ((_, o), out) in sealed.iter().zip(&outcomes) {
            if *out == PutOutcome::Stored {
                self.stats.new_objects += 1;
                self.stats.uploaded_bytes += o.len() as u64;
            } else {
                self.stats.reused_objects += 1;
            }
        }
        self.stats.reused_objects += wanted.len() as u64 - sealed.len() as u64;
        for ((i, data), p) in chunks.iter().zip(&preps) {
            self.stats.chunks += 1;
            if !matches!(p, Prep::Zero) {
                self.stats.hashed_bytes += data.len() as u64;
            }
            match p {
                Prep::Zero => {
                    self.stats.zero_chunks += 1;
                    index.set_zero(*i);
                }
                Prep::Plain { id, states } => index.set_record_states(*i, *id, None, states),
                Prep::Sealed {
                    id, key, states, ..
                } => index.set_record_states(*i, *id, Some(*key), states),
            }
        }
        Ok(())
    }

    /// Store a version package (or any whole object); returns its name.
    pub fn put_object(&mut self, bytes: &[u8]) -> Result<ChunkId> {
        self.refresh()?;
        let id = self.codec.hash.hash(bytes);
        let sealed = self.codec.seal_plain(id, bytes);
        self.store.put_many(&[(id, &sealed.object)])?;
        Ok(id)
    }

    /// Make everything uploaded so far durable.
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }
}

impl<S: ChunkWrite + ?Sized> Drop for Uploader<'_, S> {
    fn drop(&mut self) {
        if let Err(e) = self.store.lease_end(&self.lease.id) {
            tracing::warn!(error = %e, lease = %self.lease.id, "cannot end the commit lease; gc will expire it");
        }
    }
}
