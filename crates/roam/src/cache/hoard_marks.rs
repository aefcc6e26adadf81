//! Hoard marks: the versions `roamdisk hoard` keeps on this host. One file
//! per hoarded version, `hoards/VERSION` (the version id in hex), lists the
//! version's distinct chunks; the cache never evicts a chunk named in a
//! mark, whatever process runs, until the mark is released
//! (`roamdisk hoard --release`). Marks are written and removed under the
//! cache's lock (`docs/formats/cas-shared-cache.md`, "Hoard marks").
//!
//! ```text
//!   0  magic     8   "RDSCHRD\0"
//!   8  version   4   u32 LE = 1
//!  12  flags     4   u32 LE = 0 (reserved)
//!  16  id       32   the hoarded version's id (the file's name in hex)
//!  48  bytes     8   u64 LE: decoded bytes of the chunks listed
//!  56  created   8   u64 LE: seconds since 1970 when it was marked
//!  64  count     4   u32 LE: chunk ids listed
//!  68  name_len  2   u16 LE: bytes of the name (1..=1024)
//!  70  reserved  2   0
//!  72  name      name_len   USER/IMAGE, UTF-8
//!  ..  ids       32 × count  strictly ascending, none all zero
//!  ..  crc       4   CRC-32C of everything before it
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use roamdisk_blockdev::{durable, Op, Result};

use roamdisk_chunkstore::error::io;
use roamdisk_chunkstore::hash::{ChunkId, ID_LEN};

pub const MAGIC: [u8; 8] = *b"RDSCHRD\0";
pub const VERSION: u32 = 1;
/// Longest name kept in a mark.
pub const MAX_NAME: usize = 1024;

roamdisk_blockdev::offsets! {
    M_MAGIC: 8, M_VERSION: 4, M_FLAGS: 4, M_ID: ID_LEN, M_BYTES: 8, M_CREATED: 8, M_COUNT: 4,
    M_NAME_LEN: 2, M_RESERVED: 2;
    /// Length of the fixed header; the name follows.
    pub HEADER_LEN == 72
}
const CRC_LEN: usize = 4;

/// A hoarded version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoardMark {
    /// The version's id.
    pub version: ChunkId,
    /// `USER/IMAGE` it was hoarded as.
    pub name: String,
    /// Decoded bytes of its distinct chunks.
    pub bytes: u64,
    /// When it was marked, seconds since 1970.
    pub created: u64,
    /// Its distinct chunks (disk and memory image), ascending.
    pub ids: Vec<ChunkId>,
}

/// Why a mark's bytes are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    #[error("the hoard mark is {0} bytes, shorter than its 76-byte minimum")]
    Short(usize),
    #[error("not a hoard mark (bad magic)")]
    Magic,
    #[error("hoard mark version {0} is not supported (this build reads version 1)")]
    Version(u32),
    #[error("the hoard mark's checksum does not match")]
    Checksum,
    #[error("the hoard mark has unknown flags {0:#x} or reserved bytes set")]
    Flags(u32),
    #[error("the hoard mark of {count} chunks with a {name_len}-byte name should be {want} bytes, not {got}")]
    Length {
        count: u32,
        name_len: u16,
        want: u64,
        got: usize,
    },
    #[error("the hoard mark's name is empty, longer than 1024 bytes or not UTF-8")]
    Name,
    #[error("the hoard mark names the all-zero version")]
    ZeroVersion,
    #[error("the hoard mark's chunk {0} is all zero, or not above the one before it")]
    Order(usize),
    #[error("the mark in file {file} is for version {version}")]
    OtherVersion { file: String, version: ChunkId },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encode a mark. Its ids must be strictly ascending and its name 1 to
