//! The transmission phase: read requests, run them, write replies as they
//! complete (out of order).
//!
//! One task reads requests; one task writes replies. Block layers do
//! synchronous I/O, so a request runs either on tokio's blocking pool or,
//! when it is a small read or write and the stack has been answering those
//! quickly, inline on the reader task: a thread hand-off costs more than a
//! page-cache hit, and on a busy machine each hand-off waits for a CPU. One
//! slow inline request sends the next ones to the pool again, so a stack
//! that blocks (disk misses, network) keeps its concurrency. At most
//! `max_in_flight` requests run on the pool at once per connection; beyond
//! that the reader waits, which pushes back on the client through TCP.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roamdisk_blockdev::{
    extents_covering, Alloc, BlockDev, Error, ErrorKind, Op, WriteFlags, ZeroFlags,
};
use std::io::IoSlice;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, WriteHalf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::handshake::Session;
use crate::proto::*;
use crate::server::{BoxStream, Shared};

/// Reads and writes up to this size may run inline (see the module doc).
const INLINE_MAX_LEN: u32 = 256 << 10;
/// An inline-eligible request slower than this (plus `SLOW_NS_PER_KIB` per
/// KiB) counts as slow: the stack blocked, or the thread lost its CPU.
const SLOW_BASE: Duration = Duration::from_micros(200);
const SLOW_NS_PER_KIB: u64 = 1000;
/// Eligible requests run inline unless `SLOW_MAX` of the last `WINDOW` were
/// slow: a blocking stack is slow every time, a busy machine now and then.
const WINDOW: u32 = 32;
const SLOW_MAX: u32 = 8;
/// The reader yields after this many inline requests in a row, so the
/// writer (and other tasks on its thread) get to run.
const INLINE_BURST: u32 = 32;
/// Request bytes read from the socket at once. Payloads at least this big
/// (after what is already buffered) are read straight into their buffer, so
/// it is kept small: one copy of large writes, not two.
const READ_BUFFER: usize = 64 << 10;
/// Most replies written with one `writev`, and the reply buffer of streams
/// without vectored writes.
const WRITE_BATCH: usize = 64;
const WRITE_BUFFER: usize = 256 << 10;

/// Buffers smaller than this are not worth keeping.
const POOL_MIN_BUFFER: usize = 4096;
/// Buffers larger than this are not kept.
const POOL_MAX_BUFFER: usize = 4 << 20;
/// Most bytes kept for reuse per connection.
const POOL_MAX_BYTES: usize = 32 << 20;

/// Per-connection state the request workers share.
struct Conn {
    session: Session,
    wrote: AtomicBool,
    pace: Pace,
    buffers: Buffers,
    alloc: Arc<AllocMap>,
}

/// Smallest chunk `AllocMap` tracks, and the most chunks it keeps.
const ALLOC_MIN_CHUNK_SHIFT: u32 = 26;
const ALLOC_MAX_CHUNKS: u64 = 1 << 16;
/// A chunk with holes is looked at again once writes into it add up to
/// this fraction of it (1/8).
const ALLOC_RELEARN_SHIFT: u32 = 3;
/// Chunk state: bit 0 all data, bit 1 has holes, bits 2-31 KiB written since
/// learnt, bits 32-63 count trims and zeroings.
const CHUNK_DATA: u64 = 1;
const CHUNK_MIXED: u64 = 2;
const CHUNK_KIB: u64 = 4;
const CHUNK_KIB_MASK: u64 = 0xffff_fffc;
const CHUNK_GEN: u64 = 1 << 32;

/// Which chunks of an export read as data throughout, shared by the
/// export's connections, so that a structured READ there needs no
/// block-status lookup (two `lseek`s on a raw file) to choose between data
/// and hole chunks.
///
/// A chunk is learnt with one block-status call over it and forgotten by
/// any trim or zeroing that touches it (they may punch holes); a chunk with
/// holes is learnt again once enough has been written into it. A chunk
/// wrongly taken for data would only cost a hole sent as zeroes, never
/// wrong contents; the trim count keeps a trim racing a lookup from even
/// that.
pub(crate) struct AllocMap {
    shift: u32,
    size: u64,
    chunks: Box<[AtomicU64]>,
}

