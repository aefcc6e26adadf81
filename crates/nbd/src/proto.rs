//! NBD wire format: constants, request and option parsing, reply encoding.
//! No I/O here, so every parser can be fuzzed (`fuzz/`).
//!
//! The subset roamdisk speaks, its limits and its error choices are
//! documented in `docs/formats/nbd.md`; the protocol itself is the
//! upstream NBD protocol specification (fixed newstyle).

#![allow(missing_docs)]

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_ROTATIONAL: u16 = 1 << 4;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) | 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) | 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

// Info types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// `base:allocation` descriptor flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The only metadata context roamdisk serves.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its context id.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Size of a request header.
pub const REQUEST_SIZE: usize = 28;
/// Size of an option header after the magic (option + length).
pub const OPTION_HEADER_SIZE: usize = 16;
/// Largest string the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Largest option payload we accept; larger ones get ERR_TOO_BIG.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Largest READ/WRITE payload (advertised as the maximum block size).
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Preferred block size advertised.
pub const PREFERRED_BLOCK: u32 = 4096;

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// A malformed message from the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
    #[error("message is {got} bytes, needs {need}")]
    Short { got: usize, need: usize },
    #[error("{0}")]
    Invalid(&'static str),
    #[error("string of {0} bytes is longer than the protocol's 4096")]
    StringTooLong(usize),
    #[error("string is not UTF-8 or contains NUL")]
    BadString,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(ProtoError::Short {
                got: self.b.len(),
                need: self.pos.saturating_add(n),
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }
    fn string(&mut self, len: usize) -> Result<String, ProtoError> {
        if len > MAX_STRING {
            return Err(ProtoError::StringTooLong(len));
        }
        let s = self.take(len)?;
        let s = std::str::from_utf8(s).map_err(|_| ProtoError::BadString)?;
        if s.contains('\0') {
            return Err(ProtoError::BadString);
        }
        Ok(s.to_string())
    }
    fn done(&self) -> Result<(), ProtoError> {
        if self.pos == self.b.len() {
            Ok(())
        } else {
            Err(ProtoError::Invalid("trailing bytes in option payload"))
        }
    }
}

/// Parse a 28-byte request header.
pub fn parse_request(b: &[u8]) -> Result<Request, ProtoError> {
    let mut r = Reader::new(b);
    let magic = r.u32()?;
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    Ok(Request {
        flags: r.u16()?,
        cmd: r.u16()?,
        handle: r.u64()?,
        offset: r.u64()?,
        length: r.u32()?,
    })
}

/// Encode a request header (used by tests and the benchmark client).
pub fn encode_request(q: &Request) -> [u8; REQUEST_SIZE] {
    let mut b = [0u8; REQUEST_SIZE];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&q.flags.to_be_bytes());
    b[6..8].copy_from_slice(&q.cmd.to_be_bytes());
    b[8..16].copy_from_slice(&q.handle.to_be_bytes());
    b[16..24].copy_from_slice(&q.offset.to_be_bytes());
    b[24..28].copy_from_slice(&q.length.to_be_bytes());
    b
}

/// Flags each command accepts; anything else is EINVAL.
pub fn allowed_flags(cmd: u16) -> u16 {
    match cmd {
        CMD_READ => CMD_FLAG_DF,
        CMD_WRITE => CMD_FLAG_FUA,
        CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => 0,
    }
}

/// The payload of OPT_INFO / OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

/// Parse an OPT_INFO / OPT_GO payload.
pub fn parse_info_request(b: &[u8]) -> Result<InfoRequest, ProtoError> {
    let mut r = Reader::new(b);
    let nlen = r.u32()? as usize;
    let name = r.string(nlen)?;
    let n = r.u16()? as usize;
    let mut infos = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        infos.push(r.u16()?);
    }
    r.done()?;
    Ok(InfoRequest { name, infos })
}

/// The payload of OPT_LIST_META_CONTEXT / OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// Parse a meta-context option payload.
pub fn parse_meta_request(b: &[u8]) -> Result<MetaRequest, ProtoError> {
    let mut r = Reader::new(b);
    let nlen = r.u32()? as usize;
    let export = r.string(nlen)?;
    let n = r.u32()? as usize;
    if n > 1024 {
        return Err(ProtoError::Invalid("too many meta-context queries"));
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        let l = r.u32()? as usize;
        queries.push(r.string(l)?);
    }
    r.done()?;
    Ok(MetaRequest { export, queries })
}

/// Parse the OPT_EXPORT_NAME payload (the bare name).
pub fn parse_export_name(b: &[u8]) -> Result<String, ProtoError> {
    let mut r = Reader::new(b);
    let s = r.string(b.len())?;
    r.done()?;
    Ok(s)
}

/// Which contexts a meta-context query selects. LIST allows the namespace
/// wildcard `base:`; SET needs exact names.
pub fn match_meta_query(q: &str, list: bool) -> bool {
    q == BASE_ALLOCATION || (list && q == "base:")
}

