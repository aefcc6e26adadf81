//! The HTTP chunk protocol bodies: `wire::parse_have_request`,
//! `parse_have_answer` and `parse_list` on arbitrary bytes. Byte 0
//! selects (mod 3) the parser; for the answer, byte 1 is the number of
//! ids the client asked about (an answer body is only meaningful against
//! a request). Bit 2 of byte 0 rewrites the count field to match the
//! body, so mutations reach the ids and bits.
//!
//! Checks: whatever parses re-encodes to exactly its input (the encoders
//! are the server's and client's); a have request holds at most
//! `MAX_HAVE` ids; an answer has exactly the asked-for length; a listing
//! yields one entry per 48 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::store::wire::{self, MAX_HAVE};
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let fix = mode & 4 != 0;
    match mode % 3 {
        0 => {
            let mut b = rest.to_vec();
            if fix {
                fixup::cas_id_request(&mut b);
            }
            match wire::parse_have_request(&b) {
                Ok(ids) => {
                    assert!(ids.len() <= MAX_HAVE);
                    assert_eq!(wire::encode_have_request(&ids), b);
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
        1 => {
            let Some((&expect, rest)) = rest.split_first() else {
                return;
            };
            let expect = expect as usize * 3;
            let mut b = rest.to_vec();
            if fix && b.len() >= 12 {
                b[8..12].copy_from_slice(&(expect as u32).to_le_bytes());
                b.resize(12 + expect.div_ceil(8), 0);
            }
            match wire::parse_have_answer(&b, expect) {
                Ok(have) => {
                    assert_eq!(have.len(), expect);
                    // Unused bits of the last byte are not part of the answer.
                    let again = wire::encode_have_answer(&have);
                    assert_eq!(again.len(), b.len());
                    assert_eq!(
                        wire::parse_have_answer(&again, expect).expect("re-encoded"),
                        have
                    );
                    if expect % 8 == 0 {
                        assert_eq!(again, b);
                    }
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
        _ => {
            let mut entries = Vec::new();
            match wire::parse_list(rest, &mut |e| entries.push(e)) {
                Ok(()) => {
                    assert_eq!(entries.len(), (rest.len() - 8) / 48);
                    let mut again = wire::encode_list_header();
                    for e in &entries {
                        wire::encode_list_entry(&mut again, e);
                    }
                    assert_eq!(again, rest, "listing does not re-encode to its input");
                }
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }
});
