//! The binary trace form: a 16-byte file header, then checksummed chunks of
//! delta- and varint-encoded records, then an end-marker chunk. The layout
//! is specified byte by byte in `docs/formats/trace.md`; the constants here
//! are the ones it names.

use std::io::{self, Read, Write};

use super::error::TraceError;
use super::record::{Record, TraceOp};

/// File magic, bytes 0..8.
pub const MAGIC: [u8; 8] = *b"RDTRACE\0";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;

roamdisk_blockdev::offsets! {
    /// File header field offsets.
    pub HDR_MAGIC: MAGIC.len(), pub HDR_VERSION: 2, pub HDR_FLAGS: 2, pub HDR_CRC: 4;
    /// Size of the file header.
    pub HEADER_LEN == 16
}

roamdisk_blockdev::offsets! {
    /// Chunk header field offsets.
    pub CHK_PAYLOAD_LEN: 4, pub CHK_COUNT: 4, pub CHK_CRC: 4;
    /// Size of a chunk header.
    pub CHUNK_HEADER_LEN == 12
}

/// Largest chunk payload a reader accepts.
pub const MAX_CHUNK_BYTES: u32 = 1 << 24;
/// Most records in one chunk a reader accepts.
pub const MAX_CHUNK_RECORDS: u32 = 1 << 20;
/// The smallest encoded record (flags, time delta, length).
pub const MIN_RECORD_BYTES: u32 = 3;
/// Records per chunk the writer aims for.
pub const WRITER_CHUNK_RECORDS: u32 = 4096;
/// Payload size at which the writer closes a chunk early.
pub const WRITER_CHUNK_BYTES: usize = 1 << 16;
/// Payload length of the end marker (the total record count, u64).
pub const END_PAYLOAD_LEN: u32 = 8;

/// Record flag bits (the low three bits hold the op code).
pub const F_OP_MASK: u8 = 0x07;
pub const F_CLIENT: u8 = 0x08;
pub const F_DEVICE: u8 = 0x10;
pub const F_OFFSET: u8 = 0x20;
pub const F_FRAGMENT: u8 = 0x40;
pub const F_RESERVED: u8 = 0x80;

/// Delta state, reset at the start of every chunk.
#[derive(Debug, Clone, Copy, Default)]
struct State {
    time: u64,
    client: u32,
    device: u32,
    end: u64,
}

