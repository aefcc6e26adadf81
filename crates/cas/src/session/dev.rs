//! `cas:SESSION` — the writable layer of a session (seed sections 3.1-3.4).
//!
//! Reads: CLEAN or DIRTY sectors come from the private cache, ZERO sectors
//! are zeroes, EMPTY sectors come from the base version (fetched from the
//! chunk store by hash and verified). Writes: a sector of zeroes becomes
//! ZERO with no data written (P1, switchable); any other sector is written
//! to the private cache and becomes DIRTY. A flush makes the cache durable
//! and then appends the changed states to the session map.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use roamdisk_blockdev::{
    extents_covering, push_extent, Alloc, BlockDev, Caps, Extent, Op, Registry, Result, WriteFlags,
    ZeroFlags,
};

use super::map::{self, Header, KIND_COMMIT, KIND_SET, RECORD_SIZE};
use super::SessionConfig;
use crate::chunk::Key;
use crate::error::{bad_arg, context, corrupt, io};
use crate::index::{SectorState, SECTOR};
use crate::store::DynStore;
use crate::view::VersionView;

const LOCK_STRIPES: usize = 256;
/// Compact the map when its log passes this many records.
const COMPACT_RECORDS: u64 = 1 << 20;

/// Write a file through a temporary name, fsync, rename and directory
/// fsync.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// Options for opening a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOpen {
    pub read_only: bool,
    /// Use this store instead of the one in session.toml.
    pub store: Option<String>,
    /// Use this key file instead of the one in session.toml.
    pub key_file: Option<PathBuf>,
    /// Override P1 at write time.
    pub zero_detect: Option<bool>,
}

struct MapLog {
    file: File,
    chain: u32,
    seq: u64,
    records: u64,
}

/// Where a sector reads from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Cache,
    Zero,
    Base,
}

fn src_of(state: u8) -> Src {
    match state {
        2 | 3 => Src::Cache,
        1 => Src::Zero,
        _ => Src::Base,
    }
}

/// A session's disk.
pub struct CasDev {
    dir: PathBuf,
    pub config: SessionConfig,
    store: DynStore,
    base: RwLock<Arc<VersionView>>,
    cache: Arc<dyn BlockDev>,
    size: u64,
    states: Vec<AtomicU8>,
    rmw: Vec<Mutex<()>>,
    pending: Mutex<Vec<(u64, u64)>>,
    log: Mutex<MapLog>,
    states_path: PathBuf,
    read_only: bool,
    zero_detect: bool,
    user_key: Option<Key>,
    _lock: File,
}

