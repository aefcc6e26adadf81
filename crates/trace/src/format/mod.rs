//! The roamdisk trace: one [`Record`] per block request, stored in a
//! compact checksummed binary form or as CSV (both specified in
//! `docs/formats/trace.md`).
//!
//! Readers and writers stream: a trace of any length is read and written
//! with memory bounded by one chunk (at most [`binary::MAX_CHUNK_RECORDS`]
//! records).
//!
//! ```
//! use roamdisk_trace::{Format, Reader, Record, TraceOp, Writer};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("t.rdtrace");
//! let rec = Record { time_ns: 5, client: 0, device: 1, op: TraceOp::Write, offset: 4096, len: 4096, fragment: 0 };
//! let mut w = Writer::create(&path, Format::Binary).unwrap();
//! w.write(&rec).unwrap();
//! w.finish().unwrap();
//! let back: Vec<Record> = Reader::open(&path).unwrap().collect::<Result<_, _>>().unwrap();
//! assert_eq!(back, vec![rec]);
//! ```

pub mod binary;
pub mod csvfmt;
mod error;
pub mod payload;

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};

pub use error::TraceError;

/// The operation of a traced request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceOp {
    Read,
    Write,
    Trim,
    WriteZeroes,
    /// A barrier: every earlier request of the stream completes, then the
    /// device's write cache is flushed, before any later request starts.
    Flush,
}

impl TraceOp {
    /// Every op, in code order.
    pub const ALL: [TraceOp; 5] = [
        TraceOp::Read,
        TraceOp::Write,
        TraceOp::Trim,
        TraceOp::WriteZeroes,
        TraceOp::Flush,
    ];

    /// The one-byte code of the binary format.
    pub fn code(self) -> u8 {
        match self {
            TraceOp::Read => 0,
            TraceOp::Write => 1,
            TraceOp::Trim => 2,
            TraceOp::WriteZeroes => 3,
            TraceOp::Flush => 4,
        }
    }

    /// The op for a binary code.
    pub fn from_code(c: u8) -> Option<TraceOp> {
        TraceOp::ALL.get(c as usize).copied()
    }

    /// The name used in CSV and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TraceOp::Read => "read",
            TraceOp::Write => "write",
            TraceOp::Trim => "trim",
            TraceOp::WriteZeroes => "write-zeroes",
            TraceOp::Flush => "flush",
        }
    }

    /// The op for a CSV name.
    pub fn from_name(s: &str) -> Option<TraceOp> {
        TraceOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op changes the device's contents.
    pub fn is_write_like(self) -> bool {
        matches!(self, TraceOp::Write | TraceOp::Trim | TraceOp::WriteZeroes)
    }
}

impl std::fmt::Display for TraceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Record {
    /// Issue time in nanoseconds since the start of the trace.
    pub time_ns: u64,
    /// The client (VM, connection) that issued it.
    pub client: u32,
    /// The device or partition it addressed.
    pub device: u32,
    pub op: TraceOp,
    /// Byte offset within the device (0 for a flush).
    pub offset: u64,
    /// Length in bytes (0 for a flush).
    pub len: u32,
    /// Index of this piece when one logical request was split into several
    /// (LBS Table 4's "fragment"); 0 for an unsplit request.
    pub fragment: u16,
}

impl Record {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len as u64)
    }
}

/// The two on-disk forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Compact, checksummed, chunked binary (`.rdtrace`).
    Binary,
    /// One line per record with a header line (`.csv`).
    Csv,
}

impl Format {
    /// The format a file name suggests: `.csv` is CSV, anything else binary.
    pub fn from_path(p: &Path) -> Format {
        match p.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv,
            _ => Format::Binary,
        }
    }
}

enum ReaderInner {
    Binary(binary::Decoder<Box<dyn Read + Send>>),
    Csv(csvfmt::CsvDecoder<Box<dyn Read + Send>>),
}

/// A streaming trace reader; yields records in file order. After the first
/// error it yields nothing more.
pub struct Reader {
    inner: ReaderInner,
    failed: bool,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("format", &self.format())
            .field("failed", &self.failed)
            .finish()
    }
}

