//! Helpers for the `workload_trace` target: a framed binary trace built
//! around fuzz bytes, and a reader that returns few bytes per call.

use roamdisk_trace::format::binary::{
    CHK_COUNT, CHK_CRC, CHK_PAYLOAD_LEN, CHUNK_HEADER_LEN, HDR_CRC, HDR_FLAGS, HDR_MAGIC,
    HDR_VERSION, HEADER_LEN, MAGIC, VERSION,
};

/// The binary file header (`docs/formats/trace.md`).
pub fn binary_header() -> Vec<u8> {
    let mut h = vec![0u8; HEADER_LEN];
    h[HDR_MAGIC..HDR_VERSION].copy_from_slice(&MAGIC);
    h[HDR_VERSION..HDR_FLAGS].copy_from_slice(&VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&h[..HDR_CRC]);
    h[HDR_CRC..].copy_from_slice(&crc.to_le_bytes());
    h
}

fn chunk(out: &mut Vec<u8>, count: u32, payload: &[u8]) {
    let mut h = [0u8; CHUNK_HEADER_LEN];
    h[CHK_PAYLOAD_LEN..CHK_COUNT].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[CHK_COUNT..CHK_CRC].copy_from_slice(&count.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..CHK_CRC]), payload);
    h[CHK_CRC..].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
}

/// A binary trace framed around `data`: the file header, then chunks
/// `[count u8][length u8][payload]` of the input, each written with its
/// count, length and a correct CRC, then an end marker with the total
/// count. The payloads (the delta/varint records) are the fuzzer's.
pub fn frame_binary(data: &[u8]) -> Vec<u8> {
    let mut out = binary_header();
    let mut total = 0u64;
    let mut rest = data;
    while rest.len() >= 2 {
        let count = rest[0] as u32;
        let len = (rest[1] as usize).min(rest.len() - 2);
        let payload = &rest[2..2 + len];
        if count == 0 {
            // A zero count is the end marker: let the fuzzer write one
            // (with whatever payload) and stop there.
            chunk(&mut out, 0, payload);
            return out;
        }
        chunk(&mut out, count, payload);
        total += count as u64;
        rest = &rest[2 + len..];
    }
    chunk(&mut out, 0, &total.to_le_bytes());
    out
}

/// A reader that hands out at most `step` bytes per `read`.
pub struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
}

impl Trickle {
    pub fn new(data: Vec<u8>, step: usize) -> Trickle {
        Trickle { data, at: 0, step }
    }
}

impl std::io::Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