impl AllocMap {
    pub(crate) fn new(size: u64) -> AllocMap {
        let mut shift = ALLOC_MIN_CHUNK_SHIFT;
        while size.div_ceil(1 << shift) > ALLOC_MAX_CHUNKS {
            shift += 1;
        }
        let n = size.div_ceil(1 << shift) as usize;
        AllocMap {
            shift,
            size,
            chunks: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Chunk indexes covering `[off, off+len)`; empty unless the range is
    /// non-empty and inside the export.
    fn span(&self, off: u64, len: u64) -> std::ops::Range<usize> {
        match off.checked_add(len) {
            Some(end) if len > 0 && end <= self.size => {
                (off >> self.shift) as usize..((end - 1) >> self.shift) as usize + 1
            }
            _ => 0..0,
        }
    }

    /// Whether `[off, off+len)` is known to read as data throughout,
    /// learning chunks from `dev` as needed.
    fn is_data(&self, dev: &dyn BlockDev, off: u64, len: u64) -> bool {
        let span = self.span(off, len);
        let mut all = !span.is_empty();
        let relearn = (1u64 << (self.shift - 10 - ALLOC_RELEARN_SHIFT)) * CHUNK_KIB;
        for i in span {
            let w = self.chunks[i].load(Ordering::Acquire);
            let known = if w & CHUNK_DATA != 0 {
                true
            } else if w & CHUNK_MIXED != 0 && w & CHUNK_KIB_MASK < relearn {
                false
            } else {
                self.learn(dev, i, w)
            };
            all &= known;
        }
        all
    }

    /// Ask `dev` about chunk `i`, last seen as `w`; true if it is all data.
    fn learn(&self, dev: &dyn BlockDev, i: usize, w: u64) -> bool {
        let start = (i as u64) << self.shift;
        let len = (1u64 << self.shift).min(self.size - start);
        let learnt = match dev.block_status(start, len) {
            Ok(e)
                if e.first()
                    .is_some_and(|e| e.state == Alloc::Data && e.len >= len) =>
            {
                CHUNK_DATA
            }
            Ok(_) => CHUNK_MIXED,
            Err(_) => return false,
        };
        // Fails if a trim or zeroing got in: then nothing is learnt.
        let now = (w & !(CHUNK_DATA | CHUNK_MIXED | CHUNK_KIB_MASK)) | learnt;
        let set = self.chunks[i].compare_exchange(w, now, Ordering::AcqRel, Ordering::Relaxed);
        set.is_ok() && learnt == CHUNK_DATA
    }

    /// A write landed: chunks with holes may have fewer.
    fn wrote(&self, off: u64, len: u64) {
        let kib = len.div_ceil(1024).min(CHUNK_KIB_MASK / CHUNK_KIB) * CHUNK_KIB;
        for c in &self.chunks[self.span(off, len)] {
            if c.load(Ordering::Relaxed) & CHUNK_MIXED != 0 {
                let _ = c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                    let written = ((w & CHUNK_KIB_MASK) + kib).min(CHUNK_KIB_MASK);
                    Some((w & !CHUNK_KIB_MASK) | written)
                });
            }
        }
    }

    /// A trim or zeroing ran (successfully or not): forget what is known.
    fn punched(&self, off: u64, len: u64) {
        for c in &self.chunks[self.span(off, len)] {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                Some((w & !(CHUNK_DATA | CHUNK_MIXED | CHUNK_KIB_MASK)).wrapping_add(CHUNK_GEN))
            });
        }
    }
}

/// A reply ready for the wire: the first `len` bytes of `buf`. It holds its
/// request's slot among the `max_in_flight` until it has been written.
struct Reply {
    buf: Vec<u8>,
    len: usize,
    slot: Option<OwnedSemaphorePermit>,
}

impl From<Vec<u8>> for Reply {
    fn from(buf: Vec<u8>) -> Reply {
        let len = buf.len();
        Reply {
            buf,
            len,
            slot: None,
        }
    }
}

/// READ data and WRITE payload buffers, reused so that large requests do
/// not zero-fill and page-fault fresh memory every time. A reused buffer
/// holds stale bytes of an earlier request of the same connection; only
/// bytes that were just filled are used (`read_at` fills all of its buffer,
/// a payload is read in full before use).
#[derive(Default)]
struct Buffers {
    free: Mutex<FreeList>,
}

