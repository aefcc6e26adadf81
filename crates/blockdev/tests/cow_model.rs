//! Model-based test of the `cow` layer: random sequences of writes, zeroes,
//! trims, flushes, reopens and crashes (drop without flush) against a plain
//! byte-vector model.
//!
//! After a reopen that followed a flush the overlay must equal the model
//! exactly. After a crash, every cluster must equal either its content at
//! the last flush or its latest content (nothing else: no garbage, no
//! half-copied cluster from the base).

use std::sync::Arc;

use proptest::prelude::*;
use roamdisk_blockdev::layers::cow::{CowDev, CowOptions};
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::{BlockDev, WriteFlags, ZeroFlags};

const SIZE: u64 = 16 * 4096 + 1000; // not a multiple of the cluster size
const CLUSTER: u64 = 4096;

#[derive(Debug, Clone)]
enum OpK {
    Write { off: u64, len: u64, byte: u8 },
    Zero { off: u64, len: u64 },
    TrimClusters { first: u64, count: u64 },
    Flush,
    Reopen,
    Crash,
}

fn op() -> impl Strategy<Value = OpK> {
    prop_oneof![
        6 => (0..SIZE, 1u64..3 * CLUSTER, any::<u8>()).prop_map(|(off, len, byte)| OpK::Write { off, len: len.min(SIZE - off), byte }),
        2 => (0..SIZE, 1u64..3 * CLUSTER).prop_map(|(off, len)| OpK::Zero { off, len: len.min(SIZE - off) }),
        1 => (0..16u64, 1u64..4).prop_map(|(first, count)| OpK::TrimClusters { first, count: count.min(16 - first) }),
        2 => Just(OpK::Flush),
        1 => Just(OpK::Reopen),
        1 => Just(OpK::Crash),
    ]
}

fn base() -> Arc<dyn BlockDev> {
    let m = MemDev::new(SIZE);
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 253) as u8 + 1).collect();
    m.write_at(&data, 0, WriteFlags::default()).unwrap();
    Arc::new(m)
}

fn read_all(d: &dyn BlockDev) -> Vec<u8> {
    let mut v = vec![0u8; SIZE as usize];
    d.read_at(&mut v, 0).unwrap();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn cow_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let (_dir, ov) = roamdisk_blockdev::testkit::scratch("ov");
        let b = base();
        let opts = CowOptions { cluster_size: CLUSTER as u32 };
        let mut dev = CowDev::open(&ov, b.clone(), false, &opts).unwrap();
        let mut model = read_all(b.as_ref());
        let mut durable = model.clone();
        for o in ops {
            match o {
                OpK::Write { off, len, byte } => {
                    let buf = vec![byte; len as usize];
                    dev.write_at(&buf, off, WriteFlags::default()).unwrap();
                    model[off as usize..(off + len) as usize].fill(byte);
                }
                OpK::Zero { off, len } => {
                    dev.write_zeroes(off, len, ZeroFlags { may_trim: true, ..Default::default() }).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                OpK::TrimClusters { first, count } => {
                    let off = first * CLUSTER;
                    let end = ((first + count) * CLUSTER).min(SIZE);
                    dev.trim(off, end - off, WriteFlags::default()).unwrap();
                    // Whole clusters are released and read as zeroes.
                    model[off as usize..end as usize].fill(0);
                }
                OpK::Flush => {
                    dev.flush().unwrap();
                    durable = model.clone();
                }
                OpK::Reopen => {
                    dev.flush().unwrap();
                    durable = model.clone();
                    drop(dev);
                    dev = CowDev::open(&ov, b.clone(), false, &opts).unwrap();
                    prop_assert_eq!(read_all(&dev), model.clone(), "reopen after flush differs");
                }
                OpK::Crash => {
                    drop(dev);
                    dev = CowDev::open(&ov, b.clone(), false, &opts).unwrap();
                    let got = read_all(&dev);
                    for c in 0..SIZE.div_ceil(CLUSTER) {
                        let r = (c * CLUSTER) as usize..((c + 1) * CLUSTER).min(SIZE) as usize;
                        prop_assert!(
                            got[r.clone()] == durable[r.clone()] || got[r.clone()] == model[r.clone()],
                            "cluster {} after crash is neither its flushed nor its latest content", c
                        );
                    }
                    model = got;
                    durable = model.clone();
                }
            }
            prop_assert_eq!(read_all(&dev), model.clone());
        }
    }
}
