//! The borrowed disk against a model: random reads, writes, zeroing and
//! trims at any alignment (partial units go through read-modify-write)
//! must read back like a plain byte array, never touch host bytes outside
//! the plan, never leave plaintext on the host, and a zero-scrub must
//! clear exactly what was written. The on-demand fetch layer must read
//! like its source until written.

use std::sync::Arc;

use proptest::prelude::*;
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::{BlockDev, WriteFlags, ZeroFlags};
use roamdisk_borrow::ondemand::FetchDev;
use roamdisk_borrow::plan::{Device, Histogram, Partition, PlanExtent, PlanOptions};
use roamdisk_borrow::{BorrowDev, BorrowOptions, NoProgress, Plan, Status, Verify};

const HOST: u64 = 1 << 20;
const FILL: u8 = 0xEE;

/// Two hosts of 1 MiB, extents scattered over both (not in order).
fn plan() -> Plan {
    let ext = |device, offset, len| PlanExtent {
        device,
        partition: 1,
        offset,
        len,
    };
    let extents = vec![
        ext(0, 8 << 12, 3 << 12),
        ext(1, 40 << 12, 1 << 12),
        ext(0, 100 << 12, 16 << 12),
        ext(1, 2 << 12, 5 << 12),
        ext(0, 200 << 12, 2 << 12),
    ];
    let total: u64 = extents.iter().map(|e| e.len).sum();
    let dev = |id| Device {
        id,
        path: format!("/mem{id}").into(),
        size: HOST,
        scheme: "none".into(),
        table_sha256: String::new(),
    };
    let part = |device| Partition {
        fs: "ext4".into(),
        status: Status::Used,
        ..Partition::listed(device, 1, 0, HOST, "whole disk")
    };
    let plan = Plan::new(
        PlanOptions {
            min_extent: 4096,
            max_extents: 100,
            size_limit: 0,
        },
        vec![dev(0), dev(1)],
        vec![part(0), part(1)],
        Histogram::default(),
        extents,
    );
    assert_eq!(plan.total_bytes, total);
    plan
}

fn hosts() -> Vec<Arc<MemDev>> {
    (0..2)
        .map(|_| {
            let m = MemDev::new(HOST);
            m.write_at(&vec![FILL; HOST as usize], 0, WriteFlags::default())
                .unwrap();
            Arc::new(m)
        })
        .collect()
}

fn open(p: &Plan, h: &[Arc<MemDev>], size: Option<u64>, encrypt: bool) -> BorrowDev {
    let hs: Vec<Arc<dyn BlockDev>> = h.iter().map(|m| m.clone() as Arc<dyn BlockDev>).collect();
    BorrowDev::with_hosts(
        p,
        hs,
        Vec::new(),
        &BorrowOptions {
            encrypt,
            scrub: false,
            verify: Verify::Identity,
            size,
        },
    )
    .unwrap()
}

/// Host bytes covered by the plan: per host, a mask.
fn mask(p: &Plan) -> Vec<Vec<bool>> {
    let mut m = vec![vec![false; HOST as usize]; 2];
    for e in &p.extents {
        m[e.device as usize][e.offset as usize..(e.offset + e.len) as usize].fill(true);
    }
    m
}

