//! How the engine reports progress: it never draws anything, it calls a
//! [`Progress`]; the command line chooses a terminal bar, periodic log
//! lines, JSON lines or nothing.

/// Receives progress of long operations (commit, checkout, gc).
pub trait Progress: Send + Sync {
    /// A new phase starts (`"hashing"`, `"uploading"`, ...), `total`
    /// units long (bytes unless the phase says otherwise).
    fn phase(&self, name: &'static str, total: u64);
    /// `n` more units of the current phase are done.
    fn advance(&self, n: u64);
    /// A remark for the user (a filter that could not run, a stale lease).
    fn note(&self, msg: &str) {
        tracing::info!("{msg}");
    }
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn phase(&self, _: &'static str, _: u64) {}
    fn advance(&self, _: u64) {}
}
