//! The batch get bodies of the HTTP chunk protocol: `wire::parse_get_request`
//! (what a chunk server reads from any client) and `wire::parse_get_answer`
//! (what a client reads from a chunk server, perhaps a broken or hostile
//! one) on arbitrary bytes. Byte 0: bit 1 picks the parser (clear: request,
//! set: answer); for an answer, byte 1 is the number of ids asked for. Bit 0
//! ([`fixup::FIXUP`]) frames the rest first, so mutations get past the
//! framing: a request's count is rewritten to match its body; an answer is
//! built from the rest as entries (a status byte taken mod 4, so the unknown
//! status 3 occurs; for a found object a one-byte length and that many
//! bytes; bit 7 of the status byte gives any other entry a stray length of
//! one) behind the magic and a count of the entries built.
//!
//! Checks: errors are `corrupt`; whatever parses re-encodes to exactly its
//! input (the encoders are the server's); a request holds 1 to `MAX_GET`
//! ids; an answer has exactly as many entries as asked for and at most
//! `MAX_GET_BYTES` of objects.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkstore::store::wire::{self, Got, GET_MAGIC, GOT_FOUND, MAX_GET, MAX_GET_BYTES};
use roamdisk_fuzz::fixup::{self, FIXUP};

/// A well-framed answer made of the entries `rest` describes.
fn frame(rest: &[u8]) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut n = 0;
    let mut it = rest.iter().copied();
    while let Some(s) = it.next() {
        let status = s % 4;
        let len = match (status, s & 0x80 != 0) {
            (GOT_FOUND, _) => it.next().unwrap_or(0) as usize,
            (_, true) => 1,
            _ => 0,
        };
        body.push(status);
        body.extend((len as u32).to_le_bytes());
        body.extend((0..len).map(|_| it.next().unwrap_or(0)));
        n += 1;
    }
    let mut b = GET_MAGIC.to_vec();
    b.extend((n as u32).to_le_bytes());
    b.extend(body);
    (b, n)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fix = mode & FIXUP != 0;
    if mode & 2 == 0 {
        let mut b = rest.to_vec();
        if fix {
            fixup::cas_id_request(&mut b);
        }
        match wire::parse_get_request(&b) {
            Ok(ids) => {
                assert!((1..=MAX_GET).contains(&ids.len()));
                assert_eq!(wire::encode_get_request(&ids), b);
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}"),
        }
        return;
    }
    let Some((&asked, rest)) = rest.split_first() else {
        return;
    };
    let (b, asked) = if fix {
        frame(rest)
    } else {
        (rest.to_vec(), asked as usize)
    };
    match wire::parse_get_answer(&b, asked) {
        Ok(got) => {
            assert_eq!(got.len(), asked);
            let bytes: usize = got.iter().map(Got::object_len).sum();
            assert!(bytes as u64 <= MAX_GET_BYTES);
            assert_eq!(
                wire::encode_get_answer(&got),
                b,
                "answer does not re-encode to its input"
            );
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}"),
    }
});
