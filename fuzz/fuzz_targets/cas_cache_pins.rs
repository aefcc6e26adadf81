//! `roamdisk_roam::cache::pins::decode` on arbitrary bytes. The first byte
//! is the mode (`fixup::input`): with the fix-up bit, the trailing CRC is
//! rewritten first so mutations reach the count and ids. A set that decodes
//! must re-encode to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::cache::pins::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::trailing_crc) else {
        return;
    };
    if let Ok(ids) = decode(&b) {
        assert_eq!(encode(&ids), b, "pin set does not re-encode to its input");
    }
});
