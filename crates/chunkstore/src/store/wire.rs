//! Binary bodies of the HTTP chunk protocol (`docs/formats/cas-http.md`):
//! the batch "which of these do you have" request and answer, the batch
//! get and the batch put (many objects in one request) and the object
//! listing. Pure encoding and parsing (fuzz targets `cas_wire`,
//! `cas_wire_get` and `cas_wire_put`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::bytes::{Reader, Writer};
use crate::chunk::{HEADER_SIZE, MAX_OBJECT};
use crate::error::corrupt;
use crate::hash::ChunkId;
use crate::store::api::{ObjectEntry, ObjectParts, PutOutcome};
use roamdisk_blockdev::Result;

pub const HAVE_MAGIC: [u8; 8] = *b"RDHAVE01";
pub const LIST_MAGIC: [u8; 8] = *b"RDLIST01";
/// Most ids in one have request.
pub const MAX_HAVE: usize = 1 << 20;
pub const GET_MAGIC: [u8; 8] = *b"RDGETS01";
/// Most ids in one batch get request.
pub const MAX_GET: usize = 256;
/// Most object bytes (the sum of the entries' lengths) in one batch get
/// answer: what does not fit is "not sent" and asked for again.
pub const MAX_GET_BYTES: u64 = 32 << 20;

roamdisk_blockdev::offsets! {
    // The batch get answer, per entry: status (u8), length (u32), bytes.
    G_STATUS: 1, G_LEN: 4;
    /// Bytes of an entry before its object.
    pub GET_ENTRY_HEADER == 5
}
/// Bytes of a batch get request or answer before its entries: magic,
/// count.
pub const GET_HEADER: usize = 8 + 4;
/// The longest batch get answer.
pub const MAX_GET_ANSWER: u64 =
    GET_HEADER as u64 + (MAX_GET * GET_ENTRY_HEADER) as u64 + MAX_GET_BYTES;
const _: () = assert!(MAX_GET_BYTES as usize <= MAX_OBJECT + HEADER_SIZE);
const _: () = assert!(MAX_GET_ANSWER <= u32::MAX as u64);

pub const PUT_MAGIC: [u8; 8] = *b"RDPUTS01";
/// Most objects in one batch put request.
pub const MAX_PUT: usize = 256;
/// Most object bytes (the sum of the entries' lengths) in one batch put
/// request: a larger object goes alone, in a PUT of its own.
pub const MAX_PUT_BYTES: u64 = 32 << 20;
/// Bytes of a batch put request's entry before its object: id, length.
pub const PUT_ENTRY_HEADER: usize = 32 + 4;
/// The longest batch put request.
pub const MAX_PUT_REQUEST: u64 =
    GET_HEADER as u64 + (MAX_PUT * PUT_ENTRY_HEADER) as u64 + MAX_PUT_BYTES;
const _: () = assert!(MAX_PUT_REQUEST as usize <= MAX_OBJECT + HEADER_SIZE);
/// Entry statuses of a batch put answer.
pub const PUT_EXISTED: u8 = 0;
pub const PUT_STORED: u8 = 1;

/// Entry statuses of a batch get answer.
pub const GOT_MISSING: u8 = 0;
pub const GOT_FOUND: u8 = 1;
pub const GOT_NOT_SENT: u8 = 2;

/// One entry of a batch get answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// The server does not hold the object.
    Missing,
    /// The object's stored bytes (its envelope), unverified.
    Found(Vec<u8>),
    /// Not in this answer: the answer's byte budget was reached, or the
    /// server could not read it. Ask again (alone, a GET says why).
    NotSent,
}

impl Got {
    /// The length of the object, 0 for an entry without one.
    pub fn object_len(&self) -> usize {
        match self {
            Got::Found(b) => b.len(),
            _ => 0,
        }
    }
}

