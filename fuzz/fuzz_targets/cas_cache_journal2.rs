//! `roamdisk_roam::cache::journal2` (the slot layout's journal) on
//! arbitrary bytes: the header check and the record decoder. The first
//! byte is the mode: bit 0 set first rewrites every 56-byte record's CRC
//! so mutations reach the kinds, places and sizes; bits 1..4 pick the slot
//! size the records are decoded for (4 KiB << (n % 7)). Decoding must stop
//! at a record boundary, every placed chunk it returns must fit its slot,
//! and every record must re-encode to exactly the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_roam::cache::journal2::{
    check_header, decode_records, Geometry, Record, GRANULE, RECORD_LEN,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if let Ok(g) = check_header(rest) {
        assert!(g.unit >= GRANULE && g.unit.is_power_of_two());
    }
    let g = Geometry::new(GRANULE << ((mode >> 1) % 7)).expect("a valid slot size");
    let mut b = rest.to_vec();
    if mode & 1 == 1 {
        for r in b.chunks_exact_mut(RECORD_LEN) {
            let crc = crc32c::crc32c(&r[..RECORD_LEN - 4]);
            r[RECORD_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let (recs, used) = decode_records(&b, g);
    assert_eq!(used, recs.len() * RECORD_LEN);
    assert!(used <= b.len());
    for (r, raw) in recs.iter().zip(b.chunks_exact(RECORD_LEN)) {
        if let Record::Insert(p) | Record::Move(p) = r {
            assert!(g.fits(p.size, p.at) && !p.id.is_zero());
        }
        assert_eq!(
            &r.encode()[..],
            raw,
            "record does not re-encode to its bytes"
        );
        assert_eq!(Record::decode(raw, g), Some(*r));
    }
});
