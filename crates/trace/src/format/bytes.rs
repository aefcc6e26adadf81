//! Byte-stream helpers the decoders share.

use std::io::Read;

/// Read into `buf` until it is full or the stream ends; returns how many
/// bytes were read (short only at the end of the stream).
pub(crate) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
