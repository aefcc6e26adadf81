//! The S3 store's own small parsers (`docs/formats/cas-s3.md`). The first
//! byte picks one, the rest is its input:
//!
//! * 0: `S3Location::parse` on a store location (text);
//! * 1: `refs::parse_name` on a catalog update's key (`GEN-RAND`);
//! * 2: `parse_lease` on a lease body (text);
//! * 3: `refs::merge` on catalog bodies of concurrent updates, split at
//!   each 0xFF byte.
//!
//! Checks: a location that parses names a bucket, re-parses from its
//! description to the same bucket and prefix, and never keeps a secret; a
//! name that parses is rebuilt exactly by `new_name`; a merge that
//! succeeds gives a catalog that parses and holds every version of every
//! body, one body being passed through unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkstore::catalog::Catalog;
use roamdisk_chunkstore::store::s3::{parse_lease, refs, S3Location};
use roamdisk_fuzz::parse_text;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    match sel % 4 {
        0 => {
            let Some(l) = parse_text(rest, ErrorKind::InvalidArgument, S3Location::parse) else {
                return;
            };
            assert!(!l.bucket.is_empty());
            let again = S3Location::parse(&l.describe()).expect("a description parses");
            assert_eq!(
                (again.bucket, again.prefix),
                (l.bucket.clone(), l.prefix.clone())
            );
            assert!(l.settings.iter().all(|(k, _)| !k.contains("secret")));
            assert!(l.key("store.toml").ends_with("store.toml"));
        }
        1 => {
            let Ok(t) = std::str::from_utf8(rest) else {
                return;
            };
            if let Some(g) = refs::parse_name(t) {
                let r = u64::from_str_radix(&t[17..], 16).expect("hex");
                assert_eq!(refs::new_name(g, r), t.to_ascii_lowercase());
            }
        }
        2 => {
            if let Ok(t) = std::str::from_utf8(rest) {
                let _ = parse_lease(t);
            }
        }
        _ => {
            let bodies: Vec<Vec<u8>> = rest.split(|b| *b == 0xff).map(<[u8]>::to_vec).collect();
            let Ok(merged) = refs::merge("u/i", &bodies) else {
                return;
            };
            let live: Vec<&Vec<u8>> = bodies.iter().filter(|b| !b.is_empty()).collect();
            match merged {
                None => assert!(live.is_empty()),
                Some(m) => {
                    if live.len() == 1 {
                        assert_eq!(&m, live[0]);
                        return;
                    }
                    let c = Catalog::parse(&m).expect("a merged catalog parses");
                    for b in live {
                        let one = Catalog::parse(b).expect("merged bodies parse");
                        for e in one.entries {
                            assert!(c.entries.iter().any(|x| x.version == e.version));
                        }
                    }
                }
            }
        }
    }
});
