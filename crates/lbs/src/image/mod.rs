//! The LBS device: write buffer, LBN→PBN map, verified reads, barriers,
//! garbage collection and log compaction over a data [`BlockDev`] and a
//! metadata [`LogStore`]. This file holds the state and opening (replay,
//! rollback to the last barrier); each job has its own file:
//!
//! | file | job |
//! |---|---|
//! | `write.rs` | write buffer, barriers, cluster allocation, unmap |
//! | `read.rs` | resolve, read, decrypt and verify; the whole-image check |
//! | `gc_mover.rs` | victim moves and the background collector thread |
//! | `compact.rs` | metadata log compaction |
//! | `dev.rs` | the `BlockDev` operations that dispatch to the above |
//!
//! Locking: one mutex guards the map, the cluster table, the write buffer
//! and the log. Reads resolve their blocks under it, take the `reuse` read
//! lock before letting it go, and do their data I/O without it; a cluster is
//! handed to the write position only under the `reuse` write lock, so no
//! read is ever in flight on a cluster that is being overwritten.

mod compact;
mod dev;
mod gc_mover;
mod read;
mod write;

/// The image's state lock, its collector's condition variable and the
/// block-reuse lock are std's (futex) primitives, not parking_lot's like
/// the rest of roamdisk: with clients' writes and the collector contending
/// for the state, std's measured 5-6% faster on a full image
/// (`bench/ab.py --rows lbs-steady`, 3 passes, hot/cold 23,125 against
/// 22,035 IOPS, zipf:1.1 28,476 against 26,789; docs/BENCHMARKS.md, issue
/// 23). Poisoning is ignored as parking_lot does: a panic while holding the
/// lock does not make the image unusable to other threads.
#[allow(
    clippy::disallowed_types,
    reason = "measured faster for the image state; see the module's doc"
)]
mod stdlock {
    use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard};
    use std::time::Duration;

    /// `std::sync::Condvar` for a [`StateLock`].
    #[derive(Default)]
    pub struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Self::default()
        }
        pub fn notify_all(&self) {
            self.0.notify_all()
        }
        /// Wait until notified or `timeout` passed; the lock is held again
        /// on return.
        pub fn wait_for<'a, T>(
            &self,
            g: MutexGuard<'a, T>,
            timeout: Duration,
        ) -> MutexGuard<'a, T> {
            match self.0.wait_timeout(g, timeout) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            }
        }
    }

    /// `std::sync::Mutex` whose `lock` ignores poisoning.
    pub struct StateLock<T>(std::sync::Mutex<T>);

    impl<T> StateLock<T> {
        pub fn new(t: T) -> Self {
            StateLock(std::sync::Mutex::new(t))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }
    }

    /// `std::sync::RwLock` whose `read` and `write` ignore poisoning.
    pub struct RwLock<T>(std::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub fn new(t: T) -> Self {
            RwLock(std::sync::RwLock::new(t))
        }
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|p| p.into_inner())
        }
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|p| p.into_inner())
        }
    }
}

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use stdlock::{Condvar, RwLock, StateLock};

use roamdisk_blockdev::{
    Alloc, BlockDev, Caps, Error, ErrorKind, Extent, Op, Result, WriteFlags, ZeroFlags,
};

use crate::checksum::ChecksumKind;
use crate::format::{encode_entry, DataSuper, Entry, Geometry, MetaHeader, SUPERBLOCK_SIZE};
use crate::gc::{is_moved, ClusterState, GcPolicy, HOT, STREAMS};
use crate::replay::{replay, IN_PLACE, UNMAPPED, ZERO};
use crate::storage::LogStore;
use crate::victims::{ClusterView, VictimIndex};
use roamdisk_crypto::Xts;

/// A slot in the write buffer whose block was zeroed or trimmed after it
/// was buffered: written to disk but never mapped.
const DEAD: u64 = u64::MAX;
/// A PBN holding no live block, in the reverse map.
const NO_LBN: u32 = u32::MAX;
/// Clusters in front of another stream's active cluster that a stream
/// does not take while it finds others (at most an eighth of the image).
const STREAM_GAP: u64 = 32;
/// Clusters kept for the garbage collector's own moves.
const GC_RESERVE: u64 = 1;

