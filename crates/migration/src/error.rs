//! What can be wrong with a migration stream, with where it was met.

/// A stream roamdisk cannot take, or a broken one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A valid stream using something roamdisk does not store (another
    /// capability set, a section or command it does not know): refused
    /// before anything is committed.
    #[error("QEMU's migration stream has {what} at byte {at}: roamdisk stores the state of a stopped VM migrated with QEMU's default capabilities; {hint}")]
    Unsupported {
        what: String,
        at: u64,
        hint: &'static str,
    },
    /// Bytes that are not a migration stream (truncated, damaged, not
    /// QEMU's).
    #[error("QEMU's migration stream is damaged at byte {at}: {what}")]
    Corrupt { what: String, at: u64 },
    /// The stream could not be read (its socket or file failed).
    #[error("QEMU's migration stream could not be read at byte {at}: {source}")]
    Io {
        at: u64,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// The advice for a stream from a QEMU set up in another way.
pub const HINT_DEFAULTS: &str =
    "turn the migration capability off in QEMU (QMP migrate-set-capabilities) and suspend again";
/// The advice for a device or section roamdisk does not carry.
pub const HINT_DEVICE: &str =
    "remove that device or feature from the VM, or suspend it without --qmp (shut it down first)";
