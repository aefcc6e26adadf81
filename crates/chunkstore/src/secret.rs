//! Secrets: random bytes, and the small files that hold one secret (a
//! user's key, a store access token): created once with mode 0600, never
//! replaced, and read with a warning when others may read them.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{err, io};
use roamdisk_blockdev::{ErrorKind, Op, Result};

/// Fill `buf` from the operating system's random generator; `what` names
/// the use in the error.
pub fn fill_random(buf: &mut [u8], what: &str) -> Result<()> {
    roamdisk_crypto::fill_random(buf)
        .map_err(|e| err(ErrorKind::Io, Op::Write, format!("{what}: {e}")))
}

/// Create `path` (it must not exist) with mode 0600 holding `line` and a
/// newline, durably. `what` names the file in errors ("the key file").
pub fn create_file(path: &Path, line: &str, what: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(Op::Write, e, path).msg(format!("cannot create {what}")))?;
    writeln!(f, "{line}")
        .and_then(|_| f.sync_all())
        .map_err(|e| io(Op::Write, e, path))
}

/// The text of a secret file, trimmed. Warns when the file may be read by
/// users other than its owner.
pub fn read_file(path: &Path, what: &str) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io(Op::Open, e, path).msg(format!("cannot read {what}")))?;
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                "{what} {} has mode {mode:03o}: others may read it; `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
    }
    Ok(text.trim().to_string())
}
