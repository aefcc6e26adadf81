//! Converting a whole input into a trace file: the input's format is
//! given or detected from its first lines, and its records stream into a
//! new trace (binary, or CSV when the output is named `*.csv`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use roamdisk_blockdev::progress::{Progress, Unit};

use super::blkparse::{self, BlkparseOptions};
use super::msr::{self, MsrOptions};
use super::ConvertReport;
use crate::format::{Format, Reader, Record, TraceError, Writer};

/// The formats a conversion reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The text `blkparse` prints.
    Blkparse,
    /// MSR-Cambridge CSV.
    Msr,
    /// A roamdisk trace (binary or CSV): a copy, which also rescues the
    /// valid records of a truncated trace.
    Trace,
}

impl std::str::FromStr for Source {
    type Err = ConvertError;

    /// The format of a name (`blkparse`, `msr`, `trace`).
    fn from_str(name: &str) -> Result<Source, ConvertError> {
        match name {
            "blkparse" => Ok(Source::Blkparse),
            "msr" => Ok(Source::Msr),
            "trace" => Ok(Source::Trace),
            _ => Err(ConvertError::UnknownSource(name.to_string())),
        }
    }
}

/// Guess the format of a file: a roamdisk trace when it opens as one,
/// else blkparse or MSR by the first of its first 50 lines that is not
/// empty and reads as either.
pub fn detect(path: &Path) -> Result<Source, ConvertError> {
    if Reader::open(path).is_ok() {
        return Ok(Source::Trace);
    }
    let f = std::fs::File::open(path).map_err(|source| ConvertError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    for line in BufReader::new(f).lines().take(50) {
        let line = line.unwrap_or_default();
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        if blkparse::parse_line(l, 1).ok().flatten().is_some() {
            return Ok(Source::Blkparse);
        }
        if l.split(',').count() == 7 {
            return Ok(Source::Msr);
        }
    }
    Err(ConvertError::Unknown {
        path: path.to_path_buf(),
    })
}

/// Why an input could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The input file does not open.
    #[error("cannot open {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A format name that is none of the known ones.
    #[error("--from must be blkparse, msr or trace, not '{0}'")]
    UnknownSource(String),
    /// Detection found no known format.
    #[error("{}: cannot tell the format (not a roamdisk trace, blkparse text or MSR CSV); say it with --from", .path.display())]
    Unknown { path: PathBuf },
    /// A roamdisk trace is read from a file only.
    #[error("--from trace needs a file, not stdin")]
    TraceFromStream,
    /// The blkparse or MSR input (or the output) failed at some line.
    #[error("{}: {error}", .input.display())]
    Input { input: PathBuf, error: TraceError },
    /// The trace input or the output failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// What to convert.
pub enum Input {
    /// A file; its format is detected when not given.
    File(PathBuf),
    /// A stream such as stdin (named `-` in messages): blkparse unless
    /// given otherwise; never a roamdisk trace.
    Stream(Box<dyn BufRead>),
}

impl Input {
    fn name(&self) -> PathBuf {
        match self {
            Input::File(p) => p.clone(),
            Input::Stream(_) => PathBuf::from("-"),
        }
    }
}

/// How to convert.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// The input's format; `None`: detected (a file) or blkparse (a stream).
    pub from: Option<Source>,
    pub blkparse: BlkparseOptions,
    pub msr: MsrOptions,
}

/// What a conversion did.
#[derive(Debug)]
pub struct Converted {
    /// The format read.
    pub from: Source,
    /// Lines read and skipped, names given client ids.
    pub report: ConvertReport,
    /// Records written.
    pub records: u64,
    /// A trace input that ended early: the records before it were copied.
    pub truncated: Option<TraceError>,
}

/// Convert `input` into the trace file `output`, reporting a phase
/// "converting" over the input's bytes (estimated from records written).
pub fn convert_file(
    input: Input,
    output: &Path,
    opts: &ConvertOptions,
    progress: &dyn Progress,
) -> Result<Converted, ConvertError> {
    let name = input.name();
    let stream = matches!(input, Input::Stream(_));
    let from = match (opts.from, &input) {
        (Some(f), _) => f,
        (None, Input::Stream(_)) => Source::Blkparse,
        (None, Input::File(p)) => detect(p)?,
    };
    let mut w = Writer::create(output, Format::from_path(output))?;
    let (reader, size): (Box<dyn BufRead>, u64) = match input {
        Input::Stream(r) => (r, 0),
        Input::File(p) => {
            let f = std::fs::File::open(&p).map_err(|source| ConvertError::Open {
                path: p.clone(),
                source,
            })?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            (Box::new(BufReader::with_capacity(1 << 20, f)), size)
        }
    };
    progress.start("converting", size.max(1), Unit::Bytes);
    let mut sink = |r: &Record| -> Result<(), TraceError> {
        w.write(r)?;
        if w.count().is_multiple_of(65536) {
            progress.set(w.count() * 40);
        }
        Ok(())
    };
    let at = |error: TraceError| ConvertError::Input {
        input: name.clone(),
        error,
    };
    let mut truncated = None;
    let report = match from {
        Source::Blkparse => blkparse::convert(reader, &opts.blkparse, &mut sink).map_err(at)?,
        Source::Msr => msr::convert(reader, &opts.msr, &mut sink).map_err(at)?,
        Source::Trace => {
            if stream {
                return Err(ConvertError::TraceFromStream);
            }
            let mut rep = ConvertReport::default();
            for r in Reader::open(&name)? {
                match r {
                    Ok(r) => {
                        sink(&r)?;
                        rep.records += 1;
                    }
                    Err(e) if e.is_truncated() => {
                        truncated = Some(e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            rep
        }
    };
    progress.end();
    let records = w.count();
    w.finish()?;
    Ok(Converted {
        from,
        report,
        records,
        truncated,
    })
}
