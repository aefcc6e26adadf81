//! The SD-card model: a block-mapped flash translation layer with
//! allocation units, pages, a few open units and read-modify-write when a
//! unit is opened or closed, charging simulated time per operation. Pure
//! computation, no I/O.
//!
//! The card (seed `lbs-logging-block-store` section 2):
//!
//! - The logical space is cut into allocation units (AU, 4 MiB), the unit
//!   the card erases and maps. Up to `open_units` AUs are *open*: each is
//!   being written, in order, into a fresh erased unit, with a write
//!   pointer.
//! - A write at an open AU's write pointer is appended: it costs only the
//!   command and the transfer ("sequential").
//! - A write ahead of the pointer first copies the skipped valid pages
//!   from the old unit (strides within an AU: the farther apart, the
//!   slower, Figure 3).
//! - A write to an AU that is not open (or behind its pointer) opens it:
//!   when all open slots are taken, the least recently used AU is closed by
//!   copying its not-yet-written valid tail from its old unit; the new unit
//!   is erased and the valid head before the write is copied into it. This
//!   read-modify-write of nearly a whole AU is what makes small random
//!   writes so slow; it is paid per write, so large writes amortise it
//!   (Figures 1 and 2), and interleaved sequential writers are fast until
//!   they outnumber the open units (Figure 4).
//! - Reads cost the command and the transfer wherever they land, so random
//!   and sequential reads are alike (Figure 1).
//! - Trim marks whole pages invalid: they are not copied any more.

use roamdisk_blockdev::units::UnitError;
use serde::Serialize;

/// The parameters of a card.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlashParams {
    /// Allocation unit (erase and mapping unit), bytes.
    pub au: u64,
    /// Flash page (the copy granularity), bytes.
    pub page: u64,
    /// AUs that can be open for writing at once.
    pub open_units: usize,
    /// Fixed cost of a read command.
    pub read_cmd_ns: u64,
    /// Fixed cost of a write command.
    pub write_cmd_ns: u64,
    /// Host read rate (bus and array), bytes per second.
    pub read_rate: f64,
    /// Host write rate (bus and programming), bytes per second.
    pub write_rate: f64,
    /// Internal copy rate of read-modify-write, bytes per second.
    pub copy_rate: f64,
    /// Erasing a fresh unit when an AU is opened.
    pub erase_ns: u64,
    /// A flush (the card's small buffer is committed).
    pub flush_ns: u64,
    /// A trim command.
    pub trim_ns: u64,
    /// Pages start invalid (a new, erased card) rather than valid (a card
    /// holding a preallocated image, as in the seed's experiments).
    pub fresh: bool,
}

impl FlashParams {
    /// A Class 6 card like the seed's 8 GB ADATA: 4 MiB AUs, four open
    /// units ("good performance with up to four sequential writers"),
    /// sequential writes plateauing near 8 MB/s from 128 KiB.
    pub fn class6() -> Self {
        FlashParams {
            au: 4 << 20,
            page: 16 << 10,
            open_units: 4,
            read_cmd_ns: 300_000,
            write_cmd_ns: 500_000,
            read_rate: 18e6,
            write_rate: 8e6,
            copy_rate: 128e6,
            erase_ns: 2_000_000,
            flush_ns: 100_000,
            trim_ns: 200_000,
            fresh: false,
        }
    }

    /// A Class 4 card like the seed's Kingston: one open unit ("supports
    /// only a single writer"), slower throughout.
    pub fn class4() -> Self {
        FlashParams {
            open_units: 1,
            read_rate: 14e6,
            write_rate: 5e6,
            copy_rate: 80e6,
            erase_ns: 3_000_000,
            ..Self::class6()
        }
    }

    /// A Class 10 card like the seed's PNY: fast sequential writes, two
    /// open units.
    pub fn class10() -> Self {
        FlashParams {
            open_units: 2,
            read_rate: 20e6,
            write_rate: 13e6,
            copy_rate: 160e6,
            write_cmd_ns: 400_000,
            ..Self::class6()
        }
    }

    /// The presets by name.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "class6" => Some(Self::class6()),
            "class4" => Some(Self::class4()),
            "class10" => Some(Self::class10()),
            _ => None,
        }
    }

    /// Check the parameters make sense.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if self.page == 0 || self.au == 0 || !self.au.is_multiple_of(self.page) {
            return Err(ParamsError::Geometry {
                au: self.au,
                page: self.page,
            });
        }
        if !(1..=64).contains(&self.open_units) {
            return Err(ParamsError::OpenUnits(self.open_units));
        }
        for (n, v) in [
            ("read-rate", self.read_rate),
            ("write-rate", self.write_rate),
            ("copy-rate", self.copy_rate),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(ParamsError::Rate(n));
            }
        }
        Ok(())
    }
}

