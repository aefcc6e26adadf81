//! Creating images and opening them from files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::{BlockDev, Error, ErrorKind, Op, Result, WriteFlags};

use crate::checksum::ChecksumKind;
use crate::format::{Cipher, DataSuper, Geometry, KeySource, MetaHeader};
use crate::image::{AlignedBuf, Lbs, LbsOptions};
use crate::storage::FileLog;
use roamdisk_crypto as crypto;

/// The two files of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub data: PathBuf,
    pub meta: PathBuf,
}

impl Paths {
    /// `X.lbsd` / `X.lbsm` from `X`, `X.lbsd` or `X.lbsm`; the metadata in
    /// `meta_dir` when given.
    pub fn resolve(path: &Path, meta_dir: Option<&Path>) -> Paths {
        let s = path.to_string_lossy();
        let stem = s
            .strip_suffix(".lbsd")
            .or_else(|| s.strip_suffix(".lbsm"))
            .unwrap_or(&s)
            .to_string();
        let data = PathBuf::from(format!("{stem}.lbsd"));
        let mut meta = PathBuf::from(format!("{stem}.lbsm"));
        if let Some(d) = meta_dir {
            meta = d.join(meta.file_name().expect("a file name"));
        }
        Paths { data, meta }
    }
}

/// How a new image is encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encryption {
    None,
    /// Use the key in this file, generating it (mode 0600) if it does not exist.
    KeyFile(PathBuf),
    /// Derive the key from a passphrase with Argon2id.
    Passphrase(Vec<u8>),
    /// Use this key as is and record it as a key-file key (for callers that
    /// manage keys themselves, and tests).
    RawKey([u8; 64]),
}

/// Parameters of a new image.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Logical size in bytes (rounded up to the block size).
    pub size: u64,
    /// 1024 or 4096.
    pub block_size: u32,
    /// Cluster size in bytes (power of two, at least 16 blocks).
    pub cluster_size: u32,
    /// Physical space as a percentage of the logical size (the seed: 112).
    pub overprovision_pct: u32,
    pub checksum: ChecksumKind,
    pub encryption: Encryption,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            size: 0,
            block_size: 4096,
            cluster_size: 256 * 1024,
            overprovision_pct: 112,
            checksum: ChecksumKind::Crc32c,
            encryption: Encryption::None,
        }
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, Op::Open, "lbs", msg)
}

/// Compute the header and data superblock of a new image; returns them
/// and the key (for encrypted images).
pub fn plan(o: &CreateOptions) -> Result<(MetaHeader, DataSuper, Option<[u8; 64]>)> {
    if !crate::format::BLOCK_SIZES.contains(&o.block_size) {
        return Err(bad("block size must be 1K or 4K"));
    }
    if o.size == 0 {
        return Err(bad("size must be more than 0 (e.g. --size 10G)"));
    }
    if o.overprovision_pct < 101 {
        return Err(bad(
            "overprovisioning must be more than 100% (the seed uses 112%)",
        ));
    }
    let bs = o.block_size as u64;
    let lblocks = o.size.div_ceil(bs);
    let bpc = (o.cluster_size / o.block_size) as u64;
    let clusters = (lblocks * o.overprovision_pct as u64).div_ceil(100 * bpc.max(1)) + 2;
    let geometry = Geometry {
        block_size: o.block_size,
        cluster_size: o.cluster_size,
        clusters: clusters.max(4),
    };
    let mut uuid = [0u8; 16];
    crypto::random(&mut uuid);
    let mut salt = [0u8; 32];
    let (cipher, key_source, argon, key) = match &o.encryption {
        Encryption::None => (Cipher::None, KeySource::None, (0, 0, 0), None),
        Encryption::KeyFile(p) => {
            let key = if p.exists() {
                crypto::read_key_file(p).map_err(|e| bad(e.to_string()))?
            } else {
                let k = crypto::new_key();
                crypto::write_key_file(p, &k).map_err(|e| {
                    Error::io(Op::Open, "lbs", e)
                        .path(p)
                        .msg("cannot write the key file")
                })?;
                k
            };
            (Cipher::Aes256Xts, KeySource::KeyFile, (0, 0, 0), Some(key))
        }
        Encryption::RawKey(k) => (Cipher::Aes256Xts, KeySource::KeyFile, (0, 0, 0), Some(*k)),
        Encryption::Passphrase(pw) => {
            if pw.is_empty() {
                return Err(bad("the passphrase is empty"));
            }
            crypto::random(&mut salt);
            let key = crypto::derive_key(pw, &salt, crypto::ARGON_DEFAULT)
                .map_err(|e| bad(e.to_string()))?;
            (
                Cipher::Aes256Xts,
                KeySource::Passphrase,
                crypto::ARGON_DEFAULT,
                Some(key),
            )
        }
    };
    let header = MetaHeader {
        cipher,
        key_source,
        argon,
        salt,
        key_check: key.as_ref().map(crypto::key_check).unwrap_or([0; 16]),
        ..MetaHeader::plain(uuid, lblocks * bs, geometry, o.checksum)
    };
    // Round-trip through the parser: a header we write must be one we read.
    MetaHeader::parse(&header.encode()).map_err(|e| bad(format!("invalid geometry: {e}")))?;
    let ds = DataSuper {
        geometry,
        encrypted: key.is_some(),
        uuid,
    };
    Ok((header, ds, key))
}

