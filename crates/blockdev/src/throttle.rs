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
//!
//! A [`Duplex`] is both directions of one link. Several `throttle` layers
//! of one process may share one ([`Duplex::named`], `link=NAME`): the
//! TransCom server's 1 Gbit/s port, which every client's requests cross
//! after their own 100 Mbit/s link.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Op, Result};

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

/// What one direction of a link carried (a `throttle` layer's
/// `report=` file).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LinkStats {
    /// Requests that crossed, data or not (flushes, trims and block
    /// status queries cross with no bytes).
    pub requests: u64,
    /// Bytes carried.
    pub bytes: u64,
    /// `bytes / rate`: how long the link was busy sending, seconds (0 on
    /// an unlimited link).
    pub busy_seconds: f64,
    /// Time the requests waited at the link (queueing, transfer beyond
    /// the burst, latency), seconds.
    pub wait_seconds: f64,
}

/// One direction's state, under one lock.
#[derive(Default)]
struct State {
    /// When the bytes accepted so far have all been sent.
    tat: Option<Instant>,
    requests: u64,
    bytes: u64,
    wait: Duration,
}

/// One direction of an emulated link.
pub struct Link {
    spec: LinkSpec,
    state: Mutex<State>,
}

impl Link {
    pub fn new(spec: LinkSpec) -> Link {
        Link {
            spec,
            state: Mutex::new(State::default()),
        }
    }

    /// What this direction has carried so far.
    pub fn stats(&self) -> LinkStats {
        let s = self.state.lock();
        LinkStats {
            requests: s.requests,
            bytes: s.bytes,
            busy_seconds: if self.spec.rate == 0 {
                0.0
            } else {
                s.bytes as f64 / self.spec.rate as f64
            },
            wait_seconds: s.wait.as_secs_f64(),
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
        let mut s = self.state.lock();
        if self.spec.rate > 0 && bytes > 0 {
            let per = |n: u64| Duration::from_secs_f64(n as f64 / self.spec.rate as f64);
            let start = s.tat.map_or(now, |t| t.max(now));
            let end = start + per(bytes);
            s.tat = Some(end);
            let allowed = end.checked_sub(per(self.spec.burst)).unwrap_or(now);
            d += allowed.saturating_duration_since(now);
        }
        s.requests += 1;
        s.bytes += bytes;
        s.wait += d;
        d
    }
}

/// Both directions of a link: reads cross `down`, writes `up`.
pub struct Duplex {
    pub down: Link,
    pub up: Link,
}

/// A link's counters, both directions (the `report=` file, JSON).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct DuplexStats {
    /// The rate of each direction, bytes per second (0: unlimited).
    pub rate: u64,
    pub down: LinkStats,
    pub up: LinkStats,
}

impl Duplex {
    /// A link of its own.
    pub fn new(spec: LinkSpec) -> Arc<Duplex> {
        Arc::new(Duplex {
            down: Link::new(spec),
            up: Link::new(spec),
        })
    }

    /// The link called `name` in this process, made with `spec` if no one
    /// holds it now; a different `spec` for a link in use is an error
    /// (one port has one rate). Every holder shares both directions'
    /// token buckets and counters.
    pub fn named(name: &str, spec: LinkSpec) -> Result<Arc<Duplex>> {
        static LINKS: OnceLock<Mutex<HashMap<String, Weak<Duplex>>>> = OnceLock::new();
        let mut links = LINKS.get_or_init(Default::default).lock();
        links.retain(|_, l| l.strong_count() > 0);
        if let Some(l) = links.get(name).and_then(Weak::upgrade) {
            let have = l.spec();
            if have != spec {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    Op::Open,
                    "throttle",
                    format!(
                        "link '{name}' is already open with rate {} B/s, latency {:?}, burst {} B \
                         (this one: rate {} B/s, latency {:?}, burst {} B); give every throttle \
                         on link '{name}' the same rate, latency and burst",
                        have.rate, have.latency, have.burst, spec.rate, spec.latency, spec.burst
                    ),
                ));
            }
            return Ok(l);
        }
        let l = Duplex::new(spec);
        links.insert(name.to_string(), Arc::downgrade(&l));
        Ok(l)
    }

    pub fn spec(&self) -> LinkSpec {
        self.down.spec()
    }

    pub fn stats(&self) -> DuplexStats {
        DuplexStats {
            rate: self.spec().rate,
            down: self.down.stats(),
            up: self.up.stats(),
        }
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
        let s = l.stats();
        assert_eq!((s.requests, s.bytes), (3, 201_000));
        assert!((s.busy_seconds - 0.201).abs() < 1e-9, "{s:?}");
        assert!((s.wait_seconds - 0.325).abs() < 1e-9, "{s:?}");
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

    #[test]
    fn one_name_is_one_link_and_other_names_are_others() {
        let spec = LinkSpec {
            rate: 1_000_000,
            latency: Duration::ZERO,
            burst: 0,
        };
        let a = Duplex::named("test-one-name", spec).unwrap();
        let b = Duplex::named("test-one-name", spec).unwrap();
        let c = Duplex::named("test-other-name", spec).unwrap();
        let t0 = Instant::now();
        // a and b share the down direction's rate: b's 100 KB queues
        // behind a's; c is a link of its own; the up direction is apart.
        assert_eq!(a.down.delay(100_000, t0), Duration::from_millis(100));
        assert_eq!(b.down.delay(100_000, t0), Duration::from_millis(200));
        assert_eq!(c.down.delay(100_000, t0), Duration::from_millis(100));
        assert_eq!(b.up.delay(100_000, t0), Duration::from_millis(100));
        assert_eq!(a.stats(), b.stats());
        assert_eq!(a.stats().down.bytes, 200_000);
        assert_eq!(c.stats().down.bytes, 100_000);
        // Other settings for a link in use are refused, saying what to do.
        let faster = LinkSpec {
            rate: 2_000_000,
            ..spec
        };
        let e = Duplex::named("test-one-name", faster)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("already open") && e.contains("same rate"), "{e}");
        // Once no one holds it, the name may be opened anew.
        drop((a, b));
        let d = Duplex::named("test-one-name", faster).unwrap();
        assert_eq!(d.stats().down.bytes, 0);
    }
}