impl CasDev {
    /// Open the session in `dir`. `registry` opens the private cache.
    pub fn open(dir: &Path, opts: &SessionOpen, registry: &Registry) -> Result<CasDev> {
        let config = SessionConfig::load(dir)?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io(Op::Open, e, &lock_path))?;
        roamdisk_blockdev::layers::raw::lock_file(&lock, opts.read_only, "cas", dir)?;
        let store_loc = opts.store.clone().unwrap_or_else(|| config.store.clone());
        let store = crate::store::open(&store_loc, &Default::default())?;
        let key_file = opts.key_file.clone().or_else(|| config.key_file.clone());
        let user_key = match &key_file {
            Some(k) => Some(crate::version::read_key_file(k)?),
            None => None,
        };
        let states_path = dir.join("states");
        let bytes = std::fs::read(&states_path).map_err(|e| io(Op::Open, e, &states_path))?;
        let replay = map::replay(&bytes)
            .map_err(|e| corrupt(format!("session map is unusable: {e}")).path(&states_path))?;
        if replay.discarded > 0 {
            tracing::warn!(map = %states_path.display(), bytes = replay.discarded, "discarded an uncommitted or torn tail of the session map (writes after the last flush)");
        }
        let base = VersionView::open(store.clone(), replay.header.base, user_key.as_ref())
            .map_err(|e| context(e, format!("the base of session {}", dir.display())))?;
        let size = replay.header.disk_size;
        if base.version.index.disk_size != size {
            return Err(corrupt(format!(
                "session map says {size} bytes but base version {} has {}",
                base.id.short(),
                base.version.index.disk_size
            )));
        }
        let cache: Arc<dyn BlockDev> = registry.build(&config.cache_spec(dir), opts.read_only)?;
        if cache.size() < size {
            return Err(bad_arg(format!(
                "the private cache {} is {} bytes, smaller than the {size}-byte disk",
                config.cache,
                cache.size()
            )));
        }
        let sectors = size / SECTOR;
        let states: Vec<AtomicU8> = (0..sectors.div_ceil(4)).map(|_| AtomicU8::new(0)).collect();
        let log_file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .open(&states_path)
            .map_err(|e| io(Op::Open, e, &states_path))?;
        let dev = CasDev {
            dir: dir.to_path_buf(),
            zero_detect: opts.zero_detect.unwrap_or(config.zero_detect),
            config,
            store,
            base: RwLock::new(Arc::new(base)),
            cache,
            size,
            states,
            rmw: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            pending: Mutex::new(Vec::new()),
            log: Mutex::new(MapLog {
                file: log_file,
                chain: replay.chain,
                seq: replay.last_seq,
                records: ((replay.valid_len - map::HEADER_SIZE) / RECORD_SIZE) as u64,
            }),
            states_path,
            read_only: opts.read_only,
            user_key,
            _lock: lock,
        };
        for r in &replay.runs {
            dev.set_range(r.start, r.start + r.count as u64, r.state);
        }
        if !opts.read_only {
            let mut log = dev.log.lock().unwrap_or_else(|e| e.into_inner());
            dev.compact(&mut log)?;
        }
        Ok(dev)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn store(&self) -> &DynStore {
        &self.store
    }
    pub fn user_key(&self) -> Option<&Key> {
        self.user_key.as_ref()
    }
    pub fn base(&self) -> Arc<VersionView> {
        self.base.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn cache_dev(&self) -> &Arc<dyn BlockDev> {
        &self.cache
    }
    pub fn sectors(&self) -> u64 {
        self.size / SECTOR
    }

    /// The state of sector `s`.
    pub fn state(&self, s: u64) -> SectorState {
        SectorState::from_bits(self.raw_state(s))
    }

    fn raw_state(&self, s: u64) -> u8 {
        (self.states[(s / 4) as usize].load(Ordering::Acquire) >> ((s % 4) * 2)) & 3
    }

    /// Set sectors `[s0, s1)` to `v` (in memory; logged at the next flush
    /// if recorded as pending).
    fn set_range(&self, s0: u64, s1: u64, v: u8) {
        let mut s = s0;
        while s < s1 {
            if s.is_multiple_of(4) && s + 4 <= s1 {
                self.states[(s / 4) as usize].store(v * 0x55, Ordering::Release);
                s += 4;
                continue;
            }
            let shift = (s % 4) * 2;
            let _ = self.states[(s / 4) as usize].fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                |b| Some((b & !(3 << shift)) | (v << shift)),
            );
            s += 1;
        }
    }

    fn mark(&self, s0: u64, s1: u64, v: u8) {
        self.set_range(s0, s1, v);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((s0, s1 - s0));
    }

    /// Counts of sectors in each state (EMPTY, ZERO, CLEAN, DIRTY).
    pub fn usage(&self) -> [u64; 4] {
        let mut c = [0u64; 4];
        for s in 0..self.sectors() {
            c[self.raw_state(s) as usize] += 1;
        }
        c
    }

