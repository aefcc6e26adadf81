//! The payload sidecar (`TRACE.data`): the bytes of every write of a trace,
//! in trace order, so a replay can reproduce an image byte for byte. The
//! trace itself never holds data. Layout in `docs/formats/trace.md`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::bytes::read_up_to;
use super::error::TraceError;

/// Sidecar magic, bytes 0..8.
pub const MAGIC: [u8; 8] = *b"RDTRDATA";
/// Sidecar format version.
pub const VERSION: u16 = 1;

roamdisk_blockdev::offsets! {
    from MAGIC.len();
    pub HDR_VERSION: 2, pub HDR_FLAGS: 2, pub HDR_CRC: 4;
    /// Size of the sidecar header.
    pub HEADER_LEN == 16
}

/// Size of the header before each payload (length, CRC-32C).
pub const ENTRY_HEADER_LEN: usize = 8;

/// The sidecar path of a trace: `TRACE.data`.
pub fn sidecar_path(trace: &Path) -> PathBuf {
    let mut s = trace.as_os_str().to_os_string();
    s.push(".data");
    PathBuf::from(s)
}

/// Appends write payloads.
pub struct PayloadWriter {
    w: BufWriter<File>,
    path: PathBuf,
}

impl PayloadWriter {
    pub fn create(path: &Path) -> Result<Self, TraceError> {
        let io = |e| TraceError::io(e, Some(path));
        let f = File::create(path).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let mut h = [0u8; HEADER_LEN];
        h[..HDR_VERSION].copy_from_slice(&MAGIC);
        h[HDR_VERSION..HDR_FLAGS].copy_from_slice(&VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&h[..HDR_CRC]);
        h[HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
        w.write_all(&h).map_err(io)?;
        Ok(PayloadWriter {
            w,
            path: path.to_path_buf(),
        })
    }

    /// Append the payload of the next write record.
    pub fn write(&mut self, data: &[u8]) -> Result<(), TraceError> {
        let len = u32::try_from(data.len())
            .map_err(|_| TraceError::InvalidRecord("payload longer than 4 GiB".into()))?;
        let mut h = [0u8; ENTRY_HEADER_LEN];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
        let io = |e| TraceError::io(e, Some(&self.path));
        self.w.write_all(&h).map_err(io)?;
        self.w.write_all(data).map_err(io)
    }

    pub fn flush(&mut self) -> Result<(), TraceError> {
        self.w
            .flush()
            .map_err(|e| TraceError::io(e, Some(&self.path)))
    }

    /// Flush and sync to disk.
    pub fn finish(self) -> Result<(), TraceError> {
        let path = self.path;
        let f = self
            .w
            .into_inner()
            .map_err(|e| TraceError::io(e.into_error(), Some(&path)))?;
        f.sync_all().map_err(|e| TraceError::io(e, Some(&path)))
    }
}

fn corrupt(path: &Path, offset: u64, message: String) -> TraceError {
    TraceError::Corrupt {
        path: Some(path.to_path_buf()),
        offset,
        message,
    }
}

/// Where each payload lives in a sidecar: built by one sequential,
/// checksum-verifying pass ([`PayloadIndex::next`]), then read at random
/// with [`PayloadFile::read`].
pub struct PayloadIndex {
    r: BufReader<File>,
    path: PathBuf,
    pos: u64,
    skip_buf: Vec<u8>,
}

impl PayloadIndex {
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let f = File::open(path).map_err(|e| TraceError::io(e, Some(path)))?;
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut h = [0u8; HEADER_LEN];
        let n = read_up_to(&mut r, &mut h).map_err(|e| TraceError::io(e, Some(path)))?;
        if n < HEADER_LEN || h[..HDR_VERSION] != MAGIC {
            return Err(corrupt(
                path,
                0,
                "not a trace payload file (magic RDTRDATA missing)".into(),
            ));
        }
        if crc32c::crc32c(&h[..HDR_CRC]) != u32::from_le_bytes(h[HDR_CRC..].try_into().expect("4"))
        {
            return Err(corrupt(
                path,
                HDR_CRC as u64,
                "header checksum mismatch".into(),
            ));
        }
        let v = u16::from_le_bytes([h[HDR_VERSION], h[HDR_VERSION + 1]]);
        if v != VERSION {
            return Err(TraceError::Version {
                path: Some(path.to_path_buf()),
                found: v,
                supported: VERSION,
            });
        }
        Ok(PayloadIndex {
            r,
            path: path.to_path_buf(),
            pos: HEADER_LEN as u64,
            skip_buf: Vec::new(),
        })
    }

    /// Verify the next payload, which must be `len` bytes, and return the
    /// file offset of its bytes.
    pub fn next(&mut self, len: u32) -> Result<u64, TraceError> {
        let mut h = [0u8; ENTRY_HEADER_LEN];
        let n = read_up_to(&mut self.r, &mut h).map_err(|e| TraceError::io(e, Some(&self.path)))?;
        if n < ENTRY_HEADER_LEN {
            return Err(TraceError::Truncated {
                path: Some(self.path.clone()),
                offset: self.pos,
                records: 0,
                message: "payload file ends before the trace's writes do".into(),
            });
        }
        let got = u32::from_le_bytes(h[..4].try_into().expect("4"));
        if got != len {
            return Err(corrupt(
                &self.path,
                self.pos,
                format!("payload of {got} bytes where the trace has a write of {len} bytes (trace and payload file do not belong together)"),
            ));
        }
        let crc = u32::from_le_bytes(h[4..].try_into().expect("4"));
        self.skip_buf.clear();
        let read = (&mut self.r)
            .take(len as u64)
            .read_to_end(&mut self.skip_buf)
            .map_err(|e| TraceError::io(e, Some(&self.path)))?;
        if read < len as usize {
            return Err(TraceError::Truncated {
                path: Some(self.path.clone()),
                offset: self.pos,
                records: 0,
                message: "payload cut short".into(),
            });
        }
        if crc32c::crc32c(&self.skip_buf) != crc {
            return Err(corrupt(
                &self.path,
                self.pos,
                "payload checksum mismatch".into(),
            ));
        }
        let at = self.pos + ENTRY_HEADER_LEN as u64;
        self.pos = at + len as u64;
        Ok(at)
    }
}

/// Random access to verified payloads.
pub struct PayloadFile {
    f: File,
    path: PathBuf,
}

impl PayloadFile {
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        Ok(PayloadFile {
            f: File::open(path).map_err(|e| TraceError::io(e, Some(path)))?,
            path: path.to_path_buf(),
        })
    }

    /// Read the payload at `offset` (from [`PayloadIndex::next`]).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<(), TraceError> {
        self.f
            .read_exact_at(buf, offset)
            .map_err(|e| TraceError::io(e, Some(&self.path)))
    }
}
