//! `roamdisk_cas::lookaside::decode_index` on arbitrary bytes. The first
//! byte is the mode: even decodes the rest as is; odd first rewrites the
//! trailing CRC so mutations reach the identity and the entries. An index
//! that decodes must re-encode to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_cas::lookaside::{decode_index, encode_index};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if mode % 2 == 1 && b.len() >= 4 {
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
    }
    if let Ok((who, entries)) = decode_index(&b) {
        assert_eq!(encode_index(&who, &entries), b, "index does not re-encode to its input");
    }
});
