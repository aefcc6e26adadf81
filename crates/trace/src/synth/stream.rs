//! The pieces every generator is made of: a seeded random generator,
//! sub-seeds, requests on the one disk, run lengths and the time-ordered
//! merge of several clients' streams.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::rngs::Xoshiro256PlusPlus;
use rand::SeedableRng;

use crate::format::{Record, TraceOp};

/// A stream of records in time order.
pub type RecordStream = Box<dyn Iterator<Item = Record> + Send>;

/// A request of `client` on device 0, the one disk of the desktop, boot
/// and Virtual PC generators.
pub(crate) fn request(time_ns: u64, client: u32, op: TraceOp, offset: u64, len: u32) -> Record {
    Record {
        time_ns,
        client,
        device: 0,
        op,
        offset,
        len,
        fragment: 0,
    }
}

/// A seed for a sub-generator, decorrelated from its siblings.
pub(crate) fn mix_seed(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random generator every workload uses: a fixed algorithm, so a seed
/// gives the same trace on every platform and version.
pub fn rng(seed: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

/// k-way merge of time-ordered streams; ties keep stream order.
pub struct Merge {
    streams: Vec<RecordStream>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    heads: Vec<Option<Record>>,
}

impl Merge {
    pub fn new(mut streams: Vec<RecordStream>) -> Self {
        let mut heap = BinaryHeap::new();
        let mut heads = Vec::with_capacity(streams.len());
        for (i, s) in streams.iter_mut().enumerate() {
            let h = s.next();
            if let Some(r) = &h {
                heap.push(Reverse((r.time_ns, i)));
            }
            heads.push(h);
        }
        Merge {
            streams,
            heap,
            heads,
        }
    }
}

impl Iterator for Merge {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        let Reverse((_, i)) = self.heap.pop()?;
        let out = self.heads[i].take();
        let n = self.streams[i].next();
        if let Some(r) = &n {
            self.heap.push(Reverse((r.time_ns, i)));
        }
        self.heads[i] = n;
        out
    }
}

/// Split `n` items into `k` non-empty parts at random (the lengths of a
/// generator's runs).
pub(crate) fn split(n: u64, k: u64, rng: &mut impl rand::Rng) -> Vec<u64> {
    if k == 0 || n == 0 {
        return Vec::new();
    }
    let k = k.min(n);
    let mut cuts: Vec<u64> = rand::seq::index::sample(rng, (n - 1) as usize, (k - 1) as usize)
        .into_iter()
        .map(|c| c as u64 + 1)
        .collect();
    cuts.sort_unstable();
    let mut parts = Vec::with_capacity(k as usize);
    let mut prev = 0;
    for c in cuts {
        parts.push(c - prev);
        prev = c;
    }
    parts.push(n - prev);
    parts
}
