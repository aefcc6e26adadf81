//! The units a user types and reads — byte sizes, durations and rates —
//! each with one grammar, used by every command, layer option, store
//! location and configuration file (no other parser of these exists).
//!
//! * Sizes: a whole number with an optional binary suffix: `4096`, `64K`,
//!   `1G`, `512MiB` (K, M, G, T, P, with or without `B`/`iB`: all powers
//!   of 1024).
//! * Durations: a number and a unit: `250us`, `8ms`, `1.5s`, `15m`, `2h`,
//!   `1d` (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`, `d`); a bare number is
//!   seconds where the caller allows it ([`Bare`]).
//! * Rates, in bytes per second: bits with a decimal prefix (`1Mbit`,
//!   `100kbit`, `1Gbps`), SI bytes (`750KB/s`, `6MB/s`: powers of 1000),
//!   or a binary size (`10M`, `64K/s`, `6MiB/s`); `/s` may follow any of
//!   them; `0` or `off` is no limit.

use std::time::Duration;

/// A value that does not follow its grammar; the message quotes the input
/// and shows what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

impl UnitError {
    fn new(msg: impl Into<String>) -> UnitError {
        UnitError(msg.into())
    }
}

/// Parse a byte size: a number with an optional binary suffix
/// (K, M, G, T, P with optional `iB`/`B`; all powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(UnitError::new(format!(
            "'{s}' is not a size: expected a number such as 4096, 64K or 1G"
        )));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| UnitError::new(format!("'{s}' is too large")))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        other => {
            return Err(UnitError::new(format!(
                "'{s}': unknown size suffix '{other}' (use K, M, G, T or P)"
            )))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| UnitError::new(format!("'{s}' is too large")))
}

/// Print a byte count with a binary suffix, exact when it divides evenly
/// (`512 B`, `1 GiB`, `1.5 KiB`).
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// What a number with no unit means to [`parse_duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bare {
    /// Seconds (`30` is `30s`).
    Seconds,
    /// Nothing: the unit must be written (where a bare `8` would as
    /// likely mean milliseconds, as a latency does).
    Refuse,
}

/// Split `t` into its number and the unit that follows it (letters, `µ`).
fn number_and_unit(t: &str) -> (&str, &str) {
    let unit_len: usize = t
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphabetic() || *c == 'µ')
        .map(char::len_utf8)
        .sum();
    let (num, unit) = t.split_at(t.len() - unit_len);
    (num.trim(), unit)
}

/// Parse a duration: `250us`, `8ms`, `1.5s`, `15m`, `2h`, `1d`, `0`.
pub fn parse_duration(s: &str, bare: Bare) -> Result<Duration, UnitError> {
    let bad = || {
        UnitError::new(format!(
            "'{s}' is not a duration: write e.g. 250us, 8ms, 1.5s, 15m or 2h"
        ))
    };
    let t = s.trim();
    let (num, unit) = number_and_unit(t);
    let scale = match unit {
        "" if bare == Bare::Seconds || num == "0" => 1.0,
        "" => {
            return Err(UnitError::new(format!(
                "'{s}': give the unit, e.g. {num}ms or {num}s"
            )))
        }
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        u => {
            return Err(UnitError::new(format!(
                "'{s}': unknown time unit '{u}' (use ns, us, ms, s, m, h or d)"
            )))
        }
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(UnitError::new(format!(
            "'{s}': a duration is a number of 0 or more"
        )));
    }
    Duration::try_from_secs_f64(v * scale).map_err(|_| bad())
}

