//! A minimal NBD client written from the protocol specification, for tests
//! that must send what no well-behaved client sends: malformed options,
//! bad flags, out-of-range requests, abrupt disconnects.
//!
//! It shares no code with the server (constants included), so a wire-format
//! mistake on one side is not silently mirrored on the other. Every socket
//! gets a timeout: a server that stops answering fails the test instead of
//! hanging it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
pub const FLAG_C_NO_ZEROES: u32 = 2;

pub const TF_HAS_FLAGS: u16 = 1;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;

/// How long any single read or write may block.
pub const TIMEOUT: Duration = Duration::from_secs(15);

/// Connect to a Unix socket with read and write timeouts set.
pub fn connect(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock).unwrap_or_else(|e| panic!("connect {}: {e}", sock.display()));
    s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    s.set_write_timeout(Some(TIMEOUT)).expect("timeout");
    s
}

fn read_vec(s: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().expect("2 bytes"))
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Read the server's greeting; returns its handshake flags.
pub fn read_greeting(s: &mut impl Read) -> io::Result<u16> {
    let g = read_vec(s, 18)?;
    assert_eq!(be64(&g[0..8]), NBDMAGIC, "greeting magic");
    assert_eq!(be64(&g[8..16]), IHAVEOPT, "not a newstyle server");
    Ok(be16(&g[16..18]))
}

/// Read the greeting and answer with fixed-newstyle + no-zeroes.
pub fn greet(s: &mut (impl Read + Write)) -> io::Result<()> {
    let f = read_greeting(s)?;
    assert!(f & FLAG_FIXED_NEWSTYLE != 0, "server is not fixed-newstyle");
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
}

/// An option header (magic, option, length) for a payload of `len` bytes.
pub fn option_header(opt: u32, len: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

pub fn send_option(s: &mut impl Write, opt: u32, payload: &[u8]) -> io::Result<()> {
    let mut v = option_header(opt, payload.len() as u32);
    v.extend_from_slice(payload);
    s.write_all(&v)
}

/// One option reply.
#[derive(Debug, Clone)]
pub struct OptReply {
    pub opt: u32,
    pub rtype: u32,
    pub data: Vec<u8>,
}

impl OptReply {
    pub fn is_error(&self) -> bool {
        self.rtype & (1 << 31) != 0
    }
}

pub fn read_option_reply(s: &mut impl Read) -> io::Result<OptReply> {
    let h = read_vec(s, 20)?;
    assert_eq!(be64(&h[0..8]), OPT_REPLY_MAGIC, "option reply magic");
    let len = be32(&h[16..20]) as usize;
    assert!(len <= 1 << 20, "option reply of {len} bytes");
    Ok(OptReply {
        opt: be32(&h[8..12]),
        rtype: be32(&h[12..16]),
        data: read_vec(s, len)?,
    })
}

/// Every reply to one option, up to and including its ACK or error.
pub fn option_replies(s: &mut impl Read, opt: u32) -> io::Result<Vec<OptReply>> {
    let mut v = Vec::new();
    loop {
        let r = read_option_reply(s)?;
        assert_eq!(r.opt, opt, "reply is for option {} not {opt}", r.opt);
        let last = r.rtype == REP_ACK || r.is_error();
        v.push(r);
        if last {
            return Ok(v);
        }
    }
}

/// Send one option and return its final reply type (ACK or an error).
pub fn option_result(s: &mut (impl Read + Write), opt: u32, payload: &[u8]) -> u32 {
    send_option(s, opt, payload).expect("send option");
    let r = option_replies(s, opt).expect("option reply");
    r.last().expect("at least one reply").rtype
}

/// An OPT_INFO / OPT_GO payload.
pub fn info_payload(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// An OPT_LIST_META_CONTEXT / OPT_SET_META_CONTEXT payload.
pub fn meta_payload(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(export.len() as u32).to_be_bytes());
    v.extend_from_slice(export.as_bytes());
    v.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        v.extend_from_slice(&(q.len() as u32).to_be_bytes());
        v.extend_from_slice(q.as_bytes());
    }
    v
}

