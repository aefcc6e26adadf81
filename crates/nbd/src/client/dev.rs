//! The `nbd:` layer: an NBD export as a [`BlockDev`], reconnecting when
//! the connection drops.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roamdisk_blockdev::{
    write_zero_buffers, Alloc, BlockDev, Caps, Error, ErrorKind, Extent, Op, Result, WriteFlags,
    ZeroFlags,
};

use super::conn::{connect, Negotiated};
use super::pipeline::{Broken, Failed, Pipeline, Reply};
use super::sock::{io_err, proto_err, LAYER};
use super::tls::ClientTls;
use super::uri::NbdUri;
use crate::proto::*;

/// How the client connects and reconnects.
#[derive(Debug, Clone)]
pub struct NbdOptions {
    /// Ask for structured replies (and `base:allocation`); off, the client
    /// speaks simple replies only.
    pub structured: bool,
    /// Connection attempts after the connection drops, before a request
    /// fails.
    pub reconnect_tries: u32,
    /// Wait before the first attempt; it doubles for each next one, up to
    /// [`NbdOptions::max_backoff`].
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Longest wait for the server during one connection's handshake
    /// (TLS included); a silent server fails the attempt.
    pub handshake_timeout: Duration,
    /// Longest wait for a request's reply (None: for ever); past it the
    /// connection is dropped and made again, so a server or network gone
    /// silent fails the guest's request instead of hanging it.
    pub request_timeout: Option<Duration>,
}

