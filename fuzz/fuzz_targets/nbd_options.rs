//! The option-payload parsers on arbitrary bytes. The first byte selects
//! the parser (`parse_info_request`, `parse_meta_request`,
//! `parse_export_name`) or the reply encoders; the rest is the payload.
//! What parses must obey the protocol's limits (strings of at most 4096
//! bytes, UTF-8 without NUL, at most 1024 queries) and re-encode to exactly
//! the payload (no trailing bytes accepted, nothing lost).
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::{
    info_payload, meta_payload, OPT_SELECTORS, OPT_SEL_ENCODERS, OPT_SEL_EXPORT_NAME, OPT_SEL_INFO,
    OPT_SEL_META,
};
use roamdisk_nbd::proto::*;

fn valid_string(s: &str) {
    assert!(
        s.len() <= MAX_STRING,
        "string of {} bytes accepted",
        s.len()
    );
    assert!(!s.contains('\0'), "string with NUL accepted");
}

fn encoders(p: &[u8]) {
    let (head, msg) = p.split_at(p.len().min(8));
    let mut h = [0u8; 8];
    h[..head.len()].copy_from_slice(head);
    let opt = u32::from_be_bytes(h[..4].try_into().unwrap());
    let rtype = u32::from_be_bytes(h[4..].try_into().unwrap());
    let r = encode_option_reply(opt, rtype, msg);
    assert_eq!(r.len(), 20 + msg.len());
    assert_eq!(r[..8], OPT_REPLY_MAGIC.to_be_bytes());
    assert_eq!(r[16..20], (msg.len() as u32).to_be_bytes());
    assert_eq!(&r[20..], msg);

    let text = String::from_utf8_lossy(msg);
    let handle = u64::from_be_bytes(h);
    let c = encode_error_chunk(handle, opt, &text);
    let m = text.len().min(MAX_STRING);
    assert_eq!(c.len(), CHUNK_HEADER_SIZE + 6 + m);
    assert_eq!(c[..4], STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(c[16..20], ((6 + m) as u32).to_be_bytes());
    assert_eq!(c[24..26], (m as u16).to_be_bytes());
    assert_eq!(&c[26..], &text.as_bytes()[..m]);

    let s = encode_simple_reply(opt, handle);
    assert_eq!(s[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, p)) = data.split_first() else {
        return;
    };
    match sel % OPT_SELECTORS {
        OPT_SEL_INFO => {
            if let Ok(r) = parse_info_request(p) {
                valid_string(&r.name);
                assert_eq!(info_payload(&r.name, &r.infos), p);
            }
        }
        OPT_SEL_META => {
            if let Ok(r) = parse_meta_request(p) {
                valid_string(&r.export);
                assert!(r.queries.len() <= 1024);
                for q in &r.queries {
                    valid_string(q);
                    if match_meta_query(q, false) {
                        assert!(match_meta_query(q, true));
                        assert_eq!(q, BASE_ALLOCATION);
                    }
                }
                let qs: Vec<&str> = r.queries.iter().map(String::as_str).collect();
                assert_eq!(meta_payload(&r.export, &qs), p);
            }
        }
        OPT_SEL_EXPORT_NAME => {
            let expect_ok =
                p.len() <= MAX_STRING && std::str::from_utf8(p).is_ok_and(|s| !s.contains('\0'));
            match parse_export_name(p) {
                Ok(name) => {
                    assert!(expect_ok);
                    valid_string(&name);
                    assert_eq!(name.as_bytes(), p);
                }
                Err(e) => {
                    assert!(!expect_ok, "valid name refused: {e}");
                }
            }
        }
        OPT_SEL_ENCODERS => encoders(p),
        _ => unreachable!(),
    }
});
