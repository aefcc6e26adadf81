//! Many requests in flight on one connection.
//!
//! Callers write their request under the writer lock and wait on their own
//! channel; one reader thread reads replies in whatever order the server
//! sends them and matches them by cookie (the protocol's handle), filling
//! read data and block-status extents from simple or structured replies.
//! When the connection breaks every waiting request fails with
//! [`Failed::Gone`], and so does every later one: the layer then opens a
//! new connection.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::conn::Negotiated;
use super::sock::{read_array, Sock};
use crate::proto::*;

/// Why a request failed.
#[derive(Debug, Clone)]
pub(super) enum Failed {
    /// The server answered with an error.
    Server { errno: u32, message: String },
    /// The connection is gone; the request may or may not have run.
    Gone(Broken),
}

/// Why a connection stopped carrying requests (every request in flight
/// on it fails with this).
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum Broken {
    /// The server hung up between replies.
    #[error("the server closed the connection")]
    Closed,
    /// Reading a reply failed.
    #[error("connection lost: {0}")]
    Lost(Arc<std::io::Error>),
    /// Sending a request failed.
    #[error("cannot send a request: {0}")]
    Send(Arc<std::io::Error>),
    /// A reply header the protocol does not allow.
    #[error(transparent)]
    Proto(#[from] ProtoError),
    /// A reply that is not a reply.
    #[error("bad reply magic {0:#010x}")]
    Magic(u32),
    /// A structured chunk larger than any request could need.
    #[error("a reply chunk of {0} bytes")]
    ChunkTooLarge(u32),
    /// A reply to a request that is not waiting for one.
    #[error("a reply to request {0}, which is not in flight")]
    NotInFlight(u64),
    /// A structured chunk that does not fit its request.
    #[error("bad reply chunk (type {rtype}): {what}")]
    Chunk { rtype: u16, what: String },
    /// The thread reading replies is gone.
    #[error("the reply reader stopped")]
    ReaderStopped,
    /// A request had no reply within the layer's `timeout` (a server or
    /// network gone silent): the connection is dropped and made again.
    #[error("no reply within {0:?} (the server or the network went silent)")]
    TimedOut(std::time::Duration),
}

impl From<std::io::Error> for Broken {
    fn from(e: std::io::Error) -> Broken {
        Broken::Lost(Arc::new(e))
    }
}

/// A successful reply.
#[derive(Debug, Default)]
pub(super) struct Reply {
    /// Read data (READ only).
    pub data: Vec<u8>,
    /// `base:allocation` descriptors `(length, flags)` (BLOCK_STATUS only).
    pub extents: Vec<(u32, u32)>,
}

/// A request waiting for its reply.
struct Slot {
    cmd: u16,
    offset: u64,
    len: u32,
    reply: Reply,
    error: Option<(u32, String)>,
    tx: SyncSender<Result<Reply, Failed>>,
}

impl Slot {
    fn finish(self) {
        let r = match self.error {
            Some((errno, message)) => Err(Failed::Server { errno, message }),
            None => Ok(self.reply),
        };
        let _ = self.tx.send(r);
    }
}

#[derive(Default)]
struct State {
    slots: HashMap<u64, Slot>,
    /// Set once the connection is broken, with the reason.
    dead: Option<Broken>,
}

type Shared = Arc<Mutex<State>>;

/// Mark the connection broken and fail every waiting request.
fn kill(state: &Shared, why: Broken) {
    let slots = {
        let mut st = state.lock();
        if st.dead.is_none() {
            st.dead = Some(why.clone());
        }
        std::mem::take(&mut st.slots)
    };
    for (_, s) in slots {
        let _ = s.tx.send(Err(Failed::Gone(why.clone())));
    }
}

/// A request sent, not yet answered.
pub(super) struct Pending {
    rx: Receiver<Result<Reply, Failed>>,
    /// How long to wait for the reply (None: for ever).
    timeout: Option<std::time::Duration>,
    /// To break the connection when the reply does not come.
    state: Shared,
    control: Arc<Sock>,
}

impl Pending {
    /// The reply; past the timeout, the connection is broken (every
    /// request on it fails, and the layer reconnects).
    pub(super) fn wait(self) -> Result<Reply, Failed> {
        let Some(t) = self.timeout else {
            return self
                .rx
                .recv()
                .unwrap_or(Err(Failed::Gone(Broken::ReaderStopped)));
        };
        match self.rx.recv_timeout(t) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                kill(&self.state, Broken::TimedOut(t));
                self.control.shutdown();
                Err(Failed::Gone(Broken::TimedOut(t)))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(Failed::Gone(Broken::ReaderStopped))
            }
        }
    }
}