    /// Rewrite the map as runs of the current states (base `base`).
    fn compact_with(&self, log: &mut MapLog, base: crate::hash::ChunkId) -> Result<()> {
        let header = Header {
            disk_size: self.size,
            base,
        };
        let hb = header.encode();
        let mut chain = Header::chain_seed(&hb);
        let mut buf = hb.to_vec();
        let mut records = 0;
        let n = self.sectors();
        let mut s = 0;
        while s < n {
            let v = self.raw_state(s);
            let mut e = s + 1;
            while e < n && e - s < u32::MAX as u64 && self.raw_state(e) == v {
                e += 1;
            }
            if v != 0 {
                let r = map::encode_record(KIND_SET, v, (e - s) as u32, s, chain);
                chain = map::record_crc(&r);
                buf.extend_from_slice(&r);
                records += 1;
            }
            s = e;
        }
        let r = map::encode_record(KIND_COMMIT, 0, 0, 1, chain);
        chain = map::record_crc(&r);
        buf.extend_from_slice(&r);
        // The cache's data is durable before a map that claims it.
        self.cache.flush()?;
        write_atomically(&self.states_path, &buf)
            .map_err(|e| io(Op::Flush, e, &self.states_path))?;
        log.file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.states_path)
            .map_err(|e| io(Op::Flush, e, &self.states_path))?;
        log.chain = chain;
        log.seq = 1;
        log.records = records + 1;
        Ok(())
    }

    fn compact(&self, log: &mut MapLog) -> Result<()> {
        let base = self.base().id;
        self.compact_with(log, base)
    }

    /// After a commit: switch to the new base version and apply the state
    /// changes `(sector, new state)`, atomically on disk.
    pub fn rebase(&self, view: VersionView, changes: &[(u64, u64, SectorState)]) -> Result<()> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        for &(s0, s1, st) in changes {
            self.set_range(s0, s1, st as u8);
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let id = view.id;
        self.compact_with(&mut log, id)?;
        *self.base.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        Ok(())
    }

    fn stripe(&self, sector: u64) -> usize {
        ((sector / 128) as usize) % LOCK_STRIPES
    }

    /// Write whole sectors at a sector-aligned offset.
    fn write_aligned(&self, data: &[u8], off: u64) -> Result<()> {
        let s0 = off / SECTOR;
        let n = data.len() / SECTOR as usize;
        let zero_at = |i: usize| {
            self.zero_detect
                && crate::hash::is_zero(&data[i * SECTOR as usize..(i + 1) * SECTOR as usize])
        };
        let mut i = 0;
        while i < n {
            let z = zero_at(i);
            let mut j = i + 1;
            while j < n && zero_at(j) == z {
                j += 1;
            }
            let (a, b) = (s0 + i as u64, s0 + j as u64);
            if z {
                self.set_range(a, b, SectorState::Zero as u8);
                self.release_cache(a, b);
            } else {
                self.cache.write_at(
                    &data[i * SECTOR as usize..j * SECTOR as usize],
                    a * SECTOR,
                    WriteFlags::default(),
                )?;
                self.set_range(a, b, SectorState::Dirty as u8);
            }
            i = j;
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((s0, n as u64));
        Ok(())
    }

    /// Best effort: let the cache release space of sectors that no longer
    /// hold data (whole 4 KiB blocks only).
    fn release_cache(&self, s0: u64, s1: u64) {
        let a = (s0 * SECTOR).div_ceil(4096) * 4096;
        let b = (s1 * SECTOR) / 4096 * 4096;
        if b > a && self.cache.caps().can_trim {
            let _ = self.cache.trim(a, b - a, WriteFlags::default());
        }
    }

    /// Zero whole sectors `[s0, s1)` by state.
    fn zero_sectors(&self, s0: u64, s1: u64) {
        if s1 > s0 {
            self.mark(s0, s1, SectorState::Zero as u8);
            self.release_cache(s0, s1);
        }
    }
}

