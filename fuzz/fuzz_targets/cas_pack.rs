//! Pack files (`docs/formats/cas-pack.md`): `pack::parse_header`,
//! `Trailer::parse` and `Trailer::parse_index` on a whole pack file, as the
//! local store reads one. Byte 0 odd = the trailer's index offset and
//! count made to fit the file and its checksum rewritten
//! (`fixup::cas_pack`), so mutations reach the index entries; bit 1 picks
//! the store's hash function (SHA-256, else BLAKE3).
//!
//! Checks: a rejected pack is `corrupt`; what parses has strictly
//! ascending ids, every object of at least an envelope header inside the
//! object area, and its index and trailer re-encode (`encode_tail`) to
//! exactly the file's last bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkstore::hash::HashKind;
use roamdisk_chunkstore::store::pack::{self, Trailer, HEADER_SIZE, TRAILER_SIZE};
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_pack) else {
        return;
    };
    let hash = match data[0] & 2 {
        0 => HashKind::Blake3,
        _ => HashKind::Sha256,
    };
    let parsed = pack::parse_header(&b, hash).and_then(|()| {
        let t = Trailer::parse(&b[b.len().saturating_sub(TRAILER_SIZE)..], b.len() as u64)?;
        let a = t.index_offset as usize;
        let entries = t.parse_index(&b[..HEADER_SIZE], &b[a..a + t.index_len()])?;
        Ok((t, entries))
    });
    match parsed {
        Ok((t, mut entries)) => {
            assert_eq!(entries.len(), t.count as usize);
            assert!(entries.windows(2).all(|w| w[0].id < w[1].id));
            for e in &entries {
                assert!(e.len >= 16 && e.offset >= HEADER_SIZE as u64);
                assert!(e
                    .offset
                    .checked_add(e.len as u64)
                    .is_some_and(|end| end <= t.index_offset));
            }
            let header: [u8; HEADER_SIZE] = b[..HEADER_SIZE].try_into().expect("header");
            let tail = pack::encode_tail(&header, &mut entries, t.index_offset);
            assert_eq!(
                tail,
                &b[t.index_offset as usize..],
                "tail does not re-encode"
            );
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            let _ = e.to_string();
        }
    }
});