/// A REP_META_CONTEXT payload: (context id, name).
pub fn parse_meta_context(r: &OptReply) -> (u32, String) {
    assert_eq!(r.rtype, REP_META_CONTEXT);
    (
        be32(&r.data[0..4]),
        String::from_utf8(r.data[4..].to_vec()).expect("utf-8 context name"),
    )
}

/// Assert the peer closes the connection (EOF or reset); whatever it sends
/// first is discarded. Fails after [`TIMEOUT`] of silence.
pub fn expect_closed(s: &mut impl Read, what: &str) {
    let mut buf = [0u8; 4096];
    let mut got = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                got += n;
                assert!(
                    got <= 1 << 20,
                    "{what}: server kept talking instead of hanging up"
                );
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ) =>
            {
                return
            }
            Err(e) => panic!("{what}: expected the server to hang up, got {e}"),
        }
    }
}

/// One structured reply chunk.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub flags: u16,
    pub rtype: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

impl Chunk {
    /// Offset of an OFFSET_DATA or OFFSET_HOLE chunk.
    pub fn offset(&self) -> u64 {
        be64(&self.payload[0..8])
    }
    /// Length covered by an OFFSET_DATA or OFFSET_HOLE chunk.
    pub fn len(&self) -> u64 {
        match self.rtype {
            REPLY_TYPE_OFFSET_DATA => self.payload.len() as u64 - 8,
            REPLY_TYPE_OFFSET_HOLE => be32(&self.payload[8..12]) as u64,
            t => panic!("chunk type {t} has no length"),
        }
    }
    /// (context id, [(length, flags)]) of a BLOCK_STATUS chunk.
    pub fn extents(&self) -> (u32, Vec<(u32, u32)>) {
        assert_eq!(self.rtype, REPLY_TYPE_BLOCK_STATUS);
        let p = &self.payload;
        assert_eq!((p.len() - 4) % 8, 0, "block status payload length");
        let ext = p[4..]
            .chunks(8)
            .map(|d| (be32(&d[0..4]), be32(&d[4..8])))
            .collect();
        (be32(&p[0..4]), ext)
    }
}

/// A complete reply to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Simple {
        handle: u64,
        error: u32,
        data: Vec<u8>,
    },
    Structured {
        handle: u64,
        chunks: Vec<Chunk>,
    },
}

impl Reply {
    pub fn handle(&self) -> u64 {
        match self {
            Reply::Simple { handle, .. } | Reply::Structured { handle, .. } => *handle,
        }
    }

    /// The error value (0 for success).
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Structured { chunks, .. } => chunks
                .iter()
                .find(|c| c.rtype & (1 << 15) != 0)
                .map(|c| be32(&c.payload[0..4]))
                .unwrap_or(0),
        }
    }

    /// The human message of a structured error, if any.
    pub fn message(&self) -> Option<String> {
        let Reply::Structured { chunks, .. } = self else {
            return None;
        };
        let c = chunks.iter().find(|c| c.rtype & (1 << 15) != 0)?;
        let n = be16(&c.payload[4..6]) as usize;
        Some(String::from_utf8_lossy(&c.payload[6..6 + n]).into_owned())
    }

    pub fn is_structured(&self) -> bool {
        matches!(self, Reply::Structured { .. })
    }

    pub fn chunks(&self) -> &[Chunk] {
        match self {
            Reply::Structured { chunks, .. } => chunks,
            Reply::Simple { .. } => panic!("simple reply has no chunks"),
        }
    }

    /// Reassemble the data of a successful READ of `[off, off+len)`,
    /// checking that chunks neither overlap nor leave gaps.
    pub fn read_data(&self, off: u64, len: u32) -> Vec<u8> {
        assert_eq!(self.error(), 0, "read failed: {self:?}");
        match self {
            Reply::Simple { data, .. } => {
                assert_eq!(data.len(), len as usize);
                data.clone()
            }
            Reply::Structured { chunks, .. } => {
                let mut out = vec![0u8; len as usize];
                let mut covered = vec![false; len as usize];
                for c in chunks {
                    if c.rtype == REPLY_TYPE_NONE {
                        continue;
                    }
                    let start = c.offset().checked_sub(off).expect("chunk before range") as usize;
                    let n = c.len() as usize;
                    assert!(start + n <= len as usize, "chunk past the range");
                    for f in &mut covered[start..start + n] {
                        assert!(!*f, "overlapping read chunks");
                        *f = true;
                    }
                    if c.rtype == REPLY_TYPE_OFFSET_DATA {
                        out[start..start + n].copy_from_slice(&c.payload[8..]);
                    }
                }
                assert!(covered.iter().all(|&f| f), "read chunks leave a gap");
                out
            }
        }
    }
}

