//! The transmission phase: read requests, run them on the blocking pool,
//! write replies as they complete (out of order).
//!
//! One task reads requests; each request runs on tokio's blocking pool
//! (block layers do synchronous I/O); one task writes replies. At most
//! `max_in_flight` requests run at once per connection; beyond that the
//! reader waits, which pushes back on the client through TCP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use roamdisk_blockdev::{
    extents_covering, Alloc, BlockDev, Error, ErrorKind, Op, WriteFlags, ZeroFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};

use crate::handshake::Session;
use crate::proto::*;
use crate::server::{BoxStream, Shared};

/// Per-connection state the request workers share.
struct Conn {
    session: Session,
    wrote: AtomicBool,
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
/// shuts down. Waits for in-flight requests and flushes the export if this
/// connection wrote anything, so nothing acknowledged is left in a layer's
/// volatile buffers when a client vanishes.
pub async fn serve(
    stream: BoxStream,
    session: Session,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(256 * 1024, wr);
        while let Some(mut msg) = rx.recv().await {
            loop {
                w.write_all(&msg).await?;
                match rx.try_recv() {
                    Ok(m) => msg = m,
                    Err(_) => break,
                }
            }
            w.flush().await?;
        }
        let _ = w.shutdown().await;
        Ok::<_, std::io::Error>(())
    });

    let max = shared.max_in_flight;
    let sem = Arc::new(Semaphore::new(max));
    let conn = Arc::new(Conn {
        session,
        wrote: AtomicBool::new(false),
    });
    let mut shutdown = shared.shutdown_rx();
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
            payload = vec![0u8; req.length as usize];
            if let Err(e) = rd.read_exact(&mut payload).await {
                break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
        }
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let conn = conn.clone();
        let tx = tx.clone();
        tokio::task::spawn_blocking(move || {
            let reply = handle(&conn, req, payload);
            let _ = tx.send(reply);
            drop(permit);
        });
    };
    // Wait for every in-flight request, then flush what this client wrote.
    let _all = sem
        .acquire_many(max as u32)
        .await
        .expect("semaphore never closed");
    if conn.wrote.load(Ordering::Acquire) {
        let dev = conn.session.export.dev.clone();
        let flushed = tokio::task::spawn_blocking(move || dev.flush()).await;
        if let Ok(Err(e)) = flushed {
            tracing::error!(error = %e, "flush at disconnect failed");
        }
    }
    drop(tx);
    let _ = writer.await;
    result
}

fn error_reply(s: &Session, handle: u64, err: u32, msg: &str) -> Vec<u8> {
    if s.structured {
        encode_error_chunk(handle, err, msg)
    } else {
        encode_simple_reply(err, handle).to_vec()
    }
}

fn ok_reply(handle: u64) -> Vec<u8> {
    encode_simple_reply(0, handle).to_vec()
}

fn fail(s: &Session, handle: u64, e: &Error) -> Vec<u8> {
    let n = errno(e);
    if n == EIO {
        tracing::error!(error = %e, "I/O error");
    } else {
        tracing::debug!(error = %e, "request refused");
    }
    error_reply(s, handle, n, &e.to_string())
}

/// Execute one request and produce its complete reply.
fn handle(conn: &Conn, req: Request, payload: Vec<u8>) -> Vec<u8> {
    let s = &conn.session;
    let dev: &dyn BlockDev = s.export.dev.as_ref();
    let h = req.handle;
    if req.flags & !allowed_flags(req.cmd) != 0 {
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
            match read_reply(s, dev, h, off, req.length, df) {
                Ok(v) => v,
                Err(e) => fail(s, h, &e),
            }
        }
        CMD_WRITE => {
            conn.wrote.store(true, Ordering::Release);
            match dev.write_at(&payload, off, WriteFlags { fua }) {
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
            match dev.trim(off, len, WriteFlags { fua }) {
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
            match dev.write_zeroes(off, len, flags) {
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
                Ok(v) => v,
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
    h: u64,
    off: u64,
    len: u32,
    df: bool,
) -> Result<Vec<u8>, Error> {
    if !s.structured {
        let mut v = vec![0u8; 16 + len as usize];
        dev.read_at(&mut v[16..], off)?;
        v[..16].copy_from_slice(&encode_simple_reply(0, h));
        return Ok(v);
    }
    let extents = if df || !dev.caps().can_extents {
        Vec::new()
    } else {
        extents_covering(dev, off, len as u64)?
    };
    if extents.len() <= 1 && extents.first().is_none_or(|e| e.state == Alloc::Data) {
        let mut v = Vec::with_capacity(CHUNK_HEADER_SIZE + 8 + len as usize);
        put_chunk_header(&mut v, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, h, 8 + len);
        v.extend_from_slice(&off.to_be_bytes());
        let start = v.len();
        v.resize(start + len as usize, 0);
        dev.read_at(&mut v[start..], off)?;
        return Ok(v);
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
    Ok(v)
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
