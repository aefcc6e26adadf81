//! How long work reports how far it got. Engines (a commit, a checkout,
//! a scan, a copy) never draw anything: they call a [`Progress`], and the
//! command line chooses a terminal bar, periodic log lines, JSON lines or
//! nothing (`crates/cli/src/progress.rs`).
//!
//! Work comes in phases: [`Progress::start`] names one and its total,
//! [`Progress::advance`] or [`Progress::set`] report what is done,
//! [`Progress::end`] closes it (the next `start` closes it too).

/// What a phase counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (shown as sizes and rates).
    Bytes,
    /// Things: requests, steps, blocks.
    Items,
}

/// Receives progress of long operations. Every method has a do-nothing
/// default, so a reporter implements what it shows.
pub trait Progress: Send + Sync {
    /// A new phase of `total` units starts.
    fn start(&self, _name: &'static str, _total: u64, _unit: Unit) {}
    /// `n` more units of the current phase are done.
    fn advance(&self, _n: u64) {}
    /// `done` units of the current phase are done in all.
    fn set(&self, _done: u64) {}
    /// The current phase is over.
    fn end(&self) {}
    /// A remark for the user (a filter that could not run, a stale lease).
    fn note(&self, msg: &str) {
        tracing::info!("{msg}");
    }

    /// A new phase of `total` bytes.
    fn phase(&self, name: &'static str, total: u64) {
        self.start(name, total, Unit::Bytes)
    }

    /// A new phase of `total` things (objects, refs, requests).
    fn items(&self, name: &'static str, total: u64) {
        self.start(name, total, Unit::Items)
    }
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {}
