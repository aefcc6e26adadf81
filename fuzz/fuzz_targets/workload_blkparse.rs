//! `roamdisk_trace::convert::blkparse::convert` on arbitrary text
//! (byte 0: bit 0 = `single_client`, bits 1-2 pick the action converted:
//! D, Q, C or an empty one).
//!
//! Checks: on success every input line is counted, as records or as
//! skipped; each record's range stays inside 2^64 and the pieces of one
//! request are at most 2 GiB each, consecutive and numbered 0, 1, 2...;
//! `single_client` gives client 0; each line parsed alone by `parse_line`
//! and `event_records` gives the same records as the whole conversion.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_trace::convert::blkparse::{convert, event_records, parse_line, BlkparseOptions};
use roamdisk_trace::format::{Record, TraceOp};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let opts = BlkparseOptions {
        action: ["D", "Q", "C", ""][(mode as usize >> 1) % 4].to_string(),
        single_client: mode & 1 != 0,
    };
    let mut recs: Vec<Record> = Vec::new();
    let rep = convert(rest, &opts, &mut |r: &Record| {
        recs.push(*r);
        Ok(())
    });
    let rep = match rep {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(rep.records as usize, recs.len());
    let text = std::str::from_utf8(rest).expect("converted text is UTF-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(rep.lines as usize, lines.len());
    assert!(rep.skipped <= rep.lines);
    let mut per_line = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let ev = parse_line(l, i as u64 + 1).expect("line parsed in the conversion");
        if let Some(ev) = ev {
            if ev.action == opts.action {
                per_line.extend(event_records(&ev, opts.single_client, i as u64 + 1).unwrap());
            }
        }
    }
    assert_eq!(per_line, recs);
    let mut prev: Option<Record> = None;
    for r in &recs {
        if opts.single_client {
            assert_eq!(r.client, 0);
        }
        if r.op == TraceOp::Flush {
            assert_eq!((r.offset, r.len, r.fragment), (0, 0, 0));
        } else {
            assert!(r.len > 0 && r.len <= 1 << 31, "{r:?}");
            assert!(
                r.offset.checked_add(r.len as u64).is_some(),
                "range wraps: {r:?}"
            );
            if r.fragment > 0 {
                let p = prev.expect("a fragment follows its request's previous piece");
                assert_eq!(p.fragment + 1, r.fragment, "{p:?} {r:?}");
                assert_eq!(p.offset + p.len as u64, r.offset, "{p:?} {r:?}");
                assert_eq!(p.len, 1 << 31);
            }
        }
        prev = Some(*r);
    }
});