/// A request or answer's head: `magic`, then a count. Returns the reader
/// past it and the count; `what` names the body in errors.
fn read_head<'a>(b: &'a [u8], magic: [u8; 8], what: &'static str) -> Result<(Reader<'a>, usize)> {
    let mut r = Reader::new(b, what);
    if r.bytes(8, "magic")? != magic {
        return Err(corrupt(format!("{what}: bad magic")));
    }
    let n = r.u32("count")? as usize;
    Ok((r, n))
}

/// A request naming `ids`: `magic`, the count, the ids.
fn encode_ids(magic: [u8; 8], ids: &[ChunkId]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&magic).u32(ids.len() as u32);
    for id in ids {
        w.id(id);
    }
    w.buf
}

/// The rest of a request [`encode_ids`] wrote, whose head gave `n`: at
/// most `max` ids and nothing after them.
fn read_ids(mut r: Reader, n: usize, max: usize, what: &str) -> Result<Vec<ChunkId>> {
    if n > max || n * 32 != r.remaining() {
        return Err(corrupt(format!(
            "{what}: count {n} does not match the body"
        )));
    }
    (0..n).map(|_| r.id("id")).collect()
}

pub fn encode_have_request(ids: &[ChunkId]) -> Vec<u8> {
    encode_ids(HAVE_MAGIC, ids)
}

pub fn parse_have_request(b: &[u8]) -> Result<Vec<ChunkId>> {
    let (r, n) = read_head(b, HAVE_MAGIC, "have request")?;
    read_ids(r, n, MAX_HAVE, "have request")
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
    let (mut r, n) = read_head(b, HAVE_MAGIC, "have answer")?;
    if n != expect {
        return Err(corrupt(format!(
            "have answer for {n} ids, asked about {expect}"
        )));
    }
    let bits = r.bytes(n.div_ceil(8), "bitmap")?;
    r.finish()?;
    Ok((0..n).map(|i| bits[i / 8] & (1 << (i % 8)) != 0).collect())
}

pub fn encode_get_request(ids: &[ChunkId]) -> Vec<u8> {
    encode_ids(GET_MAGIC, ids)
}

/// A batch get request: 1 to [`MAX_GET`] ids.
pub fn parse_get_request(b: &[u8]) -> Result<Vec<ChunkId>> {
    let (r, n) = read_head(b, GET_MAGIC, "batch get request")?;
    if n == 0 || n > MAX_GET {
        return Err(corrupt(format!(
            "batch get request for {n} objects: 1 to {MAX_GET} may be asked for at once"
        )));
    }
    read_ids(r, n, MAX_GET, "batch get request")
}

/// The answer to a batch get request. Objects past [`MAX_GET_BYTES`] in
/// total are written as not sent (the server reads no more than that,
/// `ChunkRead::get_many_within`, so this only guards the limit).
pub fn encode_get_answer(got: &[Got]) -> Vec<u8> {
    let bytes: usize = got.iter().map(Got::object_len).sum();
    let mut w = Writer::new();
    w.buf
        .reserve(GET_HEADER + got.len() * GET_ENTRY_HEADER + bytes.min(MAX_GET_BYTES as usize));
    w.bytes(&GET_MAGIC).u32(got.len() as u32);
    let mut used = 0u64;
    for g in got {
        match g {
            Got::Found(b) if used + b.len() as u64 <= MAX_GET_BYTES => {
                used += b.len() as u64;
                w.u8(GOT_FOUND).u32(b.len() as u32).bytes(b);
            }
            Got::Missing => {
                w.u8(GOT_MISSING).u32(0);
            }
            _ => {
                w.u8(GOT_NOT_SENT).u32(0);
            }
        }
    }
    w.buf
}