/// Options for opening an image.
#[derive(Debug, Clone)]
pub struct LbsOptions {
    pub read_only: bool,
    /// Write buffer size in bytes (default 256 KiB).
    pub buffer_size: usize,
    /// Run the garbage collector in a background thread (otherwise it runs
    /// only when a write finds no free cluster).
    pub background_gc: bool,
    /// GC watermarks and weights; `None` = defaults for the image size.
    pub gc: Option<GcPolicy>,
    /// Compact the metadata log when it grows past this many bytes and
    /// twice its length after the last compaction (so a large image, whose
    /// compacted map alone may pass the limit, compacts after as many bytes
    /// of new entries as the map takes, not at every barrier).
    pub compact_limit: u64,
}

impl Default for LbsOptions {
    fn default() -> Self {
        LbsOptions {
            read_only: false,
            buffer_size: 256 * 1024,
            background_gc: true,
            gc: None,
            compact_limit: 64 << 20,
        }
    }
}

/// Counters, for `lbs info`, benchmarks and the write-amplification figure.
#[derive(Debug, Default)]
pub struct Stats {
    /// Blocks clients asked to write (after RMW of partial blocks).
    pub client_blocks: AtomicU64,
    /// Overwrites absorbed in the write buffer.
    pub absorbed: AtomicU64,
    /// Blocks written to the data file (client, GC moves, dead slots).
    pub physical_blocks: AtomicU64,
    /// Blocks moved by the garbage collector.
    pub gc_moved: AtomicU64,
    /// Clusters reclaimed by the garbage collector.
    pub gc_clusters: AtomicU64,
    pub barriers: AtomicU64,
    pub compactions: AtomicU64,
    /// Checksum failures seen on read.
    pub integrity_errors: AtomicU64,
    /// Blocks put into each write stream (`crate::gc::WARM` ..).
    pub stream_blocks: [AtomicU64; STREAMS],
    /// Times a client's write found no cluster and retired every stream's
    /// active cluster to let the collector at their free slots.
    pub retires: AtomicU64,
}

/// A snapshot of [`Stats`] plus space figures. Serialised, it is the
/// counters object `roamdisk serve` prints for each image as it stops
/// (`roamdisk: lbs counters of NAME: {...}`): what the collector did
/// (`gc_moved`, `gc_clusters`) next to what clients wrote
/// (`client_blocks`) and what reached the data file (`physical_blocks`),
/// and the space; the per-stream counts, retires and log size are left
/// out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    pub client_blocks: u64,
    pub absorbed: u64,
    pub physical_blocks: u64,
    pub gc_moved: u64,
    pub gc_clusters: u64,
    pub barriers: u64,
    pub compactions: u64,
    pub integrity_errors: u64,
    /// Blocks put into each write stream (`crate::gc::WARM` ..).
    #[serde(skip)]
    pub stream_blocks: [u64; STREAMS],
    #[serde(skip)]
    pub retires: u64,
    pub free_clusters: u64,
    pub used_clusters: u64,
    pub mapped_blocks: u64,
    pub zero_blocks: u64,
    #[serde(skip)]
    pub log_bytes: u64,
}

/// Where a block was sealed (encrypted and checksummed): PBN and epoch.
/// Its XTS tweak and its checksum's epoch; a move keeps it.
type Seal = (u64, u64);

struct WriteBuf {
    /// PBN of slot 0.
    base: u64,
    lbns: Vec<u64>,
    /// Per slot: `None` for a client's block (plaintext, sealed at this
    /// slot when the buffer is written), or the seal of a moved block
    /// (its bytes as on disk: ciphertext, written as they are).
    seals: Vec<Option<Seal>>,
    /// `lbns.len() * block_size` bytes.
    data: Vec<u8>,
    index: HashMap<u64, usize>,
}

/// A write position: its active cluster and the buffer mapping to the
/// next PBNs of it. There is one per temperature (`crate::gc::STREAMS`:
/// clients' warm and hot writes, the collector's cold and hot moves), so
/// data of one temperature fills clusters of its own.
struct Stream {
    active: Option<usize>,
    /// Where the search for this stream's next cluster starts: after its
    /// last one (kept when an active cluster is retired).
    next: usize,
    buf: WriteBuf,
}

impl Stream {
    fn new(next: usize) -> Stream {
        Stream {
            active: None,
            next,
            buf: WriteBuf {
                base: 0,
                lbns: Vec::new(),
                seals: Vec::new(),
                data: Vec::new(),
                index: HashMap::new(),
            },
        }
    }
}

