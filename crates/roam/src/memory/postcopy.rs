//! The postcopy source: roamdisk plays the side of a migrating QEMU for a
//! QEMU started with `-incoming defer`, so the guest runs before its
//! memory is here. The destination gets the device state first (packaged
//! between LISTEN and RUN) and runs at once; each page its guest touches
//! comes back as a request on the return path and is answered from the
//! version's fetch chain (shared cache, lookaside media, store) on a path
//! of its own, never behind the background push, which meanwhile sends
//! the rest (the memory working set first, then block by block). An
//! all-zero chunk is never fetched nor pushed; a destination reads what it
//! was never sent as zeroes. Every page goes at most once (a second copy
//! of a page fails QEMU's load); a page that cannot be had is retried and
//! reported, never given up. Protocol: `docs/formats/qemu-migration.md`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use roamdisk_blockdev::{ErrorKind, Op, Result};
use roamdisk_chunkstore::error::err;
use roamdisk_chunkstore::memimage::MemoryPages;
use roamdisk_migration::proto::*;
use roamdisk_migration::rp::{RpMessage, RpReader};
use roamdisk_migration::stream::RamSection;
use roamdisk_migration::write::{self, is_zero, Records};
use serde::Serialize;

use crate::fetch::{GatherStats, Source, Wanted};
use crate::memory::build::stream_error;
use crate::memory::link::LinkFit;
use crate::memory::ram_section;
use crate::view::VersionView;

/// Threads answering page requests (several vCPUs, or the device loader
/// and a vCPU, fault at once).
const DEMAND_THREADS: usize = 4;
/// Most chunks the push fetches in one request, and how long one request
/// should take at the rate seen (a waited-on fetch queues behind at most
/// that on a link that serves requests in turn).
const PUSH_MAX_BATCH: usize = 32;
const PUSH_REQUEST: Duration = Duration::from_millis(20);
/// Retry waits of a fetch that failed (the store or the link away).
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Fault latencies kept for the percentiles, and touched chunks recorded.
const MAX_LATENCIES: usize = 1 << 20;
const MAX_TOUCHED: usize = 1 << 16;

/// How the engine runs.
#[derive(Clone)]
pub struct EngineOptions {
    /// Report a page that cannot be had for this long (it is still tried).
    pub watchdog: Duration,
    /// Where remarks go (a page stalled, a fetch failing).
    pub note: Arc<dyn Fn(&str) + Send + Sync>,
    /// Chunks fetched per fault: the faulted one and the others of its
    /// aligned group of this many (1: the faulted chunk alone); 0 chooses
    /// by the link ([`LinkFit`]).
    pub fault_group: usize,
}

/// What the lazy resume did so far (`resume --json`, the progress line).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LazyStats {
    /// Bytes of the VM's RAM, and pages in stored (not all-zero) chunks:
    /// what must reach QEMU before the migration ends.
    pub ram_bytes: u64,
    pub pages_to_send: u64,
    /// Page requests from QEMU: for pages not yet sent (faults), and for
    /// pages already on their way.
    pub faults: u64,
    pub duplicate_requests: u64,
    /// Pages sent because the guest asked for them (the page, and the rest
    /// of its chunk), and by the background push.
    pub demand_pages: u64,
    pub pushed_pages: u64,
    /// Of those, pages sent as zero records (no data on the socket).
    pub zero_records: u64,
    /// Pages of all-zero chunks: never fetched; sent (as zero records)
    /// only when asked for, else never sent.
    pub zero_chunk_pages: u64,
    pub zero_chunk_pages_sent: u64,
    /// Chunk bytes fetched for faults and for the push (decoded sizes).
    pub demand_bytes: u64,
    pub pushed_bytes: u64,
    /// Pages of stored chunks not sent yet.
    pub missing_pages: u64,
    /// Fault latency (request read to page written), microseconds.
    pub fault_p50_us: u64,
    pub fault_p99_us: u64,
    pub fault_max_us: u64,
    /// Fetches retried after an error, and pages waited on longer than
    /// the watchdog right now.
    pub retries: u64,
    pub stalled: u64,
    /// Chunks fetched, by source.
    pub sources: GatherStats,
    /// Every page is in QEMU (it said so: SHUT 0).
    pub complete: bool,
    /// Seconds from the engine's start to the last page sent.
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Running = 0,
    /// Every stored page sent and the end mark written.
    Ended = 1,
    /// QEMU has every page (SHUT 0).
    Done = 2,
    Failed = 3,
}