fn host_bytes(h: &MemDev) -> Vec<u8> {
    let mut v = vec![0u8; HOST as usize];
    h.read_at(&mut v, 0).unwrap();
    v
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, Vec<u8>),
    Read(u64, usize),
    Zero(u64, u64),
    Trim(u64, u64),
    Flush,
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    let off = 0..size;
    prop_oneof![
        4 => (off.clone(), 1usize..20000, any::<u8>()).prop_map(move |(o, n, b)| {
            let n = n.min((size - o) as usize).max(1);
            Op::Write(o, (0..n).map(|i| b.wrapping_add(i as u8)).collect())
        }),
        3 => (off.clone(), 1usize..30000).prop_map(move |(o, n)| Op::Read(o, n.min((size - o) as usize).max(1))),
        1 => (off.clone(), 1u64..20000).prop_map(move |(o, n)| Op::Zero(o, n.min(size - o).max(1))),
        1 => (off, 1u64..20000).prop_map(move |(o, n)| Op::Trim(o, n.min(size - o).max(1))),
        1 => Just(Op::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn reads_like_a_byte_array_and_stays_inside_the_plan(
        ops in proptest::collection::vec(op(27 << 12), 1..40),
        encrypt in any::<bool>(),
        cut in 0u64..5000,
    ) {
        let p = plan();
        let size = p.total_bytes - cut;
        let h = hosts();
        let d = open(&p, &h, Some(size), encrypt);
        prop_assert_eq!(d.size(), size);
        let mut model = vec![0u8; size as usize];
        for o in ops {
            match o {
                Op::Write(off, data) => {
                    if off + data.len() as u64 > size { continue; }
                    d.write_at(&data, off, WriteFlags::default()).unwrap();
                    model[off as usize..off as usize + data.len()].copy_from_slice(&data);
                }
                Op::Read(off, n) => {
                    if off + n as u64 > size { continue; }
                    let mut b = vec![0u8; n];
                    d.read_at(&mut b, off).unwrap();
                    prop_assert!(b == model[off as usize..off as usize + n], "read at {off}+{n}");
                }
                Op::Zero(off, n) => {
                    if off + n > size { continue; }
                    d.write_zeroes(off, n, ZeroFlags::default()).unwrap();
                    model[off as usize..(off + n) as usize].fill(0);
                }
                Op::Trim(off, n) => {
                    // Trimmed ranges read as zeroes on a borrowed disk.
                    if off + n > size { continue; }
                    d.trim(off, n, WriteFlags::default()).unwrap();
                    model[off as usize..(off + n) as usize].fill(0);
                }
                Op::Flush => d.flush().unwrap(),
            }
        }
        let mut all = vec![0u8; size as usize];
        d.read_at(&mut all, 0).unwrap();
        prop_assert!(all == model);
        // Outside the plan the hosts are untouched.
        let m = mask(&p);
        for (k, host) in h.iter().enumerate() {
            let b = host_bytes(host);
            for (i, &x) in b.iter().enumerate() {
                if !m[k][i] {
                    prop_assert_eq!(x, FILL, "host {} byte {} outside the plan changed", k, i);
                }
            }
        }
        // Past the end nothing is accepted.
        prop_assert!(d.write_at(&[1], size, WriteFlags::default()).is_err());
        prop_assert!(d.read_at(&mut [0u8; 2], size - 1).is_err());
    }
}

#[test]
fn encryption_leaves_no_plaintext_and_scrub_clears_what_was_written() {
    let p = plan();
    let h = hosts();
    let d = open(&p, &h, None, true);
    let data: Vec<u8> = (0..p.total_bytes).map(|i| (i % 251) as u8).collect();
    d.write_at(&data, 0, WriteFlags::default()).unwrap();
    let mut logical = 0usize;
    for e in &p.extents {
        let mut b = vec![0u8; e.len as usize];
        h[e.device as usize].read_at(&mut b, e.offset).unwrap();
        for (k, blk) in b.chunks(4096).enumerate() {
            let at = logical + k * 4096;
            assert_ne!(blk, &data[at..at + 4096], "plaintext on the host");
            assert_ne!(blk, &[FILL; 4096][..], "not written");
        }
        logical += e.len as usize;
    }
    assert_eq!(d.written_bytes(), p.total_bytes);
    assert_eq!(d.release(true, &NoProgress).unwrap(), p.total_bytes);
    for e in &p.extents {
        let mut b = vec![1u8; e.len as usize];
        h[e.device as usize].read_at(&mut b, e.offset).unwrap();
        assert!(b.iter().all(|&x| x == 0), "scrubbed");
    }
    // Released: no more I/O.
    assert!(d.read_at(&mut [0u8; 4096], 0).is_err());
}

#[test]
fn dirty_ranges_track_guest_writes_not_copy_in() {
    let p = plan();
    let h = hosts();
    let d = open(&p, &h, None, true);
    d.write_unmarked(&vec![7u8; 40960], 0).unwrap();
    assert!(d.dirty_ranges().is_empty());
    d.write_at(&[1u8; 100], 5000, WriteFlags::default())
        .unwrap();
    d.write_zeroes(16384, 8192, ZeroFlags::default()).unwrap();
    assert_eq!(d.dirty_ranges(), vec![(4096, 8192), (16384, 24576)]);
}

#[test]
fn on_demand_fetch_reads_like_the_source_until_written() {
    let p = plan();
    let h = hosts();
    let inner = Arc::new(open(&p, &h, Some(100_000), true));
    let src = Arc::new(MemDev::new(100_000));
    let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 256) as u8).collect();
    src.write_at(&content, 0, WriteFlags::default()).unwrap();
    let f = FetchDev::new(inner.clone(), src.clone());
    let mut model = content.clone();
    // A partial write into an unfetched unit keeps the rest of the unit.
    f.write_at(&[9u8; 10], 4100, WriteFlags::default()).unwrap();
    model[4100..4110].fill(9);
    // A whole-unit write needs no fetch; reading around it fetches.
    f.write_at(&[5u8; 8192], 16384, WriteFlags::default())
        .unwrap();
    model[16384..24576].fill(5);
    f.write_zeroes(50_000, 1000, ZeroFlags::default()).unwrap();
    model[50_000..51_000].fill(0);
    let mut all = vec![0u8; 100_000];
    f.read_at(&mut all, 0).unwrap();
    assert!(all == model);
    assert_eq!(f.fetched_bytes(), 100_000u64.next_multiple_of(4096));
    // The source is never written; only guest writes are dirty.
    let mut s = vec![0u8; 100_000];
    src.read_at(&mut s, 0).unwrap();
    assert!(s == content);
    assert_eq!(
        inner.dirty_ranges(),
        vec![(4096, 8192), (16384, 24576), (49152, 53248)]
    );
}
