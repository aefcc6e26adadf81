//! `roamdisk_chunkstore::index::Index::parse` on arbitrary bytes, as a committed
//! version's index and as a session's. Byte 0 is the mode: bit 0 rewrites
//! the record count, payload length and both CRCs (`fixup::cas_index`) so
//! mutations reach the records and the zstd payload.
//!
//! Checks: the committed parse succeeds only if the session parse does,
//! with the same result; a parsed index has the geometry the header
//! promises (records = disk / chunk rounded up, state bytes per record,
//! keys for every record or none); committed indexes hold only EMPTY and
//! ZERO sectors and a zero name exactly for all-ZERO records; the index
//! round-trips through `encode` (raw and zstd) and an uncompressed one
//! re-encodes to exactly its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::index::{
    valid_chunk_size, Index, SectorState, FLAG_ZSTD, MAX_DISK, SECTOR,
};
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_index) else {
        return;
    };
    let session = Index::parse(&b, false);
    let committed = Index::parse(&b, true);
    let idx = match (session, committed) {
        (Err(e), Err(_)) => {
            let _ = e.to_string();
            return;
        }
        (Ok(_), Err(e)) => {
            assert!(e.to_string().contains("index record"), "{e}");
            return;
        }
        (Err(e), Ok(_)) => panic!("committed parse accepts what the session parse refuses: {e}"),
        (Ok(s), Ok(c)) => {
            assert_eq!(s, c);
            c
        }
    };
    assert!(valid_chunk_size(idx.chunk_size));
    assert!(idx.disk_size > 0 && idx.disk_size % SECTOR == 0 && idx.disk_size <= MAX_DISK);
    let n = idx.disk_size.div_ceil(idx.chunk_size as u64) as usize;
    assert_eq!(idx.records(), n);
    assert_eq!(idx.states.len(), n * idx.state_bytes());
    assert!(idx.keys.is_empty() || idx.keys.len() == n);
    let mut data_bytes = 0u64;
    for i in 0..n {
        assert!(idx.chunk_len(i) > 0 && idx.chunk_len(i) <= idx.chunk_size as usize);
        let mut all_zero = true;
        for s in 0..idx.chunk_sectors() {
            match idx.state(i, s) {
                SectorState::Empty => all_zero = false,
                SectorState::Zero => {}
                other => panic!("committed index has {other:?}"),
            }
        }
        assert_eq!(all_zero, idx.ids[i].is_zero());
        if !all_zero {
            data_bytes += idx.chunk_len(i) as u64;
        }
    }
    assert_eq!(idx.data_bytes(), data_bytes);
    let raw = idx.encode(None);
    if u32::from_le_bytes(b[12..16].try_into().unwrap()) & FLAG_ZSTD == 0 {
        assert_eq!(raw, b, "raw index does not re-encode to its input");
    }
    assert_eq!(Index::parse(&raw, true).expect("re-encoded raw index"), idx);
    let z = idx.encode(Some(1));
    assert_eq!(Index::parse(&z, true).expect("re-encoded zstd index"), idx);
});
