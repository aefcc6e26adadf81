//! The trace reader, `roamdisk_trace::format::Reader::from_reader`, on
//! arbitrary bytes: binary (`RDTRACE\0` magic) or CSV (the header line),
//! whichever the input starts with. Byte 0 is the mode: bit 0 turns the
//! rest into a framed binary trace first — the file header, then the rest
//! cut into chunks at the lengths its own bytes give, each with a correct
//! CRC and a record count that fits, then a correct end marker — so
//! mutations reach the record decoder; bit 1 feeds the input in pieces
//! of at most 7 bytes (a reader must not depend on read sizes).
//!
//! Checks: the reader stops after its first error; the records read
//! before the end (or before an error) re-encode, through the binary
//! encoder, to a trace that reads back as the same records.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use roamdisk_fuzz::trace::{frame_binary, Trickle};
use roamdisk_trace::format::binary::Encoder;
use roamdisk_trace::format::{Reader, Record};

/// Most records looked at per input (bounds time; the binary decoder holds
/// one chunk at a time anyway).
const MAX_RECORDS: usize = 100_000;

fn read_all(r: Box<dyn Read + Send>) -> (Vec<Record>, bool) {
    let mut out = Vec::new();
    let mut reader = match Reader::from_reader(r) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return (out, false);
        }
    };
    let mut ok = true;
    for r in reader.by_ref().take(MAX_RECORDS) {
        match r {
            Ok(rec) => out.push(rec),
            Err(e) => {
                let _ = e.to_string();
                ok = false;
                break;
            }
        }
    }
    if !ok {
        assert!(reader.next().is_none(), "reader yields more after an error");
    }
    (out, ok)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let input = if mode & 1 != 0 {
        frame_binary(rest)
    } else {
        rest.to_vec()
    };
    let src: Box<dyn Read + Send> = if mode & 2 != 0 {
        Box::new(Trickle::new(input.clone(), 7))
    } else {
        Box::new(std::io::Cursor::new(input.clone()))
    };
    let (records, _) = read_all(src);
    if mode & 2 != 0 {
        let (whole, _) = read_all(Box::new(std::io::Cursor::new(input)));
        assert_eq!(whole, records, "the result depends on read sizes");
    }
    let mut enc = Encoder::new(Vec::new()).expect("vec");
    for r in &records {
        enc.write(r).expect("vec");
    }
    let bytes = enc.finish().expect("vec");
    let (back, ok) = read_all(Box::new(std::io::Cursor::new(bytes)));
    assert!(ok, "a trace written by the encoder fails to read");
    assert_eq!(
        back, records,
        "records do not round-trip through the binary form"
    );
});
