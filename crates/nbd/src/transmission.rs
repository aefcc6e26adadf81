//! The transmission phase: read requests, run them, write replies as they
//! complete (out of order).
//!
//! One task reads requests; one task writes replies, each batch of ready
//! ones with a single `writev`. Block layers do synchronous I/O, so a
//! request runs either on the server's blocking pool or, when it is a read
//! or write and the stack has not been blocking ([`pace`]), inline on the
//! reader task: a thread hand-off costs more than a page-cache hit, and on
//! a busy machine each hand-off waits for a CPU. Small ones always qualify;
//! large ones only while enough connections are busy to keep every CPU
//! working (otherwise the pool overlaps one request's copy with the next
//! one's transfer). A stack that blocks (disk misses, network) is noticed
//! and gets the pool back, with its concurrency. Between requests of a
//! client that sends them back to back, the thread polls briefly instead of
//! sleeping ([`spin`]).

//! A request holds one of `max_in_flight` slots from when it starts until
//! its reply is written; with none free the reader stops reading, which
//! pushes back on the client (also one that does not read its replies).
//!
//! Every request runs, start to finish, on one thread (inline or on the
//! pool) inside [`context::with_context`] with the connection's client id,
//! so layers such as the `trace` recorder know which client issued it; so
//! does the settle at disconnect.
//!
//! READ data and WRITE payloads live in reused per-connection buffers
//! ([`buffers`]); whether a structured READ must look for holes comes from
//! what the export's connections have learnt of its allocation ([`alloc`]).

pub(crate) mod alloc;
mod buffers;
pub(crate) mod pace;
pub(crate) mod spin;
#[cfg(test)]
mod tests;

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::context::{self, IoContext};
use roamdisk_blockdev::{
    extents_covering, Alloc, BlockDev, Error, ErrorKind, Op, WriteFlags, ZeroFlags,
};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, WriteHalf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use self::alloc::AllocMap;
use self::buffers::Buffers;
use self::pace::Pace;
use self::spin::Spin;
use crate::handshake::Session;
use crate::proto::*;
use crate::shared::Shared;
use crate::stream::BoxStream;

/// Reads and writes up to this size may run inline.
/// Larger ones go to the pool, where copying one request's data overlaps
/// with receiving or sending the next on another CPU, unless there are
/// enough busy connections to keep the CPUs busy ([`BusyConns`](pace::BusyConns)); then
/// those up to `INLINE_WIDE_MAX_LEN` run inline too.
const INLINE_MAX_LEN: u32 = 64 << 10;
const INLINE_WIDE_MAX_LEN: u32 = 4 << 20;
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

