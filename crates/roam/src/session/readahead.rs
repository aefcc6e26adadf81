//! Sequential read-ahead of a session's base chunks: which chunks to fetch
//! before the guest asks for them (Machine Bank 3.3: fetch what the guest
//! will read next while it works on what it has).
//!
//! The guest's reads are reported here by chunk (all of them: a run goes on
//! through the chunks an earlier window put into the private cache). A
//! read of chunk `c` right after one of `c - 1` (among the last [`RECENT`]
//! chunks read) starts a *stream*: the [`INITIAL`] chunks after the read
//! (or as many as the read spanned, if more) are fetched. When the guest
//! reaches the latest window of a stream, the next window is fetched, twice
//! as long, up to [`MAX`] chunks: a run that goes on is kept 32 to 64 chunks
//! ahead of the guest. Random reads start no stream (their previous chunk
//! is almost never among the recent ones) and fetch nothing more than they
//! read. Concurrent readers are fine: the test is "was the previous chunk
//! read lately", not "was it the last read", so reads that arrive out of
//! order (several NBD requests in flight) still make a run, and up to
//! [`STREAMS`] runs (several files read at once) are followed.
//!
//! Pure bookkeeping, cheap enough for the guest's read path; the fetching,
//! of the chunks that still read from the base, happens elsewhere
//! (`CasDev::start_readahead`).

use std::collections::VecDeque;
use std::ops::Range;

/// Chunks fetched when a stream starts.
pub const INITIAL: usize = 4;
/// Most chunks of one window.
pub const MAX: usize = 32;
/// Chunks remembered as read lately.
pub const RECENT: usize = 64;
/// Runs followed at once.
pub const STREAMS: usize = 4;

/// One sequential run of the guest.
#[derive(Debug, Clone)]
struct Stream {
    /// The first chunk the run read (a read before it is not the run's).
    origin: usize,
    /// The latest window fetched: `start..end`.
    start: usize,
    end: usize,
    /// Its length as asked (before clipping at the end of the disk).
    size: usize,
    /// When the run last read (for eviction).
    used: u64,
}

/// The read-ahead state of one session.
#[derive(Debug, Default)]
pub struct Tracker {
    recent: VecDeque<usize>,
    streams: Vec<Stream>,
    tick: u64,
}

impl Tracker {
    /// The guest read base chunks `c0..=c1` of a disk of `chunks` chunks:
    /// the chunks to fetch ahead now, if any.
    pub fn on_read(&mut self, c0: usize, c1: usize, chunks: usize) -> Option<Range<usize>> {
        self.tick += 1;
        let (tick, span) = (self.tick, c1 + 1 - c0);
        let hit = self
            .streams
            .iter_mut()
            .find(|s| s.origin <= c1 && c0 <= s.end);
        let ahead = match hit {
            Some(s) => {
                s.used = tick;
                // The guest reached the latest window: fetch the next one.
                (c1 >= s.start).then(|| {
                    s.size = (s.size * 2).max(span).min(MAX);
                    s.start = s.end.max(c1 + 1).min(chunks);
                    s.end = (s.start + s.size).min(chunks);
                    s.start..s.end
                })
            }
            None if c0 > 0 && self.recent.contains(&(c0 - 1)) => {
                if self.streams.len() == STREAMS {
                    let oldest = (0..STREAMS)
                        .min_by_key(|&k| self.streams[k].used)
                        .expect("streams");
                    self.streams.swap_remove(oldest);
                }
                let size = INITIAL.max(span).min(MAX);
                let start = (c1 + 1).min(chunks);
                let s = Stream {
                    origin: c0,
                    start,
                    end: (start + size).min(chunks),
                    size,
                    used: tick,
                };
                let r = s.start..s.end;
                self.streams.push(s);
                Some(r)
            }
            None => None,
        };
        for c in c0.max(c1.saturating_sub(RECENT - 1))..=c1 {
            if !self.recent.contains(&c) {
                if self.recent.len() == RECENT {
                    self.recent.pop_front();
                }
                self.recent.push_back(c);
            }
        }
        ahead.filter(|r| !r.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read chunks one by one from `from` to `to` (exclusive): what is
    /// fetched ahead, as one list.
    fn run(t: &mut Tracker, from: usize, to: usize, chunks: usize) -> Vec<Range<usize>> {
        (from..to).filter_map(|c| t.on_read(c, c, chunks)).collect()
    }

    #[test]
    fn a_sequential_run_is_fetched_ahead_in_growing_windows() {
        let mut t = Tracker::default();
        let got = run(&mut t, 10, 80, 1000);
        assert_eq!(got[0], 12..16, "the second read starts the stream");
        let sizes: Vec<usize> = got.iter().map(|r| r.len()).collect();
        assert_eq!(sizes[..5], [4, 8, 16, 32, 32]);
        // Contiguous windows, never fetching a chunk twice or one read.
        for w in got.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        // Each window is asked for as the guest enters the previous one:
        // the guest is never past what was fetched.
        let mut t = Tracker::default();
        let mut ahead = 0;
        for c in 0..500 {
            if let Some(r) = t.on_read(c, c, 1000) {
                ahead = r.end;
            }
            assert!(c < 2 || ahead > c + 1, "chunk {c}: fetched up to {ahead}");
        }
    }

    #[test]
    fn random_reads_fetch_nothing_ahead() {
        let mut t = Tracker::default();
        // Even chunks in a scrambled order: no chunk follows its previous.
        let mut c = 7usize;
        for _ in 0..500 {
            c = (c * 7919 + 13) % 1000;
            let even = c / 2 * 2;
            assert_eq!(t.on_read(even, even, 1000), None, "chunk {even}");
        }
        // The same chunk again and again is no run either.
        for _ in 0..10 {
            assert_eq!(t.on_read(500, 500, 1000), None);
        }
    }

    #[test]
    fn big_reads_out_of_order_and_the_end_of_the_disk() {
        // Reads of 8 chunks: the first window is as long as a read.
        let mut t = Tracker::default();
        assert_eq!(t.on_read(0, 7, 100), None);
        assert_eq!(t.on_read(8, 15, 100), Some(16..24));
        assert_eq!(t.on_read(16, 23, 100), Some(24..40));
        // Reads of the same run arriving out of order stay in the run.
        assert_eq!(t.on_read(30, 31, 100), Some(40..72));
        assert_eq!(t.on_read(26, 27, 100), None);
        // The disk ends at chunk 100.
        assert_eq!(t.on_read(45, 46, 100), Some(72..100));
        assert_eq!(t.on_read(80, 80, 100), None);
        assert_eq!(t.on_read(99, 99, 100), None);
        // Two runs at once are both followed.
        let mut t = Tracker::default();
        for c in 0..20 {
            t.on_read(c, c, 10_000);
            t.on_read(5000 + c, 5000 + c, 10_000);
        }
        assert!(t.on_read(20, 20, 10_000).is_none_or(|r| r.start > 20));
        assert_eq!(t.streams.len(), 2);
        let ends: Vec<usize> = t.streams.iter().map(|s| s.end).collect();
        assert!(ends[0] > 20 && ends[1] > 5020, "{ends:?}");
    }
}
