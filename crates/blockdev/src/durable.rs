//! Durable file writes: the one home of the few steps every on-disk format
//! of roamdisk builds its crash argument on.
//!
//! * [`write_atomically`]: a whole file replaced through a temporary name,
//!   `fsync`, `rename` and an `fsync` of the directory, so a crash leaves
//!   either the old file or the new one, never a mix.
//! * [`write_then_rename`]: the same without the `fsync` of the directory,
//!   which the caller does once for a batch of names (a chunk store's
//!   catalogs, leases and settings).
//! * [`write_unsynced`]: the same without the `fsync`s, atomic for readers
//!   only: for a report rewritten at every flush, or a cache checked on
//!   read.
//! * [`sync_parent`] / [`sync_dir`]: make a directory entry (a create, a
//!   rename, an unlink) durable.
//! * [`rename_noreplace`]: move a file to a name only if that name is free
//!   (`RENAME_NOREPLACE`), reporting what happened instead of failing;
//!   [`rename_noreplace_at`] names it in a directory opened once;
//!   [`move_into_place`] moves a durable file over another of the same
//!   content.
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
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The file-system calls a whole-file write is made of, so the crash tests
/// run the very code production runs. [`Os`] is the real file system.
pub trait FileSystem {
    /// A file open for writing.
    type File: Write;
    /// Create `path`, or truncate it if it exists, open for writing.
    fn create(&self, path: &Path) -> std::io::Result<Self::File>;
    /// Create `path`, which must not exist (`AlreadyExists` otherwise),
    /// open for writing, readable by everyone and writable by its owner
    /// (mode 0644).
    fn create_new(&self, path: &Path) -> std::io::Result<Self::File>;
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
    fn create_new(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
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

/// `syncfs`: make everything written to the file system that holds `path`
/// durable, in one call (cheaper than an `fsync` per file for a batch).
pub fn sync_file_system(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    rustix::fs::syncfs(&f).map_err(std::io::Error::from)
}

/// `create_dir_all`, then make the name of every folder it made durable:
/// each new folder's parent is synced, from the top down (a folder's own
/// name lives in its parent, which a sync of the folder does not cover).
pub fn create_dir_all_durable(path: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut p = path;
    while !p.exists() {
        missing.push(p);
        match p.parent() {
            Some(q) if !q.as_os_str().is_empty() => p = q,
            _ => break,
        }
    }
    std::fs::create_dir_all(path)?;
    for d in missing.iter().rev() {
        sync_parent(d)?;
    }
    Ok(())
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

/// [`write_atomically_via`] without the `fsync` of the directory: `tmp`
/// (a new file: it must not exist) is written, `fsync`ed and renamed over
/// `path`. The content is durable before it gets the name, so a crash
/// leaves the old file or the new one; the new name is durable once the
/// caller has run [`sync_dir`] on `path`'s directory, once for a batch of
/// names. On failure `tmp` may be left behind: the caller removes it.
pub fn write_then_rename(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_then_rename_in(&Os, path, tmp, bytes)
}

/// [`write_then_rename`] on the file system `fs`.
pub fn write_then_rename_in<F: FileSystem>(
    fs: &F,
    path: &Path,
    tmp: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    {
        let mut f = fs.create_new(tmp)?;
        f.write_all(bytes)?;
        fs.sync_file(&mut f)?;
    }
    fs.rename(tmp, path)
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

/// [`write_unsynced`] through the temporary file `tmp` (a name of the
/// writer's own, where several processes may write one file at once).
pub fn write_unsynced_via(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(&Os, path, tmp, bytes, false)
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
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<Renamed> {
    rename_noreplace_impl(rustix::fs::CWD, from, rustix::fs::CWD, to)
}

/// [`rename_noreplace`] of the file at `from` to the name `to` in the
/// directory opened as `dir` (a folder opened once and named into many
/// times, without a walk of its whole path each time). `SourceMissing`
/// also when `dir` was removed since it was opened. The rename is durable
/// only after an `fsync` of `dir` (and of `from`'s directory).
pub fn rename_noreplace_at(
    from: &Path,
    dir: impl AsFd,
    to: impl AsRef<Path>,
) -> std::io::Result<Renamed> {
    rename_noreplace_impl(rustix::fs::CWD, from, dir, to.as_ref())
}

/// The one `RENAME_NOREPLACE` of the project.
#[allow(clippy::disallowed_methods, reason = "durable is the home of renames")]
fn rename_noreplace_impl(
    from_dir: impl AsFd,
    from: &Path,
    to_dir: impl AsFd,
    to: &Path,
) -> std::io::Result<Renamed> {
    use rustix::fs::{renameat_with, RenameFlags};
    match renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
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

    /// Write a file `f` twice with `write` through the temporary `tmp`:
    /// the second replaces the first and no temporary is left. Returns
    /// the folder, the file and the temporary.
    fn write_twice(
        write: fn(&Path, &Path, &[u8]) -> std::io::Result<()>,
        tmp: &str,
    ) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (p, tmp) = (d.path().join("f"), d.path().join(tmp));
        write(&p, &tmp, b"one").unwrap();
        write(&p, &tmp, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!tmp.exists());
        (d, p, tmp)
    }

    #[test]
    fn create_dir_all_durable_makes_every_missing_level() {
        let d = tempfile::tempdir().unwrap();
        let deep = d.path().join("a/b/c");
        create_dir_all_durable(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all_durable(&deep).unwrap(); // already there: nothing to do
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(create_dir_all_durable(&f.join("under")).is_err());
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let (_d, p, tmp) = write_twice(|p, _, bytes| write_atomically(p, bytes), "f.tmp");
        assert_eq!(tmp, with_suffix(&p, ".tmp"), "the temporary checked for");
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

    #[test]
    fn rename_noreplace_at_names_into_an_opened_directory() {
        let (d, sub) = crate::testkit::scratch("sub");
        std::fs::create_dir(&sub).unwrap();
        let dir = File::open(&sub).unwrap();
        let a = d.path().join("a");
        assert_eq!(
            rename_noreplace_at(&a, &dir, "x").unwrap(),
            Renamed::SourceMissing
        );
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(sub.join("x"), b"x").unwrap();
        assert_eq!(
            rename_noreplace_at(&a, &dir, "x").unwrap(),
            Renamed::TargetExists
        );
        assert_eq!(std::fs::read(sub.join("x")).unwrap(), b"x");
        assert_eq!(rename_noreplace_at(&a, &dir, "y").unwrap(), Renamed::Moved);
        assert_eq!(std::fs::read(sub.join("y")).unwrap(), b"a");
        assert!(!a.exists());
    }

    #[test]
    fn write_then_rename_refuses_a_taken_temporary_and_writes_0644() {
        use std::os::unix::fs::PermissionsExt;
        let (d, p, tmp) = write_twice(write_then_rename, "f.tmp");
        // Never more than 0644, whatever the umask allows.
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert!(mode & !0o644 == 0 && mode & 0o600 == 0o600, "{mode:o}");
        std::fs::write(&tmp, b"stale").unwrap();
        let e = write_then_rename(&p, &tmp, b"three").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        sync_dir(d.path()).unwrap();
    }

    #[test]
    fn write_unsynced_via_replaces_through_the_given_temporary() {
        write_twice(write_unsynced_via, ".f.7");
    }
}
