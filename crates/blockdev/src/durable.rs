//! Durable file writes: the one home of the few steps every on-disk format
//! of roamdisk builds its crash argument on.
//!
//! * [`write_atomically`]: a whole file replaced through a temporary name,
//!   `fsync`, `rename` and an `fsync` of the directory, so a crash leaves
//!   either the old file or the new one, never a mix.
//! * [`write_unsynced`]: the same without the `fsync`s, atomic for readers
//!   only: for a report rewritten at every flush.
//! * [`sync_parent`] / [`sync_dir`]: make a directory entry (a create, a
//!   rename, an unlink) durable.
//! * [`rename_noreplace`]: move a file to a name only if that name is free
//!   (`RENAME_NOREPLACE`), reporting what happened instead of failing.
//!
//! Every whole-file write of the project goes through here: `clippy.toml`
//! refuses `std::fs::rename` (and the other renames) everywhere else. The
//! steps of a write run on a [`FileSystem`]: production on [`Os`], the crash
//! tests on the simulated `testkit::simfs::SimFs`, which cuts the power at
//! every step and checks that a reboot finds the old file or the new one
//! (`crates/blockdev/tests/durable_crash.rs`). The media assumptions and
//! that check are stated once in `docs/formats/overlay-map.md`
//! ("Crash-consistency argument").

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file-system calls a whole-file write is made of, so the crash tests
/// run the very code production runs. [`Os`] is the real file system.
pub trait FileSystem {
    /// A file open for writing.
    type File: Write;
    /// Create `path`, or truncate it if it exists, open for writing.
    fn create(&self, path: &Path) -> std::io::Result<Self::File>;
    /// `fsync` `file`: its data and size are durable when this returns.
    fn sync_file(&self, file: &mut Self::File) -> std::io::Result<()>;
    /// Rename `from` to `to`, atomically replacing `to` if it exists. The
    /// new name is durable only after [`FileSystem::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    /// `fsync` the directory `dir`: its entries are durable when this
    /// returns.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct Os;

impl FileSystem for Os {
    type File = File;
    fn create(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }
    fn sync_file(&self, file: &mut File) -> std::io::Result<()> {
        file.sync_all()
    }
    #[allow(
        clippy::disallowed_methods,
        reason = "the one rename of a whole-file write"
    )]
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// `path` with `suffix` appended to its file name (`states` -> `states.tmp`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The directory that holds `path` (the current directory for a bare file
/// name).
pub fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// `fsync` the directory `dir` itself.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    Os.sync_dir(dir)
}

/// `fsync` the directory that holds `path` (the current directory for a
/// bare file name).
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    Os.sync_dir(parent_of(path))
}

/// Replace `path` with `bytes` crash-safely: write `PATH.tmp`, `fsync` it,
/// rename it over `path`, `fsync` the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomically_in(&Os, path, bytes)
}

/// [`write_atomically`] on the file system `fs` (the crash tests pass a
/// simulated one).
pub fn write_atomically_in<F: FileSystem>(
    fs: &F,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    replace(fs, path, &with_suffix(path, ".tmp"), bytes, true)
}

/// [`write_atomically`] through the temporary file `tmp` (a format that
/// names its second file, like LBS's `.lbsm2`).
pub fn write_atomically_via(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(&Os, path, tmp, bytes, true)
}

/// Replace `path` with `bytes` for readers only: [`write_atomically`]
/// without its two `fsync`s. A reader sees the old content or the new one,
/// never a part, but a power cut may leave an empty or torn file. Only for
/// a file rewritten on the I/O path that a crash makes worthless anyway (a
/// layer's `report` at each flush, which would otherwise cost two `fsync`s
/// per flush); the file's last version is written with
/// [`write_atomically`].
pub fn write_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_unsynced_in(&Os, path, bytes)
}

/// [`write_unsynced`] on the file system `fs`.
pub fn write_unsynced_in<F: FileSystem>(fs: &F, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(fs, path, &with_suffix(path, ".tmp"), bytes, false)
}

/// The algorithm: write `tmp`, rename it over `path`. With `sync`, the new
/// content is durable under the temporary name before the name `path` is
/// given to it, and the rename is durable before this returns.
fn replace<F: FileSystem>(
    fs: &F,
    path: &Path,
    tmp: &Path,
    bytes: &[u8],
    sync: bool,
) -> std::io::Result<()> {
    {
        let mut f = fs.create(tmp)?;
        f.write_all(bytes)?;
        if sync {
            fs.sync_file(&mut f)?;
        }
    }
    fs.rename(tmp, path)?;
    if sync {
        fs.sync_dir(parent_of(path))?;
    }
    Ok(())
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
#[allow(clippy::disallowed_methods, reason = "durable is the home of renames")]
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<Renamed> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(Renamed::Moved),
        Err(rustix::io::Errno::EXIST) => Ok(Renamed::TargetExists),
        Err(rustix::io::Errno::NOENT) => Ok(Renamed::SourceMissing),
        Err(e) => Err(e.into()),
    }
}

/// Move `from`, a file whose data is already durable, to `to`,
/// replacing any file there (a chunk the cache admits: the same content
/// under the same name). The new name is durable only after
/// [`sync_parent`] of `to`; a format that names the file elsewhere before
/// that (a journal) must cope with the name missing after a crash.
#[allow(clippy::disallowed_methods, reason = "durable is the home of renames")]
pub fn move_into_place(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)
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