#[derive(Default)]
struct FreeList {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl Buffers {
    /// A buffer of at least `len` bytes, contents unspecified.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let b = free.bufs.swap_remove(i);
                free.bytes -= b.len();
                b
            }
            None => {
                drop(free);
                vec![0u8; len]
            }
        }
    }

    /// Keep `buf` for reuse if there is room.
    fn give(&self, buf: Vec<u8>) {
        if !(POOL_MIN_BUFFER..=POOL_MAX_BUFFER).contains(&buf.len()) {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.bytes + buf.len() <= POOL_MAX_BYTES {
            free.bytes += buf.len();
            free.bufs.push(buf);
        }
    }
}

/// Whether inline-eligible requests run inline, from how long recent ones
/// took (wherever they ran).
#[derive(Default)]
struct Pace {
    /// Bits 0-7: requests seen in this window; 8-15: slow ones; 16: offload.
    state: AtomicU32,
}

const PACE_SLOW: u32 = 1 << 8;
const PACE_OFFLOAD: u32 = 1 << 16;

impl Pace {
    fn inline(&self) -> bool {
        self.state.load(Ordering::Relaxed) & PACE_OFFLOAD == 0
    }

    /// Account an inline-eligible request of `len` bytes that took `took`.
    fn observe(&self, len: u32, took: Duration) {
        let limit = SLOW_BASE + Duration::from_nanos(SLOW_NS_PER_KIB * (len as u64 >> 10));
        let slow = took > limit;
        let was = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                let seen = (s & 0xff) + 1;
                let slows = ((s >> 8) & 0xff) + slow as u32;
                Some(if slows >= SLOW_MAX {
                    PACE_OFFLOAD
                } else if seen >= WINDOW {
                    0
                } else {
                    (s & PACE_OFFLOAD) | (slows * PACE_SLOW) | seen
                })
            })
            .unwrap_or_default();
        if was & PACE_OFFLOAD != self.state.load(Ordering::Relaxed) & PACE_OFFLOAD {
            tracing::debug!(
                inline = self.inline(),
                "small requests switch between inline and the blocking pool"
            );
        }
    }
}

fn inline_eligible(req: &Request) -> bool {
    matches!(req.cmd, CMD_READ | CMD_WRITE)
        && req.flags & CMD_FLAG_FUA == 0
        && req.length <= inline_max()
}

fn inline_max() -> u32 {
    static V: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("XINLINE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(INLINE_MAX_LEN)
    })
}

/// Map a block-layer error to the NBD error value.
pub fn errno(e: &Error) -> u32 {
    match e.kind() {
        ErrorKind::OutOfRange if e.op().is_write() => ENOSPC,
        ErrorKind::OutOfRange | ErrorKind::InvalidArgument => EINVAL,
        ErrorKind::ReadOnly | ErrorKind::PermissionDenied => EPERM,
        ErrorKind::NoSpace => ENOSPC,
        ErrorKind::Unsupported => ENOTSUP,
        ErrorKind::Shutdown => ESHUTDOWN,
        ErrorKind::Io | ErrorKind::Corrupt | ErrorKind::NotFound => EIO,
    }
}

