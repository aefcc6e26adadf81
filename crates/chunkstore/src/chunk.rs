//! The stored form of a chunk (or of any object: version packages are
//! stored the same way): a 16-byte envelope header and the payload,
//! optionally zstd-compressed, optionally encrypted with a key derived
//! from the content (convergent encryption). Byte layout:
//! `docs/formats/cas-chunk.md`.
//!
//! The name (id) of a plain chunk is the hash of its plaintext, so the same
//! content gets the same name whatever the compression; the name of an
//! encrypted chunk is the hash of its ciphertext (domain separated), so a
//! store can verify every object without keys. Every read is verified by
//! [`ChunkCodec::open`]: a chunk that does not match its name is reported
//! by name and never used.

use crate::error::corrupt;
use crate::hash::{ChunkId, HashKind};
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 4] = *b"RDCK";
pub const VERSION: u8 = 1;
pub const FLAG_ZSTD: u8 = 1;
pub const FLAG_ENCRYPTED: u8 = 2;
const KNOWN_FLAGS: u8 = FLAG_ZSTD | FLAG_ENCRYPTED;

roamdisk_blockdev::offsets! {
    E_MAGIC: 4, E_VERSION: 1, E_FLAGS: 1, E_HASH: 1, E_RESERVED: 1, E_PAYLOAD_LEN: 4,
    E_ORIGINAL_LEN: 4;
    /// Size of the envelope header.
    pub HEADER_SIZE == 16
}

/// Largest object (payload or plaintext) accepted: 1 GiB.
pub const MAX_OBJECT: usize = 1 << 30;

/// Domain string of the id of an encrypted chunk.
const ENC_ID_DOMAIN: &[u8] = b"roamdisk-cas encrypted chunk v1\0";
/// Domain string of the convergent key.
const KEY_DOMAIN: &str = "roamdisk-cas convergent key v1";

/// A 256-bit key (convergent chunk key or user key).
pub type Key = [u8; 32];

/// How chunks are written to a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkCodec {
    pub hash: HashKind,
    /// zstd level, or `None` for no compression.
    pub zstd_level: Option<i32>,
}

/// A chunk ready to be stored.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub id: ChunkId,
    /// The convergent key, for encrypted chunks (goes into the index).
    pub key: Option<Key>,
    /// The envelope to store under `id`.
    pub object: Vec<u8>,
}

/// The parsed envelope header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub hash: HashKind,
    pub payload_len: usize,
    pub original_len: usize,
}

impl Envelope {
    pub fn parse(object: &[u8]) -> Result<Envelope> {
        if object.len() < HEADER_SIZE {
            return Err(corrupt(format!(
                "object of {} bytes is shorter than the {HEADER_SIZE}-byte chunk header",
                object.len()
            )));
        }
        if object[E_MAGIC..E_MAGIC + 4] != MAGIC {
            return Err(corrupt("bad magic: not a roamdisk chunk"));
        }
        if object[E_VERSION] != VERSION {
            return Err(corrupt(format!(
                "chunk format version {} (this build reads {VERSION})",
                object[E_VERSION]
            )));
        }
        let flags = object[E_FLAGS];
        if flags & !KNOWN_FLAGS != 0 || object[E_RESERVED] != 0 {
            return Err(corrupt(format!("unknown chunk flags {flags:#x}")));
        }
        let hash = HashKind::from_u8(object[E_HASH])?;
        let le = |o: usize| u32::from_le_bytes(object[o..o + 4].try_into().expect("4")) as usize;
        let payload_len = le(E_PAYLOAD_LEN);
        let original_len = le(E_ORIGINAL_LEN);
        if payload_len != object.len() - HEADER_SIZE {
            return Err(corrupt(format!(
                "chunk payload is {} bytes but its header says {payload_len} (truncated or padded)",
                object.len() - HEADER_SIZE
            )));
        }
        if original_len > MAX_OBJECT || (flags & FLAG_ZSTD == 0 && original_len != payload_len) {
            return Err(corrupt(format!(
                "chunk original length {original_len} is invalid"
            )));
        }
        Ok(Envelope {
            flags,
            hash,
            payload_len,
            original_len,
        })
    }

    fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut h = [0u8; HEADER_SIZE];
        h[E_MAGIC..E_MAGIC + 4].copy_from_slice(&MAGIC);
        h[E_VERSION] = VERSION;
        h[E_FLAGS] = self.flags;
        h[E_HASH] = self.hash as u8;
        h[E_PAYLOAD_LEN..E_PAYLOAD_LEN + 4]
            .copy_from_slice(&(self.payload_len as u32).to_le_bytes());
        h[E_ORIGINAL_LEN..E_ORIGINAL_LEN + 4]
            .copy_from_slice(&(self.original_len as u32).to_le_bytes());
        h
    }
}

