//! The checks both overlay-map targets (`cow_map`, `cas_session_map`) make
//! on a replay, for any header of the overlay-map engine
//! (`docs/formats/overlay-map.md`).

use roamdisk_blockdev::overlay::log::{self, MapHeader, Replay, HEADER_SIZE, RECORD_SIZE};

/// Replay `b` and check the result is self-consistent: replay fails exactly
/// when the header does not parse (with the same error); on success the
/// header round-trips, `valid_len` is the header plus whole records inside
/// the file and `discarded` the rest; every committed run is non-empty,
/// has a valid state and lies inside the map; no commit means no runs and
/// the header's chain seed; replaying the valid prefix gives the same
/// state, and a SET + COMMIT appended there (what a layer does at its next
/// flush) is accepted. Returns the replay for target-specific checks.
pub fn check<H: MapHeader + PartialEq + std::fmt::Debug>(b: &[u8]) -> Option<Replay<H>> {
    let r = match log::replay::<H>(b) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            assert_eq!(
                log::parse_header::<H>(b).err(),
                Some(e),
                "replay and parse_header disagree"
            );
            return None;
        }
    };
    let h = r.header.clone();
    assert_eq!(log::parse_header::<H>(b).ok(), Some(h.clone()));
    let mut hb = [0u8; HEADER_SIZE];
    hb.copy_from_slice(&b[..HEADER_SIZE]);
    assert_eq!(
        log::parse_header::<H>(&log::encode_header(&h)).ok(),
        Some(h.clone()),
        "header does not round-trip"
    );

    assert!(r.valid_len >= HEADER_SIZE && r.valid_len <= b.len());
    assert_eq!((r.valid_len - HEADER_SIZE) % RECORD_SIZE, 0);
    assert_eq!(r.discarded, b.len() - r.valid_len);
    let units = h.units();
    for run in &r.runs {
        assert!(run.count > 0 && run.state <= H::MAX_STATE, "{run:?}");
        let end = run.start.checked_add(run.count as u64);
        assert!(
            end.is_some_and(|e| e <= units),
            "{run:?} outside {units} units"
        );
    }
    if r.last_seq == 0 {
        assert!(r.runs.is_empty());
        assert_eq!(r.valid_len, HEADER_SIZE);
        assert_eq!(r.chain, log::chain_seed(&hb));
    }
    // Commits are numbered 1, 2, ... and each takes a record.
    assert!(r.last_seq <= r.records());

    // Truncating to the valid prefix (recovery) changes nothing.
    let mut prefix = b[..r.valid_len].to_vec();
    let again = log::replay::<H>(&prefix).expect("valid prefix replays");
    assert_eq!(again.runs, r.runs);
    assert_eq!(again.last_seq, r.last_seq);
    assert_eq!(again.chain, r.chain);
    assert_eq!(again.discarded, 0);

    // Appending the next flush there is accepted.
    if units > 0 {
        let s = log::encode_record(log::KIND_SET, H::MAX_STATE, 1, 0, r.chain);
        let c = log::encode_record(log::KIND_COMMIT, 0, 0, r.last_seq + 1, log::record_crc(&s));
        prefix.extend_from_slice(&s);
        prefix.extend_from_slice(&c);
        let next = log::replay::<H>(&prefix).expect("extended map replays");
        assert_eq!(next.last_seq, r.last_seq + 1);
        assert_eq!(next.valid_len, r.valid_len + 2 * RECORD_SIZE);
        assert_eq!(next.runs.len(), r.runs.len() + 1);
        assert_eq!(next.chain, log::record_crc(&c));
    }
    Some(r)
}

/// A map file for seeds: `h`'s header followed by `records`
/// (kind, state, count, start), chained. Returns the header and the file.
pub fn map_file<H: MapHeader>(h: &H, records: &[(u8, u8, u32, u64)]) -> (Vec<u8>, Vec<u8>) {
    let hb = log::encode_header(h);
    let mut chain = log::chain_seed(&hb);
    let mut f = hb.to_vec();
    for &(kind, state, count, start) in records {
        let r = log::encode_record(kind, state, count, start, chain);
        chain = log::record_crc(&r);
        f.extend_from_slice(&r);
    }
    (hb.to_vec(), f)
}