/// Run the transmission phase until the client disconnects or the server
/// shuts down. Waits for in-flight requests and, once the connection is
/// closed, flushes the export if this connection wrote anything, so nothing
/// acknowledged is left in a layer's volatile buffers when a client
/// vanishes.
pub async fn serve(
    stream: BoxStream,
    session: Session,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
    let conn = Arc::new(Conn {
        wrote: AtomicBool::new(false),
        pace: Pace::default(),
        buffers: Buffers::default(),
        alloc: shared.alloc_map(&session.export),
        session,
    });
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(write_replies(wr, rx, conn.clone()));

    // A request holds a slot from when it starts until its reply is written
    // (so a client that does not read its replies is pushed back too), and
    // a `running` permit while it runs on the blocking pool.
    let max = shared.max_in_flight;
    let slots = Arc::new(Semaphore::new(max));
    let running = Arc::new(Semaphore::new(max));
    let mut shutdown = shared.shutdown_rx();
    let mut burst = 0u32;
    let result = loop {
        let mut hdr = [0u8; REQUEST_SIZE];
        tokio::select! {
            r = rd.read_exact(&mut hdr) => {
                if let Err(e) = r {
                    break if e.kind() == std::io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(e) };
                }
            }
            _ = shutdown.changed() => break Ok(()),
        }
        let req = match parse_request(&hdr) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "protocol violation; closing connection");
                break Ok(());
            }
        };
        if req.cmd == CMD_DISC {
            break Ok(());
        }
        let mut payload = Vec::new();
        if req.cmd == CMD_WRITE {
            if req.length > MAX_PAYLOAD {
                // Stay in sync with the stream: consume and refuse.
                tokio::io::copy(
                    &mut (&mut rd).take(req.length as u64),
                    &mut tokio::io::sink(),
                )
                .await?;
                let _ = tx.send(error_reply(
                    &conn.session,
                    req.handle,
                    EOVERFLOW,
                    "write larger than the 32 MiB maximum",
                ));
                continue;
            }
            payload = conn.buffers.take(req.length as usize);
            // A client stalled mid-payload must not hold up a shutdown: the
            // request is incomplete, so nothing was acknowledged.
            let r = tokio::select! {
                r = rd.read_exact(&mut payload[..req.length as usize]) => r,
                _ = shutdown.changed() => break Ok(()),
            };
            if let Err(e) = r {
                break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) => tokio::select! {
                s = slots.clone().acquire_owned() => s.expect("semaphore never closed"),
                _ = shutdown.changed() => break Ok(()),
            },
        };
        let eligible = inline_eligible(&req);
        if eligible && conn.pace.inline() {
            let start = Instant::now();
            let mut reply = handle_guarded(&conn, req, &payload);
            reply.slot = Some(slot);
            conn.pace.observe(req.length, start.elapsed());
            conn.buffers.give(payload);
            let _ = tx.send(reply);
            burst += 1;
            if burst == INLINE_BURST {
                burst = 0;
                tokio::task::yield_now().await;
            }
            continue;
        }
        burst = 0;
        let permit = running
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let conn = conn.clone();
        let tx = tx.clone();
        shared.spawn_blocking(move || {
            let start = Instant::now();
            let mut reply = handle_guarded(&conn, req, &payload);
            reply.slot = Some(slot);
            if eligible {
                conn.pace.observe(req.length, start.elapsed());
            }
            conn.buffers.give(payload);
            let _ = tx.send(reply);
            drop(permit);
        });
    };
    // Wait for every in-flight request and send the replies; close the
    // connection, then flush what this client wrote: the client, which
    // asked for no flush, need not wait for it, and the server still does
    // not finish (nor shut down) before it is done.
    let _all = running
        .acquire_many(max as u32)
        .await
        .expect("semaphore never closed");
    drop(tx);
    let _ = writer.await;
    drop(rd);
    if conn.wrote.load(Ordering::Acquire) {
        let dev = conn.session.export.dev.clone();
        let flushed = shared.spawn_blocking(move || dev.flush()).await;
        if let Ok(Err(e)) = flushed {
            tracing::error!(error = %e, "flush at disconnect failed");
        }
    }
    result
}

/// Write replies as they come, each batch of ready ones with one `writev`
/// when the stream supports it (no copy), else through a buffer (TLS).
async fn write_replies(
    mut w: WriteHalf<BoxStream>,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    conn: Arc<Conn>,
) -> std::io::Result<()> {
    let mut batch = Vec::new();
    if w.is_write_vectored() {
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let mut slices: Vec<IoSlice> = batch
                .iter()
                .map(|r| IoSlice::new(&r.buf[..r.len]))
                .collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                let n = w.write_vectored(rest).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
            for r in batch.drain(..) {
                conn.buffers.give(r.buf);
            }
        }
        let _ = w.shutdown().await;
    } else {
        let mut w = BufWriter::with_capacity(WRITE_BUFFER, w);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while let Ok(r) = rx.try_recv() {
                batch.push(r);
            }
            for r in &batch {
                w.write_all(&r.buf[..r.len]).await?;
            }
            w.flush().await?;
            for r in batch.drain(..) {
                conn.buffers.give(r.buf);
            }
        }
        let _ = w.shutdown().await;
    }
    Ok(())
}

