//! The cow map (`OVERLAY.cowmap`): the overlay-map log with the cow header,
//! replayed from arbitrary bytes. The first byte is the mode: even feeds
//! the rest as is; odd first rewrites every checksum
//! (`fix_cow_map_checksums`) so mutations reach the record logic. The
//! checks are the overlay-map engine's (`roamdisk_fuzz::overlay::check`),
//! plus a valid cluster size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::layers::cow::map::{self, Header};
use roamdisk_fuzz::{fix_cow_map_checksums, COW_FIXUP};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if mode & 1 == COW_FIXUP {
        fix_cow_map_checksums(&mut b);
    }
    if let Some(r) = roamdisk_fuzz::overlay::check::<Header>(&b) {
        assert!(map::valid_cluster_size(r.header.cluster_size));
    }
});
