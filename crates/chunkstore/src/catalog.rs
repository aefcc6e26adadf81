//! A catalog: the versions of one image of one user (`USER/IMAGE`), in
//! commit order, each with time, description, parent, tags and commit
//! statistics. The seed's Catalog File (section 3.5): browsing it and
//! checking out an older entry is time travel. Stored as a ref of the
//! chunk store, updated by compare-and-swap. Byte layout:
//! `docs/formats/cas-catalog.md`. Pure encoding and parsing (a fuzz target).

use crate::bytes::{Reader, Writer};
use crate::error::{bad_arg, corrupt, not_found};
use crate::hash::ChunkId;
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 8] = *b"RDCASCAT";
pub const VERSION: u32 = 1;
const HEADER_SIZE: usize = 32;
const MAX_ENTRIES: u32 = 1 << 20;
const MAX_DESCRIPTION: usize = 4096;
const MAX_TAGS: usize = 32;
pub const FLAG_ENCRYPTED: u32 = 1;

/// One version in a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: ChunkId,
    pub parent: Option<ChunkId>,
    /// Nanoseconds since the Unix epoch (UTC).
    pub created: i64,
    pub disk_size: u64,
    pub encrypted: bool,
    pub new_objects: u64,
    pub reused_objects: u64,
    pub uploaded_bytes: u64,
    pub data_bytes: u64,
    pub description: String,
    pub tags: Vec<String>,
}

/// The versions of one image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Catalog {
    pub generation: u64,
    pub entries: Vec<Entry>,
}

/// Validate a tag name: 1-64 of `[A-Za-z0-9._-]`, not all hex digits of
/// length ≥ 4 (those would read as version ids) and not starting with a
/// digit-dash date shape.
pub fn check_tag(t: &str) -> Result<()> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    let hexlike = t.len() >= 4 && t.bytes().all(|b| b.is_ascii_hexdigit());
    let datelike = t.as_bytes().first().is_some_and(|b| b.is_ascii_digit());
    if !ok || hexlike || datelike {
        return Err(bad_arg(format!(
            "'{t}' is not a usable tag: 1-64 letters, digits, '.', '_' or '-', starting with a letter and not made of hex digits only"
        )));
    }
    Ok(())
}