impl Default for NbdOptions {
    /// Five attempts over about ten seconds (0.4 + 0.8 + 1.6 + 3.2 + 4 s);
    /// a request waits 60 s for its reply.
    fn default() -> Self {
        NbdOptions {
            structured: true,
            reconnect_tries: 5,
            first_backoff: Duration::from_millis(400),
            max_backoff: Duration::from_secs(4),
            handshake_timeout: Duration::from_secs(30),
            request_timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// An NBD export as a block device.
///
/// Any number of threads may call it at once: their requests share one
/// connection, in flight together. When the connection drops, the next
/// request (or the one that saw it drop) reconnects with bounded
/// exponential backoff and is sent again on the new connection; every
/// request the layer sends is idempotent (read, write, write-zeroes, trim,
/// flush, block-status), so running one twice is harmless.
///
/// What survives a *server* crash is the server's business, as with any
/// NBD client: writes acknowledged but not yet flushed may be lost. A
/// caller that needs them durable calls [`BlockDev::flush`] (or writes
/// with FUA) and only trusts what a successful flush covered.
pub struct NbdDev {
    uri: NbdUri,
    opts: NbdOptions,
    /// What the first connection negotiated; later ones must agree on
    /// the size.
    neg: Negotiated,
    conn: Mutex<Arc<Pipeline>>,
    /// An `nbds` URI's credentials, loaded once; every connection,
    /// reconnects included, runs STARTTLS with them.
    tls: Option<ClientTls>,
    read_only: bool,
    /// Connections re-established so far.
    reconnects: AtomicU64,
}

fn errno_kind(e: u32) -> ErrorKind {
    match e {
        EPERM => ErrorKind::ReadOnly,
        ENOSPC => ErrorKind::NoSpace,
        EINVAL | EOVERFLOW => ErrorKind::InvalidArgument,
        ENOTSUP => ErrorKind::Unsupported,
        ESHUTDOWN => ErrorKind::Shutdown,
        _ => ErrorKind::Io,
    }
}

fn start(uri: &NbdUri, opts: &NbdOptions, tls: Option<&ClientTls>) -> Result<Pipeline> {
    let (sock, neg) = connect(uri, opts.structured, tls, opts.handshake_timeout)?;
    Pipeline::start(sock, neg, opts.request_timeout).map_err(|e| io_err(Op::Open, e))
}

impl NbdDev {
    /// Connect to `uri` with the default options.
    pub fn connect(uri: &NbdUri) -> Result<NbdDev> {
        NbdDev::connect_with(uri, NbdOptions::default(), false)
    }

    /// Connect to `uri`; `read_only` refuses writes here even if the
    /// server takes them.
    pub fn connect_with(uri: &NbdUri, opts: NbdOptions, read_only: bool) -> Result<NbdDev> {
        let tls = uri.tls.as_ref().map(ClientTls::new).transpose()?;
        let p = start(uri, &opts, tls.as_ref())?;
        Ok(NbdDev {
            uri: uri.clone(),
            neg: p.neg,
            opts,
            conn: Mutex::new(Arc::new(p)),
            tls,
            read_only,
            reconnects: AtomicU64::new(0),
        })
    }

    /// Whether replies are structured on the current connection.
    pub fn structured(&self) -> bool {
        self.neg.structured
    }

    /// How many times the connection was re-established.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    fn current(&self) -> Arc<Pipeline> {
        self.conn.lock().clone()
    }

    /// Replace `old` by a new connection, unless another thread already
    /// did.
    fn reconnect(&self, old: &Arc<Pipeline>, op: Op, why: &Broken) -> Result<()> {
        let mut cur = self.conn.lock();
        if !Arc::ptr_eq(&cur, old) {
            return Ok(());
        }
        let began = Instant::now();
        let mut wait = self.opts.first_backoff;
        let mut last = None;
        for attempt in 1..=self.opts.reconnect_tries {
            tracing::warn!(uri = %self.uri, attempt, of = self.opts.reconnect_tries, reason = %why,
                "NBD connection lost; reconnecting in {} ms", wait.as_millis());
            std::thread::sleep(wait);
            wait = (wait * 2).min(self.opts.max_backoff);
            match start(&self.uri, &self.opts, self.tls.as_ref()) {
                Ok(p) if p.neg.size != self.neg.size => {
                    return Err(proto_err(
                        op,
                        format!(
                            "after reconnecting, {} is {} bytes, not {}: a different disk",
                            self.uri, p.neg.size, self.neg.size
                        ),
                    ));
                }
                Ok(p) => {
                    tracing::info!(uri = %self.uri, attempt, "NBD connection re-established");
                    *cur = Arc::new(p);
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(uri = %self.uri, attempt, error = %e, "reconnect failed");
                    last = Some(e);
                }
            }
        }
        let e = last.map_or_else(String::new, |e| format!(": {e}"));
        Err(proto_err(
            op,
            format!(
                "the connection to {} dropped ({why}) and {} reconnects over {:.0?} failed{e}",
                self.uri,
                self.opts.reconnect_tries,
                began.elapsed()
            ),
        ))
    }

    /// Run `f` on the current connection; if the connection drops, on a
    /// new one.
    fn run<T>(
        &self,
        op: Op,
        off: u64,
        mut f: impl FnMut(&Pipeline) -> Result<T, Failed>,
    ) -> Result<T> {
        let mut drops = 0;
        loop {
            let p = self.current();
            match f(&p) {
                Ok(v) => return Ok(v),
                Err(Failed::Server { errno, message }) => {
                    let m = if message.is_empty() {
                        format!("the server failed the request (errno {errno})")
                    } else {
                        format!("the server failed the request: {message} (errno {errno})")
                    };
                    return Err(Error::new(errno_kind(errno), op, LAYER, m).at(off));
                }
                Err(Failed::Gone(why)) => {
                    drops += 1;
                    if drops > self.opts.reconnect_tries {
                        return Err(proto_err(
                            op,
                            format!("the connection to {} keeps dropping: {why}", self.uri),
                        )
                        .at(off));
                    }
                    self.reconnect(&p, op, &why).map_err(|e| e.at(off))?;
                }
            }
        }
    }

    /// Split `[off, off+len)` into requests the server takes.
    fn pieces(&self, off: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
        let max = self.neg.max_request as u64;
        (0..len.div_ceil(max)).map(move |i| {
            let o = i * max;
            (off + o, (len - o).min(max) as u32)
        })
    }

    /// Send one command per piece of a range, all in flight together.
    fn ranged(&self, op: Op, cmd: u16, flags: u16, off: u64, len: u64) -> Result<()> {
        self.run(op, off, |p| {
            let sent = self
                .pieces(off, len)
                .map(|(o, n)| p.submit(cmd, flags, o, n, None))
                .collect::<Result<Vec<_>, _>>()?;
            for s in sent {
                s.wait()?;
            }
            Ok(())
        })
    }

    fn has(&self, flag: u16) -> bool {
        self.neg.flags & flag != 0
    }

    fn fua(&self, fua: bool) -> u16 {
        if fua && self.has(TF_SEND_FUA) {
            CMD_FLAG_FUA
        } else {
            0
        }
    }
}

fn unsupported(op: Op, m: &str) -> Error {
    Error::new(ErrorKind::Unsupported, op, LAYER, m)
}

impl BlockDev for NbdDev {
    roamdisk_blockdev::layer!(LAYER);
    fn describe(&self) -> String {
        format!(
            "nbd: {} ({}{} replies{})",
            self.uri,
            if self.tls.is_some() { "TLS, " } else { "" },
            if self.neg.structured {
                "structured"
            } else {
                "simple"
            },
            if self.neg.base_allocation.is_some() {
                ", base:allocation"
            } else {
                ""
            }
        )
    }
    fn size(&self) -> u64 {
        self.neg.size
    }
    fn caps(&self) -> Caps {
        Caps {
            can_write: !self.has(TF_READ_ONLY),
            can_flush: self.has(TF_SEND_FLUSH),
            can_fua: self.has(TF_SEND_FUA),
            can_trim: self.has(TF_SEND_TRIM),
            can_zero: true,
            can_fast_zero: self.has(TF_SEND_FAST_ZERO),
            can_multi_conn: self.has(TF_CAN_MULTI_CONN),
            can_extents: self.neg.base_allocation.is_some(),
            rotational: self.has(TF_ROTATIONAL),
            min_block: 1,
            preferred_block: self.neg.preferred,
        }
        .restrict(self.read_only)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.run(Op::Read, off, |p| {
            let sent = self
                .pieces(off, buf.len() as u64)
                .map(|(o, n)| p.submit(CMD_READ, 0, o, n, None).map(|s| (o, s)))
                .collect::<Result<Vec<_>, _>>()?;
            for (o, s) in sent {
                let Reply { data, .. } = s.wait()?;
                let at = (o - off) as usize;
                buf[at..at + data.len()].copy_from_slice(&data);
            }
            Ok(())
        })
    }
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let fua = self.fua(flags.fua);
        self.run(Op::Write, off, |p| {
            let sent = self
                .pieces(off, buf.len() as u64)
                .map(|(o, n)| {
                    let at = (o - off) as usize;
                    p.submit(CMD_WRITE, fua, o, n, Some(&buf[at..at + n as usize]))
                })
                .collect::<Result<Vec<_>, _>>()?;
            for s in sent {
                s.wait()?;
            }
            Ok(())
        })?;
        if flags.fua && fua == 0 {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        if !self.has(TF_SEND_FLUSH) {
            return Ok(());
        }
        self.run(Op::Flush, 0, |p| {
            p.submit(CMD_FLUSH, 0, 0, 0, None)?.wait().map(drop)
        })
    }
    fn trim(&self, off: u64, len: u64, flags: WriteFlags) -> Result<()> {
        if !self.has(TF_SEND_TRIM) {
            // A hint the server does not take: nothing to do.
            return Ok(());
        }
        self.ranged(Op::Trim, CMD_TRIM, self.fua(flags.fua), off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let op = Op::WriteZeroes;
        if !self.has(TF_SEND_WRITE_ZEROES) {
            if flags.fast {
                return Err(unsupported(op, "no fast zero"));
            }
            return write_zero_buffers(self, off, len, flags.fua);
        }
        let mut f = self.fua(flags.fua);
        if !flags.may_trim {
            f |= CMD_FLAG_NO_HOLE;
        }
        if flags.fast {
            if !self.has(TF_SEND_FAST_ZERO) {
                return Err(unsupported(op, "no fast zero"));
            }
            f |= CMD_FLAG_FAST_ZERO;
        }
        self.ranged(op, CMD_WRITE_ZEROES, f, off, len)?;
        if flags.fua && !self.has(TF_SEND_FUA) {
            self.flush()?;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> Result<Vec<Extent>> {
        let len = len.min(self.neg.size.saturating_sub(off));
        if self.neg.base_allocation.is_none() {
            // No base:allocation: everything reads as data.
            return Ok(vec![Extent {
                len,
                state: Alloc::Data,
            }]);
        }
        let ask = len.min(u32::MAX as u64 & !0xfff).max(1) as u32;
        let reply = self.run(Op::BlockStatus, off, |p| {
            p.submit(CMD_BLOCK_STATUS, 0, off, ask, None)?.wait()
        })?;
        let mut out = Vec::new();
        let mut left = len;
        for (n, flags) in reply.extents {
            if left == 0 {
                break;
            }
            let n = (n as u64).min(left);
            let state = match (flags & STATE_HOLE != 0, flags & STATE_ZERO != 0) {
                (true, true) => Alloc::Hole,
                (false, true) => Alloc::Zero,
                _ => Alloc::Data,
            };
            roamdisk_blockdev::push_extent(&mut out, Extent { len: n, state });
            left -= n;
        }
        if out.is_empty() {
            return Err(proto_err(Op::BlockStatus, "the server reported no extent").at(off));
        }
        Ok(out)
    }
}
