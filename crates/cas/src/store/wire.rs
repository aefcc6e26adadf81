//! Binary bodies of the HTTP chunk protocol (`docs/formats/cas-http.md`):
//! the batch "which of these do you have" request and answer, and the
//! object listing. Pure encoding and parsing (a fuzz target).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::bytes::{Reader, Writer};
use crate::error::corrupt;
use crate::hash::ChunkId;
use crate::store::ObjectEntry;
use roamdisk_blockdev::Result;

pub const HAVE_MAGIC: [u8; 8] = *b"RDHAVE01";
pub const LIST_MAGIC: [u8; 8] = *b"RDLIST01";
/// Most ids in one have request.
pub const MAX_HAVE: usize = 1 << 20;

pub fn encode_have_request(ids: &[ChunkId]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&HAVE_MAGIC).u32(ids.len() as u32);
    for id in ids {
        w.id(id);
    }
    w.buf
}

pub fn parse_have_request(b: &[u8]) -> Result<Vec<ChunkId>> {
    let mut r = Reader::new(b, "have request");
    if r.bytes(8, "magic")? != HAVE_MAGIC {
        return Err(corrupt("have request: bad magic"));
    }
    let n = r.u32("count")? as usize;
    if n > MAX_HAVE || n * 32 != r.remaining() {
        return Err(corrupt(format!(
            "have request: count {n} does not match the body"
        )));
    }
    (0..n).map(|_| r.id("id")).collect()
}

pub fn encode_have_answer(have: &[bool]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&HAVE_MAGIC).u32(have.len() as u32);
    let mut bits = vec![0u8; have.len().div_ceil(8)];
    for (i, h) in have.iter().enumerate() {
        if *h {
            bits[i / 8] |= 1 << (i % 8);
        }
    }
    w.bytes(&bits);
    w.buf
}

pub fn parse_have_answer(b: &[u8], expect: usize) -> Result<Vec<bool>> {
    let mut r = Reader::new(b, "have answer");
    if r.bytes(8, "magic")? != HAVE_MAGIC {
        return Err(corrupt("have answer: bad magic"));
    }
    let n = r.u32("count")? as usize;
    if n != expect {
        return Err(corrupt(format!(
            "have answer for {n} ids, asked about {expect}"
        )));
    }
    let bits = r.bytes(n.div_ceil(8), "bitmap")?;
    r.finish()?;
    Ok((0..n).map(|i| bits[i / 8] & (1 << (i % 8)) != 0).collect())
}

pub fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn from_nanos(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n)
}

pub fn encode_list_header() -> Vec<u8> {
    LIST_MAGIC.to_vec()
}

pub fn encode_list_entry(w: &mut Vec<u8>, e: &ObjectEntry) {
    w.extend_from_slice(&e.id.0);
    w.extend_from_slice(&nanos(e.mtime).to_le_bytes());
    w.extend_from_slice(&e.size.to_le_bytes());
}

pub fn parse_list(b: &[u8], f: &mut dyn FnMut(ObjectEntry)) -> Result<()> {
    let mut r = Reader::new(b, "object listing");
    if r.bytes(8, "magic")? != LIST_MAGIC {
        return Err(corrupt("object listing: bad magic"));
    }
    if !r.remaining().is_multiple_of(48) {
        return Err(corrupt("object listing is truncated"));
    }
    while r.remaining() > 0 {
        let id = r.id("id")?;
        let mtime = from_nanos(r.u64("mtime")?);
        let size = r.u64("size")?;
        f(ObjectEntry { id, mtime, size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn have_round_trip() {
        let ids = vec![ChunkId([1; 32]), ChunkId([2; 32]), ChunkId([3; 32])];
        assert_eq!(parse_have_request(&encode_have_request(&ids)).unwrap(), ids);
        let a = vec![true, false, true];
        assert_eq!(parse_have_answer(&encode_have_answer(&a), 3).unwrap(), a);
        assert!(parse_have_answer(&encode_have_answer(&a), 4).is_err());
        let b = encode_have_request(&ids);
        assert!(parse_have_request(&b[..b.len() - 1]).is_err());
    }
}
