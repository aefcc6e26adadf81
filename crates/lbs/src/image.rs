//! The LBS device: write buffer, LBN→PBN map, verified reads, barriers,
//! garbage collection and log compaction over a data [`BlockDev`] and a
//! metadata [`LogStore`].
//!
//! Locking: one mutex guards the map, the cluster table, the write buffer
//! and the log. Reads resolve their blocks under it, take the `reuse` read
//! lock before letting it go, and do their data I/O without it; a cluster is
//! handed to the write position only under the `reuse` write lock, so no
//! read is ever in flight on a cluster that is being overwritten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use roamdisk_blockdev::{
    Alloc, BlockDev, Caps, Error, ErrorKind, Extent, Op, Result, WriteFlags, ZeroFlags,
};

use crate::checksum::ChecksumKind;
use crate::format::{encode_entry, DataSuper, Entry, Geometry, MetaHeader, SUPERBLOCK_SIZE};
use crate::gc::{pick_victim, ClusterState, GcPolicy};
use crate::replay::{replay, UNMAPPED, ZERO};
use crate::storage::LogStore;
use roamdisk_crypto::Xts;

/// A slot in the write buffer whose block was zeroed or trimmed after it
/// was buffered: written to disk but never mapped.
const DEAD: u64 = u64::MAX;
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
    /// Compact the metadata log when it grows past this many bytes.
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
}

/// A snapshot of [`Stats`] plus space figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub client_blocks: u64,
    pub absorbed: u64,
    pub physical_blocks: u64,
    pub gc_moved: u64,
    pub gc_clusters: u64,
    pub barriers: u64,
    pub compactions: u64,
    pub integrity_errors: u64,
    pub free_clusters: u64,
    pub used_clusters: u64,
    pub mapped_blocks: u64,
    pub zero_blocks: u64,
    pub log_bytes: u64,
}

struct WriteBuf {
    /// PBN of slot 0.
    base: u64,
    lbns: Vec<u64>,
    /// Plaintext, `lbns.len() * block_size` bytes.
    data: Vec<u8>,
    index: HashMap<u64, usize>,
}

struct State {
    l2p: Vec<u32>,
    sums: Vec<u8>,
    epochs: Vec<u64>,
    live: Vec<u32>,
    cstate: Vec<ClusterState>,
    quarantined: Vec<bool>,
    pending: Vec<usize>,
    free: u64,
    active: Option<usize>,
    buf: WriteBuf,
    log: Box<dyn LogStore>,
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
    state: Mutex<State>,
    reuse: RwLock<()>,
    gc_wake: Condvar,
    stop: AtomicBool,
    stats: Stats,
    describe: String,
}