fn error_reply(s: &Session, handle: u64, err: u32, msg: &str) -> Reply {
    if s.structured {
        encode_error_chunk(handle, err, msg).into()
    } else {
        encode_simple_reply(err, handle).to_vec().into()
    }
}

fn ok_reply(handle: u64) -> Reply {
    encode_simple_reply(0, handle).to_vec().into()
}

fn fail(s: &Session, handle: u64, e: &Error) -> Reply {
    let n = errno(e);
    if n == EIO {
        tracing::error!(error = %e, "I/O error");
    } else {
        tracing::debug!(error = %e, "request refused");
    }
    error_reply(s, handle, n, &e.to_string())
}

/// `handle`, but a bug that panics in a layer becomes an EIO reply for that
/// request instead of a client waiting forever.
fn handle_guarded(conn: &Conn, req: Request, payload: &[u8]) -> Reply {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(conn, req, payload))) {
        Ok(r) => r,
        Err(_) => {
            tracing::error!(
                cmd = req.cmd,
                offset = req.offset,
                length = req.length,
                "request handler panicked; replying EIO"
            );
            error_reply(
                &conn.session,
                req.handle,
                EIO,
                "internal error (the server logged it)",
            )
        }
    }
}

/// Execute one request and produce its complete reply. `payload` holds a
/// WRITE's data in its first `req.length` bytes.
fn handle(conn: &Conn, req: Request, payload: &[u8]) -> Reply {
    let s = &conn.session;
    let dev: &dyn BlockDev = s.export.dev.as_ref();
    let h = req.handle;
    let mut valid = allowed_flags(req.cmd);
    let caps = dev.caps();
    if caps.can_write && caps.can_fua {
        // The spec: a server advertising FUA accepts it on every command
        // (old qemu sends FLUSH with FUA); it means nothing on reads.
        valid |= CMD_FLAG_FUA;
    }
    if req.flags & !valid != 0 {
        return error_reply(s, h, EINVAL, "flag not valid for this command");
    }
    let off = req.offset;
    let len = req.length as u64;
    let needs_len = matches!(
        req.cmd,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE | CMD_BLOCK_STATUS
    );
    if needs_len && len == 0 {
        return error_reply(s, h, EINVAL, "zero-length request");
    }
    let fua = req.flags & CMD_FLAG_FUA != 0;
    match req.cmd {
        CMD_READ => {
            if req.length > MAX_PAYLOAD {
                return error_reply(s, h, EOVERFLOW, "read larger than the 32 MiB maximum");
            }
            if req.flags & CMD_FLAG_DF != 0 && !s.structured {
                return error_reply(s, h, EINVAL, "DF needs structured replies");
            }
            let df = req.flags & CMD_FLAG_DF != 0;
            match read_reply(s, dev, conn, h, off, req.length, df) {
                Ok(v) => v,
                Err(e) => fail(s, h, &e),
            }
        }
        CMD_WRITE => {
            conn.wrote.store(true, Ordering::Release);
            let r = dev.write_at(&payload[..req.length as usize], off, WriteFlags { fua });
            conn.alloc.wrote(off, len);
            match r {
                Ok(()) => ok_reply(h),
                Err(e) => fail(s, h, &e),
            }
        }
        CMD_FLUSH => match dev.flush() {
            Ok(()) => ok_reply(h),
            Err(e) => fail(s, h, &e),
        },
        CMD_TRIM => {
            conn.wrote.store(true, Ordering::Release);
            let r = dev.trim(off, len, WriteFlags { fua });
            conn.alloc.punched(off, len);
            match r {
                Ok(()) => ok_reply(h),
                Err(e) => fail(s, h, &e),
            }
        }
        CMD_WRITE_ZEROES => {
            conn.wrote.store(true, Ordering::Release);
            let flags = ZeroFlags {
                fua,
                may_trim: req.flags & CMD_FLAG_NO_HOLE == 0,
                fast: req.flags & CMD_FLAG_FAST_ZERO != 0,
            };
            let r = dev.write_zeroes(off, len, flags);
            conn.alloc.punched(off, len);
            match r {
                Ok(()) => ok_reply(h),
                Err(e) => fail(s, h, &e),
            }
        }
        CMD_CACHE => match dev.cache(off, len) {
            Ok(()) => ok_reply(h),
            Err(e) => fail(s, h, &e),
        },
        CMD_BLOCK_STATUS => {
            if !s.base_allocation {
                return error_reply(s, h, EINVAL, "no metadata context negotiated");
            }
            match block_status_reply(dev, h, off, len, req.flags & CMD_FLAG_REQ_ONE != 0) {
                Ok(v) => v.into(),
                Err(e) => fail(s, h, &e),
            }
        }
        _ => error_reply(s, h, EINVAL, "unknown command"),
    }
}