/// Parse the answer to a batch get request of `asked` ids: exactly
/// `asked` entries, in the request's order, each a known status with a
/// length that is zero unless found, objects adding up to at most
/// [`MAX_GET_BYTES`], nothing after the last. Objects are not verified
/// here: the caller checks each against its name.
pub fn parse_get_answer(b: &[u8], asked: usize) -> Result<Vec<Got>> {
    let (mut r, n) = read_head(b, GET_MAGIC, "batch get answer")?;
    if n != asked {
        return Err(corrupt(format!(
            "batch get answer for {n} objects, asked for {asked}"
        )));
    }
    let mut used = 0u64;
    let mut out = Vec::with_capacity(n.min(MAX_GET));
    for k in 0..n {
        let status = r.u8("status")?;
        let len = r.u32("length")? as u64;
        match status {
            GOT_FOUND => {
                if len > MAX_GET_BYTES - used {
                    return Err(corrupt(format!(
                        "batch get answer: object {k} is {len} bytes, past the answer's limit of {MAX_GET_BYTES} bytes"
                    )));
                }
                used += len;
                out.push(Got::Found(r.bytes(len as usize, "object")?.to_vec()));
            }
            GOT_MISSING | GOT_NOT_SENT if len != 0 => {
                return Err(corrupt(format!(
                    "batch get answer: entry {k} has no object but a length of {len}"
                )));
            }
            GOT_MISSING => out.push(Got::Missing),
            GOT_NOT_SENT => out.push(Got::NotSent),
            s => {
                return Err(corrupt(format!(
                    "batch get answer: entry {k} has unknown status {s}"
                )));
            }
        }
    }
    r.finish()?;
    Ok(out)
}

/// A batch put request of `items` (1 to [`MAX_PUT`] objects of at most
/// [`MAX_PUT_BYTES`] together, no id twice: the caller splits).
pub fn encode_put_request(items: &[(ChunkId, &[u8])]) -> Vec<u8> {
    let parts: Vec<ObjectParts<'_>> = items.iter().map(|(id, b)| (*id, [*b, &[]])).collect();
    encode_put_request_parts(&parts)
}

/// [`encode_put_request`] of objects given in two pieces each (stored
/// back to back), copied once, into the request.
pub fn encode_put_request_parts(items: &[ObjectParts<'_>]) -> Vec<u8> {
    let bytes: usize = items.iter().map(|(_, p)| p[0].len() + p[1].len()).sum();
    let mut w = Writer::new();
    w.buf
        .reserve(GET_HEADER + items.len() * PUT_ENTRY_HEADER + bytes);
    w.bytes(&PUT_MAGIC).u32(items.len() as u32);
    for (id, [a, b]) in items {
        w.id(id).u32((a.len() + b.len()) as u32).bytes(a).bytes(b);
    }
    w.buf
}

/// Parse a batch put request: 1 to [`MAX_PUT`] entries, each an id, a
/// length and that many bytes, the lengths adding up to at most
/// [`MAX_PUT_BYTES`], no id twice, nothing after the last. The objects
/// are not verified here: the server checks each against its name.
pub fn parse_put_request(b: &[u8]) -> Result<Vec<(ChunkId, &[u8])>> {
    let (mut r, n) = read_head(b, PUT_MAGIC, "batch put request")?;
    if n == 0 || n > MAX_PUT {
        return Err(corrupt(format!(
            "batch put request of {n} objects: 1 to {MAX_PUT} may be sent at once"
        )));
    }
    let mut used = 0u64;
    let mut out: Vec<(ChunkId, &[u8])> = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::with_capacity(n);
    for k in 0..n {
        let id = r.id("id")?;
        let len = r.u32("length")? as u64;
        if len > MAX_PUT_BYTES - used {
            return Err(corrupt(format!(
                "batch put request: object {k} is {len} bytes, past the request's limit of {MAX_PUT_BYTES} bytes"
            )));
        }
        if !seen.insert(id) {
            return Err(corrupt(format!(
                "batch put request: object {id} is sent twice"
            )));
        }
        used += len;
        out.push((id, r.bytes(len as usize, "object")?));
    }
    r.finish()?;
    Ok(out)
}

/// The answer to a batch put request: one status per object, in order.
pub fn encode_put_answer(outcomes: &[PutOutcome]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&PUT_MAGIC).u32(outcomes.len() as u32);
    for o in outcomes {
        w.u8(match o {
            PutOutcome::Stored => PUT_STORED,
            PutOutcome::Existed => PUT_EXISTED,
        });
    }
    w.buf
}

