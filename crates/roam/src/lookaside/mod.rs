//! Lookaside media (seed: ISR lookaside caching): read-only places that
//! may hold some of a version's chunks — a USB key with a resume set, a
//! DVD with an installation image, an old copy of the disk — consulted by
//! chunk id before the network. Nothing on a medium is trusted: every
//! chunk found is verified against its id, so a wrong, stale or damaged
//! medium costs time only, never correctness.
//!
//! Two kinds of medium:
//!
//! - a **chunk-store folder** (it has a `store.toml`: what
//!   `roamdisk suspend --to-media` writes): objects are looked up by id
//!   and opened with the store's codec, which verifies them;
//! - an **image file or block device** (raw bytes of a disk): hashed once
//!   in chunks of the version's chunk size, and the index (id → offset)
//!   is cached under the host's cache folder (`~/.cache/roamdisk/lookaside/`
//!   for the `roamdisk` command), keyed by the
//!   file's identity (path, size, mtime, inode), so it is hashed again
//!   only when it changes. Format: `docs/formats/cas-lookaside-index.md`.
//!   A **qcow2 image** (told by its magic) is the same, its virtual disk
//!   read through `qemu-nbd` ([`qemu_nbd`]).
//!
//! Plain chunks only for image media: an encrypted chunk's id is the hash
//! of its ciphertext, which a medium of plaintext does not show (a store
//! folder works for both).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use roamdisk_blockdev::{durable, Op, Result};

use crate::fetch::{ChunkSource, Source, Wanted};
use qemu_nbd::{Qcow2, StartError};
use roamdisk_chunkstore::chunk::{ChunkCodec, Key};
use roamdisk_chunkstore::error::{corrupt, io};
use roamdisk_chunkstore::hash::{ChunkId, HashKind, ID_LEN};
use roamdisk_chunkstore::store::{local::LocalStore, ChunkRead};

pub mod qemu_nbd;

pub const INDEX_MAGIC: [u8; 8] = *b"RDLAIDX\0";
pub const INDEX_VERSION: u32 = 1;

/// The identity an index was made for: if any field differs, the file
/// changed and is hashed again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub hash: HashKind,
    pub chunk_size: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

roamdisk_blockdev::offsets! {
    from INDEX_MAGIC.len();
    I_VERSION: 4, I_HASH: 4, I_CHUNK: 4, I_SIZE: 8, I_MTIME: 8, I_INO: 8, I_DEV: 8, I_COUNT: 8;
    I_ENTRIES == 60
}
const ENTRY: usize = ID_LEN + 8;

