//! `roamdisk_cas::cache::pins::decode` on arbitrary bytes. The first byte
//! is the mode: even decodes the rest as is; odd first rewrites the
//! trailing CRC so mutations reach the count and ids. A set that decodes
//! must re-encode to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_cas::cache::pins::{decode, encode};

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
    if let Ok(ids) = decode(&b) {
        assert_eq!(encode(&ids), b, "pin set does not re-encode to its input");
    }
});
