//! A version package: everything needed to reinstantiate one version of an
//! image (the seed's "VMI package": index + VM configuration file, plus an
//! optional memory image, itself chunked), stored in the chunk store under
//! the hash of its bytes before any catalog names it. Byte layout:
//! `docs/formats/cas-version.md`. Pure encoding and parsing (a fuzz target).
//!
//! With encryption the body (which holds the index and so every chunk's
//! key) is sealed with the user's key (AES-256-GCM); the list of objects
//! the version references stays readable so that gc works without keys.

use crate::bytes::{Reader, Writer};
use crate::chunk::Key;
use crate::error::{bad_arg, corrupt, err};
use crate::hash::{ChunkId, HashKind};
use crate::index::Index;
use crate::memimage::MemoryPages;
use roamdisk_blockdev::{ErrorKind, Op, Result};

pub const MAGIC: [u8; 8] = *b"RDCASVER";
/// The format written for a version without a working set (read by every
/// build); one with a working set is written as [`VERSION_WORKING_SET`].
pub const VERSION: u32 = 1;
pub const VERSION_WORKING_SET: u32 = 2;
/// A version whose memory is a page image (`memimage.rs`): the body ends
/// with a working set (count may be 0) and the image.
pub const VERSION_PAGES: u32 = 3;
pub const FLAG_ENCRYPTED: u32 = 1;

pub const HEADER_SIZE: usize = 64;
const KEY_ID_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Largest VM configuration file kept in a package.
pub const MAX_CONFIG: usize = 16 << 20;
const MAX_DESCRIPTION: usize = 4096;

/// A memory image, chunked like the disk (chunk size of the index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    pub size: u64,
    pub ids: Vec<ChunkId>,
    /// Convergent keys (encrypted versions only).
    pub keys: Vec<Key>,
}

/// One version, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Commit time, nanoseconds since the Unix epoch (UTC).
    pub created: i64,
    pub parent: Option<ChunkId>,
    pub description: String,
    /// The VM configuration file, verbatim (may be empty).
    pub config: Vec<u8>,
    pub memory: Memory,
    pub index: Index,
    /// The recorded working set: disk chunk numbers in the order a session
    /// first read them (a boot's reads first), unique. Resume prefetches
    /// them in this order. Empty: none recorded.
    pub working_set: Vec<u32>,
    /// The running VM's memory as pages (a live suspend); `memory` is then
    /// empty.
    pub pages: Option<MemoryPages>,
}

/// The readable header of a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub encrypted: bool,
    pub hash: HashKind,
    pub chunk_size: u32,
    pub disk_size: u64,
    /// Bytes of the disk held in non-zero chunks.
    pub data_bytes: u64,
    refs_len: u64,
    body_len: u64,
}

/// The working-set section of a format-2 body: a count and that many
/// distinct chunk numbers, each below `records`.
pub fn read_working_set(r: &mut Reader<'_>, records: usize) -> Result<Vec<u32>> {
    read_working_set_of(r, records, false)
}

/// [`read_working_set`], a count of 0 allowed with `may_be_empty` (the
/// format-3 body always has the section).
fn read_working_set_of(r: &mut Reader<'_>, records: usize, may_be_empty: bool) -> Result<Vec<u32>> {
    let n = r.u32("working set count")? as usize;
    if (n == 0 && !may_be_empty) || n > records || n.saturating_mul(4) > r.remaining() {
        return Err(corrupt(format!(
            "working set of {n} chunks for a {records}-chunk disk (truncated or damaged)"
        )));
    }
    let mut seen = vec![false; records];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = r.u32("working set chunk")?;
        match seen.get_mut(c as usize) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(corrupt(format!(
                    "working set names chunk {c} twice or beyond the {records}-chunk disk"
                )))
            }
        }
        out.push(c);
    }
    Ok(out)
}

