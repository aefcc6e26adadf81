//! Per-connection buffers for READ data and WRITE payloads.

use parking_lot::Mutex;

/// Buffers smaller than this are not worth keeping.
const POOL_MIN_BUFFER: usize = 4096;
/// Buffers larger than this are not kept.
const POOL_MAX_BUFFER: usize = 4 << 20;
/// Most bytes kept for reuse per connection.
const POOL_MAX_BYTES: usize = 32 << 20;

/// READ data and WRITE payload buffers, reused so that large requests do
/// not zero-fill and page-fault fresh memory every time. A reused buffer
/// holds stale bytes of an earlier request of the same connection; only
/// bytes that were just filled are used (`read_at` fills all of its buffer,
/// a payload is read in full before use).
#[derive(Default)]
pub(super) struct Buffers {
    free: Mutex<FreeList>,
}

#[derive(Default)]
struct FreeList {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl Buffers {
    /// A buffer of at least `len` bytes, contents unspecified.
    pub(super) fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock();
        let best = free
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let b = free.bufs.swap_remove(i);
                free.bytes -= b.len();
                b
            }
            None => {
                drop(free);
                vec![0u8; len]
            }
        }
    }

    /// Keep `buf` for reuse if there is room.
    pub(super) fn give(&self, buf: Vec<u8>) {
        if !(POOL_MIN_BUFFER..=POOL_MAX_BUFFER).contains(&buf.len()) {
            return;
        }
        let mut free = self.free.lock();
        if free.bytes + buf.len() <= POOL_MAX_BYTES {
            free.bytes += buf.len();
            free.bufs.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_smallest_fit_first_and_bounded() {
        let b = Buffers::default();
        b.give(vec![1u8; 8192]);
        b.give(vec![2u8; 1 << 20]);
        b.give(vec![3u8; 100]);
        assert_eq!(b.take(4096).len(), 8192);
        assert_eq!(b.take(4096).len(), 1 << 20);
        assert_eq!(b.take(4096).len(), 4096);
        for _ in 0..64 {
            b.give(vec![0u8; POOL_MAX_BUFFER]);
        }
        let free = b.free.lock();
        assert!(free.bytes <= POOL_MAX_BYTES);
        assert_eq!(free.bytes, free.bufs.iter().map(Vec::len).sum::<usize>());
    }
}
