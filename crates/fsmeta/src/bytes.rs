//! Bounded reads: a [`Region`] of a device (a partition) that refuses to
//! read outside itself, and little-endian field access on byte slices that
//! returns a `Corrupt` error instead of panicking when a field lies past
//! the end of what was read.

use roamdisk_blockdev::{BlockDev, Error, ErrorKind, Op, Result};

/// A `Corrupt` error raised by parser `what` (e.g. `"ext4"`, `"gpt"`).
pub(crate) fn corrupt(what: &str, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, Op::Read, format!("fsmeta:{what}"), msg)
}

/// A byte range `[start, start + len)` of a device, read through `&dyn
/// BlockDev`. Offsets given to [`Region::read`] are relative to `start`.
#[derive(Clone, Copy)]
pub struct Region<'a> {
    pub dev: &'a dyn BlockDev,
    pub start: u64,
    pub len: u64,
}

impl<'a> Region<'a> {
    /// The range, checked against the device size.
    pub fn new(dev: &'a dyn BlockDev, start: u64, len: u64) -> Result<Region<'a>> {
        match start.checked_add(len) {
            Some(end) if end <= dev.size() => Ok(Region { dev, start, len }),
            _ => Err(Error::new(
                ErrorKind::OutOfRange,
                Op::Read,
                "fsmeta",
                format!(
                    "range of {len} bytes at {start} ends past the end of the {}-byte device",
                    dev.size()
                ),
            )
            .at(start)),
        }
    }

    /// Fill `buf` from relative offset `off`; reading past the end of the
    /// region is a `Corrupt` error naming `what` (truncated image or a
    /// field pointing outside its partition).
    pub fn read(&self, what: &str, buf: &mut [u8], off: u64) -> Result<()> {
        match off.checked_add(buf.len() as u64) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(corrupt(
                    what,
                    format!(
                        "metadata at offset {off} (+{} bytes) lies past the end of the {}-byte partition: truncated image or corrupt pointer",
                        buf.len(),
                        self.len
                    ),
                )
                .at(self.start.saturating_add(off)))
            }
        }
        self.dev.read_at(buf, self.start + off)
    }

    /// Read `len` bytes at relative offset `off` into a new buffer.
    pub fn read_vec(&self, what: &str, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(what, &mut v, off)?;
        Ok(v)
    }
}

/// Little-endian (and big-endian) field access that fails instead of
/// panicking.
pub(crate) trait Fields {
    fn field<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
    fn u8_at(&self, off: usize) -> Option<u8> {
        self.field::<1>(off).map(|b| b[0])
    }
    fn le16(&self, off: usize) -> Option<u16> {
        self.field(off).map(u16::from_le_bytes)
    }
    fn le32(&self, off: usize) -> Option<u32> {
        self.field(off).map(u32::from_le_bytes)
    }
    fn le64(&self, off: usize) -> Option<u64> {
        self.field(off).map(u64::from_le_bytes)
    }
    fn be32(&self, off: usize) -> Option<u32> {
        self.field(off).map(u32::from_be_bytes)
    }
}

impl Fields for [u8] {
    fn field<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let end = off.checked_add(N)?;
        self.get(off..end).map(|s| s.try_into().expect("length N"))
    }
}

/// A checked slice `[off, off + len)` of `b`.
pub(crate) fn sub(b: &[u8], off: usize, len: usize) -> Option<&[u8]> {
    b.get(off..off.checked_add(len)?)
}

/// Lowercase hex of bytes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SHA-256 of a list of byte strings.
pub(crate) fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// A NUL-padded byte string as text (lossy), or `None` when empty.
pub(crate) fn text(b: &[u8]) -> Option<String> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = String::from_utf8_lossy(&b[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// A UUID in its usual text form from 16 bytes in on-disk (big-endian) order.
pub(crate) fn uuid_text(u: &[u8; 16]) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        hex(&u[0..4]),
        hex(&u[4..6]),
        hex(&u[6..8]),
        hex(&u[8..10]),
        hex(&u[10..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_out_of_range_are_none() {
        let b = [1u8, 2, 3, 4];
        assert_eq!(b.le16(2), Some(0x0403));
        assert_eq!(b.le32(1), None);
        assert_eq!(b.le64(usize::MAX - 2), None);
        assert_eq!(sub(&b, 3, 2), None);
    }
}