impl ChunkCodec {
    /// The convergent key of a plaintext.
    pub fn convergent_key(&self, data: &[u8]) -> Key {
        match self.hash {
            HashKind::Blake3 => blake3::derive_key(KEY_DOMAIN, data),
            HashKind::Sha256 => {
                self.hash
                    .hash_parts(&[KEY_DOMAIN.as_bytes(), b"\0", data])
                    .0
            }
        }
    }

    /// The id an encrypted payload is stored under.
    fn encrypted_id(&self, payload: &[u8]) -> ChunkId {
        self.hash.hash_parts(&[ENC_ID_DOMAIN, payload])
    }

    fn maybe_compress(&self, data: &[u8]) -> (u8, Option<Vec<u8>>) {
        if let Some(level) = self.zstd_level.filter(|_| !looks_random(data)) {
            if let Ok(c) = compress(data, level) {
                // Kept only when it saves at least 1/64 of the size.
                if c.len() + data.len() / 64 < data.len() {
                    return (FLAG_ZSTD, Some(c));
                }
            }
        }
        (0, None)
    }

    /// The envelope header of a plain, uncompressed object of `len` bytes
    /// (the object is this header followed by the content itself, so a
    /// writer can send both with one vectored write and no copy).
    pub fn plain_header(&self, len: usize) -> [u8; HEADER_SIZE] {
        Envelope {
            flags: 0,
            hash: self.hash,
            payload_len: len,
            original_len: len,
        }
        .encode()
    }

    /// Seal a plain chunk whose id (`hash(data)`) is already known.
    pub fn seal_plain(&self, id: ChunkId, data: &[u8]) -> Sealed {
        let (flags, compressed) = self.maybe_compress(data);
        let payload = compressed.as_deref().unwrap_or(data);
        let env = Envelope {
            flags,
            hash: self.hash,
            payload_len: payload.len(),
            original_len: data.len(),
        };
        let mut object = Vec::with_capacity(HEADER_SIZE + payload.len());
        object.extend_from_slice(&env.encode());
        object.extend_from_slice(payload);
        Sealed {
            id,
            key: None,
            object,
        }
    }

    /// Seal a chunk: plain (`encrypt == false`) or convergently encrypted.
    pub fn seal(&self, data: &[u8], encrypt: bool) -> Sealed {
        if !encrypt {
            return self.seal_plain(self.hash.hash(data), data);
        }
        let key = self.convergent_key(data);
        let (flags, compressed) = self.maybe_compress(data);
        let body = compressed.as_deref().unwrap_or(data);
        let payload = roamdisk_crypto::aes256_ctr(&key, body);
        let env = Envelope {
            flags: flags | FLAG_ENCRYPTED,
            hash: self.hash,
            payload_len: payload.len(),
            original_len: data.len(),
        };
        let id = self.encrypted_id(&payload);
        let mut object = Vec::with_capacity(HEADER_SIZE + payload.len());
        object.extend_from_slice(&env.encode());
        object.extend_from_slice(&payload);
        Sealed {
            id,
            key: Some(key),
            object,
        }
    }

    /// Check that `object` is a well-formed envelope stored under the right
    /// name, without keys (what a store does on every write). Plain chunks
    /// are decompressed and hashed; encrypted ones have their ciphertext
    /// hashed.
    pub fn verify(&self, id: &ChunkId, object: &[u8]) -> Result<Envelope> {
        let env =
            Envelope::parse(object).map_err(|e| crate::error::context(e, format!("chunk {id}")))?;
        if env.hash != self.hash {
            return Err(corrupt(format!(
                "chunk {id} was hashed with {} but this store uses {}",
                env.hash.name(),
                self.hash.name()
            )));
        }
        let payload = &object[HEADER_SIZE..];
        let got = if env.flags & FLAG_ENCRYPTED != 0 {
            self.encrypted_id(payload)
        } else if env.flags & FLAG_ZSTD != 0 {
            self.hash.hash(&decompress(id, payload, env.original_len)?)
        } else {
            self.hash.hash(payload)
        };
        if got != *id {
            return Err(mismatch(id));
        }
        Ok(env)
    }