/// One negotiated connection carrying requests.
pub(super) struct Pipeline {
    pub neg: Negotiated,
    writer: Mutex<Sock>,
    /// A handle on the socket to shut it down without the writer lock (a
    /// writer may be blocked on a silent network).
    control: Arc<Sock>,
    /// How long a request waits for its reply.
    timeout: Option<std::time::Duration>,
    state: Shared,
    cookie: AtomicU64,
    reader: Option<JoinHandle<()>>,
}

impl Pipeline {
    /// Start the reply reader on a negotiated connection.
    pub(super) fn start(
        sock: Sock,
        neg: Negotiated,
        timeout: Option<std::time::Duration>,
    ) -> std::io::Result<Pipeline> {
        let rd = sock.try_clone()?;
        let control = Arc::new(sock.try_clone()?);
        let state: Shared = Arc::default();
        let st = state.clone();
        let reader = std::thread::Builder::new()
            .name("roamdisk-nbd-rx".into())
            .spawn(move || {
                let mut rd = rd;
                let why = match read_replies(&mut rd, &st) {
                    Ok(()) => Broken::Closed,
                    Err(e) => e,
                };
                kill(&st, why);
            })?;
        Ok(Pipeline {
            neg,
            writer: Mutex::new(sock),
            control,
            timeout,
            state,
            cookie: AtomicU64::new(1),
            reader: Some(reader),
        })
    }