/// Encode an index: `(id, chunk number)` entries.
pub fn encode_index(who: &Identity, entries: &[(ChunkId, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(I_ENTRIES + entries.len() * ENTRY + 4);
    b.extend_from_slice(&INDEX_MAGIC);
    b.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    b.extend_from_slice(&(who.hash as u32).to_le_bytes());
    b.extend_from_slice(&who.chunk_size.to_le_bytes());
    b.extend_from_slice(&who.size.to_le_bytes());
    b.extend_from_slice(&who.mtime_ns.to_le_bytes());
    b.extend_from_slice(&who.ino.to_le_bytes());
    b.extend_from_slice(&who.dev.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (id, n) in entries {
        b.extend_from_slice(&id.0);
        b.extend_from_slice(&n.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Decode an index; `Err` says why it cannot be used (it is then rebuilt).
pub fn decode_index(b: &[u8]) -> Result<(Identity, Vec<(ChunkId, u64)>)> {
    if b.len() < I_ENTRIES + 4 || b[..I_VERSION] != INDEX_MAGIC {
        return Err(corrupt("not a lookaside index"));
    }
    let u32_at = |a: usize| u32::from_le_bytes(b[a..a + 4].try_into().expect("4"));
    let u64_at = |a: usize| u64::from_le_bytes(b[a..a + 8].try_into().expect("8"));
    if u32_at(I_VERSION) != INDEX_VERSION {
        return Err(corrupt(format!(
            "index version {} is not supported",
            u32_at(I_VERSION)
        )));
    }
    let end = b.len() - 4;
    if crc32c::crc32c(&b[..end]) != u32_at(end) {
        return Err(corrupt("index checksum does not match"));
    }
    let hash = HashKind::from_u8(u8::try_from(u32_at(I_HASH)).unwrap_or(0))
        .map_err(|e| corrupt(e.to_string()))?;
    let count = u64_at(I_COUNT);
    if (end - I_ENTRIES) as u64 != count.saturating_mul(ENTRY as u64) {
        return Err(corrupt(format!(
            "index of {count} entries has the wrong length"
        )));
    }
    let who = Identity {
        hash,
        chunk_size: u32_at(I_CHUNK),
        size: u64_at(I_SIZE),
        mtime_ns: u64_at(I_MTIME) as i64,
        ino: u64_at(I_INO),
        dev: u64_at(I_DEV),
    };
    let entries = b[I_ENTRIES..end]
        .chunks_exact(ENTRY)
        .map(|e| {
            (
                ChunkId::from_slice(&e[..ID_LEN]),
                u64::from_le_bytes(e[ID_LEN..].try_into().expect("8")),
            )
        })
        .collect();
    Ok((who, entries))
}

enum Medium {
    Store(Box<LocalStore>),
    Image {
        disk: ImageDisk,
        chunk_size: u64,
        index: HashMap<ChunkId, u64>,
    },
}

/// The disk bytes of an image medium.
enum ImageDisk {
    /// A raw image file or a block device.
    Raw(File),
    /// A qcow2 image's virtual disk.
    Qcow2(Box<Qcow2>),
}

impl ImageDisk {
    fn read_at(&self, buf: &mut [u8], off: u64, path: &Path) -> Result<()> {
        match self {
            ImageDisk::Raw(f) => f.read_exact_at(buf, off).map_err(|e| io(Op::Read, e, path)),
            ImageDisk::Qcow2(q) => q.read_at(buf, off),
        }
    }

    /// The disk's size: a raw file's length, a block device's size, a
    /// qcow2 image's virtual size.
    fn size(&self, path: &Path) -> Result<u64> {
        match self {
            ImageDisk::Raw(f) => {
                let m = f.metadata().map_err(|e| io(Op::Open, e, path))?;
                if m.file_type().is_file() {
                    Ok(m.len())
                } else {
                    // A block device: its size is where seeking to the end lands.
                    use std::io::Seek;
                    let mut f = f;
                    f.seek(std::io::SeekFrom::End(0))
                        .map_err(|e| io(Op::Open, e, path))
                }
            }
            ImageDisk::Qcow2(q) => Ok(q.size()),
        }
    }
}

/// What the lookaside media did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookasideStats {
    /// Chunks found and verified.
    pub hits: u64,
    pub bytes: u64,
    /// Chunks a medium had under the right name but that failed their
    /// check (damaged or stale media), and were fetched elsewhere.
    pub bad: u64,
}

/// The lookaside media of a session or view, in the order given.
pub struct Lookaside {
    media: Vec<(PathBuf, Medium)>,
    hits: AtomicU64,
    bytes: AtomicU64,
    bad: AtomicU64,
}

impl Lookaside {
    /// Open every medium. Media are only a cache: one that cannot be
    /// used (missing or unplugged, unreadable, a damaged `store.toml`, a
    /// folder with no resume set in it, an empty folder) is skipped with a
    /// warning that says why, and its chunks come from elsewhere. A folder
    /// without a `store.toml` of its own (a key's mount point) stands for
    /// the chunk-store folders up to two levels below it.
    pub fn open(
        paths: &[PathBuf],
        hash: HashKind,
        chunk_size: u32,
        index_dir: Option<&Path>,
    ) -> Result<Lookaside> {
        let mut media = Vec::new();
        for given in paths {
            let found = medium_paths(given);
            if found.first() != Some(given) {
                let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
                tracing::info!(
                    "lookaside {}: using the chunk stores in it: {}",
                    given.display(),
                    names.join(", ")
                );
            }
            for p in found {
                match open_medium(&p, hash, chunk_size, index_dir) {
                    Ok(m) => media.push((p, m)),
                    // A missing tool (qemu-nbd) is the host's to fix.
                    Err(Skip::Host(e)) => return Err(e),
                    Err(Skip::Medium(why)) => tracing::warn!(
                        "lookaside {}: {why}; the medium is skipped (its chunks come from the caches and the store)",
                        p.display()
                    ),
                }
            }
        }
        Ok(Lookaside {
            media,
            hits: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            bad: AtomicU64::new(0),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.media.is_empty()
    }

    /// Chunk `id` (of decoded length `len`) from the first medium that
    /// has it whole and correct, or `None`.
    pub fn find(
        &self,
        codec: &ChunkCodec,
        id: &ChunkId,
        key: Option<&Key>,
        len: usize,
    ) -> Option<Vec<u8>> {
        for (path, m) in &self.media {
            let got = match m {
                Medium::Store(s) => match s.get(id) {
                    Ok(raw) => codec.open(id, key, &raw).ok(),
                    Err(e) if e.kind() == roamdisk_blockdev::ErrorKind::NotFound => continue,
                    // There but unreadable (a damaged pack): counted bad.
                    Err(_) => None,
                },
                Medium::Image {
                    disk,
                    chunk_size,
                    index,
                } => {
                    let Some(&n) = index.get(id) else { continue };
                    if key.is_some() {
                        continue;
                    }
                    let mut buf = vec![0u8; len];
                    match disk.read_at(&mut buf, n * chunk_size, path) {
                        Ok(()) if codec.hash.hash(&buf) == *id => Some(buf),
                        _ => None,
                    }
                }
            };
            match got {
                Some(d) if d.len() == len => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    self.bytes.fetch_add(len as u64, Ordering::Relaxed);
                    return Some(d);
                }
                _ => {
                    self.bad.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        "lookaside {}: chunk {} is damaged or stale there; skipped",
                        path.display(),
                        id.short()
                    );
                }
            }
        }
        None
    }

    pub fn stats(&self) -> LookasideStats {
        LookasideStats {
            hits: self.hits.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            bad: self.bad.load(Ordering::Relaxed),
        }
    }
}

/// Why a medium is not used.
enum Skip {
    /// The medium cannot serve (said to the user as a warning).
    Medium(String),
    /// This host lacks something every such medium needs.
    Host(roamdisk_blockdev::Error),
}

/// The media a path given by the user stands for: itself, or for a folder
/// with no `store.toml` (a key's mount point, the folder above a resume
/// set), the chunk-store folders up to two levels below it.
fn medium_paths(given: &Path) -> Vec<PathBuf> {
    if !given.is_dir() || given.join("store.toml").exists() {
        return vec![given.to_path_buf()];
    }
    let mut found = Vec::new();
    let mut level = vec![given.to_path_buf()];
    for _ in 0..2 {
        let mut next = Vec::new();
        for d in &level {
            let Ok(rd) = std::fs::read_dir(d) else {
                continue;
            };
            let mut subs: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            subs.sort();
            for sub in subs {
                if sub.join("store.toml").exists() {
                    found.push(sub);
                } else {
                    next.push(sub);
                }
            }
        }
        level = next;
    }
    if found.is_empty() {
        // Said as a warning when it is opened.
        return vec![given.to_path_buf()];
    }
    found
}

/// One medium, opened.
fn open_medium(
    p: &Path,
    hash: HashKind,
    chunk_size: u32,
    index_dir: Option<&Path>,
) -> std::result::Result<Medium, Skip> {
    if p.join("store.toml").exists() {
        return LocalStore::open(p, None)
            .map(|s| Medium::Store(Box::new(s)))
            .map_err(|e| Skip::Medium(format!("its chunk store cannot be opened ({e})")));
    }
    let meta = std::fs::metadata(p).map_err(|e| {
        Skip::Medium(format!(
            "cannot be opened ({e}): give a chunk-store folder (roamdisk suspend --to-media), the folder above one, an image file (raw or qcow2) or a block device"
        ))
    })?;
    if meta.is_dir() {
        return Err(Skip::Medium(
            "is a folder with no chunk store (store.toml) in it or up to two levels below".into(),
        ));
    }
    use std::os::unix::fs::FileTypeExt;
    if !meta.is_file() && !meta.file_type().is_block_device() {
        return Err(Skip::Medium(
            "is neither an image file nor a block device".into(),
        ));
    }
    let file = File::open(p).map_err(|e| Skip::Medium(format!("cannot be opened ({e})")))?;
    let disk = if qemu_nbd::is_qcow2(&file) {
        match Qcow2::open(p) {
            Ok(q) => ImageDisk::Qcow2(Box::new(q)),
            Err(StartError::Tool(e)) => return Err(Skip::Host(e)),
            Err(StartError::Image(why)) => {
                return Err(Skip::Medium(format!(
                    "qemu-nbd cannot read this qcow2 image ({why})"
                )))
            }
        }
    } else {
        ImageDisk::Raw(
            file.try_clone()
                .map_err(|e| Skip::Medium(format!("cannot be opened ({e})")))?,
        )
    };
    let index = image_index(p, &file, &disk, hash, chunk_size, index_dir)
        .map_err(|e| Skip::Medium(format!("cannot be indexed ({e})")))?;
    Ok(Medium::Image {
        disk,
        chunk_size: chunk_size as u64,
        index,
    })
}

/// Open `media` for reading the chunks of a version made of
/// `chunk_size`-byte chunks named by `hash` (`None` if there are none);
/// image media's chunk indexes are kept in `index_dir` (`None`: they are
/// hashed at every open).
pub fn open_media(
    hash: HashKind,
    chunk_size: u32,
    media: &[PathBuf],
    index_dir: Option<&Path>,
) -> Result<Option<std::sync::Arc<Lookaside>>> {
    if media.is_empty() {
        return Ok(None);
    }
    let la = Lookaside::open(media, hash, chunk_size, index_dir)?;
    Ok(Some(std::sync::Arc::new(la)))
}

/// Lookaside media as a source of a fetch chain, opening what they hold
/// with the store's codec.
pub struct MediaSource {
    pub media: std::sync::Arc<Lookaside>,
    pub codec: ChunkCodec,
}

impl ChunkSource for MediaSource {
    fn kind(&self) -> Source {
        Source::Lookaside
    }
    fn fetch(&self, wanted: &[Wanted]) -> Vec<Result<Option<Vec<u8>>>> {
        wanted
            .iter()
            .map(|w| Ok(self.media.find(&self.codec, &w.id, w.key.as_ref(), w.len)))
            .collect()
    }
}

/// Object `id` as stored (a version package, say), from the first
/// chunk-store folder among `media` that holds it whole and correct.
pub fn find_object(media: &[PathBuf], codec: &ChunkCodec, id: &ChunkId) -> Option<Vec<u8>> {
    media
        .iter()
        .flat_map(|p| medium_paths(p))
        .filter(|p| p.join("store.toml").exists())
        .filter_map(|p| LocalStore::open(&p, None).ok()?.get(id).ok())
        .find(|raw| codec.verify(id, raw).is_ok())
}

/// Lookaside media as a layer option: paths separated by `+`.
pub fn parse_media(v: Option<&str>) -> Vec<PathBuf> {
    v.map(|s| {
        s.split('+')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect()
    })
    .unwrap_or_default()
}

/// The index of an image medium: cached by the identity of its `file`
/// (for a qcow2 image, the qcow2 file's), else made by hashing `disk` once.
fn image_index(
    path: &Path,
    file: &File,
    disk: &ImageDisk,
    hash: HashKind,
    chunk_size: u32,
    index_dir: Option<&Path>,
) -> Result<HashMap<ChunkId, u64>> {
    let m = file.metadata().map_err(|e| io(Op::Open, e, path))?;
    let size = disk.size(path)?;
    let who = Identity {
        hash,
        chunk_size,
        size: if m.file_type().is_file() {
            m.len()
        } else {
            size
        },
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        ino: m.ino(),
        dev: m.dev(),
    };
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let cache_file = index_dir.map(|d| {
        let tag = blake3::hash(canon.to_string_lossy().as_bytes()).to_hex();
        d.join(format!("{}-{}.idx", &tag[..24], chunk_size))
    });
    if let Some(cf) = &cache_file {
        if let Ok(b) = std::fs::read(cf) {
            match decode_index(&b) {
                Ok((w, entries)) if w == who => {
                    return Ok(entries.into_iter().collect());
                }
                Ok(_) => {
                    tracing::info!("lookaside {}: changed since it was indexed", path.display())
                }
                Err(e) => tracing::info!("lookaside index {}: {e}; indexing again", cf.display()),
            }
        }
    }
    tracing::info!(
        "lookaside {}: indexing {} bytes in {} byte chunks",
        path.display(),
        size,
        chunk_size
    );
    let (entries, unreadable) = hash_chunks(path, disk, size, hash, chunk_size);
    if unreadable > 0 {
        // Left out, and the index is not kept: the next open tries again.
        tracing::warn!(
            "lookaside {}: {unreadable} chunks could not be read (a damaged medium?); they are left out",
            path.display()
        );
    } else if let Some(cf) = &cache_file {
        let wrote = cf
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| durable::write_atomically(cf, &encode_index(&who, &entries)));
        if let Err(e) = wrote {
            tracing::warn!("lookaside index {} not saved: {e}", cf.display());
        }
    }
    Ok(entries.into_iter().collect())
}

/// Hash `disk` in chunks: `(id, chunk number)` of every chunk that is not
/// all zero, and how many chunks could not be read. A qcow2 image's
/// unallocated and zero clusters are skipped without reading them.
fn hash_chunks(
    path: &Path,
    disk: &ImageDisk,
    size: u64,
    hash: HashKind,
    chunk_size: u32,
) -> (Vec<(ChunkId, u64)>, u64) {
    let cs = chunk_size as u64;
    let mut entries = Vec::new();
    let mut unreadable = 0u64;
    let mut buf = vec![0u8; chunk_size as usize];
    // What block status said from here on: zero (or data) up to `until`.
    let (mut zero, mut until) = (false, 0u64);
    let mut n = 0u64;
    while n * cs < size {
        let off = n * cs;
        let len = (size - off).min(cs);
        if let ImageDisk::Qcow2(q) = disk {
            // Ask again once past what the last answer covered (on a
            // failure, read everything).
            while off >= until {
                (zero, until) = q.extent_at(off, size - off).unwrap_or((false, size));
                if until <= off {
                    (zero, until) = (false, size);
                }
            }
            if zero && off + len <= until {
                n += 1;
                continue;
            }
        }
        let len = len as usize;
        match disk.read_at(&mut buf[..len], off, path) {
            Ok(()) if !roamdisk_chunkstore::hash::is_zero(&buf[..len]) => {
                entries.push((hash.hash(&buf[..len]), n));
            }
            Ok(()) => {}
            Err(e) => {
                unreadable += 1;
                tracing::debug!("lookaside {}: chunk {n}: {e}", path.display());
            }
        }
        n += 1;
    }
    (entries, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Identity {
        Identity {
            hash: HashKind::Blake3,
            chunk_size: 65536,
            size: 1 << 20,
            mtime_ns: 1_700_000_000_123_456_789,
            ino: 42,
            dev: 7,
        }
    }

    #[test]
    fn index_round_trips_and_damage_is_refused() {
        let e = vec![(ChunkId([3; 32]), 5), (ChunkId([4; 32]), 9)];
        let b = encode_index(&who(), &e);
        assert_eq!(decode_index(&b).unwrap(), (who(), e));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(decode_index(&d).is_err(), "byte {i}");
        }
        for n in 0..b.len() {
            assert!(decode_index(&b[..n]).is_err(), "length {n}");
        }
    }

    #[test]
    fn an_image_medium_serves_verified_chunks_and_skips_stale_ones() {
        let t = tempfile::tempdir().unwrap();
        let cs = 4096usize;
        let img: Vec<u8> = (0..8 * cs).map(|i| (i * 7 / 13) as u8).collect();
        let p = t.path().join("disk.img");
        std::fs::write(&p, &img).unwrap();
        let codec = ChunkCodec {
            hash: HashKind::Blake3,
            zstd_level: None,
        };
        let idx = t.path().join("idx");
        let id2 = HashKind::Blake3.hash(&img[2 * cs..3 * cs]);
        let la = Lookaside::open(
            std::slice::from_ref(&p),
            HashKind::Blake3,
            cs as u32,
            Some(&idx),
        )
        .unwrap();
        assert_eq!(
            la.find(&codec, &id2, None, cs).unwrap(),
            &img[2 * cs..3 * cs]
        );
        assert!(la.find(&codec, &ChunkId([9; 32]), None, cs).is_none());
        // The index was cached; change the file in place (same size): the
        // stale entry is detected by hash.
        assert_eq!(std::fs::read_dir(&idx).unwrap().count(), 1);
        let mut changed = img.clone();
        changed[2 * cs] ^= 1;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(&changed[2 * cs..2 * cs + 1], 2 * cs as u64)
            .unwrap();
        assert!(la.find(&codec, &id2, None, cs).is_none());
        assert_eq!(
            la.stats(),
            LookasideStats {
                hits: 1,
                bytes: cs as u64,
                bad: 1
            }
        );
        // A new open sees the changed mtime and indexes again.
        let la2 = Lookaside::open(&[p], HashKind::Blake3, cs as u32, Some(&idx)).unwrap();
        assert!(la2.find(&codec, &id2, None, cs).is_none());
    }
}