    /// Verify and decode a chunk read from a store. `key` is the chunk's
    /// convergent key from the index (required for encrypted chunks).
    pub fn open(&self, id: &ChunkId, key: Option<&Key>, object: &[u8]) -> Result<Vec<u8>> {
        let env =
            Envelope::parse(object).map_err(|e| crate::error::context(e, format!("chunk {id}")))?;
        let payload = &object[HEADER_SIZE..];
        if env.flags & FLAG_ENCRYPTED == 0 {
            let data = if env.flags & FLAG_ZSTD != 0 {
                decompress(id, payload, env.original_len)?
            } else {
                payload.to_vec()
            };
            if env.hash.hash(&data) != *id || env.hash != self.hash {
                return Err(mismatch(id));
            }
            return Ok(data);
        }
        if self.encrypted_id(payload) != *id || env.hash != self.hash {
            return Err(mismatch(id));
        }
        let key = key.ok_or_else(|| {
            corrupt(format!(
                "chunk {id} is encrypted but the index gives no key for it"
            ))
        })?;
        let body = roamdisk_crypto::aes256_ctr(key, payload);
        let data = if env.flags & FLAG_ZSTD != 0 {
            decompress(id, &body, env.original_len)?
        } else {
            body
        };
        if data.len() != env.original_len || self.convergent_key(&data) != *key {
            return Err(corrupt(format!(
                "chunk {id} does not decrypt to the content its key was derived from (wrong key in the index, or a tampered chunk)"
            )));
        }
        Ok(data)
    }
}

/// Whether `data` is the decoded content of the object named `id`, under
/// any codec a store may have used: plain under BLAKE3 or SHA-256, or
/// convergently encrypted under either with no compression or zstd at any
/// level 1-19 (the default, 3, tried first). The shared cache keeps decoded
/// content without its envelope or key, so `roamdisk cache verify` checks
/// it this way: a plain chunk costs a hash or two, an encrypted one a seal
/// per setting tried (one or two for a store with the default settings).
pub fn names_content(id: &ChunkId, data: &[u8]) -> bool {
    const HASHES: [HashKind; 2] = [HashKind::Blake3, HashKind::Sha256];
    if HASHES.iter().any(|h| h.hash(data) == *id) {
        return true;
    }
    let levels: Vec<Option<i32>> = if looks_random(data) {
        // Writers never compress these: every level seals alike.
        vec![None]
    } else {
        [Some(3), None]
            .into_iter()
            .chain((1..=19).filter(|&l| l != 3).map(Some))
            .collect()
    };
    HASHES.iter().any(|&hash| {
        levels
            .iter()
            .any(|&zstd_level| ChunkCodec { hash, zstd_level }.seal(data, true).id == *id)
    })
}

/// Bytes sampled by [`looks_random`]: one in this many.
const SAMPLE_STRIDE: usize = 16;
/// Smallest chunk [`looks_random`] judges (smaller ones are just tried).
const SAMPLE_MIN: usize = 4096;
/// Byte entropy (bits per byte) of the sample at or above which a chunk is
/// taken as incompressible. Uniform random bytes give 7.95 ± 0.01 for
/// 4,096 samples; a chunk with 1/16 of it in one byte value gives ≈ 7.77.
const RANDOM_ENTROPY: f64 = 7.9;

/// Whether `data` looks like uniformly random bytes (encrypted or already
/// compressed), judged from the byte histogram of every 16th byte: then
/// zstd is not tried (it would not save 1/64, and trying costs twice the
/// hash). Chunks this misjudges are those that repeat random-looking
/// content within themselves; they are stored uncompressed (their size,
/// never their content or name, is what changes).
fn looks_random(data: &[u8]) -> bool {
    if data.len() < SAMPLE_MIN {
        return false;
    }
    let mut hist = [0u32; 256];
    let mut n = 0u32;
    for &b in data.iter().step_by(SAMPLE_STRIDE) {
        hist[b as usize] += 1;
        n += 1;
    }
    let n = n as f64;
    let sum: f64 = hist
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let c = c as f64;
            c * c.log2()
        })
        .sum();
    // H = log2(n) - (1/n) * sum(c * log2(c))
    n.log2() - sum / n >= RANDOM_ENTROPY
}

thread_local! {
    /// This thread's zstd context and its level (making one per chunk cost
    /// more than compressing a chunk of random data).
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// zstd-compress `data` at `level` with this thread's context.
fn compress(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().map(|(l, _)| *l) != Some(level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        let (_, z) = c.as_mut().expect("just made");
        z.compress(data)
    })
}

fn mismatch(id: &ChunkId) -> roamdisk_blockdev::Error {
    corrupt(format!(
        "chunk {id} is corrupt: its content does not hash to its name; it was not used (restore it from another store or re-commit the image that holds it)"
    ))
}

fn decompress(id: &ChunkId, payload: &[u8], original_len: usize) -> Result<Vec<u8>> {
    let d = decompress_bounded(payload, original_len)
        .map_err(|e| corrupt(format!("chunk {id} does not decompress: {e}")))?;
    if d.len() != original_len {
        return Err(corrupt(format!(
            "chunk {id} decompresses to {} bytes, not the {original_len} its header says",
            d.len()
        )));
    }
    Ok(d)
}

