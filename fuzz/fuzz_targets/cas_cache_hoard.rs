//! `roamdisk_roam::cache::hoard_marks::decode` on arbitrary bytes. The first
//! byte is the mode (`fixup::input`): with the fix-up bit, the trailing CRC
//! is rewritten first so mutations reach the lengths, the name and the ids.
//! A mark that decodes has a non-zero version, a name of 1 to 1024 bytes,
//! strictly ascending non-zero ids, and re-encodes to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::cache::hoard_marks::{decode, encode, MAX_NAME};

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::trailing_crc) else {
        return;
    };
    if let Ok(m) = decode(&b) {
        assert!(!m.version.is_zero());
        assert!(!m.name.is_empty() && m.name.len() <= MAX_NAME);
        assert!(m.ids.iter().all(|id| !id.is_zero()));
        assert!(m.ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(encode(&m), b, "hoard mark does not re-encode to its input");
    }
});
