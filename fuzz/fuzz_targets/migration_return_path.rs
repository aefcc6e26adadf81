//! `roamdisk_migration::rp::RpReader` on arbitrary bytes: what a QEMU
//! destination sends its postcopy source (page requests, bitmaps, the
//! end). Every message up to the end or the first error. Checks: a page
//! request names a block; a bitmap is a whole number of 8-byte words and
//! within its bound; the reader never reads past the input; an error
//! prints.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_migration::rp::{RpMessage, RpReader, MAX_BITMAP};

fuzz_target!(|data: &[u8]| {
    let mut r = RpReader::new(data);
    loop {
        match r.read() {
            Ok(None) => break,
            Ok(Some(m)) => {
                match m {
                    RpMessage::ReqPages { block, .. } => assert!(!block.is_empty()),
                    RpMessage::RecvBitmap { block, bitmap } => {
                        assert!(!block.is_empty());
                        assert_eq!(bitmap.len() % 8, 0);
                        assert!(bitmap.len() as u64 <= MAX_BITMAP);
                    }
                    _ => {}
                }
                assert!(r.position() <= data.len() as u64);
            }
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
});
