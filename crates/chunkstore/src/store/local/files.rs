//! The file steps a local store is built from: files written before they
//! have a name ([`Unnamed`]: `O_TMPFILE`, or a named temporary file in
//! `tmp/` where the file system has no unnamed files), how such a file is
//! given its name ([`Naming`], learned on first use), vectored writes of an
//! object's two pieces, opened folders, touches (a reference time set to
//! now), and file steps that may find no file (a gc removed it). No store
//! state.

use std::fs::{self, File};
use std::io::{ErrorKind as IoKind, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::fs::{AtFlags, Timespec, Timestamps, CWD, UTIME_NOW, UTIME_OMIT};

/// How an unnamed (`O_TMPFILE`) file is given its name, found on first use.
const NAMING_UNKNOWN: u8 = 0;
/// `linkat(fd, "", AT_EMPTY_PATH)` (Linux ≥ 6.10 for the file's opener, or
/// `CAP_DAC_READ_SEARCH`).
const NAMING_EMPTY_PATH: u8 = 1;
/// `linkat("/proc/self/fd/N", AT_SYMLINK_FOLLOW)`.
const NAMING_PROC: u8 = 2;
/// No `O_TMPFILE` here: named temporary files in `tmp/`, renamed.
const NAMING_TMP_DIR: u8 = 3;

/// A file being written that has no name yet: unnamed (`O_TMPFILE`), or
/// a named temporary file in `tmp/` where the file system has no unnamed
/// files — removed on drop unless it was renamed into place (`tmp` set to
/// `None` then).
pub(super) struct Unnamed {
    pub(super) file: File,
    pub(super) tmp: Option<PathBuf>,
}

impl Drop for Unnamed {
    fn drop(&mut self) {
        if let Some(t) = &self.tmp {
            let _ = fs::remove_file(t);
        }
    }
}

/// A new unnamed file (`O_TMPFILE`) in the folder `dir`.
pub(super) fn open_unnamed(dir: &OwnedFd) -> rustix::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map(File::from)
}

/// Write `parts` back to back at `offset` with vectored writes.
pub(super) fn pwrite_parts(f: &File, parts: &[&[u8]; 2], mut offset: u64) -> std::io::Result<()> {
    let mut slices = [IoSlice::new(parts[0]), IoSlice::new(parts[1])];
    let mut bufs = &mut slices[..];
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match rustix::io::pwritev(f, bufs, offset) {
            Ok(0) => return Err(std::io::Error::from(IoKind::WriteZero)),
            Ok(n) => {
                IoSlice::advance_slices(&mut bufs, n);
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether an opened folder has been removed (no entry can be made in it).
pub(super) fn dir_removed(dir: &OwnedFd) -> bool {
    rustix::fs::fstat(dir).is_ok_and(|st| st.st_nlink == 0)
}

/// Open the folder `path`, to create, name and look up files relative to
/// it.
pub(super) fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Set the modification time of `path` to now.
pub(super) fn touch(path: &Path) -> std::io::Result<()> {
    touch_at(CWD, path)
}

/// Set the modification time of `dir/name` to now.
pub(super) fn touch_at<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> std::io::Result<()> {
    let t = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
    };
    rustix::fs::utimensat(dir, name, &t, AtFlags::empty()).map_err(std::io::Error::from)
}

/// With `touch`, [`touch_at`]; without, only check that `dir/name` is
/// there.
pub(super) fn touch_or_stat(dir: impl AsFd, name: &str, touch: bool) -> std::io::Result<()> {
    if touch {
        touch_at(dir, name)
    } else {
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map(|_| ())
            .map_err(std::io::Error::from)
    }
}

/// What a file step gave, or `None` where there was no file.
pub(super) fn if_found<T>(r: std::io::Result<T>) -> std::io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == IoKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// How this store gives an unnamed file its name: one of the `NAMING_*`
/// values, learned on first use.
pub(super) struct Naming(AtomicU8);

impl Naming {
    /// Not known yet: the first file tells.
    pub(super) fn new() -> Naming {
        Naming(AtomicU8::new(NAMING_UNKNOWN))
    }

    /// Whether files are written as named temporary files in `tmp/` (the
    /// file system has no unnamed files, or they cannot be named here).
    #[inline]
    pub(super) fn tmp_dir_only(&self) -> bool {
        self.0.load(Ordering::Relaxed) == NAMING_TMP_DIR
    }

    /// From now on, named temporary files in `tmp/`.
    #[inline]
    pub(super) fn use_tmp_dir(&self) {
        self.0.store(NAMING_TMP_DIR, Ordering::Relaxed);
    }

    /// Give a durable unnamed file the name `name` in `dir`: true if it
    /// was named, false if the name exists, `None` if this system can
    /// name no unnamed file (no `AT_EMPTY_PATH` right, no `/proc`).
    pub(super) fn link(
        &self,
        dir: BorrowedFd<'_>,
        file: &File,
        name: &str,
    ) -> std::io::Result<Option<bool>> {
        use rustix::io::Errno;
        let mode = self.0.load(Ordering::Relaxed);
        if mode == NAMING_UNKNOWN || mode == NAMING_EMPTY_PATH {
            match rustix::fs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
                Ok(()) => {
                    if mode == NAMING_UNKNOWN {
                        self.0.store(NAMING_EMPTY_PATH, Ordering::Relaxed);
                    }
                    return Ok(Some(true));
                }
                Err(Errno::EXIST) => return Ok(Some(false)),
                // Not allowed here (older kernel without the capability).
                Err(Errno::NOENT | Errno::PERM | Errno::INVAL | Errno::ACCESS) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        match rustix::fs::linkat(CWD, proc_path.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW) {
            Ok(()) => {
                if mode != NAMING_PROC {
                    self.0.store(NAMING_PROC, Ordering::Relaxed);
                }
                Ok(Some(true))
            }
            Err(Errno::EXIST) => Ok(Some(false)),
            Err(_) => Ok(None),
        }
    }
}