impl Catalog {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&MAGIC)
            .u32(VERSION)
            .u32(self.entries.len() as u32)
            .u64(self.generation)
            .u32(0)
            .crc();
        for e in &self.entries {
            w.id(&e.version)
                .id(&e.parent.unwrap_or(ChunkId::ZERO))
                .i64(e.created)
                .u64(e.disk_size)
                .u32(if e.encrypted { FLAG_ENCRYPTED } else { 0 })
                .u64(e.new_objects)
                .u64(e.reused_objects)
                .u64(e.uploaded_bytes)
                .u64(e.data_bytes)
                .str16(&e.description)
                .u8(e.tags.len() as u8);
            for t in &e.tags {
                w.u8(t.len() as u8).bytes(t.as_bytes());
            }
        }
        w.crc();
        w.buf
    }

    pub fn parse(b: &[u8]) -> Result<Catalog> {
        if b.len() < HEADER_SIZE + 4 {
            return Err(corrupt(format!(
                "catalog of {} bytes is truncated",
                b.len()
            )));
        }
        let (body, trailer) = b.split_at(b.len() - 4);
        let mut r = Reader::new(body, "catalog");
        r.frame(&MAGIC, VERSION)?;
        let count = r.u32("count")?;
        let generation = r.u64("generation")?;
        let reserved = r.u32("reserved")?;
        r.header_crc()?;
        if reserved != 0 {
            return Err(corrupt("catalog header is damaged"));
        }
        if crc32c::crc32c(body) != u32::from_le_bytes(trailer.try_into().expect("4")) {
            return Err(corrupt(
                "catalog checksum mismatch: the catalog is damaged or truncated",
            ));
        }
        if count > MAX_ENTRIES {
            return Err(corrupt(format!("catalog claims {count} entries")));
        }
        let mut entries = Vec::new();
        for i in 0..count {
            let version = r.id("version")?;
            let parent = r.id("parent")?;
            let created = r.i64("created")?;
            let disk_size = r.u64("disk size")?;
            let flags = r.u32("flags")?;
            if flags & !FLAG_ENCRYPTED != 0 {
                return Err(corrupt(format!(
                    "catalog entry {i} has unknown flags {flags:#x}"
                )));
            }
            let new_objects = r.u64("new objects")?;
            let reused_objects = r.u64("reused objects")?;
            let uploaded_bytes = r.u64("uploaded bytes")?;
            let data_bytes = r.u64("data bytes")?;
            let description = r.str16("description", MAX_DESCRIPTION)?;
            let ntags = r.u8("tag count")? as usize;
            if ntags > MAX_TAGS {
                return Err(corrupt(format!("catalog entry {i} has {ntags} tags")));
            }
            let mut tags = Vec::new();
            for _ in 0..ntags {
                let n = r.u8("tag length")? as usize;
                let t = String::from_utf8(r.bytes(n, "tag")?.to_vec())
                    .map_err(|_| corrupt("tag is not UTF-8"))?;
                check_tag(&t).map_err(|e| corrupt(e.message().to_string()))?;
                tags.push(t);
            }
            if version.is_zero() {
                return Err(corrupt(format!("catalog entry {i} names no version")));
            }
            entries.push(Entry {
                version,
                parent: (!parent.is_zero()).then_some(parent),
                created,
                disk_size,
                encrypted: flags & FLAG_ENCRYPTED != 0,
                new_objects,
                reused_objects,
                uploaded_bytes,
                data_bytes,
                description,
                tags,
            });
        }
        r.finish()?;
        Ok(Catalog {
            generation,
            entries,
        })
    }

    pub fn latest(&self) -> Option<&Entry> {
        self.entries.last()
    }

    /// Find a version: empty = latest; a tag; a unique prefix (≥ 4 hex
    /// digits) of a version id; a date (`YYYY-MM-DD[THH:MM[:SS]][Z]`, UTC;
    /// a bare date means the end of that day) or `@UNIXSECONDS`: the
    /// latest version committed at or before it.
    pub fn resolve(&self, rev: &str, name: &str) -> Result<&Entry> {
        if self.entries.is_empty() {
            return Err(not_found(format!("{name} has no versions")));
        }
        if rev.is_empty() || rev == "latest" {
            return Ok(self.latest().expect("non-empty"));
        }
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.tags.iter().any(|t| t == rev))
        {
            return Ok(e);
        }
        if rev.len() >= 4 && rev.bytes().all(|b| b.is_ascii_hexdigit()) {
            let lower = rev.to_ascii_lowercase();
            let hits: Vec<&Entry> = self
                .entries
                .iter()
                .filter(|e| e.version.to_hex().starts_with(&lower))
                .collect();
            match hits.len() {
                1 => return Ok(hits[0]),
                0 => {}
                n => {
                    return Err(bad_arg(format!(
                        "'{rev}' matches {n} versions of {name}: give more digits"
                    )))
                }
            }
        }
        if let Some(t) = parse_time(rev) {
            return self
                .entries
                .iter()
                .filter(|e| e.created <= t)
                .max_by_key(|e| e.created)
                .ok_or_else(|| {
                    not_found(format!(
                        "{name} has no version committed at or before {rev} (the first is from {})",
                        format_time(self.entries.iter().map(|e| e.created).min().unwrap_or(0))
                    ))
                });
        }
        Err(not_found(format!(
            "{name} has no version, tag or date '{rev}' (see `roamdisk log {name}`)"
        )))
    }
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + if m <= 2 { 1 } else { 0 }, m, d)
}