struct Block {
    pages: usize,
    sent: Vec<AtomicU64>,
}

impl Block {
    fn is_sent(&self, p: usize) -> bool {
        self.sent[p / 64].load(Ordering::Relaxed) & (1 << (p % 64)) != 0
    }
    fn mark(&self, p: usize) {
        self.sent[p / 64].fetch_or(1 << (p % 64), Ordering::Relaxed);
    }
}

struct Req {
    block: usize,
    page: usize,
    at: Instant,
}

/// The pages the guest touched first, in order (chunk by chunk).
#[derive(Default)]
struct Touched {
    order: Vec<(u32, u32)>,
    seen: HashSet<(u32, u32)>,
}

fn took_at(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

fn add_stats(a: GatherStats, b: GatherStats) -> GatherStats {
    GatherStats {
        chunks: a.chunks + b.chunks,
        bytes: a.bytes + b.bytes,
        shared_cache_bytes: a.shared_cache_bytes + b.shared_cache_bytes,
        lookaside_bytes: a.lookaside_bytes + b.lookaside_bytes,
        store_bytes: a.store_bytes + b.store_bytes,
        refused: a.refused + b.refused,
    }
}

/// One lazy resume's state, shared by its threads.
pub struct Engine {
    view: Arc<VersionView>,
    ram: RamSection,
    names: HashMap<String, usize>,
    chunk: usize,
    blocks: Vec<Block>,
    /// The socket's write half; sections are written whole under it.
    out: Mutex<Option<UnixStream>>,
    queue: Mutex<VecDeque<Req>>,
    wake: Condvar,
    stats: Mutex<LazyStats>,
    latencies: Mutex<Vec<u32>>,
    stalled: AtomicU64,
    phase: AtomicU8,
    error: Mutex<Option<String>>,
    touched: Mutex<Touched>,
    opts: EngineOptions,
    started: Instant,
    link: Mutex<LinkFit>,
}

fn io_err(what: &str, e: std::io::Error) -> roamdisk_blockdev::Error {
    err(ErrorKind::Io, Op::Write, format!("{what}: {e}"))
}

impl Engine {
    /// An engine for the page image of `view`.
    pub fn new(view: Arc<VersionView>, opts: EngineOptions) -> Arc<Engine> {
        let pages = view.version.pages.as_ref().expect("a page image");
        let ram = ram_section(pages);
        let blocks: Vec<Block> = pages
            .blocks
            .iter()
            .map(|b| {
                let n = (b.length / TARGET_PAGE as u64) as usize;
                Block {
                    pages: n,
                    sent: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
                }
            })
            .collect();
        let per = pages.chunk_size() as u64 / TARGET_PAGE as u64;
        let mut stats = LazyStats {
            ram_bytes: pages.ram_bytes(),
            ..Default::default()
        };
        for b in &pages.blocks {
            for (c, id) in b.index.ids.iter().enumerate() {
                let n = (b.index.chunk_len(c) / TARGET_PAGE) as u64;
                debug_assert!(n <= per);
                if id.is_zero() {
                    stats.zero_chunk_pages += n;
                } else {
                    stats.pages_to_send += n;
                }
            }
        }
        stats.missing_pages = stats.pages_to_send;
        Arc::new(Engine {
            names: ram
                .blocks
                .iter()
                .enumerate()
                .map(|(i, b)| (b.name.clone(), i))
                .collect(),
            chunk: pages.chunk_size() as usize,
            blocks,
            ram,
            view,
            out: Mutex::new(None),
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stats: Mutex::new(stats),
            latencies: Mutex::new(Vec::new()),
            stalled: AtomicU64::new(0),
            phase: AtomicU8::new(Phase::Running as u8),
            error: Mutex::new(None),
            touched: Mutex::new(Touched::default()),
            opts,
            started: Instant::now(),
            link: Mutex::new(LinkFit::default()),
        })
    }

    fn pages(&self) -> &MemoryPages {
        self.view.version.pages.as_ref().expect("a page image")
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Running,
            1 => Phase::Ended,
            2 => Phase::Done,
            _ => Phase::Failed,
        }
    }

    /// Move to phase `to`: only forward, and never out of `Done` or
    /// `Failed`. The end mark's sender and the return path race: QEMU may
    /// answer SHUT 0 before the sender has marked the stream ended, and
    /// that answer must stand.
    fn advance(&self, to: Phase) {
        let mut cur = self.phase.load(Ordering::Acquire);
        loop {
            let terminal = cur == Phase::Done as u8 || cur == Phase::Failed as u8;
            if terminal || cur >= to as u8 {
                return;
            }
            match self
                .phase
                .compare_exchange(cur, to as u8, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// The migration is over, well or not.
    pub fn finished(&self) -> bool {
        matches!(self.phase(), Phase::Done | Phase::Failed)
    }

    /// Why it failed, if it did.
    pub fn failure(&self) -> Option<String> {
        (self.phase() == Phase::Failed).then(|| {
            self.error
                .lock()
                .clone()
                .unwrap_or_else(|| "the migration stopped".into())
        })
    }

    fn fail(&self, why: String) {
        if self.finished() {
            return;
        }
        tracing::warn!("lazy resume: {why}");
        self.error.lock().get_or_insert(why);
        self.advance(Phase::Failed);
        self.wake.notify_all();
        if let Some(s) = self.out.lock().take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The stats now.
    pub fn stats(&self) -> LazyStats {
        let mut s = self.stats.lock().clone();
        let mut lat = self.latencies.lock().clone();
        lat.sort_unstable();
        let pct = |p: f64| -> u64 {
            if lat.is_empty() {
                0
            } else {
                lat[((lat.len() - 1) as f64 * p).round() as usize] as u64
            }
        };
        s.fault_p50_us = pct(0.5);
        s.fault_p99_us = pct(0.99);
        s.fault_max_us = lat.last().copied().unwrap_or(0) as u64;
        s.stalled = self.stalled.load(Ordering::Relaxed);
        s.complete = self.phase() == Phase::Done;
        s
    }

    /// The chunks the guest touched first, in order.
    pub fn touched(&self) -> Vec<(u32, u32)> {
        self.touched.lock().order.clone()
    }

    /// Write `bytes` to QEMU (whole); a failure fails the migration.
    fn send(&self, out: &mut Option<UnixStream>, bytes: &[u8]) -> bool {
        let Some(s) = out.as_mut() else { return false };
        if let Err(e) = s.write_all(bytes) {
            let _ = s.shutdown(std::net::Shutdown::Both);
            *out = None;
            let why = format!("QEMU's migration socket failed: {e}");
            tracing::warn!("lazy resume: {why}");
            self.error.lock().get_or_insert(why);
            self.advance(Phase::Failed);
            self.wake.notify_all();
            return false;
        }
        true
    }

    /// Start a fresh postcopy on `sock` (connected to a QEMU that runs
    /// `migrate-incoming` with `postcopy-ram` on): the stream's prologue,
    /// the return path, ADVISE, the RAM list, the discard QEMU needs, then
    /// — requests answered from here on — the device state and RUN, then
    /// the push.
    pub fn start(self: &Arc<Self>, sock: UnixStream) -> Result<()> {
        let pages = self.pages();
        let mut b = pages.prologue.clone();
        write::command(&mut b, CMD_OPEN_RETURN_PATH, &[]);
        write::advise(&mut b);
        write::ram_start(&mut b, &self.ram);
        // QEMU enters postcopy wrongly (loading pages with the precopy
        // loader into registered memory, and hanging) unless a discard
        // came between ADVISE and LISTEN: one page, already discarded.
        write::discard(&mut b, &self.ram.blocks[0].name, &[(0, TARGET_PAGE as u64)]);
        let mut w = sock
            .try_clone()
            .map_err(|e| io_err("the migration socket", e))?;
        w.write_all(&b)
            .map_err(|e| io_err("QEMU's migration socket", e))?;
        let mut blob = Vec::new();
        write::packaged(&mut blob, &write::postcopy_blob(&pages.devices));
        // The device state's loading faults at once (QEMU reads guest RAM
        // while it loads devices): requests are served from before it is
        // sent (their answers wait for the blob to be written whole).
        let mut out = self.out.lock();
        *out = Some(w);
        self.start_threads(&sock)?;
        if !self.send(&mut out, &blob) {
            return Err(err(
                ErrorKind::Io,
                Op::Write,
                self.failure().unwrap_or_default(),
            ));
        }
        drop(out);
        self.start_push();
        Ok(())
    }

    /// Take over a postcopy QEMU paused after its source went away
    /// (`migrate-recover` listening on `sock`): ask which pages it holds
    /// (RECV_BITMAP per block), count those as sent, resume it
    /// (POSTCOPY_RESUME, answered by RESUME_ACK), then serve and push the
    /// rest.
    pub fn recover(self: &Arc<Self>, sock: UnixStream) -> Result<u64> {
        let mut w = sock
            .try_clone()
            .map_err(|e| io_err("the migration socket", e))?;
        let mut b = Vec::new();
        for blk in &self.ram.blocks {
            write::recv_bitmap(&mut b, &blk.name);
        }
        w.write_all(&b)
            .map_err(|e| io_err("QEMU's migration socket", e))?;
        // QEMU answers at once; a QEMU that does not is not waited on for
        // ever.
        sock.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| io_err("the migration socket", e))?;
        let mut rp = RpReader::new(sock.try_clone().map_err(|e| io_err("the socket", e))?);
        let mut have = 0u64;
        let mut pending: HashSet<usize> = (0..self.blocks.len()).collect();
        while !pending.is_empty() {
            match rp.read().map_err(stream_error)? {
                Some(RpMessage::RecvBitmap { block, bitmap }) => {
                    let Some(&k) = self.names.get(&block) else {
                        return Err(err(ErrorKind::Corrupt, Op::Read, format!("QEMU sent the bitmap of a RAM block {block:?} the image does not have")));
                    };
                    if !pending.remove(&k) {
                        continue;
                    }
                    let blk = &self.blocks[k];
                    if bitmap.len() < blk.pages.div_ceil(8) {
                        return Err(err(
                            ErrorKind::Corrupt,
                            Op::Read,
                            format!(
                                "QEMU's bitmap of {block:?} is {} bytes for {} pages",
                                bitmap.len(),
                                blk.pages
                            ),
                        ));
                    }
                    for p in 0..blk.pages {
                        if bitmap[p / 8] & (1 << (p % 8)) != 0 {
                            blk.mark(p);
                            have += 1;
                        }
                    }
                }
                Some(other) => tracing::debug!("lazy resume: before the bitmaps: {other:?}"),
                None => {
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        "QEMU closed the recovered migration before sending its bitmaps",
                    ))
                }
            }
        }
        self.recount();
        let mut b = Vec::new();
        write::command(&mut b, CMD_POSTCOPY_RESUME, &[]);
        w.write_all(&b)
            .map_err(|e| io_err("QEMU's migration socket", e))?;
        loop {
            match rp.read().map_err(stream_error)? {
                Some(RpMessage::ResumeAck(v)) if v == RESUME_ACK_VALUE => break,
                Some(RpMessage::ResumeAck(v)) => {
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        format!("QEMU refused to resume its postcopy (answer {v})"),
                    ))
                }
                Some(other) => tracing::debug!("lazy resume: before the ack: {other:?}"),
                None => {
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        "QEMU closed the recovered migration before resuming it",
                    ))
                }
            }
        }
        sock.set_read_timeout(None)
            .map_err(|e| io_err("the migration socket", e))?;
        *self.out.lock() = Some(w);
        self.spawn_rp(rp);
        self.spawn_demand();
        self.start_push();
        Ok(have)
    }

    /// Count what the sent bits say is missing (after a recovery).
    fn recount(&self) {
        let pages = self.pages();
        let mut missing = 0u64;
        for (b, blk) in pages.blocks.iter().enumerate() {
            let per = self.chunk / TARGET_PAGE;
            for (c, id) in blk.index.ids.iter().enumerate() {
                if id.is_zero() {
                    continue;
                }
                let n = blk.index.chunk_len(c) / TARGET_PAGE;
                missing += (0..n)
                    .filter(|k| !self.blocks[b].is_sent(c * per + k))
                    .count() as u64;
            }
        }
        self.stats.lock().missing_pages = missing;
    }

    fn start_threads(self: &Arc<Self>, sock: &UnixStream) -> Result<()> {
        let r = sock
            .try_clone()
            .map_err(|e| io_err("the migration socket", e))?;
        self.spawn_rp(RpReader::new(r));
        self.spawn_demand();
        Ok(())
    }

    fn spawn_rp(self: &Arc<Self>, mut rp: RpReader<UnixStream>) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("postcopy-rp".into())
            .spawn(move || loop {
                match rp.read() {
                    Ok(Some(RpMessage::ReqPages { block, start, len })) => {
                        if let Err(why) = me.request(&block, start, len) {
                            me.fail(why);
                            return;
                        }
                    }
                    Ok(Some(RpMessage::Shut(0))) => {
                        me.advance(Phase::Done);
                        me.wake.notify_all();
                        return;
                    }
                    Ok(Some(RpMessage::Shut(n))) => {
                        me.fail(format!("QEMU ended the migration with an error ({n}): see its log"));
                        return;
                    }
                    Ok(Some(other)) => tracing::debug!("lazy resume: return path: {other:?}"),
                    Ok(None) => {
                        if !me.finished() {
                            me.fail("QEMU closed the migration socket before it had every page (did it exit?)".into());
                        }
                        return;
                    }
                    Err(e) => {
                        me.fail(format!("QEMU's return path: {e}"));
                        return;
                    }
                }
            })
            .expect("spawn the return-path reader");
    }

    /// A page request: queued unless the page was sent already.
    fn request(&self, block: &str, start: u64, len: u32) -> std::result::Result<(), String> {
        let Some(&b) = self.names.get(block) else {
            return Err(format!("QEMU asked for a page of RAM block {block:?}, which the image does not have (another VM configuration?)"));
        };
        if len as usize != TARGET_PAGE || !start.is_multiple_of(TARGET_PAGE as u64) {
            return Err(format!("QEMU asked for {len} bytes at {start:#x} of {block:?}: only 4 KiB pages are served"));
        }
        let page = (start / TARGET_PAGE as u64) as usize;
        if page >= self.blocks[b].pages {
            return Err(format!(
                "QEMU asked for page {start:#x} beyond RAM block {block:?}"
            ));
        }
        let mut st = self.stats.lock();
        if self.blocks[b].is_sent(page) {
            st.duplicate_requests += 1;
            return Ok(());
        }
        st.faults += 1;
        drop(st);
        let c = (page * TARGET_PAGE / self.chunk) as u32;
        tracing::trace!(
            t = self.started.elapsed().as_secs_f64(),
            block,
            page,
            chunk = c,
            "fault"
        );
        {
            let mut t = self.touched.lock();
            if t.order.len() < MAX_TOUCHED && t.seen.insert((b as u32, c)) {
                t.order.push((b as u32, c));
            }
        }
        self.queue.lock().push_back(Req {
            block: b,
            page,
            at: Instant::now(),
        });
        self.wake.notify_one();
        Ok(())
    }

    fn spawn_demand(self: &Arc<Self>) {
        for i in 0..DEMAND_THREADS {
            let me = self.clone();
            std::thread::Builder::new()
                .name(format!("postcopy-demand-{i}"))
                .spawn(move || me.demand_loop())
                .expect("spawn a page server");
        }
    }

    fn demand_loop(&self) {
        loop {
            let req = {
                let mut q = self.queue.lock();
                loop {
                    if matches!(self.phase(), Phase::Done | Phase::Failed) {
                        return;
                    }
                    if let Some(r) = q.pop_front() {
                        break r;
                    }
                    self.wake.wait_for(&mut q, Duration::from_millis(200));
                }
            };
            self.serve(req);
        }
    }

    fn page_wanted(&self, b: usize, c: usize) -> Wanted {
        self.view.page_chunk(b, c)
    }

    /// Answer one request: the page first, then the rest of its chunk.
    fn serve(&self, r: Req) {
        let blk = &self.blocks[r.block];
        if !blk.is_sent(r.page) {
            let c = r.page * TARGET_PAGE / self.chunk;
            let w = self.page_wanted(r.block, c);
            if w.id.is_zero() {
                self.send_chunk(r.block, c, None, Some(r.page), true);
            } else {
                let group = match self.opts.fault_group {
                    0 => self.link.lock().group(self.chunk),
                    k => k,
                };
                let mut others: Vec<(usize, Arc<Vec<u8>>, Option<Source>)> = Vec::new();
                let mut got = None;
                let t0 = Instant::now();
                if group > 1 {
                    let g0 = c / group * group;
                    let n = self.pages().blocks[r.block].index.records();
                    let mut cs = vec![c];
                    cs.extend((g0..(g0 + group).min(n)).filter(|&k| {
                        k != c
                            && !self.page_wanted(r.block, k).id.is_zero()
                            && !self.chunk_sent(r.block, k)
                    }));
                    let wanted: Vec<Wanted> =
                        cs.iter().map(|&k| self.page_wanted(r.block, k)).collect();
                    let chain = self.view.chain();
                    let _fg = chain.foreground();
                    if let Ok(brought) = chain.get_together_from(&wanted, true) {
                        for (k, d, src) in brought {
                            if k == 0 {
                                got = Some((d, src));
                            } else {
                                others.push((cs[k], d, src));
                            }
                        }
                    }
                }
                let got = match got {
                    Some(g) => Some(g),
                    None => self.fetch(&w, r.block, c, true),
                };
                let Some((data, from)) = got else {
                    return;
                };
                if from == Some(Source::Store) {
                    let bytes = data.len() + others.iter().map(|o| o.1.len()).sum::<usize>();
                    self.link.lock().add(bytes, t0.elapsed().as_secs_f64());
                }
                tracing::trace!(
                    t = self.started.elapsed().as_secs_f64(),
                    block = r.block,
                    chunk = c,
                    waited = took_at(r.at),
                    source = ?from,
                    "demand"
                );
                let mut st = self.stats.lock();
                st.demand_bytes += data.len() as u64;
                st.sources.count(from, data.len());
                drop(st);
                self.send_chunk(r.block, c, Some(&data), Some(r.page), true);
                for (k, d, src) in others {
                    let mut st = self.stats.lock();
                    st.demand_bytes += d.len() as u64;
                    st.sources.count(src, d.len());
                    drop(st);
                    self.send_chunk(r.block, k, Some(&d), None, true);
                }
            }
        }
        let us = r.at.elapsed().as_micros().min(u32::MAX as u128) as u32;
        let mut l = self.latencies.lock();
        if l.len() < MAX_LATENCIES {
            l.push(us);
        }
    }

    /// A chunk through the fetch chain, retried until it comes (or the
    /// migration ends); `None` if it ended first.
    fn fetch(
        &self,
        w: &Wanted,
        b: usize,
        c: usize,
        waited_on: bool,
    ) -> Option<(Arc<Vec<u8>>, Option<Source>)> {
        let chain = self.view.chain();
        let t0 = Instant::now();
        let mut wait = RETRY_FIRST;
        let mut stalled = false;
        let mut last_err;
        loop {
            let got = {
                let _fg = waited_on.then(|| chain.foreground());
                chain.get_from(w)
            };
            match got {
                Ok(d) => {
                    if stalled {
                        self.stalled.fetch_sub(1, Ordering::Relaxed);
                        (self.opts.note)(&format!(
                            "memory chunk {c} of {:?} came after {:.0} s",
                            self.ram.blocks[b].name,
                            t0.elapsed().as_secs_f64()
                        ));
                    }
                    return Some(d);
                }
                Err(e) => {
                    last_err = e.to_string();
                    self.stats.lock().retries += 1;
                    tracing::debug!("lazy resume: chunk {c} of block {b}: {last_err}; retrying");
                }
            }
            if self.finished() {
                return None;
            }
            if !stalled && waited_on && t0.elapsed() >= self.opts.watchdog {
                stalled = true;
                self.stalled.fetch_add(1, Ordering::Relaxed);
                (self.opts.note)(&format!(
                    "the guest has waited {:.0} s for memory chunk {c} of {:?} ({}): {last_err}; still trying (the VM waits; it carries on once the store or the link is back)",
                    t0.elapsed().as_secs_f64(),
                    self.ram.blocks[b].name,
                    w.id.short()
                ));
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(RETRY_MAX);
        }
    }

    /// Send what of chunk `c` of block `b` is not sent yet: `first` alone
    /// first (a faulted page, in a section of its own), then the rest.
    /// `data: None` is an all-zero chunk.
    fn send_chunk(
        &self,
        b: usize,
        c: usize,
        data: Option<&[u8]>,
        first: Option<usize>,
        demand: bool,
    ) {
        let blk = &self.blocks[b];
        let per = self.chunk / TARGET_PAGE;
        let p0 = c * per;
        let n = per.min(blk.pages - p0);
        let mut out = self.out.lock();
        if out.is_none() || self.phase() != Phase::Running {
            return;
        }
        let mut zero_records = 0u64;
        let mut sent = 0u64;
        let page_of =
            |p: usize| data.map(|d| &d[(p - p0) * TARGET_PAGE..(p - p0 + 1) * TARGET_PAGE]);
        let mut add = |rec: &mut Records<'_>, p: usize| {
            let off = (p * TARGET_PAGE) as u64;
            match page_of(p) {
                Some(pg) if !is_zero(pg) => rec.page(b, off, pg),
                _ => {
                    rec.zero(b, off);
                    zero_records += 1;
                }
            }
            blk.mark(p);
            sent += 1;
        };
        if let Some(p) = first.filter(|&p| !blk.is_sent(p)) {
            let mut rec = Records::new(&self.ram, false);
            add(&mut rec, p);
            if !self.send(&mut out, &rec.finish()) {
                return;
            }
        }
        let mut rec = Records::new(&self.ram, false);
        for p in p0..p0 + n {
            if !blk.is_sent(p) {
                add(&mut rec, p);
            }
        }
        if !rec.is_empty() && !self.send(&mut out, &rec.finish()) {
            return;
        }
        drop(out);
        let mut st = self.stats.lock();
        if demand {
            st.demand_pages += sent;
        } else {
            st.pushed_pages += sent;
        }
        st.zero_records += zero_records;
        if data.is_some() {
            st.missing_pages = st.missing_pages.saturating_sub(sent);
        } else {
            st.zero_chunk_pages_sent += sent;
        }
    }

    /// Whether every page of chunk `c` of block `b` was sent.
    fn chunk_sent(&self, b: usize, c: usize) -> bool {
        let blk = &self.blocks[b];
        let per = self.chunk / TARGET_PAGE;
        let p0 = c * per;
        (p0..(p0 + per).min(blk.pages)).all(|p| blk.is_sent(p))
    }

    fn start_push(self: &Arc<Self>) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("postcopy-push".into())
            .spawn(move || me.push())
            .expect("spawn the push");
    }

    /// Send every stored chunk not sent yet, the working set's first, in
    /// the gaps between waited-on fetches; then the end of the stream.
    fn push(&self) {
        let order = self.pages().chunks_in_push_order();
        // The working set comes first in the order: the pages the guest
        // is about to touch. Those go without waiting for a gap between
        // faults (they are what the faults would ask for next, and one
        // request brings many where each fault costs a round trip); the
        // rest goes in the gaps.
        let in_ws: HashSet<(u32, u32)> = self.pages().working_set.iter().copied().collect();
        let ws = order
            .iter()
            .take_while(|c| in_ws.contains(&(c.block, c.chunk)))
            .count();
        let chain = self.view.chain();
        let mut batch = 1usize;
        let mut i = 0;
        while i < order.len() {
            if self.phase() != Phase::Running {
                return;
            }
            let mut take = Vec::new();
            while i < order.len() && take.len() < batch {
                let c = &order[i];
                i += 1;
                if !self.chunk_sent(c.block as usize, c.chunk as usize) {
                    take.push(*c);
                }
            }
            if take.is_empty() {
                continue;
            }
            let wanted: Vec<Wanted> = take
                .iter()
                .map(|c| self.page_wanted(c.block as usize, c.chunk as usize))
                .collect();
            if i > ws {
                chain.background_turn();
            }
            let t0 = Instant::now();
            let got = loop {
                match chain.get_together_from(&wanted, true) {
                    Ok(g) => break g,
                    Err(e) => {
                        self.stats.lock().retries += 1;
                        tracing::debug!("lazy resume: the push: {e}; retrying");
                        if self.phase() != Phase::Running {
                            return;
                        }
                        std::thread::sleep(RETRY_MAX);
                    }
                }
            };
            let mut bytes = 0usize;
            let mut done = vec![false; take.len()];
            let mut from = GatherStats::default();
            for (k, data, src) in &got {
                bytes += data.len();
                from.count(*src, data.len());
                done[*k] = true;
                let c = &take[*k];
                self.send_chunk(c.block as usize, c.chunk as usize, Some(data), None, false);
            }
            // Those the caches held came back without data: read them.
            for (k, c) in take.iter().enumerate().filter(|(k, _)| !done[*k]) {
                let Some((d, src)) =
                    self.fetch(&wanted[k], c.block as usize, c.chunk as usize, false)
                else {
                    return;
                };
                bytes += d.len();
                from.count(src, d.len());
                self.send_chunk(c.block as usize, c.chunk as usize, Some(&d), None, false);
            }
            tracing::trace!(
                t = self.started.elapsed().as_secs_f64(),
                chunks = take.len(),
                bytes,
                took = took_at(t0),
                "pushed"
            );
            let mut st = self.stats.lock();
            st.pushed_bytes += bytes as u64;
            st.sources = add_stats(st.sources, from);
            drop(st);
            let took = t0.elapsed().as_secs_f64().max(1e-6);
            let rate = bytes as f64 / took;
            // At most twice the last batch: a link's first bytes go at its
            // burst, not its rate.
            batch = ((rate * PUSH_REQUEST.as_secs_f64()) / self.chunk as f64)
                .clamp(1.0, (2 * batch).min(PUSH_MAX_BATCH) as f64) as usize;
        }
        self.end();
    }

    /// Every stored page is sent: the RAM section's end and the stream's.
    fn end(&self) {
        let mut out = self.out.lock();
        if self.phase() != Phase::Running {
            return;
        }
        let mut b = Records::new(&self.ram, true).finish();
        b.push(VM_EOF);
        // Before the send: QEMU may answer SHUT 0 before it returns.
        self.stats.lock().seconds = self.started.elapsed().as_secs_f64();
        if self.send(&mut out, &b) {
            #[cfg(test)]
            std::thread::sleep(Duration::from_millis(
                super::tests::END_MARK_DELAY_MS.load(Ordering::Relaxed),
            ));
            // If it did, Done stands.
            self.advance(Phase::Ended);
        }
    }

    /// Wait until QEMU has every page or the migration failed, calling
    /// `tick` every `every`.
    pub fn wait(&self, every: Duration, mut tick: impl FnMut(&LazyStats)) -> Result<LazyStats> {
        loop {
            let s = self.stats();
            tick(&s);
            match self.phase() {
                Phase::Done => return Ok(s),
                Phase::Failed => {
                    return Err(err(
                        ErrorKind::Io,
                        Op::Read,
                        self.failure().unwrap_or_default(),
                    ))
                }
                _ => {}
            }
            std::thread::sleep(every);
        }
    }
}
