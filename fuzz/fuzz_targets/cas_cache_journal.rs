//! `roamdisk_roam::cache::journal` on arbitrary bytes: the header check and
//! the record decoder. The first byte is the mode: even decodes the rest
//! as is; odd first rewrites every 41-byte record's CRC so mutations reach
//! the kinds, ids and sizes. Decoding must stop at a record boundary, and
//! every record it returns must re-encode to exactly the bytes it came
//! from (one encoding per record).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_roam::cache::journal::{check_header, decode_records, Record, RECORD_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let _ = check_header(rest).map_err(|e| e.to_string());
    let mut b = rest.to_vec();
    if mode % 2 == 1 {
        for r in b.chunks_exact_mut(RECORD_LEN) {
            let crc = crc32c::crc32c(&r[..RECORD_LEN - 4]);
            r[RECORD_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let (recs, used) = decode_records(&b);
    assert_eq!(used % RECORD_LEN, 0);
    assert_eq!(used, recs.len() * RECORD_LEN);
    assert!(used <= b.len());
    for (r, raw) in recs.iter().zip(b.chunks_exact(RECORD_LEN)) {
        assert!(!r.id.is_zero());
        assert_eq!(
            &r.encode()[..],
            raw,
            "record does not re-encode to its bytes"
        );
        assert_eq!(Record::decode(raw), Some(*r));
    }
});
