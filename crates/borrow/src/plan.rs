//! The plan: which host extents make up the borrowed disk, and the host
//! identities they were taken from. Stored as JSON; the format is
//! specified in `docs/formats/borrow-plan.md` (this module is the only
//! reader and writer).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use roamdisk_blockdev::durable::{self, FileSystem};
use roamdisk_blockdev::Error;

use crate::bad_plan;

/// `format` field of every plan file.
pub const FORMAT: &str = "roamdisk-borrow-plan";
/// Current plan version; readers accept exactly the versions they know.
pub const VERSION: u32 = 1;
/// Every extent starts and ends on this boundary: the unit of encryption
/// and of the written-block maps.
pub const UNIT: u64 = 4096;
/// Sector size of device-mapper tables.
pub const DM_SECTOR: u64 = 512;

/// How a plan was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanOptions {
    /// Free extents shorter than this (after alignment) were ignored.
    pub min_extent: u64,
    /// At most this many extents (the largest) were kept.
    pub max_extents: u64,
    /// The plan was cut to this many bytes (0 = everything kept).
    pub size_limit: u64,
}

/// A host device (disk or image file) as seen at scan time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Index used by partitions and extents.
    pub id: u32,
    /// Absolute path of the disk or image.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// `mbr`, `gpt` or `none`.
    pub scheme: String,
    /// SHA-256 (hex) of the partition-table sectors.
    pub table_sha256: String,
}

/// Whether a partition's free space was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Checked clean; extents may come from it.
    Used,
    /// Not touched; `reason` says why.
    Skipped,
}

/// One partition of a host device and what the scan found in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    pub device: u32,
    /// Partition number (0 = whole device without a table).
    pub number: u32,
    /// Byte offset and length on the device.
    pub start: u64,
    pub len: u64,
    /// Partition type from the table.
    pub type_name: String,
    /// File system found (`ext4`, `ntfs`, `swap`, `vfat`, `unknown`...).
    pub fs: String,
    pub uuid: Option<String>,
    pub label: Option<String>,
    /// SHA-256 (hex) of the file system's identifying metadata.
    pub identity_sha256: String,
    pub status: Status,
    /// Machine-readable reason when skipped (`not-clean`, `hibernated`,
    /// `unsupported`, `corrupt`, `io-error`, ...).
    pub reason: Option<String>,
    /// Human explanation when skipped.
    pub detail: Option<String>,
    /// Free bytes and extents found (before the size filter).
    pub free_bytes: u64,
    pub free_extents: u64,
    /// Bytes and extents taken into the plan.
    pub borrowed_bytes: u64,
    pub borrowed_extents: u64,
}

impl Partition {
    /// Partition `number` of `device` as its table lists it, before the
    /// scan looks inside: file system unknown, skipped, nothing free or
    /// borrowed.
    pub fn listed(device: u32, number: u32, start: u64, len: u64, type_name: &str) -> Partition {
        Partition {
            device,
            number,
            start,
            len,
            type_name: type_name.to_string(),
            fs: "unknown".into(),
            uuid: None,
            label: None,
            identity_sha256: String::new(),
            status: Status::Skipped,
            reason: None,
            detail: None,
            free_bytes: 0,
            free_extents: 0,
            borrowed_bytes: 0,
            borrowed_extents: 0,
        }
    }
}

/// One extent of the borrowed disk, in logical order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanExtent {
    pub device: u32,
    pub partition: u32,
    /// Byte offset on the device (not the partition).
    pub offset: u64,
    pub len: u64,
}

/// Free-extent size histogram: `counts[i]` extents of `[2^i, 2^(i+1))`
/// bytes, `bytes[i]` their total.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub bytes: Vec<u64>,
}

impl Histogram {
    pub fn add(&mut self, len: u64) {
        if len == 0 {
            return;
        }
        let b = 63 - len.leading_zeros() as usize;
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
            self.bytes.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.bytes[b] += len;
    }

    /// Add another histogram's counts and bytes.
    pub fn merge(&mut self, o: &Histogram) {
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), 0);
            self.bytes.resize(o.counts.len(), 0);
        }
        for (i, (c, b)) in o.counts.iter().zip(&o.bytes).enumerate() {
            self.counts[i] += c;
            self.bytes[i] += b;
        }
    }
}