    /// Send one request; `payload` is WRITE's data.
    pub(super) fn submit(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: Option<&[u8]>,
    ) -> Result<Pending, Failed> {
        let handle = self.cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        let data = if cmd == CMD_READ {
            vec![0u8; len as usize]
        } else {
            Vec::new()
        };
        {
            let mut st = self.state.lock();
            if let Some(why) = &st.dead {
                return Err(Failed::Gone(why.clone()));
            }
            st.slots.insert(
                handle,
                Slot {
                    cmd,
                    offset,
                    len,
                    reply: Reply {
                        data,
                        extents: Vec::new(),
                    },
                    error: None,
                    tx,
                },
            );
        }
        let h = header(cmd, flags, handle, offset, len);
        let sent = {
            let mut w = self.writer.lock();
            w.write_all(&h)
                .and_then(|()| payload.map_or(Ok(()), |p| w.write_all(p)))
        };
        if let Err(e) = sent {
            // The reader sees the shutdown too; our own slot fails with
            // the rest.
            kill(&self.state, Broken::Send(Arc::new(e)));
            self.writer.lock().shutdown();
        }
        Ok(Pending {
            rx,
            timeout: self.timeout,
            state: self.state.clone(),
            control: self.control.clone(),
        })
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        {
            let mut w = self.writer.lock();
            if self.state.lock().dead.is_none() {
                let _ = w.write_all(&header(CMD_DISC, 0, 0, 0, 0));
            }
            w.shutdown();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn header(cmd: u16, flags: u16, handle: u64, offset: u64, length: u32) -> [u8; REQUEST_SIZE] {
    encode_request(&Request {
        flags,
        cmd,
        handle,
        offset,
        length,
    })
}

/// Largest structured chunk payload accepted (a read's data plus its
/// offset, or a block-status reply).
const MAX_CHUNK: u32 = MAX_PAYLOAD + 4096;

/// Read replies until the connection ends; `Err` carries why it broke.
fn read_replies(rd: &mut Sock, state: &Shared) -> Result<(), Broken> {
    loop {
        let mut magic = [0u8; 4];
        match rd.read_exact(&mut magic) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let b: [u8; SIMPLE_REPLY_SIZE - 4] = read_array(rd)?;
                let (errno, handle) = parse_simple_reply(&b)?;
                let mut slot = take(state, handle)?;
                if errno != 0 {
                    slot.error = Some((errno, String::new()));
                } else if slot.cmd == CMD_READ {
                    rd.read_exact(&mut slot.reply.data)?;
                }
                slot.finish();
            }
            STRUCTURED_REPLY_MAGIC => {
                let b: [u8; CHUNK_HEADER_SIZE - 4] = read_array(rd)?;
                let h = parse_chunk_header(&b)?;
                if h.length > MAX_CHUNK {
                    return Err(Broken::ChunkTooLarge(h.length));
                }
                let mut slot = take(state, h.handle)?;
                chunk(rd, &h, &mut slot)?;
                if h.flags & REPLY_FLAG_DONE != 0 {
                    slot.finish();
                } else {
                    let mut st = state.lock();
                    if st.dead.is_none() {
                        st.slots.insert(h.handle, slot);
                    }
                }
            }
            m => return Err(Broken::Magic(m)),
        }
    }
}

fn take(state: &Shared, handle: u64) -> Result<Slot, Broken> {
    state
        .lock()
        .slots
        .remove(&handle)
        .ok_or(Broken::NotInFlight(handle))
}

/// Apply one structured chunk's payload to its request.
fn chunk(rd: &mut Sock, h: &ChunkHeader, slot: &mut Slot) -> Result<(), Broken> {
    let bad = |m: &str| Broken::Chunk {
        rtype: h.rtype,
        what: m.to_string(),
    };
    let end = slot.offset + slot.len as u64;
    match h.rtype {
        REPLY_TYPE_NONE if h.length == 0 => {}
        REPLY_TYPE_OFFSET_DATA if h.length >= 8 && slot.cmd == CMD_READ => {
            let off = u64::from_be_bytes(read_array(rd)?);
            let n = (h.length - 8) as u64;
            if off < slot.offset || off + n > end {
                return Err(bad("data outside the request"));
            }
            let at = (off - slot.offset) as usize;
            rd.read_exact(&mut slot.reply.data[at..at + n as usize])?;
        }
        REPLY_TYPE_OFFSET_HOLE if h.length == 12 && slot.cmd == CMD_READ => {
            let b: [u8; 12] = read_array(rd)?;
            let off = u64::from_be_bytes(b[0..8].try_into().expect("8"));
            let n = u32::from_be_bytes(b[8..12].try_into().expect("4")) as u64;
            if off < slot.offset || off + n > end {
                return Err(bad("hole outside the request"));
            }
            let at = (off - slot.offset) as usize;
            slot.reply.data[at..at + n as usize].fill(0);
        }
        REPLY_TYPE_BLOCK_STATUS if h.length >= 4 && (h.length - 4).is_multiple_of(8) => {
            let mut b = vec![0u8; h.length as usize];
            rd.read_exact(&mut b)?;
            for d in b[4..].chunks_exact(8) {
                let len = u32::from_be_bytes(d[0..4].try_into().expect("4"));
                let flags = u32::from_be_bytes(d[4..8].try_into().expect("4"));
                slot.reply.extents.push((len, flags));
            }
        }
        t if t & (1 << 15) != 0 && h.length >= 6 => {
            let mut b = vec![0u8; h.length as usize];
            rd.read_exact(&mut b)?;
            let errno = u32::from_be_bytes(b[0..4].try_into().expect("4"));
            let mlen = u16::from_be_bytes([b[4], b[5]]) as usize;
            let message = String::from_utf8_lossy(b.get(6..6 + mlen).unwrap_or(&[])).into_owned();
            slot.error = Some((errno.max(1), message));
        }
        _ => return Err(bad(&format!("{} bytes", h.length))),
    }
    Ok(())
}
