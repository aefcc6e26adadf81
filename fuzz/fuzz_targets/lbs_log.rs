//! The LBS metadata log (`.lbsm`): `MetaHeader::parse`, `parse_entry` and
//! `replay` on arbitrary bytes. The first byte is the mode:
//!
//! * 0: the rest is a whole `.lbsm` file as is;
//! * 1: a valid header followed by the rest as raw entry bytes;
//! * 2: a valid header followed by well-framed entries generated from the
//!   rest (every entry CRC, sequence number and barrier CRC correct), so
//!   mutations reach replay's semantic checks (ranges, epochs, cluster
//!   reuse) instead of dying at a checksum.
//!
//! Bit 7 of the mode byte selects a version-1 header (whose logs may not
//! hold MOVED entries), else bit 6 a version-2 one (no STAMPS or CLUSTERS
//! hints).
//!
//! Replay must never panic. When it succeeds, the map must be consistent:
//! every mapped PBN inside the data file and owned by a cluster whose epoch
//! is set, `valid_len + discarded` the input length, and replaying just the
//! valid prefix gives the same map.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_lbs::checksum::ChecksumKind;
use roamdisk_lbs::format::{
    encode_entry, ClusterHint, Entry, Geometry, MetaHeader, META_HEADER_SIZE,
};
use roamdisk_lbs::replay::{replay, IN_PLACE, ZERO};

fn header(sum: ChecksumKind) -> MetaHeader {
    let geometry = Geometry {
        block_size: 1024,
        cluster_size: 16 * 1024,
        clusters: 6,
    };
    MetaHeader::plain([1; 16], 64 * 1024, geometry, sum)
}

/// Turn fuzz bytes into well-formed entries (kind and small fields from
/// each byte group), with correct framing.
fn generated(h: &MetaHeader, data: &[u8]) -> Vec<u8> {
    let w = h.checksum.width();
    let mut out = h.encode();
    let mut seq = 1u64;
    let mut running = 0u32;
    let mut barriers = 0u64;
    for g in data.chunks(6) {
        let b = |i: usize| *g.get(i).unwrap_or(&0) as u64;
        // What the kinds of entry share, each from the same byte.
        let (lbn, pbn, epoch) = (b(1) % 70, b(2) % 100, 1 + b(4) % 4);
        let mapped = 1 + b(3) % 4;
        let sums = vec![b(5) as u8; mapped as usize * w];
        let e = match b(0) % 8 {
            0 | 1 => Entry::placing(lbn, pbn, mapped, epoch, None, sums),
            2 => Entry::Zero {
                lbn,
                count: 1 + b(3) % 8,
            },
            3 => Entry::Trim {
                lbn,
                count: 1 + b(3) % 8,
            },
            5 => {
                let seal = (b(5) % 100, 1 + b(5) % 3);
                Entry::placing(lbn, pbn, mapped, epoch, Some(seal), sums)
            }
            6 => Entry::Stamps {
                lbn,
                clock: b(5),
                stamps: vec![b(4) as u16 * 257; 1 + b(3) as usize % 8],
            },
            7 => Entry::Clusters {
                first: b(1) % 7,
                clock: b(5),
                hints: vec![
                    ClusterHint {
                        epoch,
                        activated: b(2) % 40,
                        written: b(3) as u32 % 20,
                        stream: b(4) as u8 % 5,
                    };
                    1 + b(3) as usize % 3
                ],
            },
            _ => {
                barriers += 1;
                // Occasionally a wrong number or checksum.
                let number = if b(1) == 255 { barriers + 1 } else { barriers };
                let crc = if b(2) == 255 { running ^ 1 } else { running };
                Entry::Barrier { number, crc }
            }
        };
        let bytes = encode_entry(&e, seq, w);
        seq += 1;
        if matches!(e, Entry::Barrier { .. }) {
            running = 0;
        } else {
            running = crc32c::crc32c_append(running, &bytes);
        }
        out.extend_from_slice(&bytes);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let sum = [
        ChecksumKind::Crc32c,
        ChecksumKind::Blake3,
        ChecksumKind::None,
    ][(mode as usize / 4) % 3];
    let mut h0 = header(sum);
    if mode & 0x80 != 0 {
        h0.version = 1;
    } else if mode & 0x40 != 0 {
        h0.version = 2;
    }
    let file = match mode % 4 {
        0 => rest.to_vec(),
        1 => {
            let mut v = h0.encode();
            v.extend_from_slice(rest);
            v
        }
        _ => generated(&h0, rest),
    };
    let h = match MetaHeader::parse(&file) {
        Ok(h) => h,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(
        MetaHeader::parse(&h.encode()),
        Ok(h.clone()),
        "header does not round-trip"
    );
    let r = match replay(&file, &h) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(r.valid_len + r.discarded, file.len());
    assert!(r.valid_len >= META_HEADER_SIZE.min(file.len()));
    let bpc = h.geometry.blocks_per_cluster();
    let hints = &r.hints;
    assert!(hints.stamps.is_empty() || hints.stamps.len() == r.map.l2p.len());
    assert!(hints.clusters.is_empty() || hints.clusters.len() == r.map.epochs.len());
    if !hints.stamps.is_empty() || !hints.clusters.is_empty() {
        assert!(h.version >= 3, "hints in a log older than version 3");
    }
    for c in &hints.clusters {
        assert!(c.stream < 4 && c.written as u64 <= bpc);
    }
    for (l, &p) in r.map.l2p.iter().enumerate() {
        if r.map.seal_pbn[l] != IN_PLACE {
            assert!(p < ZERO, "a seal on an unmapped block");
            assert!(h.version >= 2, "a moved block in a version-1 log");
            assert!((r.map.seal_pbn[l] as u64) < h.geometry.physical_blocks());
            assert_ne!(r.map.seal_epoch[l], 0);
        }
        if p < ZERO {
            assert!(
                (p as u64) < h.geometry.physical_blocks(),
                "PBN outside the data file"
            );
            assert_ne!(
                r.map.epochs[(p as u64 / bpc) as usize],
                0,
                "mapped block in a cluster without epoch"
            );
        }
    }
    let again = replay(&file[..r.valid_len], &h).expect("the valid prefix replays");
    assert_eq!(
        again.map, r.map,
        "replaying the valid prefix changes the map"
    );
    assert_eq!(again.discarded, 0);
});
