//! Per-block checksums. Every checksum covers the block's LBN and write
//! epoch as well as its plaintext, so a block replayed from another place or
//! another time does not verify.

use sha2::Digest;

/// The checksum algorithm of an image, chosen at create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumKind {
    /// No checksum: blocks are not verified (for measuring the cost of the
    /// others; never the default).
    None,
    /// Fletcher-32 (the seed's fast option; not cryptographic).
    Fletcher32,
    /// CRC-32C (hardware accelerated; not cryptographic).
    Crc32c,
    /// SHA-256 truncated to 128 bits (the seed's strong option).
    Sha256,
    /// BLAKE3 truncated to 128 bits (strong and fast).
    Blake3,
}

impl ChecksumKind {
    pub const ALL: [ChecksumKind; 4] = [
        ChecksumKind::Fletcher32,
        ChecksumKind::Crc32c,
        ChecksumKind::Sha256,
        ChecksumKind::Blake3,
    ];

    /// Identifier stored in the metadata header.
    pub fn id(self) -> u8 {
        match self {
            ChecksumKind::None => 0,
            ChecksumKind::Fletcher32 => 1,
            ChecksumKind::Crc32c => 2,
            ChecksumKind::Sha256 => 3,
            ChecksumKind::Blake3 => 4,
        }
    }
    pub fn from_id(id: u8) -> Option<Self> {
        std::iter::once(ChecksumKind::None)
            .chain(ChecksumKind::ALL)
            .find(|k| k.id() == id)
    }
    pub fn name(self) -> &'static str {
        match self {
            ChecksumKind::None => "none",
            ChecksumKind::Fletcher32 => "fletcher32",
            ChecksumKind::Crc32c => "crc32c",
            ChecksumKind::Sha256 => "sha256",
            ChecksumKind::Blake3 => "blake3",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        std::iter::once(ChecksumKind::None)
            .chain(ChecksumKind::ALL)
            .find(|k| k.name() == s)
    }
    /// Bytes stored per block.
    pub fn width(self) -> usize {
        match self {
            ChecksumKind::None => 0,
            ChecksumKind::Fletcher32 | ChecksumKind::Crc32c => 4,
            ChecksumKind::Sha256 | ChecksumKind::Blake3 => 16,
        }
    }

    /// Checksum of `data` as block `lbn` written in `epoch`, into `out`
    /// (`width()` bytes).
    pub fn compute(self, lbn: u64, epoch: u64, data: &[u8], out: &mut [u8]) {
        let mut prefix = [0u8; 16];
        prefix[..8].copy_from_slice(&lbn.to_le_bytes());
        prefix[8..].copy_from_slice(&epoch.to_le_bytes());
        match self {
            ChecksumKind::None => {}
            ChecksumKind::Fletcher32 => {
                let mut f = Fletcher32::default();
                f.update(&prefix);
                f.update(data);
                out[..4].copy_from_slice(&f.finish().to_le_bytes());
            }
            ChecksumKind::Crc32c => {
                let c = crc32c::crc32c_append(crc32c::crc32c(&prefix), data);
                out[..4].copy_from_slice(&c.to_le_bytes());
            }
            ChecksumKind::Sha256 => {
                let mut h = sha2::Sha256::new();
                h.update(prefix);
                h.update(data);
                out[..16].copy_from_slice(&h.finalize()[..16]);
            }
            ChecksumKind::Blake3 => {
                let mut h = blake3::Hasher::new();
                h.update(&prefix);
                h.update(data);
                out[..16].copy_from_slice(&h.finalize().as_bytes()[..16]);
            }
        }
    }
}

/// Fletcher-32 over little-endian 16-bit words (an odd trailing byte is
/// padded with zero), sums modulo 65535.
#[derive(Default)]
struct Fletcher32 {
    a: u32,
    b: u32,
    odd: Option<u8>,
}

impl Fletcher32 {
    fn update(&mut self, mut data: &[u8]) {
        if let Some(lo) = self.odd.take() {
            if let Some((&hi, rest)) = data.split_first() {
                self.word(u16::from_le_bytes([lo, hi]) as u32);
                data = rest;
            } else {
                self.odd = Some(lo);
                return;
            }
        }
        // 359 words keep both sums below 2^32 before reduction.
        for chunk in data.chunks(2 * 359) {
            let mut words = chunk.chunks_exact(2);
            for w in &mut words {
                self.a += u16::from_le_bytes([w[0], w[1]]) as u32;
                self.b += self.a;
            }
            if let [last] = words.remainder() {
                self.odd = Some(*last);
            }
            self.a %= 65535;
            self.b %= 65535;
        }
    }
    fn word(&mut self, w: u32) {
        self.a = (self.a + w) % 65535;
        self.b = (self.b + self.a) % 65535;
    }
    fn finish(mut self) -> u32 {
        if let Some(lo) = self.odd.take() {
            self.word(lo as u32);
        }
        (self.b << 16) | self.a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fletcher32_known_values() {
        // Reference values for Fletcher-32 over 16-bit little-endian words.
        let f = |d: &[u8]| {
            let mut x = Fletcher32::default();
            x.update(d);
            x.finish()
        };
        assert_eq!(f(b"abcde"), 0xF04F_C729);
        assert_eq!(f(b"abcdef"), 0x5650_2D2A);
        assert_eq!(f(b"abcdefgh"), 0xEBE1_9591);
        // Split updates give the same result.
        let mut x = Fletcher32::default();
        x.update(b"abc");
        x.update(b"def");
        assert_eq!(x.finish(), 0x5650_2D2A);
    }

    #[test]
    fn checksums_bind_lbn_and_epoch() {
        for k in ChecksumKind::ALL {
            let d = vec![0x5au8; 4096];
            let mut a = vec![0u8; k.width()];
            let mut b = vec![0u8; k.width()];
            k.compute(1, 1, &d, &mut a);
            k.compute(2, 1, &d, &mut b);
            assert_ne!(a, b, "{k:?} lbn");
            k.compute(1, 2, &d, &mut b);
            assert_ne!(a, b, "{k:?} epoch");
            assert_eq!(ChecksumKind::from_id(k.id()), Some(k));
        }
    }
}