impl State {
    fn advance(&mut self, r: &Record) {
        self.time = r.time_ns;
        self.client = r.client;
        self.device = r.device;
        if r.op != TraceOp::Flush {
            self.end = r.offset.wrapping_add(r.len as u64);
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encode one record after `st`, updating it.
fn encode(out: &mut Vec<u8>, st: &mut State, r: &Record) {
    let mut flags = r.op.code();
    let seq = r.op == TraceOp::Flush || r.offset == st.end;
    let flush_at_zero = r.op == TraceOp::Flush && r.offset == 0;
    if r.client != st.client {
        flags |= F_CLIENT;
    }
    if r.device != st.device {
        flags |= F_DEVICE;
    }
    // A flush at offset 0 (the usual case) is encoded without an offset;
    // any other offset is stored so every field round-trips.
    let store_offset = if r.op == TraceOp::Flush {
        !flush_at_zero
    } else {
        !seq
    };
    if store_offset {
        flags |= F_OFFSET;
    }
    if r.fragment != 0 {
        flags |= F_FRAGMENT;
    }
    out.push(flags);
    put_varint(out, zigzag(r.time_ns.wrapping_sub(st.time) as i64));
    if flags & F_CLIENT != 0 {
        put_varint(out, r.client as u64);
    }
    if flags & F_DEVICE != 0 {
        put_varint(out, r.device as u64);
    }
    if flags & F_OFFSET != 0 {
        put_varint(out, zigzag(r.offset.wrapping_sub(st.end) as i64));
    }
    put_varint(out, r.len as u64);
    if flags & F_FRAGMENT != 0 {
        put_varint(out, r.fragment as u64);
    }
    st.advance(r);
}

/// Streaming binary encoder over any writer.
pub struct Encoder<W: Write> {
    w: W,
    payload: Vec<u8>,
    in_chunk: u32,
    st: State,
    total: u64,
}

impl<W: Write> Encoder<W> {
    /// Write the file header.
    pub fn new(mut w: W) -> io::Result<Self> {
        let mut h = [0u8; HEADER_LEN];
        h[HDR_MAGIC..HDR_VERSION].copy_from_slice(&MAGIC);
        h[HDR_VERSION..HDR_FLAGS].copy_from_slice(&VERSION.to_le_bytes());
        h[HDR_FLAGS..HDR_CRC].copy_from_slice(&0u16.to_le_bytes());
        let crc = crc32c::crc32c(&h[..HDR_CRC]);
        h[HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
        w.write_all(&h)?;
        Ok(Encoder {
            w,
            payload: Vec::with_capacity(WRITER_CHUNK_BYTES + 64),
            in_chunk: 0,
            st: State::default(),
            total: 0,
        })
    }

    /// Append one record.
    pub fn write(&mut self, r: &Record) -> io::Result<()> {
        encode(&mut self.payload, &mut self.st, r);
        self.in_chunk += 1;
        self.total += 1;
        if self.in_chunk >= WRITER_CHUNK_RECORDS || self.payload.len() >= WRITER_CHUNK_BYTES {
            self.close_chunk()?;
        }
        Ok(())
    }

    /// Records written so far.
    pub fn count(&self) -> u64 {
        self.total
    }

    fn write_chunk(&mut self, count: u32) -> io::Result<()> {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[CHK_PAYLOAD_LEN..CHK_COUNT].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        h[CHK_COUNT..CHK_CRC].copy_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..CHK_CRC]), &self.payload);
        h[CHK_CRC..].copy_from_slice(&crc.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(&self.payload)?;
        self.payload.clear();
        Ok(())
    }

    fn close_chunk(&mut self) -> io::Result<()> {
        if self.in_chunk == 0 {
            return Ok(());
        }
        let n = self.in_chunk;
        self.write_chunk(n)?;
        self.in_chunk = 0;
        self.st = State::default();
        Ok(())
    }

    /// Close the current chunk and flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.close_chunk()?;
        self.w.flush()
    }

    /// Write the end marker and return the underlying writer, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.close_chunk()?;
        self.payload.extend_from_slice(&self.total.to_le_bytes());
        self.write_chunk(0)?;
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Streaming binary decoder over any reader. Never panics and never
/// allocates more than one chunk, whatever the input.
pub struct Decoder<R: Read> {
    r: R,
    /// File offset of the next unread byte.
    pos: u64,
    buf: Vec<u8>,
    at: usize,
    left: u32,
    /// File offset where `buf` starts.
    buf_pos: u64,
    st: State,
    records: u64,
    done: bool,
}

impl<R: Read> Decoder<R> {
    /// Read and check the file header.
    pub fn new(mut r: R) -> Result<Self, TraceError> {
        let mut h = [0u8; HEADER_LEN];
        let n = read_full(&mut r, &mut h)?;
        if n < HEADER_LEN {
            if h[..n] != MAGIC[..n.min(MAGIC.len())] {
                return Err(TraceError::BAD_MAGIC);
            }
            return Err(TraceError::Truncated {
                path: None,
                offset: n as u64,
                records: 0,
                message: format!("file header needs {HEADER_LEN} bytes"),
            });
        }
        if h[HDR_MAGIC..HDR_VERSION] != MAGIC {
            return Err(TraceError::BAD_MAGIC);
        }
        let crc = u32::from_le_bytes(h[HDR_CRC..HEADER_LEN].try_into().expect("4 bytes"));
        let version = u16::from_le_bytes([h[HDR_VERSION], h[HDR_VERSION + 1]]);
        if crc != crc32c::crc32c(&h[..HDR_CRC]) {
            return Err(corrupt(HDR_CRC as u64, "file header checksum mismatch"));
        }
        if version != VERSION {
            return Err(TraceError::Version {
                path: None,
                found: version,
                supported: VERSION,
            });
        }
        let flags = u16::from_le_bytes([h[HDR_FLAGS], h[HDR_FLAGS + 1]]);
        if flags != 0 {
            return Err(corrupt(
                HDR_FLAGS as u64,
                &format!("unknown header flags {flags:#06x}"),
            ));
        }
        Ok(Decoder {
            r,
            pos: HEADER_LEN as u64,
            buf: Vec::new(),
            at: 0,
            left: 0,
            buf_pos: 0,
            st: State::default(),
            records: 0,
            done: false,
        })
    }

    fn truncated(&self, offset: u64, message: &str) -> TraceError {
        TraceError::Truncated {
            path: None,
            offset,
            records: self.records,
            message: message.to_string(),
        }
    }

    /// Load the next chunk. Returns false at the end marker.
    fn load_chunk(&mut self) -> Result<bool, TraceError> {
        let start = self.pos;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        let n = read_full(&mut self.r, &mut h)?;
        if n == 0 {
            return Err(self.truncated(start, "no end marker"));
        }
        if n < CHUNK_HEADER_LEN {
            return Err(self.truncated(start, "chunk header cut short"));
        }
        let len = u32::from_le_bytes(h[CHK_PAYLOAD_LEN..CHK_COUNT].try_into().expect("4"));
        let count = u32::from_le_bytes(h[CHK_COUNT..CHK_CRC].try_into().expect("4"));
        let crc = u32::from_le_bytes(h[CHK_CRC..].try_into().expect("4"));
        if len > MAX_CHUNK_BYTES {
            return Err(corrupt(
                start,
                &format!("chunk payload of {len} bytes exceeds the limit {MAX_CHUNK_BYTES}"),
            ));
        }
        if count > MAX_CHUNK_RECORDS {
            return Err(corrupt(
                start,
                &format!("chunk of {count} records exceeds the limit {MAX_CHUNK_RECORDS}"),
            ));
        }
        if count == 0 && len != END_PAYLOAD_LEN {
            return Err(corrupt(
                start,
                &format!("end marker payload is {len} bytes, not {END_PAYLOAD_LEN}"),
            ));
        }
        if count > 0 && (count as u64) * (MIN_RECORD_BYTES as u64) > len as u64 {
            return Err(corrupt(
                start,
                &format!("{count} records cannot fit in {len} bytes"),
            ));
        }
        self.buf.clear();
        let got = (&mut self.r)
            .take(len as u64)
            .read_to_end(&mut self.buf)
            .map_err(|e| TraceError::io(e, None))?;
        if got < len as usize {
            return Err(self.truncated(start, "chunk payload cut short"));
        }
        let want = crc32c::crc32c_append(crc32c::crc32c(&h[..CHK_CRC]), &self.buf);
        if want != crc {
            return Err(corrupt(start, "chunk checksum mismatch"));
        }
        self.buf_pos = start + CHUNK_HEADER_LEN as u64;
        self.pos = self.buf_pos + len as u64;
        if count == 0 {
            let total = u64::from_le_bytes(self.buf[..8].try_into().expect("8 bytes"));
            if total != self.records {
                return Err(corrupt(
                    start,
                    &format!(
                        "end marker counts {total} records but the chunks held {}",
                        self.records
                    ),
                ));
            }
            let mut extra = [0u8; 1];
            if read_full(&mut self.r, &mut extra)? != 0 {
                return Err(corrupt(self.pos, "data after the end marker"));
            }
            return Ok(false);
        }
        self.at = 0;
        self.left = count;
        self.st = State::default();
        Ok(true)
    }

    fn byte(&mut self) -> Result<u8, TraceError> {
        match self.buf.get(self.at) {
            Some(&b) => {
                self.at += 1;
                Ok(b)
            }
            None => Err(corrupt(
                self.buf_pos + self.at as u64,
                "record runs past the end of its chunk",
            )),
        }
    }

    fn varint(&mut self) -> Result<u64, TraceError> {
        let start = self.buf_pos + self.at as u64;
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            if i == 9 && b > 1 {
                return Err(corrupt(start, "varint overflows 64 bits"));
            }
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt(start, "varint longer than 10 bytes"))
    }

    fn varint_max(&mut self, max: u64, what: &str) -> Result<u64, TraceError> {
        let start = self.buf_pos + self.at as u64;
        let v = self.varint()?;
        if v > max {
            return Err(corrupt(start, &format!("{what} {v} exceeds {max}")));
        }
        Ok(v)
    }

    fn decode(&mut self) -> Result<Record, TraceError> {
        let start = self.buf_pos + self.at as u64;
        let flags = self.byte()?;
        if flags & F_RESERVED != 0 {
            return Err(corrupt(start, "reserved record flag set"));
        }
        let op = TraceOp::from_code(flags & F_OP_MASK)
            .ok_or_else(|| corrupt(start, &format!("unknown op code {}", flags & F_OP_MASK)))?;
        let time_ns = self.st.time.wrapping_add(unzigzag(self.varint()?) as u64);
        let client = if flags & F_CLIENT != 0 {
            self.varint_max(u32::MAX as u64, "client")? as u32
        } else {
            self.st.client
        };
        let device = if flags & F_DEVICE != 0 {
            self.varint_max(u32::MAX as u64, "device")? as u32
        } else {
            self.st.device
        };
        let offset = if flags & F_OFFSET != 0 {
            self.st.end.wrapping_add(unzigzag(self.varint()?) as u64)
        } else if op == TraceOp::Flush {
            0
        } else {
            self.st.end
        };
        let len = self.varint_max(u32::MAX as u64, "length")? as u32;
        let fragment = if flags & F_FRAGMENT != 0 {
            self.varint_max(u16::MAX as u64, "fragment")? as u16
        } else {
            0
        };
        let r = Record {
            time_ns,
            client,
            device,
            op,
            offset,
            len,
            fragment,
        };
        self.st.advance(&r);
        Ok(r)
    }

    /// The next record, `None` after the end marker.
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        if self.done {
            return Ok(None);
        }
        if self.left == 0 {
            if self.at != self.buf.len() && !self.buf.is_empty() {
                return Err(corrupt(
                    self.buf_pos + self.at as u64,
                    "chunk holds bytes after its last record",
                ));
            }
            if !self.load_chunk()? {
                self.done = true;
                return Ok(None);
            }
        }
        let r = self.decode()?;
        self.left -= 1;
        self.records += 1;
        Ok(Some(r))
    }
}

fn corrupt(offset: u64, message: &str) -> TraceError {
    TraceError::Corrupt {
        path: None,
        offset,
        message: message.to_string(),
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, TraceError> {
    super::bytes::read_up_to(r, buf).map_err(|e| TraceError::io(e, None))
}
