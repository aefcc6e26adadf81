//! `roamdisk_roam::session::workset::decode` on arbitrary bytes (a session's
//! recorded working set, for a disk of 4096 chunks). The first byte is the
//! mode (`fixup::input`): with the fix-up bit, the trailing CRC is
//! rewritten first so mutations reach the count and the chunk numbers. A
//! recording that decodes must be unique, in range, and re-encode to
//! exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::session::workset::{decode, encode};

const RECORDS: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::trailing_crc) else {
        return;
    };
    if let Ok(order) = decode(&b, RECORDS) {
        let mut seen = std::collections::HashSet::new();
        assert!(order
            .iter()
            .all(|&c| (c as usize) < RECORDS && seen.insert(c)));
        assert_eq!(
            encode(&order),
            b,
            "working set does not re-encode to its input"
        );
    }
});
