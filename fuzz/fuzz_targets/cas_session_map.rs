//! The session map file (`SESSION/states`): `map::Header::parse` and
//! `map::replay` on arbitrary bytes. Byte 0 is the mode: even parses the
//! rest as is; odd first rewrites the header CRC and the record chain
//! (`fixup::cas_session_map`) so mutations reach the record logic.
//!
//! Checks, as for `cow_map`: replay fails exactly when the header does
//! not parse (with the same error); on success the header round-trips,
//! `valid_len` is the header plus whole records inside the file and
//! `discarded` the rest; every committed run is non-empty, has a state of
//! 0..=3 and lies inside the disk's sectors; no commit means no runs and
//! the header's chain seed; replaying the valid prefix gives the same
//! state, and a commit appended there (what the session does at its next
//! flush) is accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_cas::session::map::{self, Header, HEADER_SIZE, RECORD_SIZE};
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_session_map) else {
        return;
    };
    let r = match map::replay(&b) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            assert_eq!(
                Header::parse(&b),
                Err(e),
                "replay and Header::parse disagree"
            );
            return;
        }
    };
    let h = r.header;
    assert_eq!(Header::parse(&b), Ok(h));
    assert_eq!(
        Header::parse(&h.encode()),
        Ok(h),
        "header does not round-trip"
    );
    assert_eq!(&h.encode()[..], &b[..HEADER_SIZE]);
    assert!(!h.base.is_zero());
    assert!(r.valid_len >= HEADER_SIZE && r.valid_len <= b.len());
    assert_eq!((r.valid_len - HEADER_SIZE) % RECORD_SIZE, 0);
    assert_eq!(r.discarded, b.len() - r.valid_len);
    let sectors = h.sectors();
    for run in &r.runs {
        assert!(run.count > 0 && run.state <= 3, "{run:?}");
        let end = run.start.checked_add(run.count as u64);
        assert!(
            end.is_some_and(|e| e <= sectors),
            "{run:?} outside {sectors} sectors"
        );
    }
    if r.last_seq == 0 {
        assert!(r.runs.is_empty());
        assert_eq!(r.valid_len, HEADER_SIZE);
        let mut hb = [0u8; HEADER_SIZE];
        hb.copy_from_slice(&b[..HEADER_SIZE]);
        assert_eq!(r.chain, Header::chain_seed(&hb));
    }
    assert!(r.last_seq as usize <= (r.valid_len - HEADER_SIZE) / RECORD_SIZE);

    let mut prefix = b[..r.valid_len].to_vec();
    let again = map::replay(&prefix).expect("valid prefix replays");
    assert_eq!(again.runs, r.runs);
    assert_eq!(again.last_seq, r.last_seq);
    assert_eq!(again.chain, r.chain);
    assert_eq!(again.discarded, 0);

    let s = map::encode_record(map::KIND_SET, 3, 1, 0, r.chain);
    let c = map::encode_record(map::KIND_COMMIT, 0, 0, r.last_seq + 1, map::record_crc(&s));
    prefix.extend_from_slice(&s);
    prefix.extend_from_slice(&c);
    let next = map::replay(&prefix).expect("extended map replays");
    assert_eq!(next.last_seq, r.last_seq + 1);
    assert_eq!(next.valid_len, r.valid_len + 2 * RECORD_SIZE);
    assert_eq!(next.runs.len(), r.runs.len() + 1);
    assert_eq!(next.chain, map::record_crc(&c));
});