/// Parse `YYYY-MM-DD[THH:MM[:SS[.fff]]][Z]` (UTC) or `@SECONDS` into
/// nanoseconds since the epoch. A bare date is the last instant of its day.
pub fn parse_time(s: &str) -> Option<i64> {
    if let Some(secs) = s.strip_prefix('@') {
        return secs.parse::<i64>().ok()?.checked_mul(1_000_000_000);
    }
    let s = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut dp = date.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    if dp.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || date.len() != 10 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    let (secs, frac) = match time {
        None => (86399, 999_999_999),
        Some(t) => {
            let (hms, frac) = match t.split_once('.') {
                Some((a, f)) => {
                    let digits: String = f.chars().take(9).collect();
                    let n: i64 = format!("{digits:0<9}").parse().ok()?;
                    (a, n)
                }
                None => (t, 0),
            };
            let mut p = hms.split(':');
            let h: i64 = p.next()?.parse().ok()?;
            let mi: i64 = p.next()?.parse().ok()?;
            let se: i64 = match p.next() {
                Some(x) => x.parse().ok()?,
                None => 0,
            };
            if p.next().is_some() || h > 23 || mi > 59 || se > 60 {
                return None;
            }
            (h * 3600 + mi * 60 + se, frac)
        }
    };
    (days * 86400 + secs)
        .checked_mul(1_000_000_000)?
        .checked_add(frac)
}

/// Format nanoseconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_time(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86400));
    let r = secs.rem_euclid(86400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        r / 3600,
        r / 60 % 60,
        r % 60
    )
}

/// Now, in nanoseconds since the epoch.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8, t: i64) -> Entry {
        Entry {
            version: ChunkId([n; 32]),
            parent: (n > 1).then_some(ChunkId([n - 1; 32])),
            created: t,
            disk_size: 1 << 30,
            encrypted: n.is_multiple_of(2),
            new_objects: 10,
            reused_objects: 20,
            uploaded_bytes: 30,
            data_bytes: 40,
            description: format!("v{n}"),
            tags: if n == 2 {
                vec!["stable".into()]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn round_trip_resolve_and_damage() {
        let day = 86_400_000_000_000i64;
        let c = Catalog {
            generation: 3,
            entries: vec![
                entry(1, 10 * day),
                entry(2, 11 * day + 5),
                entry(3, 12 * day),
            ],
        };
        let b = c.encode();
        assert_eq!(Catalog::parse(&b).unwrap(), c);
        assert_eq!(c.resolve("", "u/i").unwrap().version, ChunkId([3; 32]));
        assert_eq!(
            c.resolve("stable", "u/i").unwrap().version,
            ChunkId([2; 32])
        );
        assert_eq!(c.resolve("0101", "u/i").unwrap().version, ChunkId([1; 32]));
        assert_eq!(
            c.resolve("1970-01-12", "u/i").unwrap().version,
            ChunkId([2; 32])
        );
        assert_eq!(
            c.resolve("1970-01-12T00:00:01Z", "u/i").unwrap().version,
            ChunkId([2; 32])
        );
        assert!(c.resolve("1970-01-01", "u/i").is_err());
        assert!(c.resolve("nosuch", "u/i").is_err());
        for cut in [0, 20, b.len() - 1] {
            assert!(Catalog::parse(&b[..cut]).is_err());
        }
        let mut bad = b.clone();
        bad[40] ^= 1;
        assert!(Catalog::parse(&bad).is_err());
    }

    #[test]
    fn time_formats() {
        let t = parse_time("2026-11-21T07:24:36Z").unwrap();
        assert_eq!(format_time(t), "2026-11-21T07:24:36Z");
        assert_eq!(parse_time("@60"), Some(60_000_000_000));
        assert!(parse_time("2026-13-01").is_none());
        assert!(parse_time("20261101").is_none());
        assert!(check_tag("v1.0").is_ok());
        assert!(check_tag("beef").is_err());
        assert!(check_tag("2026").is_err());
    }
}
