//! `roamdisk_chunkstore::catalog::Catalog::parse` on arbitrary bytes. The first
//! byte is the mode: even parses the rest as is; odd first rewrites the
//! header and trailer CRCs (`fixup::cas_catalog`) so mutations reach the
//! entries. A catalog that parses must re-encode to exactly its input
//! (the format has one encoding), every entry must name a version, carry
//! at most 32 valid tags and a description of at most 4096 bytes, and
//! `resolve` on names taken from it (tags, id prefixes, dates) must not
//! panic and must find an entry of the catalog.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::catalog::{check_tag, format_time, parse_time, Catalog};
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_catalog) else {
        return;
    };
    let c = match Catalog::parse(&b) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.kind(), roamdisk_blockdev::ErrorKind::Corrupt, "{e}");
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(c.encode(), b, "catalog does not re-encode to its input");
    assert_eq!(Catalog::parse(&c.encode()).expect("re-encoded catalog"), c);
    for e in &c.entries {
        assert!(!e.version.is_zero());
        assert!(e.parent.is_none_or(|p| !p.is_zero()));
        assert!(e.description.len() <= 4096);
        assert!(e.tags.len() <= 32);
        for t in &e.tags {
            check_tag(t).expect("parsed tags are valid");
            let hit = c.resolve(t, "fuzz/image").expect("a tag resolves");
            assert!(c.entries.contains(hit));
        }
        let hex = e.version.to_hex();
        if let Ok(hit) = c.resolve(&hex, "fuzz/image") {
            assert!(c.entries.contains(hit));
        }
        let when = format_time(e.created);
        if let Some(t) = parse_time(&when) {
            if let Ok(hit) = c.resolve(&when, "fuzz/image") {
                assert!(hit.created <= t || hit.tags.iter().any(|x| *x == when));
            }
        }
    }
    if let Ok(s) = std::str::from_utf8(&data[1..]) {
        if s.len() <= 64 {
            let _ = parse_time(s);
            let _ = c.resolve(s, "fuzz/image");
        }
    }
});
