//! `roamdisk_trace::convert::msr::convert` on arbitrary text (byte 0,
//! bit 0: `absolute_time`).
//!
//! Checks: on success every line is a record or skipped; clients are
//! numbered in order of first appearance and name the host list; times
//! are 100 ns units since the first record (or 1601) and never before
//! the first record's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_trace::convert::msr::{convert, MsrOptions};
use roamdisk_trace::format::{Record, TraceOp};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let opts = MsrOptions {
        absolute_time: mode & 1 != 0,
    };
    let mut recs: Vec<Record> = Vec::new();
    let rep = match convert(rest, &opts, &mut |r: &Record| {
        recs.push(*r);
        Ok(())
    }) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(rep.records as usize, recs.len());
    assert_eq!(rep.records + rep.skipped, rep.lines);
    let mut next_client = 0u32;
    for (i, r) in recs.iter().enumerate() {
        assert!(matches!(r.op, TraceOp::Read | TraceOp::Write));
        assert_eq!(r.fragment, 0);
        assert_eq!(r.time_ns % 100, 0);
        if i == 0 && !opts.absolute_time {
            assert_eq!(r.time_ns, 0);
        }
        assert!((r.client as usize) < rep.clients.len());
        assert!(
            r.client <= next_client,
            "client ids not in order of appearance"
        );
        if r.client == next_client {
            next_client += 1;
        }
    }
    assert_eq!(next_client as usize, rep.clients.len());
    let mut names = rep.clients.clone();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), rep.clients.len(), "a host got two ids");
});
