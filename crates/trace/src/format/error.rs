//! The one error type of trace reading and writing.

use std::path::{Path, PathBuf};

/// Why a trace could not be read or written. Every variant names what was
/// wrong and where; none of them is ever produced by a panic path.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened, read or written.
    #[error("{}{source}", path_prefix(.path))]
    Io {
        path: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    /// Neither the binary magic nor the CSV header line.
    #[error("{}not a roamdisk trace: it starts neither with the binary magic \"RDTRACE\\0\" nor with the CSV header \"{}\" (convert blkparse or MSR traces with `roamdisk trace convert`)", path_prefix(.path), super::record::HEADER)]
    BadMagic { path: Option<PathBuf> },
    /// A binary trace of a format version this build does not read.
    #[error("{}trace format version {found} is not supported (this build reads version {supported}); upgrade roamdisk", path_prefix(.path))]
    Version {
        path: Option<PathBuf>,
        found: u16,
        supported: u16,
    },
    /// A binary trace whose bytes fail validation.
    #[error("{}corrupt trace at byte {offset}: {message}", path_prefix(.path))]
    Corrupt {
        path: Option<PathBuf>,
        offset: u64,
        message: String,
    },
    /// A binary trace that ends before its end marker (the writer was
    /// interrupted); every record before `offset` was returned.
    #[error("{}trace truncated at byte {offset} after {records} records: {message} (the recorder was probably stopped without finishing; the records before this point are valid)", path_prefix(.path))]
    Truncated {
        path: Option<PathBuf>,
        offset: u64,
        records: u64,
        message: String,
    },
    /// A CSV line that does not parse.
    #[error("{}line {line}: {message}", path_prefix(.path))]
    Csv {
        path: Option<PathBuf>,
        line: u64,
        message: String,
    },
    /// A record that the format cannot hold or that makes no sense.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
}

fn path_prefix(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => format!("{}: ", p.display()),
        None => String::new(),
    }
}

impl TraceError {
    pub(crate) fn io(source: std::io::Error, path: Option<&Path>) -> Self {
        TraceError::Io {
            path: path.map(Path::to_path_buf),
            source,
        }
    }

    pub(crate) const BAD_MAGIC: TraceError = TraceError::BadMagic { path: None };

    /// Attach the file name, if none is attached yet.
    pub fn with_path(mut self, p: &Path) -> Self {
        let slot = match &mut self {
            TraceError::Io { path, .. }
            | TraceError::BadMagic { path }
            | TraceError::Version { path, .. }
            | TraceError::Corrupt { path, .. }
            | TraceError::Truncated { path, .. }
            | TraceError::Csv { path, .. } => path,
            TraceError::InvalidRecord(_) => return self,
        };
        if slot.is_none() {
            *slot = Some(p.to_path_buf());
        }
        self
    }

    /// Whether the trace was cut short (its records up to here are valid).
    pub fn is_truncated(&self) -> bool {
        matches!(self, TraceError::Truncated { .. })
    }
}
