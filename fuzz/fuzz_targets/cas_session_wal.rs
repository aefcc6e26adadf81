//! The session's write-ahead log (`SESSION/wal`), replayed from arbitrary
//! bytes. Byte 0 is the mode: even parses the rest as is; odd first
//! rewrites the header slots' CRCs and each record's chain, log id and CRC
//! (`fixup::cas_session_wal`) so mutations reach the record logic. What
//! replays must hold together: entries inside the disk, data the length
//! of the extents, the end inside the capacity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::fixup;
use roamdisk_roam::session::wal;

const SECTORS: u64 = 2048;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_session_wal) else {
        return;
    };
    if let Ok(r) = wal::replay(&b, SECTORS) {
        assert!(r.end <= r.head.capacity && r.head.capacity <= b.len() as u64);
        for rec in &r.records {
            let bytes: u64 = rec.extents.iter().map(|e| e.count as u64 * 512).sum();
            assert_eq!(bytes, rec.data.len() as u64);
            for run in &rec.runs {
                assert!(run.state <= 3 && run.count > 0);
                assert!(run.start + run.count as u64 <= SECTORS);
            }
            for e in &rec.extents {
                assert!(e.count > 0 && e.start + e.count as u64 <= SECTORS);
            }
        }
    }
});
