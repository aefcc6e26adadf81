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
mod bytes;
pub mod csvfmt;
mod error;
pub mod payload;
mod record;

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

pub use error::TraceError;
pub use record::{Record, TraceOp};

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
        let n = bytes::read_up_to(&mut r, &mut head).map_err(|e| TraceError::io(e, None))?;
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

/// Write the records of the trace at `path` as CSV lines (the header line
/// first) to `out`, at most `limit` records. A failed write is a
/// [`TraceError::Io`] without a path (the reader's errors name `path`).
pub fn write_csv(path: &Path, limit: Option<u64>, out: &mut impl Write) -> Result<(), TraceError> {
    let wr = |e| TraceError::io(e, None);
    writeln!(out, "{}", csvfmt::HEADER).map_err(wr)?;
    for (i, r) in Reader::open(path)?.enumerate() {
        if limit.is_some_and(|l| i as u64 >= l) {
            break;
        }
        writeln!(out, "{}", csvfmt::CsvRow(&r?)).map_err(wr)?;
    }
    out.flush().map_err(wr)
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