impl Reader {
    /// Open a trace file, binary or CSV (told apart by the first bytes).
    pub fn open(path: &Path) -> Result<Reader, TraceError> {
        let f = File::open(path).map_err(|e| TraceError::io(e, Some(path)))?;
        Reader::from_reader(BufReader::with_capacity(1 << 16, f)).map_err(|e| e.with_path(path))
    }

    /// Read a trace from any byte stream (binary or CSV).
    pub fn from_reader<R: Read + Send + 'static>(mut r: R) -> Result<Reader, TraceError> {
        let mut head = [0u8; binary::MAGIC.len()];
        let n = read_up_to(&mut r, &mut head).map_err(|e| TraceError::io(e, None))?;
        let head_vec = head[..n].to_vec();
        let chained: Box<dyn Read + Send> = Box::new(std::io::Cursor::new(head_vec).chain(r));
        let inner = if n == head.len() && head == binary::MAGIC {
            ReaderInner::Binary(binary::Decoder::new(chained)?)
        } else if head[..n].starts_with(&csvfmt::HEADER.as_bytes()[..n.min(csvfmt::HEADER.len())])
            && n > 0
        {
            ReaderInner::Csv(csvfmt::CsvDecoder::new(chained)?)
        } else {
            return Err(TraceError::BAD_MAGIC);
        };
        Ok(Reader {
            inner,
            failed: false,
        })
    }

    /// The format being read.
    pub fn format(&self) -> Format {
        match self.inner {
            ReaderInner::Binary(_) => Format::Binary,
            ReaderInner::Csv(_) => Format::Csv,
        }
    }
}

pub(crate) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Iterator for Reader {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = match &mut self.inner {
            ReaderInner::Binary(d) => d.next_record(),
            ReaderInner::Csv(d) => d.next_record(),
        };
        match r {
            Ok(Some(rec)) => Some(Ok(rec)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

enum WriterInner {
    Binary(binary::Encoder<BufWriter<File>>),
    Csv(csvfmt::CsvEncoder<BufWriter<File>>),
}

/// A streaming trace writer. Call [`Writer::finish`] at the end: a binary
/// trace without its end marker reads back as truncated.
pub struct Writer {
    inner: WriterInner,
    path: PathBuf,
}

impl Writer {
    /// Create (or truncate) `path`.
    pub fn create(path: &Path, format: Format) -> Result<Writer, TraceError> {
        let f = File::create(path).map_err(|e| TraceError::io(e, Some(path)))?;
        let w = BufWriter::with_capacity(1 << 16, f);
        let inner = match format {
            Format::Binary => WriterInner::Binary(
                binary::Encoder::new(w).map_err(|e| TraceError::io(e, Some(path)))?,
            ),
            Format::Csv => {
                WriterInner::Csv(csvfmt::CsvEncoder::new(w).map_err(|e| e.with_path(path))?)
            }
        };
        Ok(Writer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Append one record.
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        match &mut self.inner {
            WriterInner::Binary(e) => e
                .write(rec)
                .map_err(|e| TraceError::io(e, Some(&self.path))),
            WriterInner::Csv(e) => e.write(rec).map_err(|e| e.with_path(&self.path)),
        }
    }

    /// Push everything written so far to the file (binary: closes the
    /// current chunk), so a reader sees it even if the writer is never
    /// finished.
    pub fn flush(&mut self) -> Result<(), TraceError> {
        match &mut self.inner {
            WriterInner::Binary(e) => e.flush(),
            WriterInner::Csv(e) => e.flush(),
        }
        .map_err(|e| TraceError::io(e, Some(&self.path)))
    }

    /// Records written so far.
    pub fn count(&self) -> u64 {
        match &self.inner {
            WriterInner::Binary(e) => e.count(),
            WriterInner::Csv(e) => e.count(),
        }
    }

    /// Write the end marker and flush to the file.
    pub fn finish(self) -> Result<(), TraceError> {
        let path = self.path;
        let w = match self.inner {
            WriterInner::Binary(e) => e.finish().map_err(|e| TraceError::io(e, Some(&path)))?,
            WriterInner::Csv(e) => e.finish().map_err(|e| e.with_path(&path))?,
        };
        let f = w
            .into_inner()
            .map_err(|e| TraceError::io(e.into_error(), Some(&path)))?;
        f.sync_all().map_err(|e| TraceError::io(e, Some(&path)))
    }
}

#[cfg(test)]
mod tests;
