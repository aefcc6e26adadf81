//! Durable file writes: the one home of the few steps every on-disk format
//! of roamdisk builds its crash argument on.
//!
//! * [`write_atomically`]: a whole file replaced through a temporary name,
//!   `fsync`, `rename` and an `fsync` of the directory, so a crash leaves
//!   either the old file or the new one, never a mix.
//! * [`sync_parent`] / [`sync_dir`]: make a directory entry (a create, a
//!   rename, an unlink) durable.
//! * [`rename_noreplace`]: move a file to a name only if that name is free
//!   (`RENAME_NOREPLACE`), reporting what happened instead of failing.
//!
//! The media assumptions these rely on are stated once in
//! `docs/formats/overlay-map.md` ("Crash-consistency argument").

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `path` with `suffix` appended to its file name (`states` -> `states.tmp`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// `fsync` the directory `dir` itself.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `fsync` the directory that holds `path` (the current directory for a
/// bare file name).
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    sync_dir(dir)
}

/// Replace `path` with `bytes` crash-safely: write `PATH.tmp`, `fsync` it,
/// rename it over `path`, `fsync` the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomically_via(path, &with_suffix(path, ".tmp"), bytes)
}

/// [`write_atomically`] through the temporary file `tmp` (a format that
/// names its second file, like LBS's `.lbsm2`).
pub fn write_atomically_via(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(tmp, path)?;
    sync_parent(path)
}

/// What [`rename_noreplace`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renamed {
    /// The file now has its new name.
    Moved,
    /// The new name was taken; nothing changed.
    TargetExists,
    /// There was no file to move.
    SourceMissing,
}

/// Rename `from` to `to` unless `to` exists (atomic: `RENAME_NOREPLACE`).
/// The rename is durable only after [`sync_parent`] of both names.
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<Renamed> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(Renamed::Moved),
        Err(rustix::io::Errno::EXIST) => Ok(Renamed::TargetExists),
        Err(rustix::io::Errno::NOENT) => Ok(Renamed::SourceMissing),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        write_atomically(&p, b"one").unwrap();
        write_atomically(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!with_suffix(&p, ".tmp").exists());
    }

    #[test]
    fn rename_noreplace_reports_each_case() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        assert_eq!(rename_noreplace(&a, &b).unwrap(), Renamed::SourceMissing);
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        assert_eq!(rename_noreplace(&a, &b).unwrap(), Renamed::TargetExists);
        assert_eq!(std::fs::read(&b).unwrap(), b"b");
        std::fs::remove_file(&b).unwrap();
        assert_eq!(rename_noreplace(&a, &b).unwrap(), Renamed::Moved);
        assert_eq!(std::fs::read(&b).unwrap(), b"a");
        sync_parent(&b).unwrap();
    }
}
