//! An emulated network link: a bandwidth limit (a token bucket, kept as
//! the generic cell-rate algorithm: one "theoretical arrival time" per
//! direction) and a fixed latency per request. Used by the `throttle:`
//! layer and by `roamdisk store serve --limit --latency`, so the seeds'
//! bandwidth experiments (ISR at 1-100 Mbit/s, Machine Bank's 100 Mbit/s
//! lab) run on one machine over loopback.
//!
//! A request of `n` bytes is sent when the bucket holds `n` tokens: it
//! waits until `tat - burst / rate`, where `tat` advances by `n / rate`
//! for every request (so concurrent requests share the rate in arrival
//! order), and then for the latency. The latency is per request and does
//! not hold the link: many requests in flight overlap their latencies,
//! as on a real network.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// A link's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkSpec {
    /// Bytes per second; 0 = unlimited.
    pub rate: u64,
    /// Latency added to every request.
    pub latency: Duration,
    /// Bytes that may go at once after an idle period (the bucket's
    /// depth); default 64 KiB.
    pub burst: u64,
}

/// One direction of an emulated link.
pub struct Link {
    spec: LinkSpec,
    /// When the bytes accepted so far have all been sent.
    tat: Mutex<Option<Instant>>,
}

impl Link {
    pub fn new(spec: LinkSpec) -> Link {
        Link {
            spec,
            tat: Mutex::new(None),
        }
    }

    pub fn spec(&self) -> LinkSpec {
        self.spec
    }

    /// Wait until `bytes` may have crossed the link, plus its latency.
    pub fn pass(&self, bytes: u64) {
        let wait = self.delay(bytes, Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// How long a request of `bytes` arriving at `now` waits.
    pub fn delay(&self, bytes: u64, now: Instant) -> Duration {
        let mut d = self.spec.latency;
        if self.spec.rate > 0 && bytes > 0 {
            let per = |n: u64| Duration::from_secs_f64(n as f64 / self.spec.rate as f64);
            let mut tat = self.tat.lock();
            let start = tat.map_or(now, |t| t.max(now));
            let end = start + per(bytes);
            *tat = Some(end);
            let allowed = end.checked_sub(per(self.spec.burst)).unwrap_or(now);
            d += allowed.saturating_duration_since(now);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_share_the_rate_in_arrival_order() {
        let l = Link::new(LinkSpec {
            rate: 1_000_000,
            latency: Duration::from_millis(8),
            burst: 0,
        });
        let t0 = Instant::now();
        // 100 KB takes 100 ms at 1 MB/s; the next 100 KB queues behind it.
        let a = l.delay(100_000, t0);
        let b = l.delay(100_000, t0);
        assert_eq!(a, Duration::from_millis(108));
        assert_eq!(b, Duration::from_millis(208));
        // After the link idles, a request waits only for itself.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(l.delay(1_000, later), Duration::from_millis(9));
    }

    #[test]
    fn a_burst_goes_at_once_after_idle() {
        let l = Link::new(LinkSpec {
            rate: 1_000_000,
            latency: Duration::ZERO,
            burst: 50_000,
        });
        let t0 = Instant::now();
        assert_eq!(l.delay(50_000, t0), Duration::ZERO);
        assert_eq!(l.delay(50_000, t0), Duration::from_millis(50));
    }
}