/// Create the two files of a new image. Refuses to overwrite either.
pub fn create(paths: &Paths, o: &CreateOptions) -> Result<MetaHeader> {
    for p in [&paths.data, &paths.meta] {
        if p.exists() {
            return Err(bad(format!(
                "{} already exists; remove it or choose another name",
                p.display()
            )));
        }
    }
    let (header, ds, _key) = plan(o)?;
    let len = header.geometry.data_file_len();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&paths.data)
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.data))?;
    f.set_len(len)
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.data))?;
    // Preallocate so the image never fragments or runs out of host space.
    if let Err(e) = rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len) {
        if e == rustix::io::Errno::NOSPC {
            let _ = std::fs::remove_file(&paths.data);
            return Err(Error::new(
                ErrorKind::NoSpace,
                Op::Open,
                "lbs",
                format!("not enough space for the {len}-byte data file"),
            )
            .path(&paths.data));
        }
        tracing::warn!(error = %e, "cannot preallocate the data file; it stays sparse");
    }
    let sb = ds.encode();
    let mut a = AlignedBuf::new(sb.len());
    a.as_mut_slice().copy_from_slice(&sb);
    use std::os::unix::fs::FileExt;
    f.write_all_at(a.as_slice(), 0)
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.data))?;
    f.sync_all()
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.data))?;
    FileLog::create(&paths.meta, &header.encode())
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.meta))?;
    Ok(header)
}

/// How to get the key of an encrypted image.
#[derive(Debug, Clone, Default)]
pub struct KeyOptions {
    pub key_file: Option<PathBuf>,
    /// File holding the passphrase (a trailing newline is ignored).
    pub passphrase_file: Option<PathBuf>,
}

/// The passphrase in file `p`, without its trailing line ends.
pub fn read_passphrase(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut pw = std::fs::read(p)?;
    while pw.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        pw.pop();
    }
    Ok(pw)
}

/// Resolve the key for `header`.
pub fn resolve_key(header: &MetaHeader, k: &KeyOptions) -> Result<Option<[u8; 64]>> {
    match header.key_source {
        KeySource::None => Ok(None),
        KeySource::KeyFile => {
            let p = k
                .key_file
                .as_ref()
                .ok_or_else(|| bad("the image is encrypted with a key file: give key-file=PATH"))?;
            Ok(Some(
                crypto::read_key_file(p).map_err(|e| bad(e.to_string()))?,
            ))
        }
        KeySource::Passphrase => {
            let p = k.passphrase_file.as_ref().ok_or_else(|| {
                bad("the image is protected by a passphrase: give passphrase-file=PATH")
            })?;
            let pw = read_passphrase(p).map_err(|e| Error::io(Op::Open, "lbs", e).path(p))?;
            Ok(Some(
                crypto::derive_key(&pw, &header.salt, header.argon)
                    .map_err(|e| bad(e.to_string()))?,
            ))
        }
    }
}

/// Read just the metadata header of an image.
pub fn read_header(paths: &Paths) -> Result<MetaHeader> {
    let mut b = vec![0u8; crate::format::META_HEADER_SIZE];
    use std::io::Read;
    let mut f = std::fs::File::open(&paths.meta).map_err(|e| {
        Error::io(Op::Open, "lbs", e)
            .path(&paths.meta)
            .msg("cannot open the metadata file (.lbsm); is meta-dir right?")
    })?;
    f.read_exact(&mut b).map_err(|_| {
        Error::new(
            ErrorKind::Corrupt,
            Op::Open,
            "lbs",
            "metadata file is shorter than its header",
        )
        .path(&paths.meta)
    })?;
    MetaHeader::parse(&b).map_err(|e| {
        Error::new(ErrorKind::Corrupt, Op::Open, "lbs", e.to_string()).path(&paths.meta)
    })
}

/// Open an image from its files (data with O_DIRECT where possible).
/// Returns the image and whether O_DIRECT is in effect.
pub fn open_files(paths: &Paths, keys: &KeyOptions, opts: LbsOptions) -> Result<(Lbs, bool)> {
    let header = read_header(paths)?;
    let key = resolve_key(&header, keys)?;
    let raw = RawDev::open_direct(&paths.data, opts.read_only)?;
    let direct = raw.is_direct();
    let data: Arc<dyn BlockDev> = Arc::new(raw);
    let log = FileLog::open(&paths.meta, !opts.read_only)
        .map_err(|e| Error::io(Op::Open, "lbs", e).path(&paths.meta))?;
    let lbs = Lbs::open(data, Box::new(log), key, opts)?;
    Ok((lbs, direct))
}

/// Write helper for import: whole-buffer write through the image.
pub fn write_all(l: &Lbs, buf: &[u8], off: u64) -> Result<()> {
    l.write_at(buf, off, WriteFlags::default())
}
