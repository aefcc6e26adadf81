//! A new folder under the temporary folder that only this user can enter
//! (mode 0700), removed with what is in it when dropped: where a private
//! Unix socket goes (a socket path must be short, so not under a session
//! or cache folder), with the messages of a helper process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A private folder, removed on drop.
pub(crate) struct PrivateDir(PathBuf);

impl PrivateDir {
    /// `roamdisk-WHAT-PID-N` under the temporary folder.
    pub(crate) fn new(what: &str) -> std::io::Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!(
            "roamdisk-{what}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(PrivateDir(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