/// Parse the answer to a batch put request of `sent` objects: exactly
/// `sent` known statuses, nothing after them.
pub fn parse_put_answer(b: &[u8], sent: usize) -> Result<Vec<PutOutcome>> {
    let (mut r, n) = read_head(b, PUT_MAGIC, "batch put answer")?;
    if n != sent {
        return Err(corrupt(format!(
            "batch put answer for {n} objects, sent {sent}"
        )));
    }
    let mut out = Vec::with_capacity(n.min(MAX_PUT));
    for k in 0..n {
        out.push(match r.u8("status")? {
            PUT_STORED => PutOutcome::Stored,
            PUT_EXISTED => PutOutcome::Existed,
            s => {
                return Err(corrupt(format!(
                    "batch put answer: entry {k} has unknown status {s}"
                )))
            }
        });
    }
    r.finish()?;
    Ok(out)
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

    #[test]
    fn put_round_trip_and_refusals() {
        let a = vec![5u8; 3000];
        let items: Vec<(ChunkId, &[u8])> = vec![
            (ChunkId([1; 32]), b"one"),
            (ChunkId([2; 32]), &a),
            (ChunkId([3; 32]), b""),
        ];
        let b = encode_put_request(&items);
        assert_eq!(parse_put_request(&b).unwrap(), items);
        for n in 0..b.len() {
            assert!(parse_put_request(&b[..n]).is_err(), "cut at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(parse_put_request(&long).is_err());
        let twice = encode_put_request(&[items[0], items[0]]);
        let e = parse_put_request(&twice).unwrap_err();
        assert!(e.to_string().contains("sent twice"), "{e}");
        assert!(parse_put_request(&encode_put_request(&[])).is_err());
        // Past the byte limit: 3 objects of 12 MiB.
        let big = vec![0u8; 12 << 20];
        let over: Vec<(ChunkId, &[u8])> = (0..3).map(|i| (ChunkId([i; 32]), &big[..])).collect();
        let e = parse_put_request(&encode_put_request(&over)).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        let outcomes = [PutOutcome::Stored, PutOutcome::Existed, PutOutcome::Stored];
        let ans = encode_put_answer(&outcomes);
        assert_eq!(parse_put_answer(&ans, 3).unwrap(), outcomes);
        assert!(parse_put_answer(&ans, 2).is_err());
        let mut bad = ans.clone();
        *bad.last_mut().unwrap() = 7;
        assert!(parse_put_answer(&bad, 3).is_err());
        assert!(parse_put_answer(&ans[..ans.len() - 1], 3).is_err());
    }

    fn sample() -> Vec<Got> {
        vec![
            Got::Found(b"first object".to_vec()),
            Got::Missing,
            Got::NotSent,
            Got::Found(Vec::new()),
            Got::Found(vec![7; 1000]),
        ]
    }

    #[test]
    fn get_round_trip() {
        let ids: Vec<ChunkId> = (0..5).map(|i| ChunkId([i; 32])).collect();
        assert_eq!(parse_get_request(&encode_get_request(&ids)).unwrap(), ids);
        let got = sample();
        let b = encode_get_answer(&got);
        assert_eq!(parse_get_answer(&b, 5).unwrap(), got);
        assert_eq!(
            b.len(),
            GET_HEADER + 5 * GET_ENTRY_HEADER + 12 + 1000,
            "the documented size"
        );
    }

    #[test]
    fn get_requests_are_bounded() {
        let err = |b: &[u8]| parse_get_request(b).unwrap_err().to_string();
        assert!(err(&encode_get_request(&[])).contains("1 to 256"));
        let many: Vec<ChunkId> = (0..=MAX_GET).map(|i| ChunkId([i as u8; 32])).collect();
        assert!(err(&encode_get_request(&many)).contains("1 to 256"));
        parse_get_request(&encode_get_request(&many[..MAX_GET])).unwrap();
        let mut b = encode_get_request(&many[..3]);
        b.push(0);
        assert!(err(&b).contains("does not match"));
        assert!(err(&b[..b.len() - 2]).contains("does not match"));
        assert!(err(b"RDHAVE01\x01\0\0\0").contains("bad magic"));
        assert!(err(b"RDGE").contains("truncated"));
    }

    /// Every answer a broken or hostile server could send is an error
    /// that says what is wrong, never a panic or a huge allocation.
    #[test]
    fn hostile_get_answers_are_errors() {
        let good = encode_get_answer(&sample());
        let err = |b: &[u8], asked: usize| parse_get_answer(b, asked).unwrap_err().to_string();
        // Truncated anywhere.
        for cut in 0..good.len() {
            let e = err(&good[..cut], 5);
            assert!(e.contains("truncated") || e.contains("magic"), "{cut}: {e}");
        }
        // Too long.
        let mut b = good.clone();
        b.push(0);
        assert!(err(&b, 5).contains("bytes"), "{}", err(&b, 5));
        // A count other than asked.
        assert!(err(&good, 4).contains("asked for 4"));
        assert!(err(&good, 6).contains("asked for 6"));
        // A huge count with no entries behind it fails on truncation.
        let mut b = good[..GET_HEADER].to_vec();
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(&b, u32::MAX as usize).contains("truncated"));
        // A length past the limit, or past the body.
        let mut b = encode_get_answer(&[Got::Found(vec![1; 8])]);
        b[GET_HEADER + G_LEN..GET_HEADER + GET_ENTRY_HEADER]
            .copy_from_slice(&(MAX_GET_BYTES as u32 + 1).to_le_bytes());
        assert!(err(&b, 1).contains("limit"), "{}", err(&b, 1));
        b[GET_HEADER + G_LEN..GET_HEADER + GET_ENTRY_HEADER]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(&b, 1).contains("limit"));
        b[GET_HEADER + G_LEN..GET_HEADER + GET_ENTRY_HEADER].copy_from_slice(&9u32.to_le_bytes());
        assert!(err(&b, 1).contains("truncated"));
        // Objects that add up past the limit, each within it.
        let half = (MAX_GET_BYTES / 2 + 1) as usize;
        let mut b = GET_MAGIC.to_vec();
        b.extend(2u32.to_le_bytes());
        for _ in 0..2 {
            b.push(GOT_FOUND);
            b.extend((half as u32).to_le_bytes());
            b.resize(b.len() + half, 0);
        }
        assert!(err(&b, 2).contains("object 1"), "{}", err(&b, 2));
        // An unknown status, a length on an entry without an object.
        let mut b = encode_get_answer(&[Got::Missing]);
        b[GET_HEADER + G_STATUS] = 3;
        assert!(err(&b, 1).contains("unknown status 3"));
        let mut b = encode_get_answer(&[Got::NotSent]);
        b[GET_HEADER + G_LEN] = 1;
        assert!(err(&b, 1).contains("no object"));
    }

    #[test]
    fn an_answer_keeps_to_its_byte_limit() {
        let big = vec![0u8; (MAX_GET_BYTES / 2) as usize];
        let got = vec![
            Got::Found(big.clone()),
            Got::Found(big.clone()),
            Got::Found(vec![1]),
            Got::Missing,
        ];
        let back = parse_get_answer(&encode_get_answer(&got), 4).unwrap();
        assert_eq!(back[..2], got[..2]);
        assert_eq!(back[2], Got::NotSent, "past the limit: not sent");
        assert_eq!(back[3], Got::Missing);
    }
}