/// A borrow plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub format: String,
    pub version: u32,
    /// Seconds since the Unix epoch at scan time.
    pub created_unix: u64,
    /// Program that wrote the plan.
    pub tool: String,
    pub options: PlanOptions,
    pub devices: Vec<Device>,
    pub partitions: Vec<Partition>,
    /// Free-extent histogram over every used partition (before filters).
    pub free_histogram: Histogram,
    /// Histogram of the extents in the plan.
    pub borrowed_histogram: Histogram,
    /// The borrowed disk: these extents back to back.
    pub extents: Vec<PlanExtent>,
    /// Sum of the extents' lengths: the borrowed disk's size.
    pub total_bytes: u64,
}

impl Plan {
    /// The plan of `extents` (the borrowed disk, back to back in this
    /// order) over `devices` and `partitions`, written now by this
    /// program: the borrowed histogram, the size and each partition's
    /// borrowed bytes and extents are counted from the extents.
    pub fn new(
        options: PlanOptions,
        devices: Vec<Device>,
        mut partitions: Vec<Partition>,
        free_histogram: Histogram,
        extents: Vec<PlanExtent>,
    ) -> Plan {
        let mut borrowed_histogram = Histogram::default();
        let mut total_bytes = 0;
        for e in &extents {
            borrowed_histogram.add(e.len);
            total_bytes += e.len;
            if let Some(p) = partitions
                .iter_mut()
                .find(|p| p.device == e.device && p.number == e.partition)
            {
                p.borrowed_bytes += e.len;
                p.borrowed_extents += 1;
            }
        }
        Plan {
            format: FORMAT.into(),
            version: VERSION,
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tool: format!("roamdisk {}", env!("CARGO_PKG_VERSION")),
            options,
            devices,
            partitions,
            free_histogram,
            borrowed_histogram,
            extents,
            total_bytes,
        }
    }