/// Build a READ reply: simple, or structured with hole chunks for ranges
/// that read as zeroes (unless DF forbids fragmenting).
fn read_reply(
    s: &Session,
    dev: &dyn BlockDev,
    conn: &Conn,
    h: u64,
    off: u64,
    len: u32,
    df: bool,
) -> Result<Reply, Error> {
    let bufs = &conn.buffers;
    if !s.structured {
        return pooled_reply(bufs, &encode_simple_reply(0, h), dev, off, len);
    }
    let extents = if df || !dev.caps().can_extents || conn.alloc.is_data(dev, off, len as u64) {
        Vec::new()
    } else {
        extents_covering(dev, off, len as u64)?
    };
    if extents.len() <= 1 && extents.first().is_none_or(|e| e.state == Alloc::Data) {
        let mut head = Vec::with_capacity(CHUNK_HEADER_SIZE + 8);
        put_chunk_header(
            &mut head,
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            h,
            8 + len,
        );
        head.extend_from_slice(&off.to_be_bytes());
        return pooled_reply(bufs, &head, dev, off, len);
    }
    let data_bytes: u64 = extents
        .iter()
        .filter(|e| e.state == Alloc::Data)
        .map(|e| e.len)
        .sum();
    let mut v = Vec::with_capacity(extents.len() * (CHUNK_HEADER_SIZE + 12) + data_bytes as usize);
    let mut pos = off;
    let n = extents.len();
    for (i, e) in extents.iter().enumerate() {
        let flags = if i + 1 == n { REPLY_FLAG_DONE } else { 0 };
        if e.state.is_zero() {
            put_chunk_header(&mut v, flags, REPLY_TYPE_OFFSET_HOLE, h, 12);
            v.extend_from_slice(&pos.to_be_bytes());
            v.extend_from_slice(&(e.len as u32).to_be_bytes());
        } else {
            put_chunk_header(&mut v, flags, REPLY_TYPE_OFFSET_DATA, h, 8 + e.len as u32);
            v.extend_from_slice(&pos.to_be_bytes());
            let start = v.len();
            v.resize(start + e.len as usize, 0);
            dev.read_at(&mut v[start..], pos)?;
        }
        pos += e.len;
    }
    Ok(v.into())
}

/// `head` followed by `len` bytes read at `off`, in a reused buffer.
fn pooled_reply(
    bufs: &Buffers,
    head: &[u8],
    dev: &dyn BlockDev,
    off: u64,
    len: u32,
) -> Result<Reply, Error> {
    let n = head.len() + len as usize;
    let mut buf = bufs.take(n);
    buf[..head.len()].copy_from_slice(head);
    if let Err(e) = dev.read_at(&mut buf[head.len()..n], off) {
        bufs.give(buf);
        return Err(e);
    }
    Ok(Reply {
        buf,
        len: n,
        slot: None,
    })
}