/// The identifier of a user key (shown in errors, stored in packages).
pub fn key_id(key: &Key) -> [u8; KEY_ID_LEN] {
    let d = blake3::derive_key("roamdisk-cas user key id v1", key);
    let mut out = [0u8; KEY_ID_LEN];
    out.copy_from_slice(&d[..KEY_ID_LEN]);
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Header {
    pub fn parse(b: &[u8]) -> Result<Header> {
        let mut r = Reader::new(b, "version package");
        r.frame_versions(&MAGIC, VERSION..=VERSION_PAGES)?;
        let flags = r.u32("flags")?;
        let hash = HashKind::from_u8(r.u8("hash")?)?;
        let reserved = r.bytes(3, "reserved")?;
        let chunk_size = r.u32("chunk size")?;
        let disk_size = r.u64("disk size")?;
        let data_bytes = r.u64("data bytes")?;
        let refs_len = r.u64("refs length")?;
        let body_len = r.u64("body length")?;
        let reserved2 = r.u32("reserved")?;
        r.header_crc()?;
        if flags & !FLAG_ENCRYPTED != 0 || reserved != [0, 0, 0] || reserved2 != 0 {
            return Err(corrupt(format!(
                "version package has unknown flags {flags:#x}"
            )));
        }
        let encrypted = flags & FLAG_ENCRYPTED != 0;
        if !encrypted && refs_len != 0 {
            return Err(corrupt("plain version package with a refs section"));
        }
        if Some(b.len() as u64)
            != (HEADER_SIZE as u64)
                .checked_add(refs_len)
                .and_then(|x| x.checked_add(body_len))
        {
            return Err(corrupt(format!(
                "version package is {} bytes but its header says {} (truncated)",
                b.len(),
                HEADER_SIZE as u64 + refs_len.saturating_add(body_len)
            )));
        }
        Ok(Header {
            encrypted,
            hash,
            chunk_size,
            disk_size,
            data_bytes,
            refs_len,
            body_len,
        })
    }
}

impl Version {
    /// Every object the version references (data and memory chunks).
    pub fn references(&self) -> Vec<ChunkId> {
        let mut v: Vec<ChunkId> = self
            .index
            .ids
            .iter()
            .chain(self.memory.ids.iter())
            .chain(self.pages.iter().flat_map(|p| p.ids()))
            .filter(|id| !id.is_zero())
            .copied()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn encode_body(&self, idx: &[u8]) -> Result<Vec<u8>> {
        let mut w = Writer::new();
        w.i64(self.created)
            .id(&self.parent.unwrap_or(ChunkId::ZERO))
            .str16(&self.description)
            .u32(self.config.len() as u32)
            .bytes(&self.config)
            .u64(self.memory.size)
            .u32(self.memory.ids.len() as u32);
        for (i, id) in self.memory.ids.iter().enumerate() {
            w.id(id);
            if self.index.encrypted() {
                w.bytes(self.memory.keys.get(i).unwrap_or(&[0; 32]));
            }
        }
        w.u64(idx.len() as u64).bytes(idx);
        if !self.working_set.is_empty() || self.pages.is_some() {
            w.u32(self.working_set.len() as u32);
            for &n in &self.working_set {
                w.u32(n);
            }
        }
        if let Some(p) = &self.pages {
            if p.blocks
                .iter()
                .any(|b| b.index.encrypted() != self.index.encrypted())
            {
                return Err(bad_arg("a memory image encrypted unlike its disk"));
            }
            let b = p.encode()?;
            w.u32(b.len() as u32).bytes(&b);
        }
        Ok(w.buf)
    }

    /// The package format this version is written in: the oldest that
    /// holds it, so older builds read what they can.
    fn format(&self) -> u32 {
        if self.pages.is_some() {
            VERSION_PAGES
        } else if self.working_set.is_empty() {
            VERSION
        } else {
            VERSION_WORKING_SET
        }
    }

    /// Encode the package. `user_key` is required exactly when the index
    /// carries chunk keys (an encrypted image).
    pub fn encode(&self, user_key: Option<&Key>) -> Result<Vec<u8>> {
        self.encode_with_index(&self.index.encode(Some(9)), user_key)
    }

    /// Encode with the index already encoded (`Index::encode`), e.g. to
    /// know its size without compressing it twice.
    pub fn encode_with_index(&self, idx: &[u8], user_key: Option<&Key>) -> Result<Vec<u8>> {
        if self.config.len() > MAX_CONFIG {
            return Err(bad_arg(format!(
                "the VM configuration file is {} bytes; at most {MAX_CONFIG} are kept",
                self.config.len()
            )));
        }
        if self.description.len() > MAX_DESCRIPTION {
            return Err(bad_arg(format!(
                "the description is longer than {MAX_DESCRIPTION} bytes"
            )));
        }
        let encrypted = self.index.encrypted();
        if encrypted != user_key.is_some() {
            return Err(bad_arg(if encrypted {
                "an encrypted version needs the user's key (--key-file)"
            } else {
                "a user key was given for a version that is not encrypted"
            }));
        }
        let body = self.encode_body(idx)?;
        let refs = if encrypted {
            let mut w = Writer::new();
            let r = self.references();
            w.u64(r.len() as u64);
            for id in &r {
                w.id(id);
            }
            zstd::bulk::compress(&w.buf, 3).expect("zstd")
        } else {
            Vec::new()
        };
        let mut h = Writer::new();
        if let Some(&n) = self
            .working_set
            .iter()
            .find(|&&n| n as usize >= self.index.records())
        {
            return Err(bad_arg(format!(
                "working set names chunk {n} of a {}-chunk disk",
                self.index.records()
            )));
        }
        h.bytes(&MAGIC)
            .u32(self.format())
            .u32(if encrypted { FLAG_ENCRYPTED } else { 0 })
            .u8(self.index.hash as u8)
            .zeros(3)
            .u32(self.index.chunk_size)
            .u64(self.index.disk_size)
            .u64(self.index.data_bytes());
        let body_len = match user_key {
            Some(_) => KEY_ID_LEN + NONCE_LEN + body.len() + TAG_LEN,
            None => body.len(),
        };
        h.u64(refs.len() as u64).u64(body_len as u64).u32(0).crc();
        let Some(key) = user_key else {
            let mut out = h.buf;
            out.extend_from_slice(&body);
            return Ok(out);
        };
        let mut nonce = [0u8; NONCE_LEN];
        crate::secret::fill_random(&mut nonce, "a nonce")?;
        let mut aad = h.buf.clone();
        aad.extend_from_slice(&refs);
        let mut tag = [0u8; TAG_LEN];
        let ct = roamdisk_crypto::aes256_gcm_seal(key, &nonce, &aad, &body, &mut tag)
            .map_err(|e| err(ErrorKind::Io, Op::Write, e.to_string()))?;
        let mut out = h.buf;
        out.extend_from_slice(&refs);
        out.extend_from_slice(&key_id(key));
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Decode a package (already verified against its name by the caller).
    pub fn decode(b: &[u8], user_key: Option<&Key>) -> Result<Version> {
        let h = Header::parse(b)?;
        let body_at = HEADER_SIZE + h.refs_len as usize;
        let sealed = &b[body_at..];
        let body;
        let plain: &[u8] = if h.encrypted {
            let key = user_key.ok_or_else(|| {
                err(
                    ErrorKind::PermissionDenied,
                    Op::Read,
                    "this version is encrypted: give the user's key with --key-file",
                )
            })?;
            if sealed.len() < KEY_ID_LEN + NONCE_LEN + TAG_LEN {
                return Err(corrupt("encrypted version body is truncated"));
            }
            let (kid, rest) = sealed.split_at(KEY_ID_LEN);
            if kid != key_id(key) {
                return Err(err(
                    ErrorKind::PermissionDenied,
                    Op::Read,
                    format!(
                        "this version was encrypted with key {}, not the given key {}",
                        hex(kid),
                        hex(&key_id(key))
                    ),
                ));
            }
            let (nonce, rest) = rest.split_at(NONCE_LEN);
            let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
            let aad = &b[..body_at];
            body = roamdisk_crypto::aes256_gcm_open(key, nonce, aad, ct, tag).map_err(|_| {
                corrupt("encrypted version body fails authentication (tampered or damaged)")
            })?;
            &body
        } else {
            sealed
        };
        let mut r = Reader::new(plain, "version body");
        let created = r.i64("created")?;
        let parent = r.id("parent")?;
        let description = r.str16("description", MAX_DESCRIPTION)?;
        let clen = r.u32("config length")? as usize;
        if clen > MAX_CONFIG {
            return Err(corrupt(format!(
                "configuration of {clen} bytes is too large"
            )));
        }
        let config = r.bytes(clen, "config")?.to_vec();
        let msize = r.u64("memory size")?;
        let mcount = r.u32("memory chunks")? as usize;
        let per = 32 + if h.encrypted { 32 } else { 0 };
        if mcount.checked_mul(per).is_none_or(|n| n > r.remaining()) {
            return Err(corrupt("memory chunk list is truncated"));
        }
        if msize.div_ceil(h.chunk_size.max(1) as u64) != mcount as u64 {
            return Err(corrupt(format!(
                "memory image of {msize} bytes does not match {mcount} chunks"
            )));
        }
        let mut memory = Memory {
            size: msize,
            ..Default::default()
        };
        for _ in 0..mcount {
            memory.ids.push(r.id("memory chunk")?);
            if h.encrypted {
                let mut k = [0u8; 32];
                k.copy_from_slice(r.bytes(32, "memory key")?);
                memory.keys.push(k);
            }
        }
        let ilen = r.u64("index length")?;
        if ilen > r.remaining() as u64 {
            return Err(corrupt("index is truncated"));
        }
        let index = Index::parse(r.bytes(ilen as usize, "index")?, true)?;
        let format = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        let working_set = match format {
            VERSION_WORKING_SET => read_working_set(&mut r, index.records())?,
            VERSION_PAGES => read_working_set_of(&mut r, index.records(), true)?,
            _ => Vec::new(),
        };
        let pages = if format == VERSION_PAGES {
            let n = r.u32("memory image length")? as usize;
            let p = MemoryPages::parse(r.bytes(n, "memory image")?, h.encrypted)?;
            if msize != 0 || p.blocks[0].index.hash != h.hash {
                return Err(corrupt(
                    "a version with two memory images, or one of another hash",
                ));
            }
            Some(p)
        } else {
            None
        };
        r.finish()?;
        if index.hash != h.hash
            || index.chunk_size != h.chunk_size
            || index.disk_size != h.disk_size
            || index.encrypted() != h.encrypted
        {
            return Err(corrupt("version header and index disagree"));
        }
        Ok(Version {
            created,
            parent: (!parent.is_zero()).then_some(parent),
            description,
            config,
            memory,
            index,
            working_set,
            pages,
        })
    }

    /// The objects a package references, without keys.
    pub fn references_of(b: &[u8]) -> Result<Vec<ChunkId>> {
        let h = Header::parse(b)?;
        if !h.encrypted {
            return Ok(Version::decode(b, None)?.references());
        }
        let refs = &b[HEADER_SIZE..HEADER_SIZE + h.refs_len as usize];
        // At most two ids per chunk of the disk, plus those of a memory
        // image (each at least 32 bytes of the body, which names it), plus
        // the count; saturating, since the header's sizes are not
        // validated before this point.
        let max = h
            .disk_size
            .div_ceil(h.chunk_size.max(1) as u64)
            .saturating_mul(2 * 32)
            .saturating_add(h.body_len.saturating_mul(2))
            .saturating_add(64)
            .min(1 << 30) as usize;
        let raw = crate::chunk::decompress_bounded(refs, max)
            .map_err(|e| corrupt(format!("refs section does not decompress: {e}")))?;
        let mut r = Reader::new(&raw, "refs section");
        let n = r.u64("count")? as usize;
        if n.checked_mul(32) != Some(r.remaining()) {
            return Err(corrupt("refs section length mismatch"));
        }
        (0..n).map(|_| r.id("ref")).collect()
    }
}

/// Read a user key file: 64 hex digits (a 256-bit key). Passwords are
/// refused: the key must be full-entropy.
pub fn read_key_file(path: &std::path::Path) -> Result<Key> {
    let t = crate::secret::read_file(path, "the key file")?;
    let id = ChunkId::from_hex(&t).ok_or_else(|| {
        bad_arg(format!(
            "{} is not a key file (64 hex digits, made by `roamdisk store keygen`); passwords are not accepted as keys",
            path.display()
        ))
    })?;
    Ok(id.0)
}

/// Create a new key file (mode 0600) holding 256 random bits.
pub fn create_key_file(path: &std::path::Path) -> Result<Key> {
    let mut key = [0u8; 32];
    crate::secret::fill_random(&mut key, "a key")?;
    crate::secret::create_file(path, &ChunkId(key).to_hex(), "the key file")?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(encrypted: bool) -> Version {
        let mut index = Index::new_zero(HashKind::Blake3, 65536, 4 * 65536, encrypted).unwrap();
        let d = vec![1u8; 65536];
        index.set_record(2, ChunkId([5; 32]), Some([6; 32]), &d);
        Version {
            created: 1_700_000_000_000_000_000,
            parent: Some(ChunkId([1; 32])),
            description: "after work".into(),
            config: b"memory = 2G\n".to_vec(),
            memory: Memory {
                size: 70000,
                ids: vec![ChunkId([7; 32]), ChunkId([8; 32])],
                keys: if encrypted {
                    vec![[1; 32], [2; 32]]
                } else {
                    vec![]
                },
            },
            index,
            working_set: Vec::new(),
            pages: None,
        }
    }

    #[test]
    fn a_page_image_makes_format_3_and_round_trips_with_its_references() {
        for encrypted in [false, true] {
            let key = [42u8; 32];
            let key = encrypted.then_some(&key);
            let mut v = version(encrypted);
            v.memory = Memory::default();
            v.pages = Some(crate::memimage::tests::sample(encrypted));
            for ws in [vec![], vec![1, 3]] {
                v.working_set = ws;
                let b = v.encode(key).unwrap();
                assert_eq!(b[8..12], VERSION_PAGES.to_le_bytes());
                assert_eq!(Version::decode(&b, key).unwrap(), v);
                let refs = Version::references_of(&b).unwrap();
                assert!(
                    refs.contains(&ChunkId([7; 32])),
                    "the page chunk is referenced"
                );
                assert!(refs.contains(&ChunkId([5; 32])), "the disk chunk too");
            }
            // An image encrypted unlike the disk is refused.
            let mut odd = v.clone();
            odd.pages = Some(crate::memimage::tests::sample(!encrypted));
            assert!(odd.encode(key).is_err());
        }
    }

    #[test]
    fn a_working_set_makes_format_2_and_round_trips() {
        for encrypted in [false, true] {
            let key = [42u8; 32];
            let key = encrypted.then_some(&key);
            let mut v = version(encrypted);
            let plain = v.encode(key).unwrap();
            assert_eq!(plain[8..12], VERSION.to_le_bytes(), "no set: format 1");
            v.working_set = vec![3, 0, 2];
            let b = v.encode(key).unwrap();
            assert_eq!(b[8..12], VERSION_WORKING_SET.to_le_bytes());
            assert_eq!(Version::decode(&b, key).unwrap(), v);
            v.working_set = vec![4];
            assert_eq!(
                v.encode(key).unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
        }
        // Plain: damage the set's entries and count (last 16 bytes: count
        // 3, then 3, 0, 2).
        let mut v = version(false);
        v.working_set = vec![3, 0, 2];
        let b = v.encode(None).unwrap();
        let n = b.len();
        let mut dup = b.clone();
        dup[n - 4..].copy_from_slice(&3u32.to_le_bytes());
        assert!(Version::decode(&dup, None)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let mut far = b.clone();
        far[n - 4..].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            Version::decode(&far, None).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        let mut count = b.clone();
        count[n - 16..n - 12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            Version::decode(&count, None).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        // A format-1 header over a body with a set: trailing bytes.
        let mut v1 = b.clone();
        v1[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let crc = crc32c::crc32c(&v1[..HEADER_SIZE - 4]);
        v1[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
        assert!(Version::decode(&v1, None)
            .unwrap_err()
            .to_string()
            .contains("trailing"));
    }

    #[test]
    fn plain_round_trip_and_references() {
        let v = version(false);
        let b = v.encode(None).unwrap();
        assert_eq!(Version::decode(&b, None).unwrap(), v);
        let refs = Version::references_of(&b).unwrap();
        assert_eq!(
            refs,
            vec![ChunkId([5; 32]), ChunkId([7; 32]), ChunkId([8; 32])]
        );
        for cut in [0, 30, 64, b.len() - 1] {
            assert!(Version::decode(&b[..cut], None).is_err(), "cut {cut}");
        }
    }

    /// Regression (fuzz target `cas_version`): `references_of` sized its
    /// decompression bound as `disk_size / chunk_size * 64 + 64` without
    /// overflow checks, before anything validated those header fields. An
    /// encrypted package whose (CRC-correct) header claimed a disk of
    /// 2^64 - 1 bytes in 1-byte chunks panicked with "attempt to multiply
    /// with overflow" (debug builds; release wrapped to a tiny bound) in
    /// gc, which reads the references of every package without keys. The
    /// bound now saturates at the 1 GiB cap.
    #[test]
    fn references_of_a_header_with_huge_sizes_does_not_overflow() {
        let key = [42u8; 32];
        let mut b = version(true).encode(Some(&key)).unwrap();
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_SIZE - 4]);
        b[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Version::references_of(&b).unwrap().len(), 3);
        assert!(Version::decode(&b, Some(&key)).is_err());
    }

    #[test]
    fn encrypted_needs_the_right_key_but_refs_are_readable() {
        let v = version(true);
        let key = [42u8; 32];
        let b = v.encode(Some(&key)).unwrap();
        assert_eq!(Version::decode(&b, Some(&key)).unwrap(), v);
        let e = Version::decode(&b, Some(&[1; 32])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(Version::decode(&b, None).is_err());
        assert_eq!(Version::references_of(&b).unwrap().len(), 3);
        assert!(
            !b.windows(10).any(|w| w == b"after work"),
            "description is sealed"
        );
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 20] ^= 1;
        assert_eq!(
            Version::decode(&bad, Some(&key)).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }
}
