//! `map::replay` (and so `Header::parse`) on arbitrary bytes. The first
//! byte is the mode: even feeds the rest as is; odd first rewrites every
//! checksum (`fix_cow_map_checksums`) so mutations reach the record logic.
//! When replay succeeds its result must be self-consistent: committed runs
//! inside the virtual size, `valid_len` a whole number of records inside
//! the file, replaying the valid prefix gives the same state, and a commit
//! appended there (what the cow layer does next) is accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::layers::cow::map::{self, Header, HEADER_SIZE, RECORD_SIZE};
use roamdisk_fuzz::{fix_cow_map_checksums, COW_FIXUP};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if mode & 1 == COW_FIXUP {
        fix_cow_map_checksums(&mut b);
    }
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
    assert!(map::valid_cluster_size(h.cluster_size));
    assert_eq!(
        Header::parse(&h.encode()),
        Ok(h),
        "header does not round-trip"
    );

    assert!(r.valid_len >= HEADER_SIZE && r.valid_len <= b.len());
    assert_eq!((r.valid_len - HEADER_SIZE) % RECORD_SIZE, 0);
    assert_eq!(r.discarded, b.len() - r.valid_len);
    let clusters = h.clusters();
    for run in &r.runs {
        assert!(run.count > 0, "empty run {run:?}");
        let end = run.start.checked_add(run.count as u64);
        assert!(
            end.is_some_and(|e| e <= clusters),
            "{run:?} outside {clusters} clusters"
        );
    }
    if r.last_seq == 0 {
        assert!(r.runs.is_empty());
        assert_eq!(r.valid_len, HEADER_SIZE);
        let mut hb = [0u8; HEADER_SIZE];
        hb.copy_from_slice(&b[..HEADER_SIZE]);
        assert_eq!(r.chain, Header::chain_seed(&hb));
    }
    // Commits are numbered 1, 2, ... and each takes a record.
    assert!(r.last_seq as usize <= (r.valid_len - HEADER_SIZE) / RECORD_SIZE);

    // Truncating to the valid prefix (recovery) changes nothing.
    let mut prefix = b[..r.valid_len].to_vec();
    let again = map::replay(&prefix).expect("valid prefix replays");
    assert_eq!(again.runs, r.runs);
    assert_eq!(again.last_seq, r.last_seq);
    assert_eq!(again.chain, r.chain);
    assert_eq!(again.discarded, 0);

    // Appending the next commit there is accepted.
    let c = map::encode_record(map::KIND_COMMIT, 0, 0, r.last_seq + 1, r.chain);
    prefix.extend_from_slice(&c);
    let next = map::replay(&prefix).expect("extended map replays");
    assert_eq!(next.last_seq, r.last_seq + 1);
    assert_eq!(next.valid_len, r.valid_len + RECORD_SIZE);
    assert_eq!(next.runs, r.runs);
    assert_eq!(next.chain, map::record_crc(&c));
});