/// A block to read: (lbn, pbn, epoch, checksum).
type BlockRef = (u64, u64, u64, [u8; 16]);

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
        let header = MetaHeader::parse(&bytes).map_err(|e| {
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
            Some(Xts::new(&key).map_err(|m| err(ErrorKind::InvalidArgument, Op::Open, m))?)
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
        let st = State {
            l2p: r.map.l2p,
            sums: r.map.sums,
            epochs: r.map.epochs,
            live,
            quarantined: vec![false; cstate.len()],
            cstate,
            pending: Vec::new(),
            free,
            active: None,
            buf: WriteBuf {
                base: 0,
                lbns: Vec::new(),
                data: Vec::new(),
                index: HashMap::new(),
            },
            log,
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
            state: Mutex::new(st),
            reuse: RwLock::new(()),
            gc_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            stats: Stats::default(),
            describe,
            opts,
        });
        if !lbs.opts.read_only {
            let mut st = lbs.lock();
            // A fresh generation: write epochs of this session can never
            // repeat one used before the crash or close.
            lbs.compact(&mut st)?;
        }
        Ok(lbs)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        let st = self.lock();
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
    /// figure: 12 MB).
    pub fn map_bytes_per_gib(&self) -> f64 {
        let per_block = 4.0 + self.width as f64;
        let per_cluster = 8.0 + 4.0 + 1.0 + 1.0;
        let blocks_per_gib = (1u64 << 30) as f64 / self.bs as f64;
        let clusters_per_gib = blocks_per_gib / self.bpc as f64
            * (self.geo.physical_blocks() as f64 / self.header.logical_blocks() as f64);
        per_block * blocks_per_gib + per_cluster * clusters_per_gib
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

    fn append_entry(&self, st: &mut State, e: &Entry) -> Result<()> {
        let b = encode_entry(e, st.seq, self.width);
        st.seq += 1;
        st.running = crc32c::crc32c_append(st.running, &b);
        st.dirty = true;
        let r = st.log.append(&b).map_err(|e| log_err(Op::Write, e));
        self.poison(st, r)
    }

    fn release(&self, st: &mut State, lbn: usize) {
        let old = st.l2p[lbn];
        if old < ZERO {
            let c = (old as u64 / self.bpc) as usize;
            st.live[c] -= 1;
            if st.live[c] == 0 && st.cstate[c] == ClusterState::Used {
                st.cstate[c] = ClusterState::PendingFree;
                st.pending.push(c);
            }
        }
    }

    fn buf_cap(&self) -> usize {
        (self.opts.buffer_size / self.bs).max(1)
    }

    fn room(&self, st: &State) -> usize {
        let Some(a) = st.active else { return 0 };
        let end = (a as u64 + 1) * self.bpc;
        let next = st.buf.base + st.buf.lbns.len() as u64;
        (self.buf_cap() - st.buf.lbns.len().min(self.buf_cap())).min((end - next) as usize)
    }

    /// Encrypt and write the buffer, then log its MAP entries.
    fn flush_buffer(&self, st: &mut State) -> Result<()> {
        let n = st.buf.lbns.len();
        if n == 0 {
            return Ok(());
        }
        let a = st.active.expect("a buffered block has an active cluster");
        let epoch = st.epochs[a];
        let base = st.buf.base;
        let mut out = AlignedBuf::new(n * self.bs);
        let (bs, w) = (self.bs, self.width);
        {
            let State { buf, sums, .. } = &mut *st;
            let o = out.as_mut_slice();
            for i in 0..n {
                let plain = &buf.data[i * bs..(i + 1) * bs];
                let lbn = buf.lbns[i];
                if lbn != DEAD {
                    self.header.checksum.compute(
                        lbn,
                        epoch,
                        plain,
                        &mut sums[lbn as usize * w..(lbn as usize + 1) * w],
                    );
                }
                let blk = &mut o[i * bs..(i + 1) * bs];
                blk.copy_from_slice(plain);
                if let Some(x) = &self.cipher {
                    x.encrypt(base + i as u64, epoch, blk);
                }
            }
        }
        let off = self.geo.data_offset() + base * bs as u64;
        let r = self
            .data
            .write_at(out.as_slice(), off, WriteFlags::default());
        self.poison(st, r)?;
        self.stats
            .physical_blocks
            .fetch_add(n as u64, Ordering::Relaxed);
        let mut i = 0;
        while i < n {
            if st.buf.lbns[i] == DEAD {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < n && st.buf.lbns[j] != DEAD && st.buf.lbns[j] == st.buf.lbns[j - 1] + 1 {
                j += 1;
            }
            let lbn = st.buf.lbns[i];
            let sums = st.sums[lbn as usize * w..(lbn as usize + (j - i)) * w].to_vec();
            self.append_entry(
                st,
                &Entry::Map {
                    lbn,
                    pbn: base + i as u64,
                    count: (j - i) as u64,
                    epoch,
                    sums,
                },
            )?;
            i = j;
        }
        st.buf.base += n as u64;
        st.buf.lbns.clear();
        st.buf.data.clear();
        st.buf.index.clear();
        Ok(())
    }

    /// Make everything so far durable: data, then a barrier entry, then the
    /// log; clusters emptied since the previous barrier become free.
    fn barrier(&self, st: &mut State) -> Result<()> {
        if !st.dirty && st.buf.lbns.is_empty() {
            // Nothing new since the last barrier: every release behind the
            // pending clusters is already durable.
            self.free_pending(st);
            return Ok(());
        }
        self.flush_buffer(st)?;
        let r = self.data.flush();
        self.poison(st, r)?;
        let e = Entry::Barrier {
            number: st.barrier_no + 1,
            crc: st.running,
        };
        let b = encode_entry(&e, st.seq, self.width);
        let r = st
            .log
            .append(&b)
            .and_then(|_| st.log.sync())
            .map_err(|e| log_err(Op::Flush, e));
        self.poison(st, r)?;
        st.seq += 1;
        st.barrier_no += 1;
        st.running = 0;
        st.dirty = false;
        self.stats.barriers.fetch_add(1, Ordering::Relaxed);
        self.free_pending(st);
        if st.log.len() > self.opts.compact_limit {
            self.compact(st)?;
        }
        Ok(())
    }

    fn free_pending(&self, st: &mut State) {
        for c in std::mem::take(&mut st.pending) {
            if st.cstate[c] == ClusterState::PendingFree && st.live[c] == 0 {
                st.cstate[c] = ClusterState::Free;
                st.free += 1;
            }
        }
    }

    /// Rewrite the log as the current (durable) state plus one barrier,
    /// atomically, under a new generation.
    fn compact(&self, st: &mut State) -> Result<()> {
        debug_assert!(st.buf.lbns.is_empty());
        let mut header = self.header.clone();
        header.generation = st.generation + 1;
        let w = self.width;
        let mut out = header.encode();
        let mut seq = 1u64;
        let mut running = 0u32;
        let push = |out: &mut Vec<u8>, e: &Entry, seq: &mut u64, running: &mut u32| {
            let b = encode_entry(e, *seq, w);
            *seq += 1;
            *running = crc32c::crc32c_append(*running, &b);
            out.extend_from_slice(&b);
        };
        let mut mapped: Vec<(u32, u32)> = st
            .l2p
            .iter()
            .enumerate()
            .filter(|(_, &p)| p < ZERO)
            .map(|(l, &p)| (p, l as u32))
            .collect();
        mapped.sort_unstable();
        let mut i = 0;
        while i < mapped.len() {
            let (p0, l0) = mapped[i];
            let c = p0 as u64 / self.bpc;
            let mut j = i + 1;
            while j < mapped.len()
                && mapped[j].0 == p0 + (j - i) as u32
                && mapped[j].1 == l0 + (j - i) as u32
                && mapped[j].0 as u64 / self.bpc == c
            {
                j += 1;
            }
            let sums = st.sums[l0 as usize * w..(l0 as usize + (j - i)) * w].to_vec();
            push(
                &mut out,
                &Entry::Map {
                    lbn: l0 as u64,
                    pbn: p0 as u64,
                    count: (j - i) as u64,
                    epoch: st.epochs[c as usize],
                    sums,
                },
                &mut seq,
                &mut running,
            );
            i = j;
        }
        let mut l = 0;
        while l < st.l2p.len() {
            if st.l2p[l] == ZERO {
                let mut m = l + 1;
                while m < st.l2p.len() && st.l2p[m] == ZERO {
                    m += 1;
                }
                push(
                    &mut out,
                    &Entry::Zero {
                        lbn: l as u64,
                        count: (m - l) as u64,
                    },
                    &mut seq,
                    &mut running,
                );
                l = m;
            } else {
                l += 1;
            }
        }
        let b = encode_entry(
            &Entry::Barrier {
                number: 1,
                crc: running,
            },
            seq,
            w,
        );
        out.extend_from_slice(&b);
        let r = st.log.replace(&out).map_err(|e| log_err(Op::Flush, e));
        self.poison(st, r)?;
        st.seq = seq + 1;
        st.barrier_no = 1;
        st.running = 0;
        st.dirty = false;
        st.generation = header.generation;
        st.epoch_counter = 0;
        self.stats.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Hand the next free cluster to the write position.
    fn take_cluster(&self, st: &mut State, for_gc: bool) -> Result<bool> {
        let reserve = if for_gc { 0 } else { GC_RESERVE };
        if st.free <= reserve {
            return Ok(false);
        }
        let n = st.cstate.len();
        let start = st.active.map_or(0, |a| a + 1);
        let Some(c) = (0..n)
            .map(|i| (start + i) % n)
            .find(|&c| st.cstate[c] == ClusterState::Free)
        else {
            return Ok(false);
        };
        let _w = self.reuse.write().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = st.active {
            if st.live[a] == 0 {
                st.cstate[a] = ClusterState::PendingFree;
                st.pending.push(a);
            } else {
                st.cstate[a] = ClusterState::Used;
            }
        }
        st.epoch_counter = st
            .epoch_counter
            .checked_add(1)
            .ok_or_else(|| err(ErrorKind::Io, Op::Write, "epoch counter exhausted"))?;
        st.epochs[c] = (st.generation << 32) | st.epoch_counter as u64;
        st.cstate[c] = ClusterState::Active;
        st.free -= 1;
        st.active = Some(c);
        st.buf.base = c as u64 * self.bpc;
        if st.free < self.policy.low {
            self.gc_wake.notify_all();
        }
        Ok(true)
    }

    /// Make room for one more block in the buffer.
    fn ensure_room(&self, st: &mut State, for_gc: bool) -> Result<()> {
        loop {
            if self.room(st) > 0 {
                return Ok(());
            }
            if !st.buf.lbns.is_empty() {
                self.flush_buffer(st)?;
                continue;
            }
            if self.take_cluster(st, for_gc)? {
                continue;
            }
            if !st.pending.is_empty() {
                self.barrier(st)?;
                continue;
            }
            if !for_gc && self.collect_to(st, GC_RESERVE + 2)? > 0 {
                continue;
            }
            return Err(err(
                ErrorKind::NoSpace,
                Op::Write,
                "no free cluster: the physical space is full of live data (create the image with more overprovisioning)",
            ));
        }
    }

    /// Put one block in the buffer as the new content of `lbn`.
    fn insert(&self, st: &mut State, lbn: u64, block: &[u8], for_gc: bool) -> Result<()> {
        if let Some(&slot) = st.buf.index.get(&lbn) {
            st.buf.data[slot * self.bs..(slot + 1) * self.bs].copy_from_slice(block);
            self.stats.absorbed.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.ensure_room(st, for_gc)?;
        let slot = st.buf.lbns.len();
        let pbn = st.buf.base + slot as u64;
        st.buf.lbns.push(lbn);
        st.buf.data.extend_from_slice(block);
        st.buf.index.insert(lbn, slot);
        self.release(st, lbn as usize);
        st.l2p[lbn as usize] = pbn as u32;
        let a = st.active.expect("ensure_room set an active cluster");
        st.live[a] += 1;
        st.dirty = true;
        Ok(())
    }

    /// Unmap or zero whole blocks `[first, first+count)`.
    fn unmap(&self, st: &mut State, first: u64, count: u64, zero: bool) -> Result<()> {
        for lbn in first..first + count {
            if let Some(slot) = st.buf.index.remove(&lbn) {
                st.buf.lbns[slot] = DEAD;
            }
            self.release(st, lbn as usize);
            st.l2p[lbn as usize] = if zero { ZERO } else { UNMAPPED };
        }
        let e = if zero {
            Entry::Zero { lbn: first, count }
        } else {
            Entry::Trim { lbn: first, count }
        };
        self.append_entry(st, &e)
    }

    /// Read and verify blocks already on disk. `plan` holds (lbn, pbn,
    /// epoch, checksum) of consecutive PBNs; returns their plaintext.
    fn read_blocks(&self, plan: &[BlockRef]) -> Result<AlignedBuf> {
        let n = plan.len();
        let mut b = AlignedBuf::new(n * self.bs);
        let off = self.geo.data_offset() + plan[0].1 * self.bs as u64;
        self.data.read_at(b.as_mut_slice(), off)?;
        for (i, &(lbn, pbn, epoch, want)) in plan.iter().enumerate() {
            let blk = &mut b.as_mut_slice()[i * self.bs..(i + 1) * self.bs];
            self.decrypt_verify(lbn, pbn, epoch, &want, blk)?;
        }
        Ok(b)
    }

    /// Decrypt one block in place and check its checksum.
    fn decrypt_verify(
        &self,
        lbn: u64,
        pbn: u64,
        epoch: u64,
        want: &[u8; 16],
        blk: &mut [u8],
    ) -> Result<()> {
        if let Some(x) = &self.cipher {
            x.decrypt(pbn, epoch, blk);
        }
        let mut sum = [0u8; 16];
        self.header
            .checksum
            .compute(lbn, epoch, blk, &mut sum[..self.width]);
        if sum[..self.width] == want[..self.width] {
            return Ok(());
        }
        self.stats.integrity_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            lbn,
            pbn,
            "integrity error: block checksum mismatch (damaged, tampered or replayed block)"
        );
        Err(err(
            ErrorKind::Corrupt,
            Op::Read,
            format!("integrity error at LBN {lbn} (PBN {pbn}): checksum mismatch; the block was damaged, tampered with or replayed"),
        )
        .at(lbn * self.bs as u64))
    }

    /// Read whole blocks `first..first+n` into `out` (n * bs bytes).
    fn read_whole(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len() / self.bs;
        let mut plan: Vec<(usize, BlockRef)> = Vec::new();
        let _reuse;
        {
            let st = self.lock();
            for i in 0..n {
                let lbn = first + i as u64;
                let dst = &mut out[i * self.bs..(i + 1) * self.bs];
                let p = st.l2p[lbn as usize];
                if p >= ZERO {
                    dst.fill(0);
                    continue;
                }
                let p = p as u64;
                if let Some(&slot) = st.buf.index.get(&lbn) {
                    dst.copy_from_slice(&st.buf.data[slot * self.bs..(slot + 1) * self.bs]);
                    continue;
                }
                let mut s = [0u8; 16];
                s[..self.width].copy_from_slice(
                    &st.sums[lbn as usize * self.width..(lbn as usize + 1) * self.width],
                );
                plan.push((i, (lbn, p, st.epochs[(p / self.bpc) as usize], s)));
            }
            _reuse = self.reuse.read().unwrap_or_else(|p| p.into_inner());
        }
        let mut k = 0;
        while k < plan.len() {
            let mut m = k + 1;
            while m < plan.len()
                && plan[m].1 .1 == plan[m - 1].1 .1 + 1
                && plan[m].1 .1 / self.bpc == plan[k].1 .1 / self.bpc
            {
                m += 1;
            }
            let run: Vec<_> = plan[k..m].iter().map(|x| x.1).collect();
            let b = self.read_blocks(&run)?;
            for (j, (i, _)) in plan[k..m].iter().enumerate() {
                out[i * self.bs..(i + 1) * self.bs]
                    .copy_from_slice(&b.as_slice()[j * self.bs..(j + 1) * self.bs]);
            }
            k = m;
        }
        Ok(())
    }

    /// Move the live blocks of the best victim cluster and free it.
    /// Returns false when no cluster is worth collecting.
    fn collect_one(&self, st: &mut State) -> Result<bool> {
        let eligible: Vec<ClusterState> = st
            .cstate
            .iter()
            .zip(&st.quarantined)
            .map(|(s, q)| if *q { ClusterState::Active } else { *s })
            .collect();
        let Some(v) = pick_victim(&eligible, &st.live, self.bpc, st.active, &self.policy) else {
            return Ok(false);
        };
        let lo = v as u64 * self.bpc;
        let mut moves: Vec<(u64, u64)> = st
            .l2p
            .iter()
            .enumerate()
            .filter(|(_, &p)| p < ZERO && (p as u64) >= lo && (p as u64) < lo + self.bpc)
            .map(|(l, &p)| (p as u64, l as u64))
            .collect();
        moves.sort_unstable();
        if let (Some(&(first, _)), Some(&(last, _))) = (moves.first(), moves.last()) {
            // One read for the span of live blocks, then verify each.
            let n = (last - first + 1) as usize;
            let mut span = AlignedBuf::new(n * self.bs);
            self.data.read_at(
                span.as_mut_slice(),
                self.geo.data_offset() + first * self.bs as u64,
            )?;
            let epoch = st.epochs[v];
            for &(pbn, lbn) in &moves {
                if st.l2p[lbn as usize] as u64 != pbn {
                    continue;
                }
                let i = (pbn - first) as usize;
                let blk = &mut span.as_mut_slice()[i * self.bs..(i + 1) * self.bs];
                let mut want = [0u8; 16];
                want[..self.width].copy_from_slice(
                    &st.sums[lbn as usize * self.width..(lbn as usize + 1) * self.width],
                );
                if let Err(e) = self.decrypt_verify(lbn, pbn, epoch, &want, blk) {
                    tracing::error!(cluster = v, lbn, error = %e, "cannot move a corrupt block; the cluster is quarantined");
                    st.quarantined[v] = true;
                    return Ok(true);
                }
                let copy = blk.to_vec();
                self.insert(st, lbn, &copy, true)?;
                self.stats.gc_moved.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats.gc_clusters.fetch_add(1, Ordering::Relaxed);
        // The victim is free after the next barrier (see `barrier`).
        Ok(true)
    }

    /// Collect victims until free plus pending clusters reach `target`,
    /// then one barrier frees them all. Returns clusters collected.
    fn collect_to(&self, st: &mut State, target: u64) -> Result<u64> {
        let mut n = 0;
        while st.free + (st.pending.len() as u64) < target {
            if !self.collect_one(st)? {
                break;
            }
            n += 1;
        }
        if !st.pending.is_empty() {
            self.barrier(st)?;
        }
        Ok(n)
    }

    /// Run the garbage collector until the high watermark (or nothing is
    /// left to collect). Returns clusters reclaimed.
    pub fn gc_now(&self) -> Result<u64> {
        let mut st = self.lock();
        self.check_writable(&st, Op::Write)?;
        self.collect_to(&mut st, self.policy.high)
    }

    /// Compact the metadata log now (after a barrier).
    pub fn compact_now(&self) -> Result<()> {
        let mut st = self.lock();
        self.check_writable(&st, Op::Flush)?;
        self.barrier(&mut st)?;
        self.compact(&mut st)
    }

    /// Verify every mapped block's checksum. Returns the LBNs that fail.
    pub fn check(&self, mut progress: impl FnMut(u64, u64)) -> Result<Vec<u64>> {
        let total = self.header.logical_blocks();
        let mut bad = Vec::new();
        let step = 256u64;
        let mut lbn = 0;
        let mut buf = vec![0u8; step as usize * self.bs];
        while lbn < total {
            let n = step.min(total - lbn);
            let out = &mut buf[..n as usize * self.bs];
            if self.read_whole(lbn, out).is_err() {
                for l in lbn..lbn + n {
                    if self.read_whole(l, &mut vec![0u8; self.bs]).is_err() {
                        bad.push(l);
                    }
                }
            }
            lbn += n;
            progress(lbn, total);
        }
        Ok(bad)
    }
}

fn gc_thread(lbs: Arc<Inner>) {
    let idle = Duration::from_millis(100);
    loop {
        if lbs.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut st = lbs.lock();
        let mut progressed = false;
        if st.free < lbs.policy.low && st.poisoned.is_none() {
            // One victim per lock hold, up to the high watermark counting
            // clusters that the next barrier frees; then that barrier.
            while !lbs.stop.load(Ordering::SeqCst)
                && st.free + (st.pending.len() as u64) < lbs.policy.high
            {
                match lbs.collect_one(&mut st) {
                    Ok(true) => progressed = true,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "background garbage collection failed");
                        break;
                    }
                }
                drop(st);
                std::thread::yield_now();
                st = lbs.lock();
            }
            if !st.pending.is_empty() {
                if let Err(e) = lbs.barrier(&mut st) {
                    tracing::error!(error = %e, "barrier after garbage collection failed");
                }
            }
        }
        if !progressed {
            let (g, _) = lbs
                .gc_wake
                .wait_timeout(st, idle)
                .unwrap_or_else(|p| p.into_inner());
            drop(g);
        }
    }
}

impl BlockDev for Inner {
    fn layer(&self) -> &'static str {
        "lbs"
    }
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn size(&self) -> u64 {
        self.header.logical_size
    }
    fn caps(&self) -> Caps {
        let c = Caps {
            min_block: 1,
            preferred_block: self.bs as u32,
            ..Caps::FULL
        };
        c.restrict(self.opts.read_only)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let bs = self.bs as u64;
        let first = off / bs;
        let end = off + buf.len() as u64;
        let last = end.div_ceil(bs);
        if off.is_multiple_of(bs) && end.is_multiple_of(bs) {
            return self.read_whole(first, buf);
        }
        let mut tmp = vec![0u8; ((last - first) * bs) as usize];
        self.read_whole(first, &mut tmp)?;
        let s = (off - first * bs) as usize;
        buf.copy_from_slice(&tmp[s..s + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let bs = self.bs as u64;
        let first = off / bs;
        let end = off + buf.len() as u64;
        let last = end.div_ceil(bs);
        // Partial edge blocks are read, merged and written whole.
        let mut head = None;
        let mut tail = None;
        if !off.is_multiple_of(bs) {
            let mut b = vec![0u8; self.bs];
            self.read_whole(first, &mut b)?;
            head = Some(b);
        }
        if !end.is_multiple_of(bs) && (last - 1 != first || head.is_none()) {
            let mut b = vec![0u8; self.bs];
            self.read_whole(last - 1, &mut b)?;
            tail = Some(b);
        }
        let mut st = self.lock();
        self.check_writable(&st, Op::Write)?;
        for lbn in first..last {
            let bstart = lbn * bs;
            let lo = off.max(bstart);
            let hi = end.min(bstart + bs);
            let src = &buf[(lo - off) as usize..(hi - off) as usize];
            if hi - lo == bs {
                self.insert(&mut st, lbn, src, false)?;
            } else {
                let mut b = if lbn == first { head.take() } else { None }
                    .or_else(|| tail.take())
                    .expect("edge block was read");
                b[(lo - bstart) as usize..(hi - bstart) as usize].copy_from_slice(src);
                self.insert(&mut st, lbn, &b, false)?;
            }
            self.stats.client_blocks.fetch_add(1, Ordering::Relaxed);
        }
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut st = self.lock();
        if self.opts.read_only {
            return Ok(());
        }
        if let Some(p) = &st.poisoned {
            return Err(err(
                ErrorKind::Io,
                Op::Flush,
                format!("an earlier write failed ({p}); reopen the image"),
            ));
        }
        self.barrier(&mut st)
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let bs = self.bs as u64;
        let first = off.div_ceil(bs);
        let last = (off + len) / bs;
        let mut st = self.lock();
        self.check_writable(&st, Op::Trim)?;
        if first < last {
            self.unmap(&mut st, first, last - first, false)?;
        }
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let bs = self.bs as u64;
        let end = off + len;
        let first = off.div_ceil(bs);
        let last = end / bs;
        if first >= last {
            return self.write_at(&vec![0u8; len as usize], off, WriteFlags { fua: flags.fua });
        }
        if off < first * bs {
            self.write_at(
                &vec![0u8; (first * bs - off) as usize],
                off,
                WriteFlags::default(),
            )?;
        }
        if end > last * bs {
            self.write_at(
                &vec![0u8; (end - last * bs) as usize],
                last * bs,
                WriteFlags::default(),
            )?;
        }
        let mut st = self.lock();
        self.check_writable(&st, Op::WriteZeroes)?;
        self.unmap(&mut st, first, last - first, !flags.may_trim)?;
        if flags.fua {
            self.barrier(&mut st)?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let bs = self.bs as u64;
        let st = self.lock();
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let lbn = pos / bs;
            let n = ((lbn + 1) * bs).min(end) - pos;
            let state = match st.l2p[lbn as usize] {
                UNMAPPED => Alloc::Hole,
                ZERO => Alloc::Zero,
                _ => Alloc::Data,
            };
            roamdisk_blockdev::push_extent(&mut out, Extent { len: n, state });
            pos += n;
            if out.len() >= 1024 {
                break;
            }
        }
        Ok(out)
    }
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
                    .spawn(move || gc_thread(i))
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
        let h = self.gc.lock().unwrap_or_else(|p| p.into_inner()).take();
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
        let mut st = self.inner.lock();
        if st.poisoned.is_some() {
            return Ok(());
        }
        self.inner.barrier(&mut st)
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
    fn layer(&self) -> &'static str {
        "lbs"
    }
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
