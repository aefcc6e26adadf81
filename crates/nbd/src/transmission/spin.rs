//! Busy-polling for the next request of a client that sends one as soon as
//! it has the previous reply (queue depth 1: a guest's synchronous I/O).
//!
//! A thread that blocks waiting for the next request puts its CPU to
//! sleep, and waking it costs a wake-up: on a virtual machine whose idle
//! vCPUs halt at once (no guest halt-polling, as on this project's test
//! machines) that is a VM exit and a host reschedule, tens of
//! microseconds, more than serving a 4 KiB read from the page cache. So
//! when a connection's recent requests arrived within `limit` of the
//! previous reply, its thread stays awake that long, polling the socket
//! (and yielding its CPU to anything else that wants it), before it blocks.
//!
//! It only spins when every request has been answered, and only for a
//! client that keeps the connection busy: while at
//! least half of the last `HISTORY` waits for a request ended within
//! `SHORT_GAP` limits (measured whether the thread spun or slept, so a
//! client that speeds up is noticed); and at most [`Spinners`] connections
//! spin at once, so CPUs stay free for the clients. A waiting connection
//! yields its CPU to any other thread that wants it on each turn. `limit`
//! zero turns it off.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::AsyncBufRead;

/// Waits remembered (a shift register, newest in bit 0).
const HISTORY: u32 = 8;
/// Spin while at least this many of the last `HISTORY` waits were short.
const MIN_SHORT: u32 = HISTORY / 2;
/// A wait is short when the request came within this many `limit`s of
/// when the wait began (a sleeping thread's own wake-up counts in).
const SHORT_GAP: u32 = 2;

/// One connection's busy-poll state.
pub(super) struct Spin {
    limit: Duration,
    /// Bit i: the i-th most recent wait was short.
    short: u32,
}

impl Spin {
    pub(super) fn new(limit: Duration) -> Spin {
        Spin { limit, short: 0 }
    }

    fn wanted(&self) -> bool {
        !self.limit.is_zero() && self.short.count_ones() >= MIN_SHORT
    }

    /// A request's header began arriving `gap` after the wait for it began.
    pub(super) fn arrived(&mut self, gap: Duration) {
        let short = gap < self.limit * SHORT_GAP;
        self.short = ((self.short << 1) | short as u32) & ((1 << HISTORY) - 1);
    }

    /// Before waiting for the next request on `rd` (whose buffer is
    /// empty): if this connection's client keeps it busy, spin until `rd`
    /// has bytes or `limit` passes, while `idle()` holds (every earlier
    /// request answered: with requests still running, the CPU is better
    /// left to them, and their replies bring the next requests anyway).
    /// Consumes nothing.
    pub(super) async fn wait<R: AsyncBufRead + Unpin>(
        &self,
        rd: &mut R,
        spinners: &Spinners,
        idle: impl Fn() -> bool,
    ) {
        if !self.wanted() {
            return;
        }
        let Some(_turn) = spinners.enter() else {
            return;
        };
        let deadline = Instant::now() + self.limit;
        loop {
            // `poll_fill_buf` is cancel-safe: polling it once and dropping
            // it consumes nothing. Ready covers data, EOF and errors (the
            // real read that follows reports those).
            let ready = std::future::poll_fn(|cx| {
                Poll::Ready(Pin::new(&mut *rd).poll_fill_buf(cx).is_ready())
            })
            .await;
            if ready || Instant::now() >= deadline {
                return;
            }
            // Let the other tasks of this thread run (the writer sends the
            // last reply), and have the runtime poll its sockets without
            // sleeping; give the CPU to another thread if one wants it.
            tokio::task::yield_now().await;
            if !idle() {
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// How many connections may spin at once (server-wide).
pub(crate) struct Spinners {
    now: AtomicUsize,
    max: usize,
}

impl Spinners {
    /// At most half the CPUs spin; on a single CPU none does (the client
    /// needs that CPU to send the request being polled for).
    pub(crate) fn new() -> Spinners {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Spinners {
            now: AtomicUsize::new(0),
            max: cpus / 2,
        }
    }

    fn enter(&self) -> Option<Turn<'_>> {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Turn(self))
    }
}

/// A connection's turn to spin; ends when dropped.
struct Turn<'a>(&'a Spinners);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_while_the_client_keeps_the_connection_busy() {
        let limit = Duration::from_micros(100);
        let mut s = Spin::new(limit);
        assert!(!s.wanted());
        for _ in 0..MIN_SHORT {
            s.arrived(limit * SHORT_GAP - Duration::from_micros(1));
        }
        assert!(s.wanted());
        for _ in 0..HISTORY - MIN_SHORT {
            s.arrived(Duration::from_millis(5));
        }
        assert!(s.wanted());
        s.arrived(Duration::from_millis(5));
        assert!(!s.wanted());
        let mut off = Spin::new(Duration::ZERO);
        off.arrived(Duration::ZERO);
        assert!(!off.wanted());
    }

    #[test]
    fn at_most_max_spinners() {
        let sp = Spinners {
            now: AtomicUsize::new(0),
            max: 1,
        };
        let a = sp.enter();
        assert!(a.is_some());
        assert!(sp.enter().is_none());
        drop(a);
        assert!(sp.enter().is_some());
    }
}
