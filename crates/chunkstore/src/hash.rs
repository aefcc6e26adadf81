//! Chunk names: the hash function chosen per store and the 32-byte id.

use std::fmt;

use crate::error::{bad_arg, corrupt};
use roamdisk_blockdev::Result;

/// Length of every id (both hash functions give 32 bytes).
pub const ID_LEN: usize = 32;

/// The hash function of a store, fixed when the store is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashKind {
    /// BLAKE3 (the default: fast, parallel, SIMD).
    Blake3 = 1,
    /// SHA-256 (SHA-NI accelerated where the CPU has it).
    Sha256 = 2,
}

impl HashKind {
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Blake3 => "blake3",
            HashKind::Sha256 => "sha256",
        }
    }

    pub fn from_name(s: &str) -> Result<HashKind> {
        match s {
            "blake3" => Ok(HashKind::Blake3),
            "sha256" => Ok(HashKind::Sha256),
            other => Err(bad_arg(format!(
                "unknown hash '{other}': use blake3 (default) or sha256"
            ))),
        }
    }

    pub fn from_u8(v: u8) -> Result<HashKind> {
        match v {
            1 => Ok(HashKind::Blake3),
            2 => Ok(HashKind::Sha256),
            other => Err(corrupt(format!("unknown hash function number {other}"))),
        }
    }

    /// Hash `data`.
    pub fn hash(self, data: &[u8]) -> ChunkId {
        match self {
            HashKind::Blake3 => ChunkId(*blake3::hash(data).as_bytes()),
            HashKind::Sha256 => {
                use sha2::Digest;
                ChunkId(sha2::Sha256::digest(data).into())
            }
        }
    }

    /// Hash the concatenation of `parts` (domain-separated derivations).
    pub fn hash_parts(self, parts: &[&[u8]]) -> ChunkId {
        match self {
            HashKind::Blake3 => {
                let mut h = blake3::Hasher::new();
                for p in parts {
                    h.update(p);
                }
                ChunkId(*h.finalize().as_bytes())
            }
            HashKind::Sha256 => {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                for p in parts {
                    h.update(p);
                }
                ChunkId(h.finalize().into())
            }
        }
    }
}

/// The name of a chunk or version: the hash of its content.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChunkId(pub [u8; ID_LEN]);

impl ChunkId {
    /// The all-zero id: "no chunk" (an all-zero chunk is never stored).
    pub const ZERO: ChunkId = ChunkId([0; ID_LEN]);

    pub fn is_zero(&self) -> bool {
        self.0 == [0; ID_LEN]
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(ID_LEN * 2);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        s
    }

    /// The first `n` hex digits (for display).
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }

    pub fn from_hex(s: &str) -> Option<ChunkId> {
        let b = s.as_bytes();
        if b.len() != ID_LEN * 2 {
            return None;
        }
        let mut out = [0u8; ID_LEN];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
        }
        Some(ChunkId(out))
    }

    pub fn from_slice(b: &[u8]) -> ChunkId {
        let mut out = [0u8; ID_LEN];
        out.copy_from_slice(&b[..ID_LEN]);
        ChunkId(out)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", self.short())
    }
}

/// Whether every byte of `b` is zero (64 bytes at a time).
pub fn is_zero(b: &[u8]) -> bool {
    let mut blocks = b.chunks_exact(64);
    for c in &mut blocks {
        let mut acc = 0u64;
        for w in c.chunks_exact(8) {
            acc |= u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&x| x == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let id = HashKind::Blake3.hash(b"abc");
        assert_eq!(ChunkId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(ChunkId::from_hex("zz"), None);
        assert_eq!(
            HashKind::Sha256.hash(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn zero_detection() {
        let mut v = vec![0u8; 4099];
        assert!(is_zero(&v));
        for i in [0, 7, 8, 63, 64, 4095, 4098] {
            v[i] = 1;
            assert!(!is_zero(&v), "byte {i}");
            v[i] = 0;
        }
        assert!(is_zero(&[]));
    }
}