/// Build a BLOCK_STATUS reply for `base:allocation`.
fn block_status_reply(
    dev: &dyn BlockDev,
    h: u64,
    off: u64,
    len: u64,
    req_one: bool,
) -> Result<Vec<u8>, Error> {
    let extents = dev.block_status(off, len)?;
    if extents.is_empty() {
        return Err(Error::new(
            ErrorKind::Io,
            Op::BlockStatus,
            "nbd",
            "stack returned no extent",
        )
        .at(off));
    }
    let mut body = Vec::with_capacity(4 + extents.len() * 8);
    body.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    let mut total = 0u64;
    for e in &extents {
        let l = e.len.min(len - total).min(u32::MAX as u64 & !511);
        if l == 0 {
            break;
        }
        body.extend_from_slice(&(l as u32).to_be_bytes());
        body.extend_from_slice(&e.state.nbd_flags().to_be_bytes());
        total += l;
        if req_one || l < e.len || total >= len {
            break;
        }
    }
    let mut v = Vec::with_capacity(CHUNK_HEADER_SIZE + body.len());
    put_chunk_header(
        &mut v,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        h,
        body.len() as u32,
    );
    v.extend_from_slice(&body);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::layers::mem::MemDev;

    const MIB: u64 = 1 << 20;

    #[test]
    fn alloc_map_learns_data_chunks_and_forgets_them_on_trim() {
        let dev = MemDev::new(256 * MIB);
        let map = AllocMap::new(dev.size());
        assert_eq!(map.chunks.len(), 4);
        dev.write_at(&vec![1u8; 64 << 20], 0, WriteFlags::default())
            .unwrap();
        assert!(map.is_data(&dev, 4096, 4096));
        // The second chunk has holes, and a read spanning both is not all data.
        assert!(!map.is_data(&dev, 64 * MIB + 4096, 4096));
        assert!(!map.is_data(&dev, 64 * MIB - 4096, 8192));
        dev.trim(0, 65536, WriteFlags::default()).unwrap();
        map.punched(0, 65536);
        assert!(!map.is_data(&dev, 4096, 4096));
        // Out of range or empty: never known.
        assert!(!map.is_data(&dev, 256 * MIB - 4096, 8192));
        assert!(!map.is_data(&dev, 0, 0));
        assert!(map.span(u64::MAX - 10, 100).is_empty());
    }

    #[test]
    fn alloc_map_looks_again_at_a_chunk_with_holes_after_enough_writes() {
        let dev = MemDev::new(64 * MIB);
        let map = AllocMap::new(dev.size());
        assert!(!map.is_data(&dev, 0, 4096));
        // Fill the chunk; the map notices only once 1/8 of it was written.
        let piece = vec![7u8; (4 * MIB) as usize];
        for i in 0..16 {
            dev.write_at(&piece, i * 4 * MIB, WriteFlags::default())
                .unwrap();
            if i == 0 {
                map.wrote(0, 4 * MIB);
                assert!(!map.is_data(&dev, 0, 4096));
            }
        }
        map.wrote(4 * MIB, 4 * MIB);
        assert!(map.is_data(&dev, 0, 4096));
    }

    #[test]
    fn alloc_map_learns_nothing_when_a_trim_races_the_lookup() {
        let dev = MemDev::new(64 * MIB);
        dev.write_at(&vec![1u8; 64 << 20], 0, WriteFlags::default())
            .unwrap();
        let map = AllocMap::new(dev.size());
        let seen = map.chunks[0].load(Ordering::Acquire);
        map.punched(0, 4096);
        assert!(!map.learn(&dev, 0, seen));
        assert_eq!(map.chunks[0].load(Ordering::Acquire) & CHUNK_DATA, 0);
    }

    #[test]
    fn pace_offloads_a_blocking_stack_and_comes_back_when_it_is_fast() {
        let pace = Pace::default();
        let slow = Duration::from_millis(5);
        let fast = Duration::from_micros(5);
        // The odd slow request (a busy machine) keeps requests inline.
        for i in 0..WINDOW * 4 {
            pace.observe(4096, if i % 16 == 0 { slow } else { fast });
            assert!(pace.inline());
        }
        for _ in 0..SLOW_MAX {
            pace.observe(4096, slow);
        }
        assert!(!pace.inline());
        // A large request may take longer before it counts as slow.
        for _ in 0..WINDOW {
            pace.observe(1 << 20, Duration::from_micros(600));
        }
        assert!(pace.inline());
    }

    #[test]
    fn buffers_are_reused_smallest_fit_first_and_bounded() {
        let b = Buffers::default();
        b.give(vec![1u8; 8192]);
        b.give(vec![2u8; 1 << 20]);
        b.give(vec![3u8; 100]);
        assert_eq!(b.take(4096).len(), 8192);
        assert_eq!(b.take(4096).len(), 1 << 20);
        assert_eq!(b.take(4096).len(), 4096);
        for _ in 0..64 {
            b.give(vec![0u8; POOL_MAX_BUFFER]);
        }
        let free = b.free.lock().unwrap();
        assert!(free.bytes <= POOL_MAX_BYTES);
        assert_eq!(free.bytes, free.bufs.iter().map(Vec::len).sum::<usize>());
    }
}
