//! `roamdisk_roam::memory::workset::decode` on arbitrary bytes (the memory
//! working set a lazy resume recorded in its session). The first byte is
//! the mode (`fixup::input`): with the fix-up bit, the trailing CRC is
//! rewritten first so mutations reach the count and the pairs. A
//! recording that decodes re-encodes to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::memory::workset::{decode, encode, MAX};

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::trailing_crc) else {
        return;
    };
    match decode(&b) {
        Ok(order) => {
            assert!(order.len() <= MAX);
            assert_eq!(encode(&order), b, "does not re-encode to its input");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