/// An option reply header plus payload.
pub fn encode_option_reply(opt: u32, rtype: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + payload.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&rtype.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// A simple reply header.
pub fn encode_simple_reply(error: u32, handle: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Size of a simple reply header.
pub const SIMPLE_REPLY_SIZE: usize = 16;

/// Size of a structured reply chunk header.
pub const CHUNK_HEADER_SIZE: usize = 20;

/// A structured reply chunk header (after its magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub rtype: u16,
    pub handle: u64,
    pub length: u32,
}

/// Parse the 16 bytes of a chunk header that follow its magic.
pub fn parse_chunk_header(b: &[u8]) -> Result<ChunkHeader, ProtoError> {
    let mut r = Reader::new(b);
    Ok(ChunkHeader {
        flags: r.u16()?,
        rtype: r.u16()?,
        handle: r.u64()?,
        length: r.u32()?,
    })
}

/// Parse the 12 bytes of a simple reply that follow its magic:
/// `(error, handle)`.
pub fn parse_simple_reply(b: &[u8]) -> Result<(u32, u64), ProtoError> {
    let mut r = Reader::new(b);
    Ok((r.u32()?, r.u64()?))
}

/// A client's option: `IHAVEOPT`, option, length, payload.
pub fn encode_option(opt: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(OPTION_HEADER_SIZE + payload.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// The payload of OPT_INFO / OPT_GO (inverse of [`parse_info_request`]).
pub fn encode_info_request(q: &InfoRequest) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(q.name.len() as u32).to_be_bytes());
    v.extend_from_slice(q.name.as_bytes());
    v.extend_from_slice(&(q.infos.len() as u16).to_be_bytes());
    for i in &q.infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// The payload of a meta-context option (inverse of [`parse_meta_request`]).
pub fn encode_meta_request(q: &MetaRequest) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(q.export.len() as u32).to_be_bytes());
    v.extend_from_slice(q.export.as_bytes());
    v.extend_from_slice(&(q.queries.len() as u32).to_be_bytes());
    for s in &q.queries {
        v.extend_from_slice(&(s.len() as u32).to_be_bytes());
        v.extend_from_slice(s.as_bytes());
    }
    v
}

/// Write a structured reply chunk header into `out`.
pub fn put_chunk_header(out: &mut Vec<u8>, flags: u16, rtype: u16, handle: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// A structured error chunk with a human message (final).
pub fn encode_error_chunk(handle: u64, error: u32, message: &str) -> Vec<u8> {
    let mut m = message.as_bytes();
    if m.len() > MAX_STRING {
        m = &m[..MAX_STRING];
    }
    let mut v = Vec::with_capacity(CHUNK_HEADER_SIZE + 6 + m.len());
    put_chunk_header(
        &mut v,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        6 + m.len() as u32,
    );
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(m.len() as u16).to_be_bytes());
    v.extend_from_slice(m);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips() {
        let q = Request {
            flags: 1,
            cmd: CMD_WRITE,
            handle: 42,
            offset: 4096,
            length: 512,
        };
        assert_eq!(parse_request(&encode_request(&q)).unwrap(), q);
        let mut b = encode_request(&q);
        b[0] ^= 1;
        assert!(matches!(parse_request(&b), Err(ProtoError::BadMagic(_))));
        assert!(parse_request(&b[..10]).is_err());
    }

    #[test]
    fn info_request_parses_and_rejects_garbage() {
        let mut p = Vec::new();
        p.extend_from_slice(&3u32.to_be_bytes());
        p.extend_from_slice(b"abc");
        p.extend_from_slice(&2u16.to_be_bytes());
        p.extend_from_slice(&INFO_NAME.to_be_bytes());
        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let r = parse_info_request(&p).unwrap();
        assert_eq!(encode_info_request(&r), p);
        assert_eq!(r.name, "abc");
        assert_eq!(r.infos, vec![INFO_NAME, INFO_BLOCK_SIZE]);
        for n in 0..p.len() {
            assert!(parse_info_request(&p[..n]).is_err());
        }
        let mut long = p.clone();
        long.push(0);
        assert!(parse_info_request(&long).is_err());
        let mut huge = Vec::new();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge).is_err());
    }

    #[test]
    fn meta_request_parses() {
        let mut p = Vec::new();
        p.extend_from_slice(&0u32.to_be_bytes());
        p.extend_from_slice(&1u32.to_be_bytes());
        p.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        p.extend_from_slice(BASE_ALLOCATION.as_bytes());
        let r = parse_meta_request(&p).unwrap();
        assert_eq!(encode_meta_request(&r), p);
        assert_eq!(r.queries, vec![BASE_ALLOCATION.to_string()]);
        assert!(parse_export_name(b"a\0b").is_err());
    }
}