/// Card parameters that do not parse or make no sense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    /// The AU is not a non-zero multiple of the page.
    #[error("au ({au}) must be a non-zero multiple of page ({page})")]
    Geometry { au: u64, page: u64 },
    /// Open AUs outside 1-64.
    #[error("open must be 1 to 64, not {0}")]
    OpenUnits(usize),
    /// A rate that is not a positive number.
    #[error("{0} must be a positive number of MB/s")]
    Rate(&'static str),
    /// No preset has this name.
    #[error("unknown card preset '{0}' (presets: class6, class4, class10)")]
    Preset(String),
    /// An item that is not `KEY=VALUE`.
    #[error("'{0}' is not KEY=VALUE")]
    NotKeyValue(String),
    /// A size that does not parse.
    #[error("{key}: {error}")]
    Size { key: String, error: UnitError },
    /// A number that does not parse.
    #[error("{key}: '{value}' is not a number")]
    Number { key: String, value: String },
    /// The open count does not parse.
    #[error("open: '{0}' is not a count")]
    Count(String),
    /// `fresh` is neither on nor off.
    #[error("fresh must be on or off, not '{0}'")]
    Fresh(String),
    /// A key no parameter has.
    #[error("unknown parameter '{0}' (au, page, open, read-cmd, write-cmd, erase, flush, trim, read-rate, write-rate, copy-rate, fresh)")]
    Unknown(String),
}

/// Counters of a simulation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlashStats {
    pub elapsed_ns: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes copied by read-modify-write.
    pub bytes_copied: u64,
    /// AUs opened (each an erase).
    pub opens: u64,
    /// Writes appended at an open AU's write pointer.
    pub appends: u64,
}

#[derive(Debug, Clone, Copy)]
struct OpenAu {
    au: u64,
    /// Byte offset within the AU of the next in-order write.
    wp: u64,
}

/// The simulated card.
pub struct FlashModel {
    p: FlashParams,
    size: u64,
    /// One bit per page: holds valid data.
    valid: Vec<u64>,
    /// Open AUs, least recently used first.
    open: Vec<OpenAu>,
    stats: FlashStats,
}

impl FlashModel {
    /// A card of `size` bytes.
    pub fn new(p: FlashParams, size: u64) -> Result<Self, ParamsError> {
        p.validate()?;
        let pages = size.div_ceil(p.page);
        let words = pages.div_ceil(64) as usize;
        let fill = if p.fresh { 0 } else { u64::MAX };
        Ok(FlashModel {
            valid: vec![fill; words],
            p,
            size,
            open: Vec::new(),
            stats: FlashStats::default(),
        })
    }

    pub fn params(&self) -> &FlashParams {
        &self.p
    }

    pub fn stats(&self) -> &FlashStats {
        &self.stats
    }

