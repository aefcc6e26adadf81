//! A catalog: the versions of one image of one user (`USER/IMAGE`), in
//! commit order, each with time, description, parent, tags and commit
//! statistics. The seed's Catalog File (section 3.5): browsing it and
//! checking out an older entry is time travel. Stored as a ref of the
//! chunk store, updated by compare-and-swap. Byte layout:
//! `docs/formats/cas-catalog.md`. Pure encoding and parsing (a fuzz target).
//!
//! A long catalog is kept in segments (version 2): the oldest entries are
//! sealed, [`segment_len`] at a time, into immutable objects of the chunk
//! store (each a version-1 catalog of generation 0), and the ref keeps
//! only their descriptors and the newest entries, so a commit rewrites a
//! bounded catalog whatever the history's length (`repo.rs` reads and
//! writes them).

use crate::bytes::{Reader, Writer};
use crate::error::{bad_arg, corrupt, not_found};
use crate::hash::ChunkId;
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 8] = *b"RDCASCAT";
/// The version written when the catalog has segments (version 1 when it
/// has none, as before them).
pub const VERSION: u32 = 2;
const HEADER_SIZE: usize = 32;
const MAX_ENTRIES: u32 = 1 << 20;
/// Entries sealed into one segment ([`segment_len`]).
pub const SEGMENT: usize = 512;

/// Entries sealed into one segment: [`SEGMENT`] unless
/// [`set_segment_len`] said otherwise. A catalog whose ref reaches twice
/// this many entries seals its oldest ([`Catalog::seal_due`]). Readers do
/// not depend on it: any segment length parses.
pub fn segment_len() -> usize {
    match SEGMENT_LEN.load(std::sync::atomic::Ordering::Relaxed) {
        0 => SEGMENT,
        n => n,
    }
}

/// Seal `n` entries per segment from now on (2 to 65,536; the command
/// takes it from `$ROAMDISK_CATALOG_SEGMENT`, for tests that want segments
/// after a few commits).
pub fn set_segment_len(n: usize) {
    SEGMENT_LEN.store(n.clamp(2, 1 << 16), std::sync::atomic::Ordering::Relaxed);
}

static SEGMENT_LEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Most segments one catalog may list (2^25 versions in all).
const MAX_SEGMENTS: u32 = 1 << 16;
/// Bytes of one segment descriptor.
const SEGMENT_REF_SIZE: usize = 56;
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

/// A sealed segment of a catalog: an object of the chunk store holding
/// `count` entries, created from `first` to `last` (ns since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRef {
    pub id: ChunkId,
    pub count: u32,
    pub first: i64,
    pub last: i64,
}

