//! NTFS: the boot sector, the MFT, free clusters from `$Bitmap`, and the
//! read-only safety check (volume dirty flag, `hiberfil.sys`, `$LogFile`).
//!
//! Boot sector: OEM "NTFS    " @3, bytes per sector u16 @0x0B, sectors per
//! cluster u8 @0x0D (above 0x80: 2^(256 - v)), total sectors u64 @0x28,
//! `$MFT` cluster u64 @0x30, `$MFTMirr` cluster u64 @0x38, clusters per
//! MFT record i8 @0x40 (negative: 2^-v bytes), clusters per index block
//! i8 @0x44, serial number u64 @0x48, 0x55AA @0x1FE. The volume has
//! `total sectors * bytes per sector / cluster size` clusters; the backup
//! boot sector sits after them, in the partition's last sector, and is
//! never part of a free extent.

mod hiber;
mod logfile;
pub mod mft;
mod vol;

use roamdisk_blockdev::Result;

use crate::bytes::{corrupt, sha256, Fields, Region};
use crate::extent::{clear_runs, Merger};
use crate::volume::{FsKind, Health, Probe, Reason};
use mft::{AT_DATA, AT_VOLUME_INFORMATION};
pub(crate) use vol::Ntfs;

/// System file record numbers (`$MFT` and the root are [`vol`]'s).
const LOGFILE_RECORD: u64 = 2;
const VOLUME_RECORD: u64 = 3;
const BITMAP_RECORD: u64 = 6;
const AT_VOLUME_NAME: u32 = 0x60;
/// `$VOLUME_INFORMATION` flags.
const VOLUME_IS_DIRTY: u16 = 0x0001;
const VOLUME_CHKDSK_UNDERWAY: u16 = 0x4000;
/// `$Bitmap` bytes read per step.
const BITMAP_CHUNK: usize = 4 << 20;

/// True when `head` starts with an NTFS boot sector.
pub fn has_magic(head: &[u8]) -> bool {
    head.get(3..11) == Some(b"NTFS    ")
}

impl Ntfs {
    fn volume_info(&self, r: &Region<'_>) -> Result<(u16, Option<String>, Vec<u8>)> {
        let rec = self.record(r, VOLUME_RECORD)?;
        let info = self
            .attribute(r, &rec, AT_VOLUME_INFORMATION, "")?
            .and_then(|a| a.resident)
            .ok_or_else(|| corrupt("ntfs", "$Volume has no resident $VOLUME_INFORMATION"))?;
        let flags = info
            .le16(0x0A)
            .ok_or_else(|| corrupt("ntfs", "$VOLUME_INFORMATION is too short"))?;
        let label = self
            .attribute(r, &rec, AT_VOLUME_NAME, "")?
            .and_then(|a| a.resident)
            .map(|v| {
                let units: Vec<u16> = v
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                String::from_utf16_lossy(&units)
            })
            .filter(|s| !s.is_empty());
        let mut raw = vec![0u8; self.record_size as usize];
        self.read_runs(
            r,
            &self.mft_runs,
            VOLUME_RECORD * self.record_size,
            &mut raw,
            "$MFT",
        )?;
        Ok((flags, label, raw))
    }

    pub fn probe(&self, r: &Region<'_>) -> Result<Probe> {
        let (flags, label, vol_raw) = self.volume_info(r)?;
        let mut notes = vec![
            format!("cluster size {}", self.cluster_size),
            format!("{} clusters", self.nr_clusters),
        ];
        let log = logfile::check(self, r, LOGFILE_RECORD)?;
        notes.push(log.note.clone());
        let hib = hiber::check(self, r)?;
        if let Some(n) = &hib.note {
            notes.push(n.clone());
        }
        let health = if flags & (VOLUME_IS_DIRTY | VOLUME_CHKDSK_UNDERWAY) != 0 {
            Health::unsafe_(
                Reason::Dirty,
                format!("the volume is marked dirty (flags {flags:#06x}): Windows must run chkdsk on it first"),
            )
        } else if let Some(h) = hib.verdict {
            h
        } else if !log.clean {
            Health::unsafe_(
                Reason::FastStartup,
                "$LogFile shows the volume was left mounted (Windows fast startup or a crash): boot Windows and shut down with fast startup off (shutdown /s /t 0)",
            )
        } else {
            Health::Clean
        };
        Ok(Probe {
            kind: FsKind::Ntfs,
            type_name: "ntfs".into(),
            uuid: Some(format!("{:016X}", self.serial)),
            label,
            unit: self.cluster_size,
            fs_bytes: self.nr_clusters * self.cluster_size,
            health,
            notes,
            identity: sha256(&[&self.boot, &vol_raw, &log.pages]),
        })
    }

    /// Stream free clusters from `$Bitmap` (bits past the cluster count
    /// are ignored).
    pub fn free(&self, r: &Region<'_>, m: &mut Merger<'_>) -> Result<()> {
        let rec = self.record(r, BITMAP_RECORD)?;
        let a = self
            .attribute(r, &rec, AT_DATA, "")?
            .ok_or_else(|| corrupt("ntfs", "$Bitmap has no data attribute"))?;
        let need = self.nr_clusters.div_ceil(8);
        if a.data_size < need || a.init_size < need {
            return Err(corrupt(
                "ntfs",
                format!(
                    "$Bitmap holds {} bytes ({} initialized) but {} clusters need {need}",
                    a.data_size, a.init_size, self.nr_clusters
                ),
            ));
        }
        if a.flags & 0x00FF != 0 {
            return Err(corrupt("ntfs", "$Bitmap is compressed"));
        }
        // Never past the cluster count, the boot sector's sector count or
        // the backup boot sector in the partition's last sector.
        let limit = (self.nr_clusters * self.cluster_size)
            .min(self.total_sectors * self.sector_size)
            .min(r.len - self.sector_size);
        let cs = self.cluster_size;
        let mut push = |c0: u64, n: u64| {
            let a = c0 * cs;
            let b = ((c0 + n) * cs).min(limit);
            if b > a {
                m.push(r.start + a, b - a);
            }
        };
        if let Some(v) = &a.resident {
            clear_runs(v, self.nr_clusters, &mut push);
            return Ok(());
        }
        let mut buf = vec![0u8; BITMAP_CHUNK];
        let mut off = 0u64;
        while off < need {
            let n = (need - off).min(BITMAP_CHUNK as u64) as usize;
            self.read_runs(r, &a.runs, off, &mut buf[..n], "$Bitmap")?;
            let first = off * 8;
            let bits = (self.nr_clusters - first).min(n as u64 * 8);
            clear_runs(&buf[..n], bits, |s, len| push(first + s, len));
            off += n as u64;
        }
        Ok(())
    }
}
