//! The shared cache's chunk files: one per resident chunk, named by its
//! id under a folder named by the id's first two hex digits
//! (`chunks/4e/4e11…`), and kept open once read (hits are a `pread` of
//! the bytes asked for). The process's file-descriptor budget for them is
//! set once.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::error::io;
use roamdisk_chunkstore::hash::ChunkId;

/// `4e/4e11…` for a chunk id.
pub(super) fn chunk_rel(id: &ChunkId) -> PathBuf {
    let hex = id.to_hex();
    PathBuf::from(&hex[..2]).join(&hex)
}

/// The chunk files of a cache, and those this process holds open.
pub(super) struct ChunkFiles {
    chunks: PathBuf,
    /// Open chunk files and their lengths.
    fds: RwLock<HashMap<ChunkId, (Arc<File>, u64)>>,
    fd_cap: usize,
}

impl ChunkFiles {
    /// The chunk files under `dir/chunks`.
    pub(super) fn new(dir: &Path) -> ChunkFiles {
        ChunkFiles {
            chunks: dir.join("chunks"),
            fds: RwLock::new(HashMap::new()),
            fd_cap: fd_budget(),
        }
    }

    /// The file chunk `id` is kept in.
    pub(super) fn path(&self, id: &ChunkId) -> PathBuf {
        self.chunks.join(chunk_rel(id))
    }

    /// The folder of every chunk file.
    pub(super) fn dir(&self) -> &Path {
        &self.chunks
    }

    /// Chunk `id`'s file if this process holds it open: `Some(None)` when
    /// it is not `len` bytes long (not the chunk the index describes: never
    /// served), `None` when it is not open.
    pub(super) fn held(&self, id: &ChunkId, len: usize) -> Option<Option<Arc<File>>> {
        match self.fds.read().get(id) {
            Some((_, flen)) if *flen != len as u64 => Some(None),
            Some((f, _)) => Some(Some(f.clone())),
            None => None,
        }
    }

    /// The open file of chunk `id` (kept open for later hits), or `None`
    /// when there is none, or not `len` bytes long (not the chunk the
    /// index describes: never served).
    pub(super) fn open(&self, id: &ChunkId, len: usize) -> Result<Option<Arc<File>>> {
        match self.held(id, len) {
            Some(f) => Ok(f),
            None => {
                let p = self.path(id);
                let f = match File::open(&p) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io(Op::Open, e, &p)),
                };
                let m = f.metadata().map_err(|e| io(Op::Read, e, &p))?;
                if m.len() != len as u64 {
                    return Ok(None);
                }
                let f = Arc::new(f);
                let mut fds = self.fds.write();
                if fds.len() >= self.fd_cap {
                    fds.clear();
                }
                fds.insert(*id, (f.clone(), m.len()));
                Ok(Some(f))
            }
        }
    }

    /// Close chunks' files (they are removed, or cut short).
    pub(super) fn forget(&self, ids: &[ChunkId]) {
        let mut fds = self.fds.write();
        for id in ids {
            fds.remove(id);
        }
    }

    /// Close and remove chunks' files.
    pub(super) fn remove(&self, ids: &[ChunkId]) {
        self.forget(ids);
        for id in ids {
            let _ = std::fs::remove_file(self.path(id));
        }
    }
}

pub(super) fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

pub(super) fn read_dir_names(dir: &Path) -> Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(|e| io(Op::Read, e, dir))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(Op::Read, e, dir)),
    }
}

/// File descriptors to keep open for hits: half the soft limit, at most
/// 65,536 (the soft limit is raised to the hard one first).
fn fd_budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 256;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max.min(1 << 20),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
    }
    let budget = ((lim.rlim_cur / 2) as usize).clamp(64, 65536);
    grow_fd_table(budget + 256, lim.rlim_cur);
    budget
}

/// Make the process's file-descriptor table large enough for `want`
/// descriptors now, once. The kernel grows the table by doubling when an
/// open needs a higher number, and in a process with several threads each
/// growth waits for an RCU grace period: 5-15 ms measured here at 256,
/// 512, 1024 and 2048 descriptors, every one of them a guest read stalled
/// behind the open of a chunk file. Done at open, it costs that once.
fn grow_fd_table(want: usize, limit: u64) {
    let hi = (want as u64).min(limit.saturating_sub(1)) as libc::c_int;
    if hi <= 3 {
        return;
    }
    // SAFETY: dup2 onto a descriptor number this process does not use
    // (checked with fcntl first), closed again at once; no Rust object
    // owns that number.
    unsafe {
        if libc::fcntl(hi, libc::F_GETFD) != -1 {
            return; // already in use: the table is that large already
        }
        if libc::dup2(libc::STDERR_FILENO, hi) == hi {
            libc::close(hi);
        }
    }
}
