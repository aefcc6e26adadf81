//! The batch put bodies of the HTTP chunk protocol: `wire::parse_put_request`
//! (what a chunk server reads from any client) and `wire::parse_put_answer`
//! (what a client reads from a chunk server, perhaps a broken or hostile
//! one) on arbitrary bytes. Byte 0: bit 1 picks the parser (clear: request,
//! set: answer); for an answer, byte 1 is the number of objects sent. Bit 0
//! ([`fixup::FIXUP`]) frames the rest first, so mutations get past the
//! framing: a request is built from the rest as entries (an id of 32 copies
//! of one byte, a one-byte length and that many bytes) behind the magic and
//! a count of the entries built; an answer's count is rewritten to the
//! statuses that follow it.
//!
//! Checks: errors are `corrupt`; whatever parses re-encodes to exactly its
//! input (the encoders are the client's and the server's); a request holds
//! 1 to `MAX_PUT` objects, no id twice, at most `MAX_PUT_BYTES`; an answer
//! has exactly as many statuses as objects were sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkstore::store::wire::{self, MAX_PUT, MAX_PUT_BYTES, PUT_MAGIC};
use roamdisk_chunkstore::ChunkId;
use roamdisk_fuzz::fixup::{self, FIXUP};

/// A well-framed request made of the entries `rest` describes.
fn frame(rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut n = 0u32;
    let mut it = rest.iter().copied();
    while let Some(id) = it.next() {
        let len = it.next().unwrap_or(0) as usize;
        body.extend(ChunkId([id; 32]).0);
        body.extend((len as u32).to_le_bytes());
        body.extend((0..len).map(|_| it.next().unwrap_or(0)));
        n += 1;
    }
    let mut b = PUT_MAGIC.to_vec();
    b.extend(n.to_le_bytes());
    b.extend(body);
    b
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fix = mode & FIXUP != 0;
    if mode & 2 == 0 {
        let b = if fix { frame(rest) } else { rest.to_vec() };
        match wire::parse_put_request(&b) {
            Ok(items) => {
                assert!((1..=MAX_PUT).contains(&items.len()));
                let bytes: usize = items.iter().map(|(_, o)| o.len()).sum();
                assert!(bytes as u64 <= MAX_PUT_BYTES);
                let ids: std::collections::HashSet<_> = items.iter().map(|(id, _)| *id).collect();
                assert_eq!(ids.len(), items.len(), "an id twice");
                assert_eq!(wire::encode_put_request(&items), b);
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}"),
        }
        return;
    }
    let Some((&sent, rest)) = rest.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if fix {
        fixup::cas_status_answer(&mut b);
    }
    match wire::parse_put_answer(&b, sent as usize) {
        Ok(out) => {
            assert_eq!(out.len(), sent as usize);
            assert_eq!(
                wire::encode_put_answer(&out),
                b,
                "answer does not re-encode to its input"
            );
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}"),
    }
});