/// [`MAX_NAME`] bytes (what [`HoardMark::new`] makes).
pub fn encode(m: &HoardMark) -> Vec<u8> {
    let name = m.name.as_bytes();
    let mut b = Vec::with_capacity(HEADER_LEN + name.len() + m.ids.len() * ID_LEN + CRC_LEN);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&m.version.0);
    b.extend_from_slice(&m.bytes.to_le_bytes());
    b.extend_from_slice(&m.created.to_le_bytes());
    b.extend_from_slice(&(m.ids.len() as u32).to_le_bytes());
    b.extend_from_slice(&(name.len() as u16).to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    debug_assert_eq!(b.len(), HEADER_LEN);
    b.extend_from_slice(name);
    for id in &m.ids {
        b.extend_from_slice(&id.0);
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Decode a mark, checking every field.
pub fn decode(b: &[u8]) -> std::result::Result<HoardMark, MarkError> {
    if b.len() < HEADER_LEN + CRC_LEN {
        return Err(MarkError::Short(b.len()));
    }
    if b[M_MAGIC..M_VERSION] != MAGIC {
        return Err(MarkError::Magic);
    }
    let end = b.len() - CRC_LEN;
    if crc32c::crc32c(&b[..end]) != u32_at(b, end) {
        return Err(MarkError::Checksum);
    }
    match u32_at(b, M_VERSION) {
        VERSION => {}
        v => return Err(MarkError::Version(v)),
    }
    let flags = u32_at(b, M_FLAGS);
    if flags != 0 || u16_at(b, M_RESERVED) != 0 {
        return Err(MarkError::Flags(flags));
    }
    let count = u32_at(b, M_COUNT);
    let name_len = u16_at(b, M_NAME_LEN);
    let want = (HEADER_LEN + CRC_LEN) as u64 + name_len as u64 + count as u64 * ID_LEN as u64;
    if want != b.len() as u64 {
        return Err(MarkError::Length {
            count,
            name_len,
            want,
            got: b.len(),
        });
    }
    let ids_at = HEADER_LEN + name_len as usize;
    let name = std::str::from_utf8(&b[HEADER_LEN..ids_at]).map_err(|_| MarkError::Name)?;
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(MarkError::Name);
    }
    let version = ChunkId::from_slice(&b[M_ID..M_BYTES]);
    if version.is_zero() {
        return Err(MarkError::ZeroVersion);
    }
    let ids: Vec<ChunkId> = b[ids_at..end]
        .chunks_exact(ID_LEN)
        .map(ChunkId::from_slice)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        if id.is_zero() || (i > 0 && ids[i - 1] >= *id) {
            return Err(MarkError::Order(i));
        }
    }
    Ok(HoardMark {
        version,
        name: name.to_string(),
        bytes: u64_at(b, M_BYTES),
        created: u64_at(b, M_CREATED),
        ids,
    })
}

impl HoardMark {
    /// A mark for `version` hoarded as `name`: `ids` sorted, zero ids and
    /// repeats left out, the name cut to [`MAX_NAME`] bytes.
    pub fn new(version: ChunkId, name: &str, bytes: u64, mut ids: Vec<ChunkId>) -> HoardMark {
        ids.retain(|id| !id.is_zero());
        ids.sort_unstable();
        ids.dedup();
        let mut cut = name.len().min(MAX_NAME);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let name = match &name[..cut] {
            "" => "?".to_string(),
            n => n.to_string(),
        };
        HoardMark {
            version,
            name,
            bytes,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            ids,
        }
    }
}

/// The file of `version`'s mark in the marks folder `dir`.
pub fn path_of(dir: &Path, version: &ChunkId) -> PathBuf {
    dir.join(version.to_hex())
}

/// Write `m` crash-safely (temporary file, fsync, rename, folder fsync).
/// The caller holds the cache's lock.
pub fn write(dir: &Path, m: &HoardMark) -> Result<()> {
    let p = path_of(dir, &m.version);
    durable::write_atomically(&p, &encode(m)).map_err(|e| io(Op::Write, e, &p))
}

/// Remove `version`'s mark; whether there was one. The caller holds the
/// cache's lock.
pub fn remove(dir: &Path, version: &ChunkId) -> Result<bool> {
    let p = path_of(dir, version);
    match std::fs::remove_file(&p) {
        Ok(()) => {
            durable::sync_dir(dir).map_err(|e| io(Op::Write, e, dir))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(Op::Write, e, &p)),
    }
}

/// One file of the marks folder: its path and what it says. A mark whose
/// content names another version than its file name is refused as
/// damaged.
pub struct Listed {
    pub path: PathBuf,
    pub mark: std::result::Result<HoardMark, MarkError>,
}