/// Per-connection state the request workers share.
struct Conn {
    session: Session,
    /// What the layers see while they run this connection's requests.
    ctx: IoContext,
    wrote: AtomicBool,
    /// Requests holding a slot; from 0 to 1 and back the connection
    /// enters and leaves the server's [`BusyConns`](pace::BusyConns).
    in_flight: AtomicUsize,
    pace: Pace,
    buffers: Buffers,
    alloc: Arc<AllocMap>,
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

/// Whether `req` may run inline; `wide`: large ones too.
fn inline_eligible(req: &Request, wide: bool) -> bool {
    let max = if wide {
        INLINE_WIDE_MAX_LEN
    } else {
        INLINE_MAX_LEN
    };
    matches!(req.cmd, CMD_READ | CMD_WRITE) && req.flags & CMD_FLAG_FUA == 0 && req.length <= max
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
/// shuts down. Waits for in-flight requests and, before the connection
/// closes, settles the export if this connection wrote anything
/// ([`BlockDev::settle`]), so nothing acknowledged is left in a layer's
/// process memory when a client vanishes; durability against power loss is
/// what FLUSH is for, and a client that did not ask for it does not pay for
/// it. The layers see `client` as the issuer of every request.
pub async fn serve(
    stream: BoxStream,
    session: Session,
    shared: Arc<Shared>,
    client: u32,
) -> std::io::Result<()> {
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
    let conn = Arc::new(Conn {
        ctx: IoContext::for_client(client),
        wrote: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        pace: Pace::default(),
        buffers: Buffers::default(),
        alloc: shared.alloc_map(&session.export),
        session,
    });
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(write_replies(wr, rx, conn.clone(), shared.clone()));

    // A request holds a slot from when it starts until its reply is
    // written, and a `running` permit while it runs on the blocking pool.
    let max = shared.max_in_flight;
    let slots = Arc::new(Semaphore::new(max));
    let running = Arc::new(Semaphore::new(max));
    let mut shutdown = shared.shutdown_rx();
    let mut burst = 0u32;
    let mut spin = Spin::new(shared.busy_poll);
    let result = loop {
        let mut hdr = [0u8; REQUEST_SIZE];
        let waiting = if rd.buffer().is_empty() {
            let now = Instant::now();
            let idle = || slots.available_permits() == max;
            spin.wait(&mut rd, &shared.spinners, idle).await;
            Some(now)
        } else {
            None
        };
        tokio::select! {
            r = rd.read_exact(&mut hdr) => {
                if let Err(e) = r {
                    break if e.kind() == std::io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(e) };
                }
            }
            _ = shutdown.changed() => break Ok(()),
        }
        if let Some(t) = waiting {
            spin.arrived(t.elapsed());
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
        if conn.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            shared.busy.enter();
        }
        let eligible = inline_eligible(&req, shared.busy.wide());
        if eligible && conn.pace.inline() {
            let probe = conn.pace.start();
            let mut reply = handle_guarded(&conn, req, &payload);
            reply.slot = Some(slot);
            conn.pace.finish(probe, req.length);
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
            let probe = if eligible { conn.pace.start() } else { None };
            let mut reply = handle_guarded(&conn, req, &payload);
            reply.slot = Some(slot);
            conn.pace.finish(probe, req.length);
            conn.buffers.give(payload);
            let _ = tx.send(reply);
            drop(permit);
        });
    };
    // Wait for every in-flight request, settle what this client wrote
    // (free for `raw`, a flush for layers holding writes in memory), then
    // send the last replies and close: once the connection is closed, a
    // crash of this process loses nothing the client was told succeeded.
    let _all = running
        .acquire_many(max as u32)
        .await
        .expect("semaphore never closed");
    if conn.wrote.load(Ordering::Acquire) {
        let dev = conn.session.export.dev.clone();
        let ctx = conn.ctx;
        let settled = shared
            .spawn_blocking(move || context::with_context(ctx, || dev.settle()))
            .await;
        if let Ok(Err(e)) = settled {
            tracing::error!(error = %e, "settling writes at disconnect failed");
        }
    }
    drop(tx);
    let _ = writer.await;
    // Replies the writer could not send (the client went away) were
    // dropped uncounted.
    if conn.in_flight.load(Ordering::Relaxed) != 0 {
        shared.busy.leave();
    }
    drop(rd);
    result
}

/// Write replies as they come, each batch of ready ones with one `writev`
/// when the stream supports it (no copy), else through a buffer (TLS).
async fn write_replies(
    mut w: WriteHalf<BoxStream>,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    // The batch is written: its requests are no longer in flight.
    let answered = |batch: &mut Vec<Reply>| {
        let n = batch.iter().filter(|r| r.slot.is_some()).count();
        if n > 0 && conn.in_flight.fetch_sub(n, Ordering::Relaxed) == n {
            shared.busy.leave();
        }
        for r in batch.drain(..) {
            conn.buffers.give(r.buf);
        }
    };
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
            answered(&mut batch);
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
            answered(&mut batch);
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
    } else if e.kind() == ErrorKind::ReadOnly
        && !s
            .warned_read_only
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            peer = %s.peer,
            export = %s.export.name,
            "refused: write to a read-only export (logged once per connection)"
        );
    } else {
        tracing::debug!(error = %e, "request refused");
    }
    error_reply(s, handle, n, &e.to_string())
}

/// `handle` in the connection's context, but a bug that panics in a layer
/// becomes an EIO reply for that request instead of a client waiting
/// forever.
fn handle_guarded(conn: &Conn, req: Request, payload: &[u8]) -> Reply {
    let run = || context::with_context(conn.ctx, || handle(conn, req, payload));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
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