struct State {
    l2p: Vec<u32>,
    sums: Vec<u8>,
    epochs: Vec<u64>,
    /// Each LBN's seal when it was moved ([`IN_PLACE`]: sealed where it
    /// lies, in its cluster's epoch).
    seal_pbn: Vec<u32>,
    seal_epoch: Vec<u64>,
    /// The reverse map: the LBN each PBN holds, or [`NO_LBN`] (derived
    /// at open; lets the collector find a victim's live blocks without
    /// scanning the whole map).
    p2l: Vec<u32>,
    live: Vec<u32>,
    cstate: Vec<ClusterState>,
    pending: Vec<usize>,
    free: u64,
    streams: [Stream; STREAMS],
    /// Per cluster: the stream that last wrote it, when it was activated
    /// on `clock` (the number of activations so far) and how many blocks
    /// were written into it since: how fast its data dies, for the victim
    /// score and to spot hot blocks.
    stream_of: Vec<u8>,
    activated: Vec<u64>,
    written: Vec<u32>,
    clock: u64,
    /// The collector's candidates, kept up to date by [`State::touch`]
    /// after every change of a cluster's tables above.
    victims: VictimIndex,
    /// Per LBN: its last client write on `clock` (`crate::gc::STAMP_FLAG`);
    /// kept across reopen by the compaction's STAMPS entries.
    stamps: Vec<u16>,
    /// Activations per stamp unit, and stamp units per pass.
    stamp_unit: u64,
    stamp_pass: u64,
    log: Box<dyn LogStore>,
    /// The log's length after the last compaction.
    compacted: u64,
    seq: u64,
    barrier_no: u64,
    running: u32,
    dirty: bool,
    generation: u64,
    epoch_counter: u32,
    /// Set after a failed data or log write: the in-memory state may be
    /// ahead of the disk, so every later write-like call is refused.
    poisoned: Option<String>,
}

impl State {
    /// The cluster tables, as the victim index reads them.
    fn clusters(&self) -> ClusterView<'_> {
        ClusterView {
            states: &self.cstate,
            live: &self.live,
            stream: &self.stream_of,
            activated: &self.activated,
            written: &self.written,
        }
    }

    /// Cluster `c`'s state, live or written count, stream or activation
    /// changed: keep the victim index up to date.
    fn touch(&mut self, c: usize) {
        let v = ClusterView {
            states: &self.cstate,
            live: &self.live,
            stream: &self.stream_of,
            activated: &self.activated,
            written: &self.written,
        };
        self.victims.refresh(c, &v);
    }
}

/// The shared state of an open image (the GC thread holds it too).
pub struct Inner {
    data: Arc<dyn BlockDev>,
    header: MetaHeader,
    geo: Geometry,
    bs: usize,
    bpc: u64,
    width: usize,
    cipher: Option<Xts>,
    opts: LbsOptions,
    policy: GcPolicy,
    state: StateLock<State>,
    reuse: RwLock<()>,
    gc_wake: Condvar,
    stop: AtomicBool,
    stats: Stats,
    describe: String,
}

/// A block to read: (lbn, pbn, seal, checksum).
type BlockRef = (u64, u64, Seal, [u8; 16]);

/// A buffer whose start is aligned for O_DIRECT.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