    fn is_valid(&self, page: u64) -> bool {
        self.valid
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    fn set_valid(&mut self, first: u64, last_excl: u64, v: bool) {
        for page in first..last_excl {
            if let Some(w) = self.valid.get_mut((page / 64) as usize) {
                if v {
                    *w |= 1 << (page % 64);
                } else {
                    *w &= !(1 << (page % 64));
                }
            }
        }
    }

    /// Cost of copying the valid pages touching `[from, to)`.
    fn copy_ns(&mut self, from: u64, to: u64) -> u64 {
        if to <= from {
            return 0;
        }
        let first = from / self.p.page;
        let last = to.div_ceil(self.p.page);
        let pages = (first..last).filter(|&pg| self.is_valid(pg)).count() as u64;
        let bytes = pages * self.p.page;
        self.stats.bytes_copied += bytes;
        (bytes as f64 / self.p.copy_rate * 1e9) as u64
    }

    fn transfer_ns(bytes: u64, rate: f64) -> u64 {
        (bytes as f64 / rate * 1e9) as u64
    }

    fn charge(&mut self, ns: u64) -> u64 {
        self.stats.elapsed_ns += ns;
        ns
    }

    /// A read; returns its simulated duration.
    pub fn read(&mut self, off: u64, len: u64) -> u64 {
        let _ = off;
        self.stats.reads += 1;
        self.stats.bytes_read += len;
        let ns = self.p.read_cmd_ns + Self::transfer_ns(len, self.p.read_rate);
        self.charge(ns)
    }

    /// A write (or zeroing, which the card does by writing); returns its
    /// simulated duration.
    pub fn write(&mut self, off: u64, len: u64) -> u64 {
        self.stats.writes += 1;
        self.stats.bytes_written += len;
        let mut ns = self.p.write_cmd_ns + Self::transfer_ns(len, self.p.write_rate);
        let end = off.saturating_add(len).min(self.size.max(off));
        let mut a = off;
        while a < end {
            let au = a / self.p.au;
            let au_start = au * self.p.au;
            let b = end.min(au_start + self.p.au);
            ns += self.write_in_au(au, a - au_start, b - au_start);
            a = b;
        }
        self.set_valid(off / self.p.page, end.div_ceil(self.p.page), true);
        self.charge(ns)
    }

    /// Write `[a, b)` of AU `au` (offsets within the AU).
    fn write_in_au(&mut self, au: u64, a: u64, b: u64) -> u64 {
        let base = au * self.p.au;
        let mut ns = 0;
        if let Some(i) = self.open.iter().position(|o| o.au == au) {
            let o = self.open.remove(i);
            if a >= o.wp {
                if a > o.wp {
                    ns += self.copy_ns(base + o.wp, base + a);
                } else {
                    self.stats.appends += 1;
                }
                self.open.push(OpenAu { au, wp: b });
                return ns;
            }
            // Behind the pointer: close this AU and open it afresh.
            ns += self.copy_ns(base + o.wp, base + self.p.au);
        } else if self.open.len() >= self.p.open_units {
            let victim = self.open.remove(0);
            let vb = victim.au * self.p.au;
            ns += self.copy_ns(vb + victim.wp, vb + self.p.au);
        }
        self.stats.opens += 1;
        ns += self.p.erase_ns;
        ns += self.copy_ns(base, base + a);
        self.open.push(OpenAu { au, wp: b });
        ns
    }

    /// A trim: whole pages in the range stop needing copies.
    pub fn trim(&mut self, off: u64, len: u64) -> u64 {
        self.stats.trims += 1;
        let first = off.div_ceil(self.p.page);
        let last = off.saturating_add(len) / self.p.page;
        if last > first {
            self.set_valid(first, last, false);
        }
        let ns = self.p.trim_ns;
        self.charge(ns)
    }

    /// A flush.
    pub fn flush(&mut self) -> u64 {
        self.stats.flushes += 1;
        let ns = self.p.flush_ns;
        self.charge(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AREA: u64 = 128 << 20;

    fn bandwidth(m: &mut FlashModel, offs: &[u64], bs: u64) -> f64 {
        let t0 = m.stats().elapsed_ns;
        for &o in offs {
            m.write(o, bs);
        }
        (offs.len() as u64 * bs) as f64 / ((m.stats().elapsed_ns - t0) as f64 / 1e9) / 1e6
    }

    fn seq(bs: u64, n: u64) -> Vec<u64> {
        (0..n).map(|i| (i * bs) % AREA).collect()
    }

    fn random(bs: u64, n: u64, seed: u64) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % (AREA / bs)) * bs
            })
            .collect()
    }

    #[test]
    fn random_writes_are_far_slower_when_small_and_converge_when_large() {
        let ratio = |bs: u64| {
            let mut m = FlashModel::new(FlashParams::class6(), AREA).unwrap();
            let s = bandwidth(&mut m, &seq(bs, 256), bs);
            let mut m = FlashModel::new(FlashParams::class6(), AREA).unwrap();
            let r = bandwidth(&mut m, &random(bs, 256, 7), bs);
            s / r
        };
        let r4 = ratio(4 << 10);
        let r256 = ratio(256 << 10);
        assert!(r4 > 20.0, "4 KiB sequential:random {r4}");
        assert!(r256 < 2.5, "256 KiB sequential:random {r256}");
    }

    #[test]
    fn sequential_writes_plateau_near_128k() {
        let bw = |bs: u64| {
            let mut m = FlashModel::new(FlashParams::class6(), AREA).unwrap();
            bandwidth(&mut m, &seq(bs, 512), bs)
        };
        let b4 = bw(4 << 10);
        let b128 = bw(128 << 10);
        let b1m = bw(1 << 20);
        assert!(b4 < 0.6 * b128, "{b4} vs {b128}");
        assert!(b128 > 0.9 * b1m, "{b128} vs {b1m}");
        assert!((6.0..9.0).contains(&b1m), "Class 6 plateau {b1m} MB/s");
    }

    #[test]
    fn interleaved_writers_degrade_past_the_open_units() {
        let bw = |writers: u64, p: FlashParams| {
            let mut m = FlashModel::new(p, AREA).unwrap();
            let bs = 256 << 10;
            let dist = 8 << 20;
            let offs: Vec<u64> = (0..256u64)
                .map(|k| (k % writers) * dist + (k / writers) * bs)
                .collect();
            bandwidth(&mut m, &offs, bs)
        };
        let p = FlashParams::class6();
        assert!(bw(4, p.clone()) > 0.95 * bw(1, p.clone()));
        assert!(bw(5, p.clone()) < 0.6 * bw(4, p.clone()));
        let k = FlashParams::class4();
        assert!(bw(2, k.clone()) < 0.6 * bw(1, k));
    }

    #[test]
    fn random_reads_cost_as_much_as_sequential_ones() {
        let mut m = FlashModel::new(FlashParams::class6(), AREA).unwrap();
        let a = m.read(0, 4096);
        let b = m.read(77 << 20, 4096);
        assert_eq!(a, b);
    }

    #[test]
    fn trimmed_pages_are_not_copied() {
        let mut m = FlashModel::new(FlashParams::class6(), AREA).unwrap();
        let full = m.write(2 << 20, 4096);
        let mut t = FlashModel::new(FlashParams::class6(), AREA).unwrap();
        t.trim(0, 4 << 20);
        let trimmed = t.write(2 << 20, 4096);
        assert!(trimmed < full / 3, "{trimmed} vs {full}");
        assert!(FlashModel::new(
            FlashParams {
                au: 1000,
                ..FlashParams::class6()
            },
            AREA
        )
        .is_err());
    }
}
