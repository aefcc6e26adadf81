//! Little-endian encoding helpers and a bounds-checked reader used by
//! every parser in this crate (index, version package, catalog, wire
//! messages): a read past the end is an error naming what was being read,
//! never a panic.

use crate::error::corrupt;
use crate::hash::{ChunkId, ID_LEN};
use roamdisk_blockdev::Result;

/// Reads fields from a byte slice, failing cleanly on truncation.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the structure in error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(corrupt(format!(
                "{} is truncated: {field} needs {n} bytes at offset {}, only {} left",
                self.what,
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.bytes(1, field)?[0])
    }
    pub fn u16(&mut self, field: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.bytes(2, field)?.try_into().expect("2"),
        ))
    }
    pub fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4, field)?.try_into().expect("4"),
        ))
    }
    pub fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8, field)?.try_into().expect("8"),
        ))
    }
    pub fn i64(&mut self, field: &str) -> Result<i64> {
        Ok(self.u64(field)? as i64)
    }
    pub fn id(&mut self, field: &str) -> Result<ChunkId> {
        Ok(ChunkId::from_slice(self.bytes(ID_LEN, field)?))
    }
    /// A u16-length-prefixed UTF-8 string of at most `max` bytes.
    pub fn str16(&mut self, field: &str, max: usize) -> Result<String> {
        let n = self.u16(field)? as usize;
        if n > max {
            return Err(corrupt(format!(
                "{}: {field} is {n} bytes, more than the {max} allowed",
                self.what
            )));
        }
        let b = self.bytes(n, field)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| corrupt(format!("{}: {field} is not UTF-8", self.what)))
    }
    /// The frame's start (every header in this crate opens with it): an
    /// 8-byte magic and a `u32` format version, both checked.
    pub fn frame(&mut self, magic: &[u8; 8], version: u32) -> Result<()> {
        self.frame_versions(magic, version..=version).map(|_| ())
    }
    /// Like [`Reader::frame`], for formats of which this build reads
    /// several versions: the version found.
    pub fn frame_versions(
        &mut self,
        magic: &[u8; 8],
        versions: std::ops::RangeInclusive<u32>,
    ) -> Result<u32> {
        if self.bytes(8, "magic")? != magic {
            return Err(corrupt(format!("bad magic: not a roamdisk {}", self.what)));
        }
        let found = self.u32("version")?;
        if !versions.contains(&found) {
            let reads = if versions.start() == versions.end() {
                versions.start().to_string()
            } else {
                format!("{} to {}", versions.start(), versions.end())
            };
            return Err(corrupt(format!(
                "{} format version {found} (this build reads {reads})",
                self.what
            )));
        }
        Ok(found)
    }
    /// The header checksum: a `u32` CRC-32C of every byte before it.
    pub fn header_crc(&mut self) -> Result<()> {
        let covered = &self.buf[..self.pos];
        if crc32c::crc32c(covered) != self.u32("header crc")? {
            return Err(corrupt(format!(
                "{} header checksum mismatch: the header is damaged",
                self.what
            )));
        }
        Ok(())
    }
    /// Fail unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(corrupt(format!(
                "{} has {} unexpected trailing bytes",
                self.what,
                self.remaining()
            )));
        }
        Ok(())
    }
}

/// Appends little-endian fields to a vector.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.u64(v as u64)
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    pub fn id(&mut self, id: &ChunkId) -> &mut Self {
        self.bytes(&id.0)
    }
    /// A u16-length-prefixed string; longer strings are cut at a char
    /// boundary below 65535 bytes.
    pub fn str16(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes(&s.as_bytes()[..end])
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.buf.resize(self.buf.len() + n, 0);
        self
    }
    /// A CRC-32C of everything written so far (see [`Reader::header_crc`]).
    pub fn crc(&mut self) -> &mut Self {
        self.u32(crc32c::crc32c(&self.buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let mut w = Writer::new();
        w.u32(7).str16("héllo");
        let b = w.buf;
        let mut r = Reader::new(&b, "test record");
        assert_eq!(r.u32("a").unwrap(), 7);
        assert_eq!(r.str16("s", 100).unwrap(), "héllo");
        r.finish().unwrap();
        let mut r = Reader::new(&b[..5], "test record");
        r.u32("a").unwrap();
        let e = r.str16("s", 100).unwrap_err().to_string();
        assert!(e.contains("test record is truncated"), "{e}");
    }
}