impl BlockDev for CasDev {
    fn layer(&self) -> &'static str {
        "cas"
    }
    fn describe(&self) -> String {
        format!(
            "cas:{} (base {} of {}, store {})",
            self.dir.display(),
            self.base().id.short(),
            self.config.target,
            self.store.describe()
        )
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        let c = Caps {
            min_block: 1,
            preferred_block: 4096,
            ..Caps::FULL
        };
        if self.read_only {
            c.read_only()
        } else {
            c
        }
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let end = off + buf.len() as u64;
        let (s0, s1) = (off / SECTOR, end.div_ceil(SECTOR));
        let base = self.base();
        let mut s = s0;
        while s < s1 {
            let src = src_of(self.raw_state(s));
            let mut e = s + 1;
            while e < s1 && src_of(self.raw_state(e)) == src {
                e += 1;
            }
            let a = (s * SECTOR).max(off);
            let b = (e * SECTOR).min(end);
            let dst = &mut buf[(a - off) as usize..(b - off) as usize];
            match src {
                Src::Cache => self.cache.read_at(dst, a)?,
                Src::Zero => dst.fill(0),
                Src::Base => base.read_at(dst, a)?,
            }
            s = e;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let end = off + buf.len() as u64;
        if off.is_multiple_of(SECTOR) && end.is_multiple_of(SECTOR) {
            self.write_aligned(buf, off)?;
        } else {
            // Read-modify-write of the partial sectors at either end, under
            // the locks of their chunks (taken in order).
            let a = off / SECTOR * SECTOR;
            let b = end.div_ceil(SECTOR) * SECTOR;
            let mut stripes = vec![self.stripe(a / SECTOR), self.stripe(b / SECTOR - 1)];
            stripes.sort_unstable();
            stripes.dedup();
            let _guards: Vec<_> = stripes
                .iter()
                .map(|&k| self.rmw[k].lock().unwrap_or_else(|e| e.into_inner()))
                .collect();
            let mut tmp = vec![0u8; (b - a) as usize];
            self.read_at(&mut tmp[..SECTOR as usize], a)?;
            let last = (b - a - SECTOR) as usize;
            self.read_at(&mut tmp[last..], b - SECTOR)?;
            tmp[(off - a) as usize..(end - a) as usize].copy_from_slice(buf);
            self.write_aligned(&tmp, a)?;
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut ranges =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        // 1. The private cache's data is durable before any record claims it.
        self.cache.flush()?;
        if ranges.is_empty() {
            return Ok(());
        }
        if log.records + ranges.len() as u64 > COMPACT_RECORDS {
            return self.compact(&mut log);
        }
        // 2. Merge the touched ranges; log their current states as runs.
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, n) in ranges {
            match merged.last_mut() {
                Some((_, me)) if s <= *me => *me = (*me).max(s + n),
                _ => merged.push((s, s + n)),
            }
        }
        let mut buf = Vec::new();
        let mut chain = log.chain;
        for (a, b) in merged {
            let mut s = a;
            while s < b {
                let v = self.raw_state(s);
                let mut e = s + 1;
                while e < b && e - s < u32::MAX as u64 && self.raw_state(e) == v {
                    e += 1;
                }
                let r = map::encode_record(KIND_SET, v, (e - s) as u32, s, chain);
                chain = map::record_crc(&r);
                buf.extend_from_slice(&r);
                s = e;
            }
        }
        let r = map::encode_record(KIND_COMMIT, 0, 0, log.seq + 1, chain);
        chain = map::record_crc(&r);
        buf.extend_from_slice(&r);
        // 3. Append and sync the map.
        let flush_err = |e| io(Op::Flush, e, &self.states_path);
        let end = log.file.metadata().map_err(flush_err)?.len();
        log.file.write_all_at(&buf, end).map_err(flush_err)?;
        log.file.sync_data().map_err(flush_err)?;
        log.records += (buf.len() / RECORD_SIZE) as u64;
        log.chain = chain;
        log.seq += 1;
        Ok(())
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        // Only whole sectors; trimmed sectors read as zero (and commit as
        // ZERO, needing no data).
        self.zero_sectors(off.div_ceil(SECTOR), (off + len) / SECTOR);
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let end = off + len;
        let (a, b) = (off.div_ceil(SECTOR), end / SECTOR);
        if a >= b {
            let z = vec![0u8; len as usize];
            self.write_at(&z, off, WriteFlags::default())?;
        } else {
            if off < a * SECTOR {
                let z = vec![0u8; (a * SECTOR - off) as usize];
                self.write_at(&z, off, WriteFlags::default())?;
            }
            self.zero_sectors(a, b);
            if end > b * SECTOR {
                let z = vec![0u8; (end - b * SECTOR) as usize];
                self.write_at(&z, b * SECTOR, WriteFlags::default())?;
            }
        }
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let end = off + len;
        let base = self.base();
        let mut out = Vec::new();
        let mut s = off / SECTOR;
        let s1 = end.div_ceil(SECTOR);
        while s < s1 {
            let src = src_of(self.raw_state(s));
            let mut e = s + 1;
            while e < s1 && src_of(self.raw_state(e)) == src {
                e += 1;
            }
            let a = (s * SECTOR).max(off);
            let b = (e * SECTOR).min(end);
            match src {
                Src::Cache => push_extent(
                    &mut out,
                    Extent {
                        len: b - a,
                        state: Alloc::Data,
                    },
                ),
                Src::Zero => push_extent(
                    &mut out,
                    Extent {
                        len: b - a,
                        state: Alloc::Hole,
                    },
                ),
                Src::Base => {
                    for x in extents_covering(base.as_ref(), a, b - a)? {
                        push_extent(&mut out, x);
                    }
                }
            }
            s = e;
            if out.len() > 1024 {
                break;
            }
        }
        Ok(out)
    }
}