/// Decompress one zstd frame into at most `limit` bytes (one more is read
/// to detect an overlong frame). Memory grows with the output actually
/// produced, not with a length a damaged header claims.
pub fn decompress_bounded(payload: &[u8], limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(limit.min(4 << 20));
    zstd::stream::read::Decoder::new(payload)?
        .take(limit as u64 + 1)
        .read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Vec<u8> {
        (0..65536u32).map(|i| (i % 7) as u8).collect()
    }

    #[test]
    fn decoded_content_is_recognised_under_every_codec_and_damage_is_not() {
        let d = data();
        let random: Vec<u8> = (0..65536u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for content in [&d, &random] {
            for hash in [HashKind::Blake3, HashKind::Sha256] {
                for zstd_level in [None, Some(3), Some(9)] {
                    let c = ChunkCodec { hash, zstd_level };
                    for encrypt in [false, true] {
                        let id = c.seal(content, encrypt).id;
                        assert!(
                            names_content(&id, content),
                            "{hash:?} {zstd_level:?} {encrypt}"
                        );
                        let mut bad = content.clone();
                        bad[100] ^= 1;
                        assert!(
                            !names_content(&id, &bad),
                            "{hash:?} {zstd_level:?} {encrypt}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn plain_and_compressed_round_trip_and_share_the_name() {
        let d = data();
        let a = ChunkCodec {
            hash: HashKind::Blake3,
            zstd_level: None,
        };
        let b = ChunkCodec {
            zstd_level: Some(3),
            ..a
        };
        let sa = a.seal(&d, false);
        let sb = b.seal(&d, false);
        assert_eq!(sa.id, sb.id);
        assert!(sb.object.len() < sa.object.len() / 10);
        assert_eq!(a.open(&sa.id, None, &sb.object).unwrap(), d);
        b.verify(&sb.id, &sb.object).unwrap();
    }

    #[test]
    fn plain_header_then_content_is_the_sealed_object() {
        let d = data();
        for hash in [HashKind::Blake3, HashKind::Sha256] {
            let c = ChunkCodec {
                hash,
                zstd_level: None,
            };
            let id = hash.hash(&d);
            let mut joined = c.plain_header(d.len()).to_vec();
            joined.extend_from_slice(&d);
            assert_eq!(joined, c.seal_plain(id, &d).object);
            c.verify(&id, &joined).unwrap();
        }
    }

    #[test]
    fn encrypted_is_convergent_and_verified() {
        let d = data();
        let c = ChunkCodec {
            hash: HashKind::Sha256,
            zstd_level: Some(1),
        };
        let s1 = c.seal(&d, true);
        let s2 = c.seal(&d, true);
        assert_eq!(s1.id, s2.id, "same content, same name");
        assert_eq!(s1.object, s2.object);
        assert!(!s1.object.windows(7).any(|w| w == [0, 1, 2, 3, 4, 5, 6]));
        c.verify(&s1.id, &s1.object).unwrap();
        assert_eq!(c.open(&s1.id, s1.key.as_ref(), &s1.object).unwrap(), d);
        let wrong = [7u8; 32];
        assert!(c.open(&s1.id, Some(&wrong), &s1.object).is_err());
        assert!(c.open(&s1.id, None, &s1.object).is_err());
    }

    #[test]
    fn random_data_is_not_compressed_and_structured_data_is() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        assert!(looks_random(&random));
        let c = ChunkCodec {
            hash: HashKind::Blake3,
            zstd_level: Some(3),
        };
        assert_eq!(c.seal(&random, false).object.len(), HEADER_SIZE + 65536);
        // A sixteenth of zeroes, text, small chunks: tried (and kept).
        let mut holey = random.clone();
        holey[..4096].fill(0);
        assert!(!looks_random(&holey));
        assert!(c.seal(&holey, false).object.len() < 65536 - 2048);
        let text = b"the quick brown fox jumps over the lazy dog ".repeat(1500);
        assert!(!looks_random(&text));
        assert!(!looks_random(&random[..1024]));
    }

    #[test]
    fn damage_is_detected_by_name() {
        let c = ChunkCodec {
            hash: HashKind::Blake3,
            zstd_level: Some(3),
        };
        let s = c.seal(&data(), false);
        for i in [0, 5, 9, HEADER_SIZE, s.object.len() - 1] {
            let mut bad = s.object.clone();
            bad[i] ^= 0x40;
            let e = c.open(&s.id, None, &bad).unwrap_err().to_string();
            assert!(e.contains(&s.id.to_hex()), "byte {i}: {e}");
        }
        let e = c.open(&s.id, None, &s.object[..20]).unwrap_err();
        assert_eq!(e.kind(), roamdisk_blockdev::ErrorKind::Corrupt);
    }
}
