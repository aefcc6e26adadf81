//! Version packages: `version::Header::parse`, `Version::decode` (no key,
//! and a fixed user key) and `Version::references_of` on arbitrary bytes.
//! Byte 0 is the mode: bit 0 rewrites the section lengths and header CRC
//! and, in a plain package, the index length and the index's own
//! lengths and CRCs (`fixup::cas_version`), so mutations reach the body.
//!
//! Checks: `decode` succeeds only on packages whose header parses, and
//! the version it returns agrees with the header (hash, chunk size, disk
//! size, encryption) and has one memory chunk per chunk-size piece of the
//! memory image; a plain version re-encodes to a package that decodes to
//! the same version; the references of a plain package are exactly the
//! non-zero chunk names of its index and memory, sorted and unique.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::version::{Header, Version};
use roamdisk_fuzz::corpus::VERSION_USER_KEY;
use roamdisk_fuzz::fixup;

fuzz_target!(|data: &[u8]| {
    let Some(b) = fixup::input(data, fixup::cas_version) else {
        return;
    };
    let header = Header::parse(&b);
    let refs = Version::references_of(&b);
    for key in [None, Some(&VERSION_USER_KEY)] {
        let v = match Version::decode(&b, key) {
            Ok(v) => v,
            Err(e) => {
                let _ = e.to_string();
                continue;
            }
        };
        let h = header.as_ref().expect("decode parsed the header");
        assert_eq!(v.index.hash, h.hash);
        assert_eq!(v.index.chunk_size, h.chunk_size);
        assert_eq!(v.index.disk_size, h.disk_size);
        assert_eq!(v.index.encrypted(), h.encrypted);
        assert_eq!(
            v.memory.size.div_ceil(h.chunk_size as u64),
            v.memory.ids.len() as u64
        );
        assert!(v.memory.keys.is_empty() || v.memory.keys.len() == v.memory.ids.len());
        assert!(v.parent.is_none_or(|p| !p.is_zero()));
        let mut want = v.references();
        assert!(want.windows(2).all(|w| w[0] < w[1]));
        assert!(want.iter().all(|id| !id.is_zero()));
        if !h.encrypted {
            let got = refs
                .as_ref()
                .expect("a plain package that decodes has references");
            assert_eq!(got, &want);
            let again = v.encode(None).expect("a decoded plain version encodes");
            assert_eq!(
                Version::decode(&again, None).expect("re-encoded package"),
                v
            );
        } else {
            let again = v.encode(key).expect("a decoded encrypted version encodes");
            assert_eq!(Version::decode(&again, key).expect("re-encoded package"), v);
            want.sort_unstable();
            assert_eq!(Version::references_of(&again).expect("refs"), want);
        }
    }
    if let Err(e) = refs {
        let _ = e.to_string();
    }
});
