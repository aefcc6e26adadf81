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

/// Parse a rate: bits per second with a decimal prefix (`1Mbit`,
/// `100kbit`, `1Gbit`), or bytes per second as a size (`10M`, `512K`,
/// binary prefixes; `/s` may follow). `0` or `off` means unlimited.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t == "0" || t.eq_ignore_ascii_case("off") {
        return Ok(0);
    }
    let lower = t.to_ascii_lowercase();
    if let Some(num) = lower
        .strip_suffix("bit")
        .or_else(|| lower.strip_suffix("bps"))
    {
        let (n, mult) = match num.chars().last() {
            Some('k') => (&num[..num.len() - 1], 1e3),
            Some('m') => (&num[..num.len() - 1], 1e6),
            Some('g') => (&num[..num.len() - 1], 1e9),
            _ => (num, 1.0),
        };
        let v: f64 = n
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not a rate: expected e.g. 1Mbit, 100kbit or 10M"))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("'{s}': a rate must be more than 0"));
        }
        return Ok(((v * mult / 8.0).round() as u64).max(1));
    }
    crate::units::parse_size(lower.strip_suffix("/s").unwrap_or(&lower))
        .map_err(|m| format!("{m} (a rate: e.g. 1Mbit, 100kbit, or bytes per second such as 10M)"))
}

/// Parse a duration: `8ms`, `250us`, `1.5s`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!(
            "'{s}' is not a duration: expected e.g. 8ms, 250us or 1s"
        ));
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale < 3600.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!(
            "'{s}' is not a duration: expected e.g. 8ms, 250us or 1s"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations_parse() {
        assert_eq!(parse_rate("1Mbit").unwrap(), 125_000);
        assert_eq!(parse_rate("100kbit").unwrap(), 12_500);
        assert_eq!(parse_rate("10M").unwrap(), 10 << 20);
        assert_eq!(parse_rate("64K/s").unwrap(), 64 << 10);
        assert_eq!(parse_rate("off").unwrap(), 0);
        assert!(parse_rate("fast").is_err() && parse_rate("0bit").is_err());
        assert_eq!(parse_duration("8ms").unwrap(), Duration::from_millis(8));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("8").is_err() && parse_duration("-1s").is_err());
    }

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
