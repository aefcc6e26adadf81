//! Free extents: absolute byte ranges of the device, and the fast scan
//! that turns an allocation bitmap into runs of clear bits.

use serde::{Deserialize, Serialize};

/// A run of bytes `[start, start + len)`, absolute on the scanned device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Collects extents handed over in increasing order, merging each with the
/// previous one when they touch, and passes finished extents on.
pub(crate) struct Merger<'f> {
    cur: Option<Extent>,
    out: &'f mut dyn FnMut(Extent),
    pub total: u64,
    /// End of the last extent pushed: extents must arrive sorted.
    last_end: u64,
}

impl<'f> Merger<'f> {
    pub fn new(out: &'f mut dyn FnMut(Extent)) -> Self {
        Merger {
            cur: None,
            out,
            total: 0,
            last_end: 0,
        }
    }

    /// Add `[start, start + len)`; it must not start before the end of the
    /// previous one.
    pub fn push(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        debug_assert!(start >= self.last_end, "extents out of order");
        self.last_end = start + len;
        self.total += len;
        match &mut self.cur {
            Some(c) if c.end() == start => c.len += len,
            Some(c) => {
                let done = *c;
                *c = Extent { start, len };
                (self.out)(done);
            }
            None => self.cur = Some(Extent { start, len }),
        }
    }

    pub fn finish(mut self) -> u64 {
        if let Some(c) = self.cur.take() {
            (self.out)(c);
        }
        self.total
    }
}

/// Call `f(first, count)` for every run of clear bits among bits
/// `[0, nbits)` of `bitmap` (bit `i` is bit `i % 8` of byte `i / 8`, the
/// order ext2/3/4 and NTFS both use). Bits past the end of `bitmap` count
/// as set (in use), so a short bitmap never yields free space.
pub fn clear_runs(bitmap: &[u8], nbits: u64, mut f: impl FnMut(u64, u64)) {
    let nbits = nbits.min(bitmap.len() as u64 * 8);
    let mut run_start: Option<u64> = None;
    let mut i = 0u64;
    // Word at a time: all-set and all-clear words are skipped in one step.
    while i < nbits {
        let byte = (i / 8) as usize;
        if i.is_multiple_of(64) && nbits - i >= 64 {
            let w = u64::from_le_bytes(bitmap[byte..byte + 8].try_into().expect("8 bytes"));
            if w == u64::MAX {
                if let Some(s) = run_start.take() {
                    f(s, i - s);
                }
                i += 64;
                continue;
            }
            if w == 0 {
                run_start.get_or_insert(i);
                i += 64;
                continue;
            }
            // Mixed word: walk its runs with trailing_zeros/ones.
            let mut w = w;
            let mut k = 0u32;
            while k < 64 {
                if w & 1 == 0 {
                    let n = if w == 0 {
                        64 - k
                    } else {
                        w.trailing_zeros().min(64 - k)
                    };
                    run_start.get_or_insert(i + k as u64);
                    k += n;
                    w = if n >= 64 { 0 } else { w >> n };
                } else {
                    let n = (!w).trailing_zeros().min(64 - k);
                    if let Some(s) = run_start.take() {
                        f(s, i + k as u64 - s);
                    }
                    k += n;
                    w = if n >= 64 { 0 } else { w >> n };
                }
            }
            i += 64;
            continue;
        }
        let set = bitmap[byte] >> (i % 8) & 1 == 1;
        if set {
            if let Some(s) = run_start.take() {
                f(s, i - s);
            }
        } else {
            run_start.get_or_insert(i);
        }
        i += 1;
    }
    if let Some(s) = run_start {
        f(s, nbits - s);
    }
}

/// Sort and merge extents (touching or overlapping ones become one).
pub fn normalize(mut v: Vec<Extent>) -> Vec<Extent> {
    v.retain(|e| e.len > 0);
    v.sort();
    let mut out: Vec<Extent> = Vec::with_capacity(v.len());
    for e in v {
        match out.last_mut() {
            Some(l) if e.start <= l.end() => {
                let end = l.end().max(e.end());
                l.len = end - l.start;
            }
            _ => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(bitmap: &[u8], nbits: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        let mut s = None;
        for i in 0..nbits.min(bitmap.len() as u64 * 8) {
            let set = bitmap[(i / 8) as usize] >> (i % 8) & 1 == 1;
            match (set, s) {
                (false, None) => s = Some(i),
                (true, Some(st)) => {
                    v.push((st, i - st));
                    s = None
                }
                _ => {}
            }
        }
        if let Some(st) = s {
            v.push((st, nbits.min(bitmap.len() as u64 * 8) - st));
        }
        v
    }

    proptest! {
        #[test]
        fn clear_runs_matches_naive(bytes in proptest::collection::vec(
            prop_oneof![Just(0u8), Just(0xffu8), any::<u8>()], 0..64), cut in 0u64..600) {
            let mut got = Vec::new();
            clear_runs(&bytes, cut, |s, n| got.push((s, n)));
            prop_assert_eq!(got, naive(&bytes, cut));
        }
    }

    #[test]
    fn merger_joins_touching_extents() {
        let mut out = Vec::new();
        let mut f = |e| out.push(e);
        let mut m = Merger::new(&mut f);
        m.push(0, 10);
        m.push(10, 5);
        m.push(20, 1);
        assert_eq!(m.finish(), 16);
        assert_eq!(
            out,
            vec![Extent { start: 0, len: 15 }, Extent { start: 20, len: 1 }]
        );
    }
}
