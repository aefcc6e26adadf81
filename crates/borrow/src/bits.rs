//! A fixed-size bitmap of atomics: one bit per 4 KiB block of the borrowed
//! disk (100 GiB = 3.2 MiB of bitmap), set and read without locks.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Bits {
    words: Vec<AtomicU64>,
    len: u64,
}

impl Bits {
    pub fn new(len: u64) -> Bits {
        Bits {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    pub fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize].load(Ordering::Acquire) >> (i % 64) & 1 == 1
    }

    /// Set or clear bits `[a, b)`.
    pub fn put_range(&self, a: u64, b: u64, on: bool) {
        let mut i = a;
        while i < b {
            let w = i / 64;
            let lo = i % 64;
            let hi = (b - w * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            if on {
                self.words[w as usize].fetch_or(mask, Ordering::AcqRel);
            } else {
                self.words[w as usize].fetch_and(!mask, Ordering::AcqRel);
            }
            i = w * 64 + hi;
        }
    }

    /// Whether any bit of `[a, b)` is set.
    pub fn any(&self, a: u64, b: u64) -> bool {
        (a..b).any(|i| self.get(i))
    }

    /// Runs of set bits as `[start, end)`, in order.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut start: Option<u64> = None;
        let mut i = 0;
        while i < self.len {
            let w = self.words[(i / 64) as usize].load(Ordering::Acquire);
            // Whole words that continue the current state are skipped.
            if i % 64 == 0
                && self.len - i >= 64
                && (w == 0 && start.is_none() || w == u64::MAX && start.is_some())
            {
                i += 64;
                continue;
            }
            match (w >> (i % 64) & 1 == 1, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    out.push((s, i));
                    start = None;
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(s) = start {
            out.push((s, self.len));
        }
        out
    }

    /// Number of set bits.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_runs() {
        let b = Bits::new(300);
        b.put_range(3, 130, true);
        b.put_range(64, 70, false);
        b.put_range(290, 300, true);
        assert_eq!(b.runs(), vec![(3, 64), (70, 130), (290, 300)]);
        assert_eq!(b.count(), 61 + 60 + 10);
        assert!(b.any(0, 4) && !b.any(0, 3) && !b.any(130, 290));
    }
}
