//! Pack indexes: read from the tail of a pack (the index and the trailer
//! whose checksum covers it), and kept in a local folder between runs
//! (packs never change), so a process that opens a bucket again fetches
//! only the indexes of packs new to it. The cache is best effort: a file
//! that cannot be written is fetched again next time, and one read back is
//! checked like a fetched one.

use std::path::PathBuf;

use roamdisk_blockdev::durable;
use roamdisk_blockdev::Result;

use super::location::S3Location;
use crate::error::corrupt;
use crate::hash::HashKind;
use crate::store::pack::{self, Entry};

/// The entries of a pack of `size` bytes from its index followed by its
/// trailer (`tail`). The header is not needed: the trailer's checksum
/// covers the header a store using `hash` writes.
pub(super) fn parse_index_tail(hash: HashKind, size: u64, tail: &[u8]) -> Result<Vec<Entry>> {
    let t_len = pack::TRAILER_SIZE;
    if tail.len() < t_len {
        return Err(corrupt("a pack index is truncated"));
    }
    let (index, t) = tail.split_at(tail.len() - t_len);
    let trailer = pack::Trailer::parse(t, size)?;
    trailer.parse_index(&pack::header(hash), index)
}

/// `$ROAMDISK_S3_INDEX_CACHE` (`off`: none), else
/// `$XDG_CACHE_HOME/roamdisk/s3-index/KEY` (else under `~/.cache`), KEY
/// naming the endpoint, bucket and prefix.
fn cache_dir(endpoint: &str, loc: &S3Location) -> Option<PathBuf> {
    let base = match std::env::var("ROAMDISK_S3_INDEX_CACHE") {
        Ok(s) if s == "off" => return None,
        Ok(s) if !s.is_empty() => PathBuf::from(s),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("roamdisk/s3-index"),
    };
    let id = blake3::hash(format!("{endpoint}\n{}\n{}", loc.bucket, loc.prefix).as_bytes());
    Some(base.join(&id.to_hex()[..32]))
}

/// The folder of cached pack indexes of one bucket and prefix (none:
/// no cache). A file is the pack's size (8 bytes, little-endian) then its
/// index and trailer, named like the pack.
pub(super) struct IndexCache {
    dir: Option<PathBuf>,
}

impl IndexCache {
    /// The cache of the bucket and prefix of `loc` at `endpoint`
    /// ([`cache_dir`]).
    pub(super) fn for_bucket(endpoint: &str, loc: &S3Location) -> IndexCache {
        IndexCache {
            dir: cache_dir(endpoint, loc),
        }
    }

    /// The entries of pack `name`, if its index is cached and intact (its
    /// checksum is verified as when fetched).
    pub(super) fn get(&self, hash: HashKind, name: &str) -> Option<Vec<Entry>> {
        let b = std::fs::read(self.dir.as_ref()?.join(name)).ok()?;
        let size = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        parse_index_tail(hash, size, &b[8..]).ok()
    }

    /// Keep the index and trailer (`tail`) of pack `name` of `size` bytes.
    /// Written through a temporary file of this process's own (several
    /// processes may cache one pack at once), not synced: a torn file
    /// fails its checksum and is fetched again.
    pub(super) fn put(&self, name: &str, size: u64, tail: &[u8]) {
        let Some(dir) = &self.dir else {
            return;
        };
        // Best effort: a cache that cannot be written is fetched again.
        let _ = std::fs::create_dir_all(dir).and_then(|()| {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let mut b = size.to_le_bytes().to_vec();
            b.extend_from_slice(tail);
            durable::write_unsynced_via(&dir.join(name), &tmp, &b)
        });
    }

    /// Forget pack `name` (a gc removed it).
    pub(super) fn remove(&self, name: &str) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_file(d.join(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    #[test]
    fn a_pack_index_is_read_from_its_tail_alone_and_checked() {
        let hash = HashKind::Blake3;
        let h = pack::header(hash);
        let mut b = h.to_vec();
        let mut entries = Vec::new();
        for k in 0..3u8 {
            let codec = StoreConfig::default().codec();
            let s = codec.seal(&[k; 100], false);
            entries.push(Entry {
                id: s.id,
                offset: b.len() as u64,
                len: s.object.len() as u32,
            });
            b.extend_from_slice(&s.object);
        }
        let at = b.len();
        b.extend(pack::encode_tail(&h, &mut entries, at as u64));
        let size = b.len() as u64;
        let got = parse_index_tail(hash, size, &b[at..]).unwrap();
        assert_eq!(got, entries);
        // A flipped index byte, a wrong size or another hash: refused.
        let mut bad = b[at..].to_vec();
        bad[5] ^= 1;
        assert!(parse_index_tail(hash, size, &bad).is_err());
        assert!(parse_index_tail(hash, size + 1, &b[at..]).is_err());
        assert!(parse_index_tail(HashKind::Sha256, size, &b[at..]).is_err());
        assert!(parse_index_tail(hash, size, &b[b.len() - 10..]).is_err());
    }
}
