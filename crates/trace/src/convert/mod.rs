//! Converters from other trace formats: the text `blkparse` prints, and
//! the CSV layout of the MSR-Cambridge traces (SNIA IOTTA). Both stream
//! line by line. How each field maps is in `docs/formats/trace.md`.

pub mod blkparse;
pub mod file;
pub mod msr;

use crate::format::{Record, TraceError};

/// What a conversion did.
#[derive(Debug, Clone, Default)]
pub struct ConvertReport {
    /// Records produced.
    pub records: u64,
    /// Input lines read.
    pub lines: u64,
    /// Lines that are not events (headers, summaries, other actions).
    pub skipped: u64,
    /// Client ids given to names (MSR host names), in id order.
    pub clients: Vec<String>,
}

/// Where converted records go.
pub type Sink<'a> = &'a mut dyn FnMut(&Record) -> Result<(), TraceError>;

fn bad_line(line: u64, message: String) -> TraceError {
    TraceError::Csv {
        path: None,
        line,
        message,
    }
}
