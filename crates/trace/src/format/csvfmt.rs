//! The CSV trace form: a header line naming the fields, then one record per
//! line, e.g. `1500,0,1,write,4096,4096,0`. Op names are those of
//! [`TraceOp::name`].

use std::io::{Read, Write};

use super::error::TraceError;
use super::record::{Record, TraceOp};

/// The required first line (also the CSV form's "magic").
pub use super::record::HEADER;

const FIELDS: [&str; 7] = [
    "time_ns", "client", "device", "op", "offset", "len", "fragment",
];

/// Streaming CSV decoder.
pub struct CsvDecoder<R: Read> {
    r: csv::Reader<R>,
    rec: csv::StringRecord,
}

impl<R: Read> CsvDecoder<R> {
    /// Read and check the header line.
    pub fn new(r: R) -> Result<Self, TraceError> {
        let mut r = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(r);
        let h = r.headers().map_err(|e| csv_err(&e, 1))?;
        if h.iter().ne(FIELDS.iter().copied()) {
            return Err(TraceError::Csv {
                path: None,
                line: 1,
                message: format!("header must be exactly \"{HEADER}\""),
            });
        }
        Ok(CsvDecoder {
            r,
            rec: csv::StringRecord::new(),
        })
    }

    /// The next record, `None` at the end of the file.
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        let more = self.r.read_record(&mut self.rec).map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            csv_err(&e, line)
        })?;
        if !more {
            return Ok(None);
        }
        let line = self.rec.position().map_or(0, |p| p.line());
        parse_record(&self.rec, line).map(Some)
    }
}

fn csv_err(e: &csv::Error, line: u64) -> TraceError {
    let message = match e.kind() {
        csv::ErrorKind::UnequalLengths { len, .. } => {
            format!("{len} fields, expected {} ({HEADER})", FIELDS.len())
        }
        csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".to_string(),
        csv::ErrorKind::Io(io) => io.to_string(),
        _ => e.to_string(),
    };
    TraceError::Csv {
        path: None,
        line,
        message,
    }
}

fn parse_record(rec: &csv::StringRecord, line: u64) -> Result<Record, TraceError> {
    let bad = |message: String| TraceError::Csv {
        path: None,
        line,
        message,
    };
    if rec.len() != FIELDS.len() {
        return Err(bad(format!(
            "{} fields, expected {} ({HEADER})",
            rec.len(),
            FIELDS.len()
        )));
    }
    fn num<T: std::str::FromStr>(
        rec: &csv::StringRecord,
        i: usize,
        line: u64,
    ) -> Result<T, TraceError> {
        let s = &rec[i];
        s.parse().map_err(|_| TraceError::Csv {
            path: None,
            line,
            message: format!(
                "{} '{s}' is not a number in range for {}",
                FIELDS[i],
                std::any::type_name::<T>()
            ),
        })
    }
    let op = TraceOp::from_name(&rec[3]).ok_or_else(|| {
        bad(format!(
            "op '{}' is not one of read, write, trim, write-zeroes, flush",
            &rec[3]
        ))
    })?;
    Ok(Record {
        time_ns: num(rec, 0, line)?,
        client: num(rec, 1, line)?,
        device: num(rec, 2, line)?,
        op,
        offset: num(rec, 4, line)?,
        len: num(rec, 5, line)?,
        fragment: num(rec, 6, line)?,
    })
}

/// One record as a CSV line (without the newline), in [`HEADER`]'s
/// column order. Every field is a number or an op name, so no quoting is
/// ever needed.
pub struct CsvRow<'a>(pub &'a Record);

impl std::fmt::Display for CsvRow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0;
        write!(
            f,
            "{},{},{},{},{},{},{}",
            r.time_ns,
            r.client,
            r.device,
            r.op.name(),
            r.offset,
            r.len,
            r.fragment
        )
    }
}

/// Streaming CSV encoder.
pub struct CsvEncoder<W: Write> {
    w: W,
    line: String,
    count: u64,
}

impl<W: Write> CsvEncoder<W> {
    /// Write the header line.
    pub fn new(mut w: W) -> Result<Self, TraceError> {
        writeln!(w, "{HEADER}").map_err(|e| TraceError::io(e, None))?;
        Ok(CsvEncoder {
            w,
            line: String::with_capacity(96),
            count: 0,
        })
    }

    /// Append one record.
    pub fn write(&mut self, r: &Record) -> Result<(), TraceError> {
        use std::fmt::Write as _;
        self.line.clear();
        let _ = writeln!(self.line, "{}", CsvRow(r));
        self.w
            .write_all(self.line.as_bytes())
            .map_err(|e| TraceError::io(e, None))?;
        self.count += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }

    /// Flush and return the underlying writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.w.flush().map_err(|e| TraceError::io(e, None))?;
        Ok(self.w)
    }
}
