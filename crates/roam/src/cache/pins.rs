//! Pin sets: the chunks a running session may still read from the shared
//! cache (those its EMPTY sectors reference). A session writes its set to
//! `pins/NAME` and holds an exclusive `flock` on that file while it runs;
//! the cache never evicts a chunk named in a live set. A set whose lock
//! can be taken belongs to a process that is gone and is removed.
//!
//! ```text
//!   0  magic    8   "RDSCPIN\0"
//!   8  version  4   u32 LE = 1
//!  12  count    4   u32 LE: number of ids
//!  16  ids     32 × count
//!  ..  crc      4   CRC-32C of everything before it
//! ```

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use roamdisk_blockdev::{durable, Op, Result};

use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::hash::{ChunkId, ID_LEN};

pub const MAGIC: [u8; 8] = *b"RDSCPIN\0";
pub const VERSION: u32 = 1;

roamdisk_blockdev::offsets! {
    from MAGIC.len();
    P_VERSION: 4, P_COUNT: 4;
    P_IDS
}

pub fn encode(ids: &[ChunkId]) -> Vec<u8> {
    let mut b = Vec::with_capacity(P_IDS + ids.len() * ID_LEN + 4);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        b.extend_from_slice(&id.0);
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

pub fn decode(b: &[u8]) -> std::result::Result<Vec<ChunkId>, String> {
    if b.len() < P_IDS + 4 || b[..P_VERSION] != MAGIC {
        return Err("not a pin set".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if u32_at(P_VERSION) != VERSION {
        return Err(format!(
            "pin set version {} is not supported",
            u32_at(P_VERSION)
        ));
    }
    let n = u32_at(P_COUNT) as usize;
    if b.len() != P_IDS + n * ID_LEN + 4 {
        return Err(format!(
            "pin set of {n} ids has the wrong length {}",
            b.len()
        ));
    }
    let end = b.len() - 4;
    if crc32c::crc32c(&b[..end]) != u32_at(end) {
        return Err("pin set checksum does not match".into());
    }
    Ok(b[P_IDS..end]
        .chunks_exact(ID_LEN)
        .map(ChunkId::from_slice)
        .collect())
}

/// A live pin set: removed when dropped.
pub struct PinGuard {
    path: PathBuf,
    _file: File,
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Write a pin set into `dir` and hold it.
pub fn pin(dir: &Path, ids: &[ChunkId]) -> Result<PinGuard> {
    let name = format!(
        "{}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(&name);
    let mut f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&tmp)
        .map_err(|e| io(Op::Open, e, &tmp))?;
    // Locked before it has a real name: no evictor ever sees it unlocked.
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| io(Op::Open, e.into(), &tmp))?;
    f.write_all(&encode(ids))
        .map_err(|e| io(Op::Write, e, &tmp))?;
    // A unique name: nobody else can hold it.
    match durable::rename_noreplace(&tmp, &path).map_err(|e| io(Op::Write, e, &path))? {
        durable::Renamed::Moved => {}
        other => {
            return Err(io(
                Op::Write,
                std::io::Error::other(format!("pin set name taken ({other:?})")),
                &path,
            ))
        }
    }
    Ok(PinGuard { path, _file: f })
}

/// A live pin set: a running session's.
pub struct PinSet {
    pub path: PathBuf,
    /// The process that holds it (from the file's name `PID-SEQ-NANOS`).
    pub pid: Option<u32>,
    pub ids: Vec<ChunkId>,
}

/// The union of every live pin set in `dir`; sets of processes that are
/// gone (their lock can be taken) are removed on the way.
pub fn live(dir: &Path) -> Result<HashSet<ChunkId>> {
    Ok(list(dir)?.into_iter().flat_map(|s| s.ids).collect())
}

/// Every live pin set in `dir`; sets of processes that are gone (their
/// lock can be taken) are removed on the way.
pub fn list(dir: &Path) -> Result<Vec<PinSet>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(Op::Read, e, dir)),
    };
    for ent in rd {
        let ent = ent.map_err(|e| io(Op::Read, e, dir))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = ent.path();
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(Op::Open, e, &path)),
        };
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                // Nobody holds it: its session is gone.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {}
            Err(e) => return Err(io(Op::Open, e.into(), &path)),
        }
        let bytes = std::fs::read(&path).map_err(|e| io(Op::Read, e, &path))?;
        let ids = decode(&bytes).map_err(|m| {
            corrupt(format!("{m}: remove the file if no session is running")).path(&path)
        })?;
        let pid = name.split('-').next().and_then(|p| p.parse().ok());
        out.push(PinSet { path, pid, ids });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_round_trip_and_damage_is_refused() {
        let ids = [ChunkId([1; 32]), ChunkId([2; 32])];
        let b = encode(&ids);
        assert_eq!(decode(&b).unwrap(), ids);
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(decode(&d).is_err(), "byte {i}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn live_sets_count_and_dropped_ones_do_not() {
        let t = tempfile::tempdir().unwrap();
        let a = pin(t.path(), &[ChunkId([1; 32])]).unwrap();
        let b = pin(t.path(), &[ChunkId([2; 32])]).unwrap();
        assert_eq!(live(t.path()).unwrap().len(), 2);
        drop(b);
        let l = live(t.path()).unwrap();
        assert!(l.contains(&ChunkId([1; 32])) && l.len() == 1);
        // A set left behind by a process that died: nobody holds its lock.
        std::fs::write(t.path().join("999-0-0"), encode(&[ChunkId([3; 32])])).unwrap();
        assert_eq!(live(t.path()).unwrap().len(), 1);
        assert!(!t.path().join("999-0-0").exists());
        drop(a);
    }
}
