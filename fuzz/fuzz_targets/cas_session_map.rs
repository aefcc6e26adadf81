//! The session map file (`SESSION/states`): the overlay-map log with the
//! session header, replayed from arbitrary bytes. Byte 0 is the mode: even
//! parses the rest as is; odd first rewrites the header CRC and the record
//! chain (`fixup::cas_session_map`) so mutations reach the record logic.
//! The checks are the overlay-map engine's
//! (`roamdisk_fuzz::overlay::check`), plus a non-zero base version.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::session::map::Header;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_session_map) else {
        return;
    };
    if let Some(r) = roamdisk_fuzz::overlay::check::<Header>(&b) {
        assert!(!r.header.base.is_zero());
    }
});