/// Whether a name in the marks folder is a mark's (64 hex digits); others
/// (temporaries `ID.tmp`) are not marks.
fn mark_name(name: &str) -> Option<ChunkId> {
    (name.len() == 2 * ID_LEN)
        .then(|| ChunkId::from_hex(name))
        .flatten()
}

/// The entries of `dir` with their names (none when it does not exist).
fn entries(dir: &Path) -> Result<Vec<(String, std::fs::DirEntry)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(Op::Read, e, dir)),
    };
    rd.map(|ent| {
        let ent = ent.map_err(|e| io(Op::Read, e, dir))?;
        Ok((ent.file_name().to_string_lossy().into_owned(), ent))
    })
    .collect()
}

/// Every mark in `dir`, damaged ones included (sorted by file name).
pub fn list(dir: &Path) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    for (name, ent) in entries(dir)? {
        let Some(id) = mark_name(&name) else { continue };
        let path = ent.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(Op::Read, e, &path)),
        };
        let mark = match decode(&bytes) {
            Ok(m) if m.version == id => Ok(m),
            Ok(m) => Err(MarkError::OtherVersion {
                file: name.clone(),
                version: m.version,
            }),
            Err(e) => Err(e),
        };
        out.push(Listed { path, mark });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Remove temporaries a writer that died left in `dir` (under the lock:
/// no live writer has one).
pub fn remove_temporaries(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for (name, ent) in entries(dir)? {
        if mark_name(&name).is_none() {
            let _ = std::fs::remove_file(ent.path());
            n += 1;
        }
    }
    Ok(n)
}

/// What the marks in a folder protect, as of one look: the union of their
/// chunk ids, and the files it was read from (to tell when to look again).
#[derive(Default)]
pub struct Protected {
    pub ids: HashSet<ChunkId>,
    stamp: Vec<Stamp>,
}

/// A mark file's name, inode, change time (seconds, nanoseconds) and
/// length.
type Stamp = (String, u64, i64, i64, u64);

/// Each mark file's [`Stamp`]: marks are only ever replaced whole (a
/// rename), so unchanged stamps mean unchanged marks.
fn stamp(dir: &Path) -> Result<Vec<Stamp>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for (name, ent) in entries(dir)? {
        if mark_name(&name).is_none() {
            continue;
        }
        match ent.metadata() {
            Ok(m) => out.push((name, m.ino(), m.ctime(), m.ctime_nsec(), m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(Op::Read, e, &ent.path())),
        }
    }
    out.sort();
    Ok(out)
}

impl Protected {
    /// Bring `self` up to date with the marks in `dir`, reading them again
    /// only if a file changed. A damaged mark is an error naming it: the
    /// cache cannot know what it protects, so it evicts nothing it might.
    pub fn refresh(&mut self, dir: &Path) -> Result<()> {
        let now = stamp(dir)?;
        if now == self.stamp {
            return Ok(());
        }
        let mut ids = HashSet::new();
        for l in list(dir)? {
            match l.mark {
                Ok(m) => ids.extend(m.ids),
                Err(e) => {
                    return Err(roamdisk_chunkstore::error::corrupt(format!(
                        "{e}: run `roamdisk hoard --release` for that version, or remove the file"
                    ))
                    .path(&l.path))
                }
            }
        }
        self.ids = ids;
        self.stamp = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ChunkId {
        ChunkId([n; ID_LEN])
    }

    fn mark() -> HoardMark {
        HoardMark {
            version: id(9),
            name: "alice/desktop".into(),
            bytes: 3 * 65536,
            created: 1_700_000_000,
            ids: vec![id(1), id(2), id(3)],
        }
    }

    #[test]
    fn marks_round_trip_with_chained_offsets() {
        let m = mark();
        let b = encode(&m);
        assert_eq!(b.len(), HEADER_LEN + 13 + 3 * ID_LEN + CRC_LEN);
        assert_eq!(&b[..8], b"RDSCHRD\0");
        assert_eq!(b[M_NAME_LEN], 13);
        assert_eq!(&b[HEADER_LEN..HEADER_LEN + 13], b"alice/desktop");
        assert_eq!(decode(&b).unwrap(), m);
        // New sorts, drops zero ids and repeats, and cuts long names.
        let n = HoardMark::new(id(9), &"é".repeat(600), 1, vec![id(3), id(0), id(1), id(3)]);
        assert_eq!(n.ids, vec![id(1), id(3)]);
        assert!(n.name.len() <= MAX_NAME);
        assert_eq!(decode(&encode(&n)).unwrap(), n);
    }

    #[test]
    fn truncated_marks_are_refused_at_every_length() {
        let b = encode(&mark());
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "length {n}");
        }
        assert_eq!(decode(&b[..10]), Err(MarkError::Short(10)));
        let mut longer = b.clone();
        longer.extend_from_slice(&[0; 32]);
        assert!(decode(&longer).is_err());
    }

    #[test]
    fn tampered_marks_are_refused_bit_by_bit() {
        let b = encode(&mark());
        for bit in 0..b.len() * 8 {
            let mut d = b.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&d).is_err(), "bit {bit}");
        }
    }

    /// A tampered field with its checksum made right again: each field's
    /// own check catches it.
    #[test]
    fn tampered_fields_with_a_fixed_checksum_are_refused() {
        fn recrc(mut b: Vec<u8>) -> Vec<u8> {
            let end = b.len() - CRC_LEN;
            let crc = crc32c::crc32c(&b[..end]);
            b[end..].copy_from_slice(&crc.to_le_bytes());
            b
        }
        let b = encode(&mark());
        let ids_at = HEADER_LEN + 13;
        let cases: Vec<(usize, u8, MarkError)> = vec![
            (M_VERSION, 2, MarkError::Version(2)),
            (M_FLAGS, 1, MarkError::Flags(1)),
            (M_RESERVED, 1, MarkError::Flags(0)),
            (
                M_COUNT,
                4,
                MarkError::Length {
                    count: 4,
                    name_len: 13,
                    want: (HEADER_LEN + CRC_LEN + 13 + 4 * ID_LEN) as u64,
                    got: b.len(),
                },
            ),
            (HEADER_LEN, 0xff, MarkError::Name),
            // The second id below the first.
            (ids_at + ID_LEN, 0, MarkError::Order(1)),
        ];
        for (at, v, want) in cases {
            let mut d = b.clone();
            d[at] = v;
            assert_eq!(decode(&recrc(d)), Err(want), "byte {at}");
        }
        let mut d = b.clone();
        d[M_ID..M_BYTES].fill(0);
        assert_eq!(decode(&recrc(d)), Err(MarkError::ZeroVersion));
        let mut d = b.clone();
        d[ids_at..ids_at + ID_LEN].fill(0);
        assert_eq!(decode(&recrc(d)), Err(MarkError::Order(0)));
        let mut d = b;
        d[M_NAME_LEN] = 0;
        d[M_COUNT] = 0;
        let d: Vec<u8> = d[..HEADER_LEN].to_vec();
        assert_eq!(
            decode(&recrc([d, vec![0; 4]].concat())),
            Err(MarkError::Name)
        );
    }

    #[test]
    fn the_folder_lists_marks_and_protects_their_chunks() {
        let t = tempfile::tempdir().unwrap();
        let m = mark();
        write(t.path(), &m).unwrap();
        std::fs::write(t.path().join("x.tmp"), b"partial").unwrap();
        let l = list(t.path()).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].mark.as_ref().unwrap(), &m);
        let mut p = Protected::default();
        p.refresh(t.path()).unwrap();
        assert_eq!(p.ids.len(), 3);
        // A mark copied under another version's name is damaged, and a
        // damaged mark stops eviction with an error naming it.
        std::fs::copy(path_of(t.path(), &m.version), path_of(t.path(), &id(7))).unwrap();
        let e = p.refresh(t.path()).unwrap_err().to_string();
        assert!(
            e.contains(&id(7).to_hex()) && e.contains("--release"),
            "{e}"
        );
        assert!(remove(t.path(), &id(7)).unwrap());
        assert!(!remove(t.path(), &id(7)).unwrap());
        p.refresh(t.path()).unwrap();
        assert_eq!(p.ids.len(), 3);
        assert_eq!(remove_temporaries(t.path()).unwrap(), 1);
        assert!(remove(t.path(), &m.version).unwrap());
        p.refresh(t.path()).unwrap();
        assert!(p.ids.is_empty());
    }
}