/// Alignment of data-file buffers.
pub const ALIGN: usize = 4096;

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN);
        AlignedBuf { raw, start, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

fn err(kind: ErrorKind, op: Op, msg: impl Into<String>) -> Error {
    Error::new(kind, op, "lbs", msg)
}

fn log_err(op: Op, e: std::io::Error) -> Error {
    Error::io(op, "lbs", e).msg("metadata log")
}

impl Inner {
    /// Open an image from its data device and metadata log. `key` is
    /// required for encrypted images and checked against the header.
    fn open(
        data: Arc<dyn BlockDev>,
        mut log: Box<dyn LogStore>,
        key: Option<[u8; 64]>,
        opts: LbsOptions,
    ) -> Result<Arc<Inner>> {
        let bytes = log.read_all().map_err(|e| log_err(Op::Open, e))?;
        let mut header = MetaHeader::parse(&bytes).map_err(|e| {
            err(
                ErrorKind::Corrupt,
                Op::Open,
                format!("{}: not a usable LBS metadata file: {e}", log.describe()),
            )
        })?;
        let mut sb = AlignedBuf::new(SUPERBLOCK_SIZE);
        data.read_at(sb.as_mut_slice(), 0)?;
        let ds = DataSuper::parse(sb.as_slice()).map_err(|e| {
            err(
                ErrorKind::Corrupt,
                Op::Open,
                format!("data file: not a usable LBS data file: {e}"),
            )
        })?;
        if ds.uuid != header.uuid || ds.geometry != header.geometry {
            return Err(err(
                ErrorKind::InvalidArgument,
                Op::Open,
                "the data and metadata files belong to different images",
            ));
        }
        if data.size() < header.geometry.data_file_len() {
            return Err(err(
                ErrorKind::Corrupt,
                Op::Open,
                format!(
                    "data file is {} bytes, needs {}: truncated",
                    data.size(),
                    header.geometry.data_file_len()
                ),
            ));
        }
        let encrypted = header.cipher != crate::format::Cipher::None;
        if ds.encrypted != encrypted {
            return Err(err(
                ErrorKind::Corrupt,
                Op::Open,
                "data and metadata disagree about encryption",
            ));
        }
        let cipher = if encrypted {
            let key = key.ok_or_else(|| {
                err(ErrorKind::PermissionDenied, Op::Open, "the image is encrypted: give its key file (key-file=) or passphrase (passphrase-file=)")
            })?;
            if roamdisk_crypto::key_check(&key) != header.key_check {
                return Err(err(
                    ErrorKind::PermissionDenied,
                    Op::Open,
                    "wrong key or passphrase for this image",
                ));
            }
            Some(
                Xts::new(&key)
                    .map_err(|m| err(ErrorKind::InvalidArgument, Op::Open, m.to_string()))?,
            )
        } else {
            None
        };
        let r = replay(&bytes, &header).map_err(|e| {
            err(
                ErrorKind::Corrupt,
                Op::Open,
                format!("{}: {e}", log.describe()),
            )
        })?;
        if r.discarded > 0 {
            tracing::warn!(
                log = %log.describe(),
                bytes = r.discarded,
                reason = ?r.stop,
                "rolled back the metadata log to its last valid barrier (writes after the last flush are discarded)"
            );
        }
        if !opts.read_only && header.version < crate::format::VERSION {
            // The compaction below rewrites the log in the current
            // version (a version-1 log is a valid version-2 log).
            tracing::info!(
                log = %log.describe(),
                from = header.version,
                to = crate::format::VERSION,
                "upgrading the metadata log's format version"
            );
            header.version = crate::format::VERSION;
        }
        let geo = header.geometry;
        let bpc = geo.blocks_per_cluster();
        let live = r.map.live_counts(bpc);
        let cstate: Vec<ClusterState> = live
            .iter()
            .map(|&l| {
                if l > 0 {
                    ClusterState::Used
                } else {
                    ClusterState::Free
                }
            })
            .collect();
        let free = cstate.iter().filter(|s| **s == ClusterState::Free).count() as u64;
        let policy = opts
            .gc
            .unwrap_or_else(|| GcPolicy::for_clusters(geo.clusters));
        let describe = format!(
            "lbs ({} blocks of {} B, cluster {} KiB, {} clusters, {}{})",
            header.logical_blocks(),
            geo.block_size,
            geo.cluster_size / 1024,
            geo.clusters,
            header.checksum.name(),
            if encrypted { ", xts-aes-256" } else { "" }
        );
        // What the collector knew at the last compaction (version 3: the
        // clusters' activations, streams and written counts, the blocks'
        // write stamps) holds for clusters still in the same use. Clusters
        // without such a hint (activated since, or an older log) count as
        // warm and activated after the hinted ones, in the order of their
        // epochs; how fast their data dies is measured afresh (written =
        // live).
        let hints = r.hints;
        let base = hints.clock;
        let mut activated = vec![0u64; live.len()];
        let mut stream_of = vec![crate::gc::WARM as u8; live.len()];
        let mut written = live.clone();
        let mut order = Vec::new();
        for c in (0..live.len()).filter(|&c| live[c] > 0) {
            match hints.clusters.get(c) {
                Some(h) if h.epoch != 0 && h.epoch == r.map.epochs[c] => {
                    activated[c] = h.activated.min(base);
                    stream_of[c] = h.stream;
                    written[c] = h.written.max(live[c]);
                }
                _ => order.push(c),
            }
        }
        order.sort_by_key(|&c| r.map.epochs[c]);
        for (k, &c) in order.iter().enumerate() {
            activated[c] = base + k as u64;
        }
        let clock = base + order.len() as u64;
        let stamps = if hints.stamps.is_empty() {
            vec![0; header.logical_blocks() as usize]
        } else {
            hints.stamps
        };
        let mut p2l = vec![NO_LBN; geo.physical_blocks() as usize];
        for (l, &p) in r.map.l2p.iter().enumerate() {
            if p < ZERO {
                p2l[p as usize] = l as u32;
            }
        }
        let clusters = live.len() as u64;
        let stamp_unit = (clusters / crate::gc::STAMP_UNITS_PER_PASS).max(1);
        let victims = VictimIndex::new(
            &ClusterView {
                states: &cstate,
                live: &live,
                stream: &stream_of,
                activated: &activated,
                written: &written,
            },
            bpc,
            &policy,
        );
        let st = State {
            p2l,
            l2p: r.map.l2p,
            sums: r.map.sums,
            epochs: r.map.epochs,
            seal_pbn: r.map.seal_pbn,
            seal_epoch: r.map.seal_epoch,
            live,
            cstate,
            pending: Vec::new(),
            free,
            // Each stream starts its sweep of the data file at its own
            // place, so streams write apart (see `take_cluster`).
            streams: std::array::from_fn(|s| Stream::new(s * geo.clusters as usize / STREAMS)),
            stream_of,
            activated,
            written,
            clock,
            victims,
            stamps,
            stamp_unit,
            stamp_pass: (clusters / stamp_unit).max(1),
            log,
            compacted: 0,
            seq: r.next_seq,
            barrier_no: r.barriers,
            running: 0,
            dirty: false,
            generation: header.generation,
            epoch_counter: 0,
            poisoned: None,
        };
        let lbs = Arc::new(Inner {
            data,
            width: header.checksum.width(),
            bs: geo.block_size as usize,
            bpc,
            geo,
            header,
            cipher,
            policy,
            state: StateLock::new(st),
            reuse: RwLock::new(()),
            gc_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            stats: Stats::default(),
            describe,
            opts,
        });
        if !lbs.opts.read_only {
            let mut st = lbs.state.lock();
            // A fresh generation: write epochs of this session can never
            // repeat one used before the crash or close.
            lbs.compact(&mut st)?;
        }
        Ok(lbs)
    }

    /// The image's header (geometry, algorithms).
    pub fn header(&self) -> &MetaHeader {
        &self.header
    }

    /// The GC policy in force.
    pub fn policy(&self) -> GcPolicy {
        self.policy
    }

    /// Counters and space figures.
    pub fn stats(&self) -> StatsSnapshot {
        let st = self.state.lock();
        let s = &self.stats;
        StatsSnapshot {
            client_blocks: s.client_blocks.load(Ordering::Relaxed),
            absorbed: s.absorbed.load(Ordering::Relaxed),
            physical_blocks: s.physical_blocks.load(Ordering::Relaxed),
            gc_moved: s.gc_moved.load(Ordering::Relaxed),
            gc_clusters: s.gc_clusters.load(Ordering::Relaxed),
            barriers: s.barriers.load(Ordering::Relaxed),
            compactions: s.compactions.load(Ordering::Relaxed),
            integrity_errors: s.integrity_errors.load(Ordering::Relaxed),
            stream_blocks: std::array::from_fn(|i| s.stream_blocks[i].load(Ordering::Relaxed)),
            retires: s.retires.load(Ordering::Relaxed),
            free_clusters: st.free,
            used_clusters: st
                .cstate
                .iter()
                .filter(|c| **c != ClusterState::Free)
                .count() as u64,
            mapped_blocks: st.l2p.iter().filter(|&&p| p < ZERO).count() as u64,
            zero_blocks: st.l2p.iter().filter(|&&p| p == ZERO).count() as u64,
            log_bytes: st.log.len(),
        }
    }

    /// Bytes of memory the map uses per GiB of logical space (the seed's
    /// figure: 12 MB): see [`map_bytes_per_gib`].
    pub fn map_bytes_per_gib(&self) -> f64 {
        map_bytes_per_gib(&self.header)
    }

    fn check_writable(&self, st: &State, op: Op) -> Result<()> {
        if self.opts.read_only {
            return Err(err(ErrorKind::ReadOnly, op, "opened read-only"));
        }
        if let Some(p) = &st.poisoned {
            return Err(err(ErrorKind::Io, op, format!("an earlier write failed ({p}); reopen the image to recover to its last barrier")));
        }
        Ok(())
    }

    fn poison<T>(&self, st: &mut State, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            st.poisoned = Some(e.to_string());
        }
        r
    }

    /// The seal of `lbn`, which lies at `pbn`.
    fn seal_of(&self, st: &State, lbn: u64, pbn: u64) -> Seal {
        match st.seal_pbn[lbn as usize] {
            IN_PLACE => (pbn, st.epochs[(pbn / self.bpc) as usize]),
            sp => (sp as u64, st.seal_epoch[lbn as usize]),
        }
    }
}

