//! `roamdisk_roam::lookaside::decode_index` on arbitrary bytes. The first
//! byte is the mode (`fixup::input`): with the fix-up bit, the trailing CRC is
//! rewritten first so mutations reach the identity and the entries. An index
//! that decodes must re-encode to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::lookaside::{decode_index, encode_index};

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::trailing_crc) else {
        return;
    };
    if let Ok((who, entries)) = decode_index(&b) {
        assert_eq!(
            encode_index(&who, &entries),
            b,
            "index does not re-encode to its input"
        );
    }
});