/// What to negotiate before OPT_GO.
#[derive(Debug, Clone, Default)]
pub struct Opts<'a> {
    pub export: &'a str,
    pub structured: bool,
    /// Queries for OPT_SET_META_CONTEXT (needs `structured`).
    pub meta: &'a [&'a str],
}

/// A connection in the transmission phase.
pub struct Client<S: Read + Write> {
    pub s: S,
    pub size: u64,
    pub tflags: u16,
    pub structured: bool,
    /// Context ids the server assigned, by name.
    pub meta_ids: HashMap<String, u32>,
    next_handle: u64,
    /// Lengths of READs in flight (a simple reply carries no length).
    reads: HashMap<u64, u32>,
}

impl Client<UnixStream> {
    /// Connect to a Unix socket and negotiate.
    pub fn open(sock: &Path, o: &Opts) -> Self {
        Client::handshake(connect(sock), o).expect("handshake")
    }
}

impl<S: Read + Write> Client<S> {
    /// Run a complete fixed-newstyle handshake ending with OPT_GO.
    pub fn handshake(mut s: S, o: &Opts) -> io::Result<Self> {
        greet(&mut s)?;
        Client::negotiate(s, o)
    }

    /// Negotiate on a stream past the greeting.
    pub fn negotiate(mut s: S, o: &Opts) -> io::Result<Self> {
        if o.structured {
            let r = option_result(&mut s, OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(r, REP_ACK, "STRUCTURED_REPLY refused");
        }
        let mut meta_ids = HashMap::new();
        if !o.meta.is_empty() {
            send_option(
                &mut s,
                OPT_SET_META_CONTEXT,
                &meta_payload(o.export, o.meta),
            )?;
            for r in option_replies(&mut s, OPT_SET_META_CONTEXT)? {
                match r.rtype {
                    REP_META_CONTEXT => {
                        let (id, name) = parse_meta_context(&r);
                        meta_ids.insert(name, id);
                    }
                    REP_ACK => {}
                    t => return Err(io::Error::other(format!("SET_META_CONTEXT: {t:#x}"))),
                }
            }
        }
        Client::go(s, o.export, o.structured, meta_ids)
    }

    /// Send OPT_GO and enter transmission.
    pub fn go(
        mut s: S,
        export: &str,
        structured: bool,
        meta_ids: HashMap<String, u32>,
    ) -> io::Result<Self> {
        send_option(&mut s, OPT_GO, &info_payload(export, &[INFO_BLOCK_SIZE]))?;
        let mut export_info = None;
        for r in option_replies(&mut s, OPT_GO)? {
            if r.is_error() {
                return Err(io::Error::other(format!(
                    "GO refused: {:#x} {}",
                    r.rtype,
                    String::from_utf8_lossy(&r.data)
                )));
            }
            if r.rtype == REP_INFO && be16(&r.data) == INFO_EXPORT {
                assert_eq!(r.data.len(), 12, "NBD_INFO_EXPORT length");
                export_info = Some((be64(&r.data[2..10]), be16(&r.data[10..12])));
            }
        }
        let (size, tflags) = export_info.expect("GO ACKed without NBD_INFO_EXPORT");
        Ok(Client {
            s,
            size,
            tflags,
            structured,
            meta_ids,
            next_handle: 1,
            reads: HashMap::new(),
        })
    }

    /// Enter transmission from an old-style NBD_OPT_EXPORT_NAME reply
    /// (the caller sent the option after greeting with NO_ZEROES).
    pub fn from_export_name(mut s: S) -> io::Result<Self> {
        let r = read_vec(&mut s, 10)?;
        Ok(Client {
            s,
            size: be64(&r[0..8]),
            tflags: be16(&r[8..10]),
            structured: false,
            meta_ids: HashMap::new(),
            next_handle: 1,
            reads: HashMap::new(),
        })
    }

    /// Send a request (and its payload); returns its handle.
    pub fn send(&mut self, flags: u16, cmd: u16, off: u64, len: u32, data: &[u8]) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        let mut v = request_header(flags, cmd, h, off, len);
        v.extend_from_slice(data);
        self.s.write_all(&v).expect("send request");
        if cmd == CMD_READ {
            self.reads.insert(h, len);
        }
        h
    }