/// Parse a rate in bytes per second (see the module's grammar); `0` and
/// `off` give 0 (no limit), any other value is more than 0.
pub fn parse_rate(s: &str) -> Result<f64, UnitError> {
    let bad = |why: &str| {
        UnitError::new(format!(
            "'{s}' is not a rate{why}: write e.g. 1Mbit, 100kbit, 6MB/s (SI), 6MiB/s or 10M (binary)"
        ))
    };
    let t = s.trim();
    if t == "0" || t.eq_ignore_ascii_case("off") {
        return Ok(0.0);
    }
    let body = t.strip_suffix("/s").unwrap_or(t);
    let (num, unit) = number_and_unit(body);
    let lower = unit.to_ascii_lowercase();
    let decimal = |p: &str| match p {
        "" => Some(1.0),
        "k" => Some(1e3),
        "m" => Some(1e6),
        "g" => Some(1e9),
        _ => None,
    };
    let scale = if let Some(p) = lower
        .strip_suffix("bit")
        .or_else(|| lower.strip_suffix("bps"))
    {
        decimal(p).ok_or_else(|| bad(""))? / 8.0
    } else {
        match unit {
            "B" | "kB" | "KB" | "MB" | "GB" => decimal(&lower[..lower.len() - 1]).expect("SI"),
            _ => {
                // A binary size per second.
                let n = parse_size(&format!("1{unit}")).map_err(|_| bad(""))?;
                n as f64
            }
        }
    };
    let v: f64 = num.parse().map_err(|_| bad(""))?;
    let r = v * scale;
    if !(r.is_finite() && r > 0.0) {
        return Err(bad(" (it must be more than 0, or off)"));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert!(parse_size("x").is_err());
        assert!(parse_size("1Q").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("20000000P").is_err());
    }

    #[test]
    fn sizes_print() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(1536), "1.5 KiB");
    }

    #[test]
    fn rates_and_durations_parse() {
        let d = |s| parse_duration(s, Bare::Refuse);
        assert_eq!(parse_rate("1Mbit").unwrap(), 125_000.0);
        assert_eq!(parse_rate("100kbit").unwrap(), 12_500.0);
        assert_eq!(parse_rate("10M").unwrap(), (10 << 20) as f64);
        assert_eq!(parse_rate("64K/s").unwrap(), (64 << 10) as f64);
        assert_eq!(parse_rate("off").unwrap(), 0.0);
        assert!(parse_rate("fast").is_err() && parse_rate("0bit").is_err());
        assert_eq!(d("8ms").unwrap(), Duration::from_millis(8));
        assert_eq!(d("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(d("250us").unwrap(), Duration::from_micros(250));
        assert!(d("8").is_err() && d("-1s").is_err());
    }

    #[test]
    fn one_grammar_serves_every_caller() {
        let secs = |s| parse_duration(s, Bare::Seconds).map(|d| d.as_secs_f64());
        // Model parameters (seconds as f64).
        assert!((secs("8ms").unwrap() - 0.008).abs() < 1e-15);
        assert!((secs("0.32ms").unwrap() - 0.00032).abs() < 1e-15);
        assert!((secs("150us").unwrap() - 150e-6).abs() < 1e-15);
        assert!((secs("2").unwrap() - 2.0).abs() < 1e-15);
        assert!(secs("8 parsecs").is_err());
        // Ages and timeouts.
        assert_eq!(secs("90").unwrap(), 90.0);
        assert_eq!(secs("15m").unwrap(), 900.0);
        assert_eq!(secs("2h").unwrap(), 7200.0);
        assert_eq!(secs("1d").unwrap(), 86400.0);
        assert_eq!(secs("1.5e3s").unwrap(), 1500.0);
        assert!(secs("inf").is_err() && secs("").is_err() && secs("s").is_err());
        assert!(parse_duration("0", Bare::Refuse).is_ok());
        // Bandwidths: SI with B, binary with iB or a bare prefix.
        assert_eq!(parse_rate("6MB/s").unwrap(), 6e6);
        assert_eq!(parse_rate("6MiB/s").unwrap(), 6.0 * 1048576.0);
        assert_eq!(parse_rate("750KB/s").unwrap(), 750e3);
        assert_eq!(parse_rate("1Gbps").unwrap(), 125e6);
        assert!(parse_rate("0MB/s").is_err());
        assert!(parse_rate("6XB/s")
            .unwrap_err()
            .to_string()
            .contains("6MB/s"));
    }
}
