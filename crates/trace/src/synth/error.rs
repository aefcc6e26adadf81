//! Why a synthetic workload cannot be generated.

use crate::format::TraceError;

/// A workload that cannot be generated as asked: an unknown name, or
/// options or parameters the generator cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// No workload has this name.
    #[error("unknown workload '{name}' (known: {known})")]
    UnknownKind {
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// The Android trace index is out of range.
    #[error("no Android trace number {0}")]
    NoAndroidTrace(usize),
    /// The scale is not a positive finite number.
    #[error("scale must be a positive number, not {0}")]
    Scale(f64),
    /// Zero clients asked for.
    #[error("clients must be at least 1")]
    NoClients,
    /// Zero requests asked for.
    #[error("requests must be at least 1")]
    NoRequests,
    /// A share of a Virtual PC trace outside [0, 1].
    #[error("{name} must lie in [0, 1], not {value}")]
    Share { name: &'static str, value: f64 },
    /// A Virtual PC trace without requests or with empty page-file runs.
    #[error("requests and page-file run length must be at least 1")]
    EmptyRun,
    /// A Virtual PC trace duration that is not positive.
    #[error("duration must be positive, not {0}")]
    Duration(f64),
    /// The trace file could not be written.
    #[error(transparent)]
    Trace(#[from] TraceError),
}