    /// Read and validate a plan file.
    pub fn load(path: &Path) -> Result<Plan, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            bad_plan(format!(
                "cannot read plan {}: {e} (make one with `roamdisk borrow scan DEVICE --plan FILE`)",
                path.display()
            ))
        })?;
        Self::from_json(&text).map_err(|e| e.path(path))
    }

    /// Parse and validate plan JSON.
    pub fn from_json(text: &str) -> Result<Plan, Error> {
        // Check the header first so an unknown version gets a clear error
        // rather than a field mismatch.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            version: Option<u32>,
        }
        let head: Head = serde_json::from_str(text)
            .map_err(|e| bad_plan(format!("not a plan (bad JSON: {e})")))?;
        if head.format.as_deref() != Some(FORMAT) {
            return Err(bad_plan(format!(
                "not a borrow plan (format is not \"{FORMAT}\")"
            )));
        }
        match head.version {
            Some(VERSION) => {}
            Some(v) => {
                return Err(bad_plan(format!(
                    "plan version {v} is not supported (this roamdisk reads version {VERSION}); re-run `roamdisk borrow scan`"
                )))
            }
            None => return Err(bad_plan("plan has no version")),
        }
        let plan: Plan =
            serde_json::from_str(text).map_err(|e| bad_plan(format!("malformed plan: {e}")))?;
        plan.validate()?;
        Ok(plan)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serializes")
    }

    /// Write the plan crash-safely (`durable::write_atomically`): a power
    /// cut leaves the old plan or the new one, never an empty file.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        self.save_in(&durable::Os, path)
    }

    /// [`Plan::save`] on the file system `fs` (the crash tests pass a
    /// simulated one).
    pub fn save_in<F: FileSystem>(&self, fs: &F, path: &Path) -> Result<(), Error> {
        durable::write_atomically_in(fs, path, (self.to_json() + "\n").as_bytes())
            .map_err(|e| Error::io(roamdisk_blockdev::Op::Write, "borrow", e).path(path))
    }

    /// Internal consistency: ids, extents aligned, inside a used
    /// partition of their device, not overlapping, and the total.
    pub fn validate(&self) -> Result<(), Error> {
        for (i, d) in self.devices.iter().enumerate() {
            if d.id as usize != i {
                return Err(bad_plan(format!("device {i} has id {}", d.id)));
            }
        }
        for p in &self.partitions {
            if p.device as usize >= self.devices.len() {
                return Err(bad_plan(format!(
                    "partition {} names device {} which is not listed",
                    p.number, p.device
                )));
            }
            let size = self.devices[p.device as usize].size;
            if p.start.checked_add(p.len).is_none_or(|e| e > size) {
                return Err(bad_plan(format!(
                    "partition {} lies outside its device",
                    p.number
                )));
            }
        }
        for (name, h) in [
            ("free_histogram", &self.free_histogram),
            ("borrowed_histogram", &self.borrowed_histogram),
        ] {
            // Bucket i holds sizes of [2^i, 2^(i+1)): 64 buckets cover u64.
            if h.counts.len() != h.bytes.len() || h.counts.len() > 64 {
                return Err(bad_plan(format!(
                    "{name} has {} counts and {} byte totals (one of each per power of two, at most 64)",
                    h.counts.len(),
                    h.bytes.len()
                )));
            }
        }
        let mut total = 0u64;
        let mut spans: Vec<(u32, u64, u64)> = Vec::with_capacity(self.extents.len());
        for (i, e) in self.extents.iter().enumerate() {
            if e.len == 0 || e.offset % UNIT != 0 || e.len % UNIT != 0 {
                return Err(bad_plan(format!(
                    "extent {i} is empty or not aligned to {UNIT} bytes"
                )));
            }
            let p = self
                .partitions
                .iter()
                .find(|p| p.device == e.device && p.number == e.partition)
                .ok_or_else(|| {
                    bad_plan(format!("extent {i} names a partition that is not listed"))
                })?;
            if p.status != Status::Used {
                return Err(bad_plan(format!(
                    "extent {i} lies in skipped partition {}",
                    p.number
                )));
            }
            let end = e
                .offset
                .checked_add(e.len)
                .ok_or_else(|| bad_plan(format!("extent {i} overflows")))?;
            if e.offset < p.start || end > p.start + p.len {
                return Err(bad_plan(format!(
                    "extent {i} lies outside partition {}",
                    p.number
                )));
            }
            total = total
                .checked_add(e.len)
                .ok_or_else(|| bad_plan("total size overflows"))?;
            spans.push((e.device, e.offset, end));
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[0].0 == w[1].0 && w[0].2 > w[1].1 {
                return Err(bad_plan(format!(
                    "extents overlap on device {} at byte {}",
                    w[0].0, w[1].1
                )));
            }
        }
        if total != self.total_bytes {
            return Err(bad_plan(format!(
                "extents add up to {total} bytes, the plan says {}",
                self.total_bytes
            )));
        }
        Ok(())
    }

    /// The device-mapper `linear` table (dmsetup format): one line per
    /// extent, `LOGICAL_START LENGTH linear DEVICE OFFSET`, in 512-byte
    /// sectors.
    pub fn dm_table(&self) -> String {
        let mut s = String::new();
        let mut logical = 0u64;
        for e in &self.extents {
            let dev = &self.devices[e.device as usize].path;
            s.push_str(&format!(
                "{} {} linear {} {}\n",
                logical / DM_SECTOR,
                e.len / DM_SECTOR,
                dev.display(),
                e.offset / DM_SECTOR
            ));
            logical += e.len;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Plan {
        let ext = |offset| PlanExtent {
            device: 0,
            partition: 1,
            offset,
            len: 4096,
        };
        let p = Plan::new(
            PlanOptions {
                min_extent: 4096,
                max_extents: 10,
                size_limit: 0,
            },
            vec![Device {
                id: 0,
                path: "/dev/sdz".into(),
                size: 1 << 30,
                scheme: "gpt".into(),
                table_sha256: "00".into(),
            }],
            vec![Partition {
                fs: "ext4".into(),
                identity_sha256: "00".into(),
                status: Status::Used,
                ..Partition::listed(0, 1, 1 << 20, 100 << 20, "Linux filesystem")
            }],
            Histogram::default(),
            vec![ext(2 << 20), ext(4 << 20)],
        );
        assert_eq!(p.total_bytes, 8192);
        assert_eq!(p.partitions[0].borrowed_extents, 2);
        p
    }

    #[test]
    fn round_trip_and_dm_table() {
        let p = sample();
        let q = Plan::from_json(&p.to_json()).unwrap();
        assert_eq!(p, q);
        assert_eq!(
            p.dm_table(),
            "0 8 linear /dev/sdz 4096\n8 8 linear /dev/sdz 8192\n"
        );
    }

    #[test]
    fn validation_refuses_bad_plans() {
        let mut p = sample();
        p.extents[1].offset = 2 << 20;
        assert!(p.validate().unwrap_err().to_string().contains("overlap"));
        let mut p = sample();
        p.extents[0].offset = 4095;
        assert!(p.validate().is_err());
        let mut p = sample();
        p.extents[0].offset = 200 << 20;
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("outside partition"));
        let mut p = sample();
        p.partitions[0].status = Status::Skipped;
        assert!(p.validate().is_err());
        let mut p = sample();
        p.total_bytes = 1;
        assert!(p.validate().is_err());
        let json = sample()
            .to_json()
            .replace("\"version\": 1", "\"version\": 9");
        assert!(Plan::from_json(&json)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        assert!(Plan::from_json("{").is_err());
    }

    /// Regression (found reviewing the `borrow_plan` fuzz target's
    /// invariants, not by the fuzzer in its 3-minute run): a plan file
    /// whose histogram had more than 64 buckets loaded, and `summary()`
    /// (`roamdisk borrow show`) then computed `1 << i` for bucket 64:
    /// "attempt to shift left with overflow" in debug builds, a wrong
    /// size label in release. Histograms are now validated on load: as
    /// many byte totals as counts, at most 64 buckets.
    #[test]
    fn histograms_with_too_many_buckets_are_refused() {
        let mut p = sample();
        p.free_histogram.counts = vec![1; 65];
        p.free_histogram.bytes = vec![1; 65];
        let e = Plan::from_json(&p.to_json()).unwrap_err();
        assert!(e.to_string().contains("free_histogram"), "{e}");
        let mut p = sample();
        p.borrowed_histogram.counts = vec![1; 3];
        assert!(p.validate().is_err());
        let mut p = sample();
        p.free_histogram.counts = vec![1; 64];
        p.free_histogram.bytes = vec![1; 64];
        let q = Plan::from_json(&p.to_json()).unwrap();
        assert!(q.summary().contains("8192 PiB"), "{}", q.summary());
    }

    /// Regression: `save` wrote a temporary file and renamed it without
    /// an `fsync`, so a power cut could leave an empty plan. It goes
    /// through `durable` now: cut the power at every I/O of a save over an
    /// older plan, and every reboot reads back one whole plan, the old one
    /// or the new one.
    #[test]
    fn a_power_cut_while_saving_leaves_the_old_plan_or_the_new_one() {
        use roamdisk_blockdev::testkit::simfs::{check_power_cuts, SimFs};
        use roamdisk_blockdev::testkit::{Countdown, Rng};
        let path = Path::new("/plans/p.json");
        let old = sample();
        let mut new = sample();
        new.extents.pop();
        new.total_bytes = 4096;
        let text = |p: &Plan| p.to_json() + "\n";
        let bad = check_power_cuts(
            path,
            Some(text(&old).as_bytes()),
            text(&new).as_bytes(),
            16,
            |fs| {
                let _ = new.save_in(fs, path);
            },
        );
        assert!(bad.is_empty(), "{bad:?}");
        for cut in 1.. {
            let fs = SimFs::new(Countdown::crash_at(cut));
            fs.put(path, text(&old).as_bytes());
            let saved = new.save_in(&fs, path).is_ok();
            assert_eq!(saved, !fs.crashed());
            let after = fs.after_crash(&mut Rng::new(cut), Countdown::unarmed());
            let read = String::from_utf8(after.read(path).expect("a plan file")).unwrap();
            let plan = Plan::from_json(&read).expect("a whole plan");
            assert!(plan == old || plan == new);
            if saved {
                assert_eq!(plan, new);
                break;
            }
        }
    }

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let mut h = Histogram::default();
        h.add(4096);
        h.add(8191);
        h.add(8192);
        assert_eq!(h.counts[12], 2);
        assert_eq!(h.counts[13], 1);
    }
}