/// Bytes of memory the map of an image with header `h` uses per GiB of
/// logical space: per logical block its PBN, checksum, seal PBN, seal
/// epoch and write stamp; per physical block its LBN (the reverse map); per
/// cluster its epoch, live count, state, stream, activation and blocks
/// written.
pub fn map_bytes_per_gib(h: &MetaHeader) -> f64 {
    let per_block = (4 + h.checksum.width() + 4 + 8 + 2) as f64;
    let per_pblock = 4.0;
    let per_cluster = 8.0 + 4.0 + 1.0 + 1.0 + 8.0 + 4.0 + crate::victims::BYTES_PER_CLUSTER as f64;
    let geo = h.geometry;
    let blocks_per_gib = (1u64 << 30) as f64 / geo.block_size as f64;
    let phys = geo.physical_blocks() as f64 / h.logical_blocks() as f64;
    blocks_per_gib
        * (per_block + phys * (per_pblock + per_cluster / geo.blocks_per_cluster() as f64))
}

/// An open LBS image. Dropping the last handle stops the collector and
/// writes a final barrier.
pub struct Lbs {
    inner: Arc<Inner>,
    gc: Mutex<Option<JoinHandle<()>>>,
}

impl std::ops::Deref for Lbs {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl Lbs {
    /// Open an image from its data device and metadata log. `key` is
    /// required for encrypted images and checked against the header.
    pub fn open(
        data: Arc<dyn BlockDev>,
        log: Box<dyn LogStore>,
        key: Option<[u8; 64]>,
        opts: LbsOptions,
    ) -> Result<Lbs> {
        let inner = Inner::open(data, log, key, opts)?;
        let gc = if !inner.opts.read_only && inner.opts.background_gc {
            let i = inner.clone();
            Some(
                std::thread::Builder::new()
                    .name("lbs-gc".into())
                    .spawn(move || i.gc_thread())
                    .map_err(|e| Error::io(Op::Open, "lbs", e))?,
            )
        } else {
            None
        };
        Ok(Lbs {
            inner,
            gc: Mutex::new(gc),
        })
    }

    fn stop_gc(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.gc_wake.notify_all();
        let h = self.gc.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Stop the collector and write a final barrier.
    pub fn close(&self) -> Result<()> {
        self.stop_gc();
        if self.inner.opts.read_only {
            return Ok(());
        }
        let mut st = self.inner.state.lock();
        if st.poisoned.is_some() {
            return Ok(());
        }
        self.inner.barrier(&mut st)?;
        // The log rewritten with the collector's hints of this session
        // (write stamps, cluster ages), for the next open.
        self.inner.compact(&mut st)
    }
}

impl Drop for Lbs {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "final flush of the LBS image failed");
        }
    }
}

impl BlockDev for Lbs {
    roamdisk_blockdev::layer!("lbs");
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        self.inner.write_at(buf, off, flags)
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.inner.trim(off, len, flags)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.inner.write_zeroes(off, len, flags)
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.block_status(off, len)
    }
}

/// Create the checksum-kind-specific zero state used by tests.
pub fn checksum_of(kind: ChecksumKind, lbn: u64, epoch: u64, data: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; kind.width()];
    kind.compute(lbn, epoch, data, &mut v);
    v
}