    /// Read the next complete reply.
    pub fn recv(&mut self) -> io::Result<Reply> {
        let magic = read_vec(&mut self.s, 4)?;
        match be32(&magic) {
            SIMPLE_REPLY_MAGIC => {
                let r = read_vec(&mut self.s, 12)?;
                let error = be32(&r[0..4]);
                let handle = be64(&r[4..12]);
                let len = self.reads.remove(&handle).unwrap_or(0);
                let data = if error == 0 {
                    read_vec(&mut self.s, len as usize)?
                } else {
                    Vec::new()
                };
                Ok(Reply::Simple {
                    handle,
                    error,
                    data,
                })
            }
            STRUCTURED_REPLY_MAGIC => {
                assert!(self.structured, "structured reply without negotiation");
                let mut chunks = Vec::new();
                let mut first = true;
                loop {
                    if !first {
                        let m = read_vec(&mut self.s, 4)?;
                        assert_eq!(be32(&m), STRUCTURED_REPLY_MAGIC, "chunk magic");
                    }
                    first = false;
                    let h = read_vec(&mut self.s, 16)?;
                    let len = be32(&h[12..16]) as usize;
                    assert!(len <= 64 << 20, "chunk of {len} bytes");
                    let c = Chunk {
                        flags: be16(&h[0..2]),
                        rtype: be16(&h[2..4]),
                        handle: be64(&h[4..12]),
                        payload: read_vec(&mut self.s, len)?,
                    };
                    if let Some(p) = chunks.last() {
                        let p: &Chunk = p;
                        assert_eq!(p.handle, c.handle, "chunks of two replies interleave");
                    }
                    let done = c.flags & REPLY_FLAG_DONE != 0;
                    chunks.push(c);
                    if done {
                        break;
                    }
                }
                let handle = chunks[0].handle;
                self.reads.remove(&handle);
                Ok(Reply::Structured { handle, chunks })
            }
            m => Err(io::Error::other(format!("bad reply magic {m:#010x}"))),
        }
    }

    /// Send one request and wait for its reply.
    pub fn call(&mut self, flags: u16, cmd: u16, off: u64, len: u32, data: &[u8]) -> Reply {
        let h = self.send(flags, cmd, off, len, data);
        let r = self.recv().expect("reply");
        assert_eq!(r.handle(), h, "reply to the wrong request");
        r
    }

    /// A write that must succeed.
    pub fn write(&mut self, off: u64, data: &[u8]) {
        let r = self.call(0, CMD_WRITE, off, data.len() as u32, data);
        assert_eq!(r.error(), 0, "write at {off}: {r:?}");
    }

    /// A read that must succeed.
    pub fn read(&mut self, off: u64, len: u32) -> Vec<u8> {
        self.call(0, CMD_READ, off, len, &[]).read_data(off, len)
    }

    /// A write and a read-back of the same bytes.
    pub fn check_io(&mut self, off: u64, seed: u8) {
        let data = pattern(4096, seed);
        self.write(off, &data);
        assert!(self.read(off, 4096) == data, "read-back at {off} differs");
    }

    /// NBD_CMD_DISC, then wait for the server to close.
    pub fn disconnect(mut self) {
        self.send(0, CMD_DISC, 0, 0, &[]);
        expect_closed(&mut self.s, "after NBD_CMD_DISC");
    }
}

/// A 28-byte request header.
pub fn request_header(flags: u16, cmd: u16, handle: u64, off: u64, len: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(28);
    v.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&cmd.to_be_bytes());
    v.extend_from_slice(&handle.to_be_bytes());
    v.extend_from_slice(&off.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

/// `n` bytes of a recognisable, seed-dependent, never-all-zero pattern.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}
