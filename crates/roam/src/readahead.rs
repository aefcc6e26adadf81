//! Read-ahead: the one policy that keeps a sequential reader ahead of
//! its data (Machine Bank 3.3: fetch what the guest will read next while
//! it works on what it has), for a session's base and for a version served
//! as a disk of its own.
//!
//! [`Tracker`] finds the runs. Every read is reported here by chunk (all of
//! them: a run goes on through the chunks an earlier window put into a
//! session's private cache). A read of chunk `c` right after one of `c - 1`
//! (among the last [`RECENT`] chunks read) starts a *stream*: the
//! [`INITIAL`] chunks after the read (or as many as the read spanned, if
//! more) are read ahead. When the reader reaches the latest window of a
//! stream, the next window follows, twice as long, up to [`MAX`] chunks:
//! a run that goes on is kept 32 to 64 chunks ahead. Random reads start no
//! stream (their previous chunk is almost never among the recent ones)
//! and bring nothing more than they read. Concurrent readers are fine: the
//! test is "was the previous chunk read lately", not "was it the last
//! read", so reads that arrive out of order (several NBD requests in
//! flight) still make a run, and up to [`STREAMS`] runs (several files
//! read at once) are followed.
//!
//! [`ReadAhead`] queues the windows to a background thread, which acts on
//! each (`crate::view::AheadTarget`), chunk by chunk:
//! a chunk a cache of the fetch chain holds is only *advised* (read into
//! the page cache: one file per chunk defeats the kernel's own read-ahead,
//! which a raw image gets across chunk boundaries); any other is
//! *fetched*, together with the rest of its window (one batched request),
//! and kept by the shared cache or, without one, by the reader. Chunks the
//! reader has read already, or no longer reads from the version, are
//! skipped.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, OnceLock};

use parking_lot::Mutex;
use roamdisk_chunkstore::hash::ChunkId;

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

/// Chunks of a version to read ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The version (a session's base changes when it commits).
    pub base: ChunkId,
    pub chunks: Range<usize>,
}

/// The read-ahead of one reader: its runs, the chunks it has read, and
/// the queue of windows to the background thread that acts on them
/// (`crate::view::AheadTarget`).
pub struct ReadAhead {
    tracker: Mutex<Tracker>,
    tx: OnceLock<mpsc::Sender<Window>>,
    /// One bit per chunk: the reader read it. The read-ahead brings only
    /// what the reader has not read: with many reads in flight it is
    /// often ahead of a window.
    read: Vec<AtomicU64>,
}

impl ReadAhead {
    /// For a version of `chunks` chunks; nothing is read ahead until
    /// [`ReadAhead::start`].
    pub fn new(chunks: usize) -> ReadAhead {
        ReadAhead {
            tracker: Mutex::new(Tracker::default()),
            tx: OnceLock::new(),
            read: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Start the background thread (once): it hands the windows that
    /// arrive together to `act`, until `act` returns false (its reader is
    /// gone) or the reader drops this.
    pub fn start(&self, mut act: impl FnMut(Vec<Window>) -> bool + Send + 'static) {
        let (tx, rx) = mpsc::channel::<Window>();
        if self.tx.set(tx).is_err() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("cas-readahead".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut jobs = vec![first];
                    jobs.extend(rx.try_iter());
                    if !act(jobs) {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the read-ahead: {e}");
        }
    }

    /// Whether the reader read chunk `i` since it opened.
    pub fn was_read(&self, i: usize) -> bool {
        self.read
            .get(i / 64)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (i % 64)) != 0)
    }

    /// The reader reads bytes `[a, b)` of version `base` (chunks of
    /// `chunk_size` bytes, `chunks` of them): if that continues a
    /// sequential run, queue the chunks that come next (the reader does
    /// not wait for them). Every read counts, whatever its sectors'
    /// states: chunks a session's read-ahead put into its private cache
    /// read from there, and a run through them must go on.
    pub fn on_read(&self, base: ChunkId, chunk_size: u32, chunks: usize, a: u64, b: u64) {
        let Some(tx) = self.tx.get().filter(|_| b > a) else {
            return;
        };
        let cs = chunk_size as u64;
        let (c0, c1) = ((a / cs) as usize, ((b - 1) / cs) as usize);
        for c in c0..=c1 {
            if let Some(w) = self.read.get(c / 64) {
                w.fetch_or(1 << (c % 64), Ordering::Relaxed);
            }
        }
        let next = self.tracker.lock().on_read(c0, c1, chunks);
        if let Some(chunks) = next {
            let _ = tx.send(Window { base, chunks });
        }
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