/// The versions of one image: the sealed segments (oldest first), then the
/// entries kept in the ref itself (the newest). Read from a ref, `entries`
/// holds only those; `repo::read_full` loads the segments' entries in
/// front of them (and empties `segments`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Catalog {
    pub generation: u64,
    pub segments: Vec<SegmentRef>,
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
    /// The bytes of the catalog: version 1 without segments, else 2.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&MAGIC)
            .u32(if self.segments.is_empty() { 1 } else { VERSION })
            .u32(self.entries.len() as u32)
            .u64(self.generation)
            .u32(self.segments.len() as u32)
            .crc();
        for g in &self.segments {
            w.id(&g.id).u32(g.count).u32(0).i64(g.first).i64(g.last);
        }
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
        let version = r.frame_versions(&MAGIC, 1..=VERSION)?;
        let count = r.u32("count")?;
        let generation = r.u64("generation")?;
        let nsegments = r.u32("segment count")?;
        r.header_crc()?;
        // Version 1 has no segments; version 2 has at least one, and the
        // newest entries in the ref (a seal leaves a segment's worth).
        if (version == 1) != (nsegments == 0) || (version == 2 && count == 0) {
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
        if nsegments > MAX_SEGMENTS || nsegments as usize * SEGMENT_REF_SIZE > r.remaining() {
            return Err(corrupt(format!("catalog claims {nsegments} segments")));
        }
        let mut segments = Vec::with_capacity(nsegments as usize);
        for i in 0..nsegments {
            let id = r.id("segment id")?;
            let n = r.u32("segment entries")?;
            let reserved = r.u32("segment reserved")?;
            let first = r.i64("segment first")?;
            let last = r.i64("segment last")?;
            if id.is_zero() || n == 0 || n > MAX_ENTRIES || reserved != 0 || first > last {
                return Err(corrupt(format!("catalog segment {i} is damaged")));
            }
            segments.push(SegmentRef {
                id,
                count: n,
                first,
                last,
            });
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
            segments,
            entries,
        })
    }

    /// An error if the catalog is past what its format holds (2^20
    /// entries in the ref, 65,536 segments): checked before it is written.
    pub fn check_limits(&self, name: &str) -> Result<()> {
        if self.entries.len() > MAX_ENTRIES as usize || self.segments.len() > MAX_SEGMENTS as usize
        {
            return Err(bad_arg(format!(
                "catalog {name} is full ({} versions in its ref, {} segments): remove old versions with `roamdisk rm`",
                self.entries.len(),
                self.segments.len()
            )));
        }
        Ok(())
    }

    /// Whether a commit's update must seal the oldest [`segment_len`]
    /// entries of the ref ([`Catalog::seal_oldest`]).
    pub fn seal_due(&self) -> bool {
        self.entries.len() >= 2 * segment_len()
    }

    /// Take the oldest [`segment_len`] entries out of the ref: the bytes of
    /// the segment object (a version-1 catalog of generation 0) for the
    /// caller to store, and its descriptor, once `id` is known, by
    /// [`Catalog::add_segment`].
    pub fn seal_oldest(&mut self) -> (Vec<u8>, Vec<Entry>) {
        let sealed: Vec<Entry> = self.entries.drain(..segment_len()).collect();
        (encode_segment(&sealed), sealed)
    }

    /// Add the descriptor of a segment holding `sealed` (non-empty),
    /// stored as object `id`.
    pub fn add_segment(&mut self, id: ChunkId, sealed: &[Entry]) {
        self.segments.push(SegmentRef {
            id,
            count: sealed.len() as u32,
            first: sealed.iter().map(|e| e.created).min().unwrap_or(0),
            last: sealed.iter().map(|e| e.created).max().unwrap_or(0),
        });
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
        // A tag names the newest version carrying it (a commit moving a
        // tag does not rewrite the sealed segments that carry it too).
        if let Some(e) = self
            .entries
            .iter()
            .rev()
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

/// The bytes of a segment object holding `entries`: a version-1 catalog of
/// generation 0.
pub fn encode_segment(entries: &[Entry]) -> Vec<u8> {
    Catalog {
        generation: 0,
        segments: Vec::new(),
        entries: entries.to_vec(),
    }
    .encode()
}

/// The entries of segment object `b`, checked against its descriptor.
pub fn parse_segment(b: &[u8], r: &SegmentRef) -> Result<Vec<Entry>> {
    let c = Catalog::parse(b)?;
    let first = c.entries.iter().map(|e| e.created).min();
    let last = c.entries.iter().map(|e| e.created).max();
    if c.generation != 0
        || !c.segments.is_empty()
        || c.entries.len() != r.count as usize
        || first != Some(r.first)
        || last != Some(r.last)
    {
        return Err(corrupt(format!(
            "catalog segment {} does not match its descriptor",
            r.id
        )));
    }
    Ok(c.entries)
}

/// Put the entries of `c`'s segments, each read by `get` (an object's
/// content), in front of its own ([`flatten`]) and empty `c.segments`:
/// the whole catalog `name`, oldest first.
pub fn load_segments_with(
    c: &mut Catalog,
    name: &str,
    mut get: impl FnMut(&ChunkId) -> Result<Vec<u8>>,
) -> Result<()> {
    if c.segments.is_empty() {
        return Ok(());
    }
    let mut parts = Vec::with_capacity(c.segments.len() + 1);
    for g in &c.segments {
        parts.push(load_segment_with(g, name, &mut get)?);
    }
    parts.push(std::mem::take(&mut c.entries));
    c.entries = flatten(parts);
    c.segments.clear();
    Ok(())
}

/// The entries of segment `g` of catalog `name`, read by `get`.
pub fn load_segment_with(
    g: &SegmentRef,
    name: &str,
    mut get: impl FnMut(&ChunkId) -> Result<Vec<u8>>,
) -> Result<Vec<Entry>> {
    get(&g.id).and_then(|b| parse_segment(&b, g)).map_err(|e| {
        crate::error::context(
            e,
            format!(
                "catalog {name}: its segment {} (versions of {} to {}) is unreadable",
                g.id,
                format_time(g.first),
                format_time(g.last)
            ),
        )
    })
}

/// One list of a catalog's entries from its segments' (oldest first) and
/// its own: an entry listed twice (two updates merged after one of them
/// sealed it) is kept once, where it first appears, with the tags of both;
/// a tag is kept only on the newest entry carrying it.
pub fn flatten(parts: Vec<Vec<Entry>>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut at: std::collections::HashMap<ChunkId, usize> = Default::default();
    for e in parts.into_iter().flatten() {
        match at.get(&e.version) {
            Some(&k) => {
                for t in e.tags {
                    if !out[k].tags.contains(&t) {
                        out[k].tags.push(t);
                    }
                }
            }
            None => {
                at.insert(e.version, out.len());
                out.push(e);
            }
        }
    }
    let mut seen: std::collections::HashSet<String> = Default::default();
    for e in out.iter_mut().rev() {
        e.tags.retain(|t| seen.insert(t.clone()));
    }
    out
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
            segments: Vec::new(),
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

    /// Rewrite a catalog's header fields and both checksums (what a
    /// tampered store could hand over).
    fn forged(mut b: Vec<u8>, version: u32, nsegments: u32) -> Vec<u8> {
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[24..28].copy_from_slice(&nsegments.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        let n = b.len() - 4;
        let crc = crc32c::crc32c(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn segments_round_trip_seal_and_refusals() {
        let mut c = Catalog {
            generation: 9,
            segments: Vec::new(),
            entries: (0..2 * segment_len())
                .map(|k| entry((k % 250) as u8 + 1, k as i64))
                .collect(),
        };
        for (k, e) in c.entries.iter_mut().enumerate() {
            let mut id = [0u8; 32];
            id[..8].copy_from_slice(&(k as u64 + 1).to_le_bytes());
            e.version = ChunkId(id);
            e.tags.clear();
        }
        assert_eq!(Catalog::parse(&c.encode()).unwrap().segments.len(), 0);
        assert_eq!(
            &c.encode()[8..12],
            &1u32.to_le_bytes(),
            "no segments: version 1"
        );
        assert!(c.seal_due());
        let all = c.entries.clone();
        let (bytes, sealed) = c.seal_oldest();
        let seg = segment_len();
        assert!(sealed == all[..seg]);
        assert!(!c.seal_due());
        c.add_segment(ChunkId([0xee; 32]), &sealed);
        let b = c.encode();
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        let back = Catalog::parse(&b).unwrap();
        assert_eq!(back, c);
        let r = back.segments[0];
        assert_eq!(
            (r.count as usize, r.first, r.last),
            (seg, 0, seg as i64 - 1)
        );
        assert!(parse_segment(&bytes, &r).unwrap() == sealed);
        assert!(flatten(vec![sealed.clone(), back.entries.clone()]) == all);
        // A segment that does not match its descriptor is refused.
        let other = SegmentRef { count: 3, ..r };
        assert!(parse_segment(&bytes, &other).is_err());
        assert!(
            parse_segment(&c.encode(), &r).is_err(),
            "a catalog with segments is no segment"
        );
        // Version 1 claiming segments, version 2 without any or without
        // entries of its own, an impossible descriptor: damaged.
        let v1 = Catalog {
            segments: Vec::new(),
            ..c.clone()
        }
        .encode();
        assert!(Catalog::parse(&forged(v1.clone(), 1, 1)).is_err());
        assert!(Catalog::parse(&forged(v1, 2, 0)).is_err());
        let empty = Catalog {
            entries: Vec::new(),
            ..c.clone()
        }
        .encode();
        assert!(Catalog::parse(&empty).is_err());
        assert!(Catalog::parse(&forged(b.clone(), 2, 40_000)).is_err());
        let mut bad = b.clone();
        bad[32 + 32..32 + 36].copy_from_slice(&0u32.to_le_bytes());
        assert!(
            Catalog::parse(&forged(bad, 2, 1)).is_err(),
            "a segment of no entries"
        );
        for cut in [33, 60, 88, b.len() - 1] {
            assert!(Catalog::parse(&b[..cut]).is_err());
        }
    }

    #[test]
    fn a_catalog_past_its_format_is_refused_before_it_is_written() {
        let g = SegmentRef {
            id: ChunkId([1; 32]),
            count: 1,
            first: 0,
            last: 0,
        };
        let mut c = Catalog {
            generation: 1,
            segments: vec![g; MAX_SEGMENTS as usize],
            entries: vec![entry(1, 1)],
        };
        assert!(c.check_limits("u/i").is_ok());
        c.segments.push(g);
        let e = c.check_limits("u/i").unwrap_err();
        assert!(e.to_string().contains("roamdisk rm"), "{e}");
    }

    #[test]
    fn flatten_keeps_an_entry_once_and_a_tag_on_its_newest_holder() {
        let mut a = entry(1, 1);
        a.tags = vec!["old".into(), "moved".into()];
        let mut b = entry(2, 2);
        b.tags = vec![];
        let mut b2 = b.clone();
        b2.tags = vec!["late".into()];
        let mut c = entry(3, 3);
        c.tags = vec!["moved".into()];
        let f = flatten(vec![vec![a.clone(), b], vec![b2, c.clone()]]);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].tags, vec!["old".to_string()]);
        assert_eq!(f[1].tags, vec!["late".to_string()]);
        assert_eq!(f[2].tags, vec!["moved".to_string()]);
        let cat = Catalog {
            generation: 1,
            segments: Vec::new(),
            entries: vec![a, c],
        };
        assert_eq!(
            cat.resolve("moved", "u/i").unwrap().version,
            ChunkId([3; 32])
        );
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
