//! `STORE/store.toml`: `StoreConfig::parse` on arbitrary text (non-UTF-8
//! input is skipped: the caller reads the file as a string).
//!
//! Checks: a parsed configuration has a zstd level of 1..=19 or none and
//! no zero quota, and it round-trips through `to_toml`; its codec seals
//! and opens a small chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkstore::store::config::StoreConfig;
use roamdisk_fuzz::parse_text;

fuzz_target!(|data: &[u8]| {
    let Some(c) = parse_text(data, ErrorKind::Corrupt, StoreConfig::parse) else {
        return;
    };
    assert!(c.zstd_level.is_none_or(|l| (1..=19).contains(&l)));
    assert_ne!(c.quota, Some(0));
    let t = c.to_toml();
    assert_eq!(
        StoreConfig::parse(&t).expect("to_toml output parses"),
        c,
        "{t}"
    );
    let mut c2 = StoreConfig::default();
    c2.set_compression(&c.compression_name())
        .expect("own compression name");
    assert_eq!(c2.zstd_level, c.zstd_level);
    let codec = c.codec();
    let s = codec.seal(b"store config fuzz chunk", false);
    assert_eq!(
        codec.open(&s.id, None, &s.object).expect("opens"),
        b"store config fuzz chunk"
    );
});
