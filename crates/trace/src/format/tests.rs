use std::io::Cursor;

use proptest::prelude::*;

use super::*;

fn op_strategy() -> impl Strategy<Value = TraceOp> {
    prop::sample::select(TraceOp::ALL.to_vec())
}

fn record_strategy() -> impl Strategy<Value = Record> {
    (
        any::<u64>(),
        prop_oneof![Just(0u32), any::<u32>()],
        prop_oneof![Just(0u32), 0u32..4, any::<u32>()],
        op_strategy(),
        prop_oneof![Just(0u64), any::<u64>()],
        any::<u32>(),
        prop_oneof![Just(0u16), any::<u16>()],
    )
        .prop_map(
            |(time_ns, client, device, op, offset, len, fragment)| Record {
                time_ns,
                client,
                device,
                op,
                offset,
                len,
                fragment,
            },
        )
}

fn encode_all(recs: &[Record]) -> Vec<u8> {
    let mut e = binary::Encoder::new(Vec::new()).unwrap();
    for r in recs {
        e.write(r).unwrap();
    }
    e.finish().unwrap()
}

fn decode_all(bytes: Vec<u8>) -> Result<Vec<Record>, TraceError> {
    Reader::from_reader(Cursor::new(bytes))?.collect()
}

fn sequential(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            time_ns: i as u64 * 1000,
            client: (i % 3) as u32,
            device: 1,
            op: if i % 10 == 9 {
                TraceOp::Flush
            } else {
                TraceOp::Write
            },
            offset: if i % 10 == 9 { 0 } else { i as u64 * 4096 },
            len: if i % 10 == 9 { 0 } else { 4096 },
            fragment: 0,
        })
        .collect()
}

proptest! {
    #[test]
    fn binary_round_trips_any_records(recs in prop::collection::vec(record_strategy(), 0..300)) {
        prop_assert_eq!(decode_all(encode_all(&recs)).unwrap(), recs);
    }

    #[test]
    fn csv_round_trips_any_records(recs in prop::collection::vec(record_strategy(), 0..100)) {
        let mut e = csvfmt::CsvEncoder::new(Vec::new()).unwrap();
        for r in &recs {
            e.write(r).unwrap();
        }
        let bytes = e.finish().unwrap();
        prop_assert_eq!(decode_all(bytes).unwrap(), recs);
    }

    #[test]
    fn hostile_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut b = binary::MAGIC.to_vec();
        b.extend_from_slice(&bytes);
        let _ = decode_all(b);
        let _ = decode_all(bytes);
    }

    #[test]
    fn flipped_bits_are_detected(seed in any::<u64>(), n in 1usize..200) {
        let recs = sequential(n);
        let mut bytes = encode_all(&recs);
        let bit = (seed % (bytes.len() as u64 * 8)) as usize;
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_all(bytes).is_err());
    }
}

#[test]
fn many_chunks_round_trip_and_stay_compact() {
    let recs = sequential(3 * binary::WRITER_CHUNK_RECORDS as usize + 17);
    let bytes = encode_all(&recs);
    // Flags, time delta, client and length: 7 bytes for these records
    // (a fixed layout would need 31).
    assert!(
        bytes.len() < recs.len() * 8,
        "{} bytes for {} records",
        bytes.len(),
        recs.len()
    );
    assert_eq!(decode_all(bytes).unwrap(), recs);
}

#[test]
fn every_truncation_is_reported_after_the_valid_prefix() {
    let recs = sequential(2 * binary::WRITER_CHUNK_RECORDS as usize);
    let bytes = encode_all(&recs);
    for cut in [
        0,
        3,
        binary::HEADER_LEN - 1,
        binary::HEADER_LEN,
        binary::HEADER_LEN + 5,
        bytes.len() / 2,
        bytes.len() - 21,
        bytes.len() - 1,
    ] {
        let mut reader = match Reader::from_reader(Cursor::new(bytes[..cut].to_vec())) {
            Ok(r) => r,
            Err(e) => {
                assert!(cut < binary::HEADER_LEN, "cut {cut}: {e}");
                continue;
            }
        };
        let mut good = 0;
        let err = loop {
            match reader.next() {
                Some(Ok(r)) => {
                    assert_eq!(r, recs[good]);
                    good += 1;
                }
                Some(Err(e)) => break e,
                None => panic!("cut at {cut} read as complete"),
            }
        };
        assert!(err.is_truncated(), "cut {cut}: {err}");
        assert!(reader.next().is_none());
    }
}

#[test]
fn errors_name_the_problem() {
    let e = decode_all(b"hello world\n".to_vec()).unwrap_err();
    assert!(e.to_string().contains("not a roamdisk trace"), "{e}");

    let mut bytes = encode_all(&sequential(3));
    bytes[binary::HDR_VERSION] = 9;
    let crc = crc32c::crc32c(&bytes[..binary::HDR_CRC]);
    bytes[binary::HDR_CRC..binary::HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    let e = decode_all(bytes).unwrap_err();
    assert!(matches!(e, TraceError::Version { found: 9, .. }), "{e}");

    let mut bytes = encode_all(&sequential(3));
    bytes.push(0);
    let e = decode_all(bytes).unwrap_err();
    assert!(e.to_string().contains("after the end marker"), "{e}");

    let csv = format!(
        "{}\n1,0,0,read,0,512,0\n2,0,0,frob,0,512,0\n",
        csvfmt::HEADER
    );
    let e = decode_all(csv.into_bytes()).unwrap_err();
    assert!(
        e.to_string().contains("line 3") && e.to_string().contains("frob"),
        "{e}"
    );
    let csv = format!("{}\n1,0,0,read,0,99999999999,0\n", csvfmt::HEADER);
    let e = decode_all(csv.into_bytes()).unwrap_err();
    assert!(e.to_string().contains("len"), "{e}");
}

#[test]
fn hostile_chunk_header_is_rejected_without_allocating() {
    let mut bytes = encode_all(&[]);
    let end = bytes.split_off(binary::HEADER_LEN);
    drop(end);
    let mut h = [0u8; binary::CHUNK_HEADER_LEN];
    h[binary::CHK_PAYLOAD_LEN..binary::CHK_COUNT].copy_from_slice(&u32::MAX.to_le_bytes());
    h[binary::CHK_COUNT..binary::CHK_CRC].copy_from_slice(&5u32.to_le_bytes());
    bytes.extend_from_slice(&h);
    let e = decode_all(bytes).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");
}

#[test]
fn files_round_trip_in_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    let recs = sequential(5000);
    for (name, fmt) in [("t.rdtrace", Format::Binary), ("t.csv", Format::Csv)] {
        let p = dir.path().join(name);
        assert_eq!(Format::from_path(&p), fmt);
        let mut w = Writer::create(&p, fmt).unwrap();
        for r in &recs {
            w.write(r).unwrap();
        }
        assert_eq!(w.count(), recs.len() as u64);
        w.finish().unwrap();
        let r = Reader::open(&p).unwrap();
        assert_eq!(r.format(), fmt);
        let back: Vec<Record> = r.collect::<Result<_, _>>().unwrap();
        assert_eq!(back, recs);
    }
    let e = Reader::open(&dir.path().join("missing")).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}
