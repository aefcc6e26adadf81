//! `parse_request` on arbitrary bytes: it accepts exactly the inputs of at
//! least 28 bytes that start with the request magic, decodes them so that
//! `encode_request` gives the same 28 bytes back, and `allowed_flags` only
//! ever allows known command flags.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_nbd::proto::*;

const KNOWN_FLAGS: u16 =
    CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;

fuzz_target!(|data: &[u8]| {
    let magic_ok = data.len() >= 4 && data[..4] == REQUEST_MAGIC.to_be_bytes();
    match parse_request(data) {
        Ok(q) => {
            assert!(magic_ok && data.len() >= REQUEST_SIZE);
            assert_eq!(encode_request(&q)[..], data[..REQUEST_SIZE]);
            let allowed = allowed_flags(q.cmd);
            assert_eq!(
                allowed & !KNOWN_FLAGS,
                0,
                "cmd {} allows unknown flags",
                q.cmd
            );
            if q.cmd > CMD_BLOCK_STATUS {
                assert_eq!(allowed, 0, "unknown command {} allows flags", q.cmd);
            }
        }
        Err(e) => {
            let _ = e.to_string();
            match e {
                ProtoError::BadMagic(m) => {
                    assert!(data.len() >= 4 && !magic_ok);
                    assert_eq!(m.to_be_bytes()[..], data[..4]);
                }
                ProtoError::Short { got, need } => {
                    assert!(data.len() < REQUEST_SIZE);
                    assert_eq!(got, data.len());
                    assert!(need > got && need <= REQUEST_SIZE);
                }
                other => panic!("unexpected error {other:?}"),
            }
        }
    }
});
