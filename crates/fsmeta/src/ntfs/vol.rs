//! An opened NTFS volume ([`Ntfs`]): the geometry its boot sector gives,
//! and reading MFT records, attributes and streams over it. Below the
//! probe and free-space scan (`ntfs/mod.rs`), `$LogFile` and hibernation
//! checks, which all read through it; above the record parser (`mft`).

use roamdisk_blockdev::Result;

use super::mft::{apply_fixups, parse_record, Attr, Record, Run, AT_ATTRIBUTE_LIST, AT_DATA};
use crate::bytes::{corrupt, sub, Fields, Region};

/// System file record numbers read here and by the hibernation check.
const MFT_RECORD: u64 = 0;
pub(crate) const ROOT_RECORD: u64 = 5;

/// An opened NTFS volume.
pub(crate) struct Ntfs {
    pub boot: Vec<u8>,
    pub sector_size: u64,
    pub cluster_size: u64,
    pub nr_clusters: u64,
    pub total_sectors: u64,
    pub record_size: u64,
    pub index_block_size: u64,
    pub mft_runs: Vec<Run>,
    pub serial: u64,
}

fn size_from_clusters(v: i8, cluster: u64) -> Option<u64> {
    if v > 0 {
        cluster.checked_mul(v as u64)
    } else {
        let e = -(v as i32);
        (e < 32).then(|| 1u64 << e)
    }
}

impl Ntfs {
    pub fn open(r: &Region<'_>, head: &[u8]) -> Result<Ntfs> {
        let b = head
            .get(..512)
            .ok_or_else(|| corrupt("ntfs", "volume shorter than a boot sector"))?;
        let bad = |m: String| corrupt("ntfs", format!("boot sector: {m}"));
        if b.le16(0x1FE) != Some(0xAA55) {
            return Err(bad("no 0x55AA signature".into()));
        }
        let bps = b.le16(0x0B).unwrap_or(0) as u64;
        if !(256..=4096).contains(&bps) || !bps.is_power_of_two() {
            return Err(bad(format!("{bps} bytes per sector")));
        }
        let spc_raw = b[0x0D];
        let spc = if spc_raw > 0x80 {
            let e = 256 - spc_raw as u32;
            if e > 20 {
                return Err(bad(format!("sectors per cluster code {spc_raw:#x}")));
            }
            1u64 << e
        } else if spc_raw == 0 || !spc_raw.is_power_of_two() {
            return Err(bad(format!("{spc_raw} sectors per cluster")));
        } else {
            spc_raw as u64
        };
        let cluster_size = bps * spc;
        if cluster_size > 2 << 20 {
            return Err(bad(format!("cluster size {cluster_size} is over 2 MiB")));
        }
        let total_sectors = b.le64(0x28).unwrap_or(0);
        let vol_bytes = total_sectors
            .checked_mul(bps)
            .filter(|&v| v > 0 && v <= r.len)
            .ok_or_else(|| {
                bad(format!(
                    "{total_sectors} sectors of {bps} bytes do not fit the {}-byte partition: truncated image or wrong partition table",
                    r.len
                ))
            })?;
        let nr_clusters = vol_bytes / cluster_size;
        let mft_lcn = b.le64(0x30).unwrap_or(0);
        if mft_lcn == 0 || mft_lcn >= nr_clusters {
            return Err(bad(format!("$MFT cluster {mft_lcn} is outside the volume")));
        }
        let record_size = size_from_clusters(b[0x40] as i8, cluster_size)
            .filter(|&s| (512..=65536).contains(&s) && s.is_power_of_two())
            .ok_or_else(|| bad(format!("MFT record size code {:#x}", b[0x40])))?;
        let index_block_size = size_from_clusters(b[0x44] as i8, cluster_size)
            .filter(|&s| (512..=65536).contains(&s) && s.is_power_of_two())
            .ok_or_else(|| bad(format!("index block size code {:#x}", b[0x44])))?;
        let mut n = Ntfs {
            boot: b.to_vec(),
            sector_size: bps,
            cluster_size,
            nr_clusters,
            total_sectors,
            record_size,
            index_block_size,
            // Bootstrap: the first records are contiguous at $MFT's cluster.
            mft_runs: vec![Run {
                vcn: 0,
                lcn: Some(mft_lcn),
                len: (16 * record_size)
                    .div_ceil(cluster_size)
                    .min(nr_clusters - mft_lcn),
            }],
            serial: b.le64(0x48).unwrap_or(0),
        };
        let rec0 = n.record(r, MFT_RECORD)?;
        if !rec0.in_use() {
            return Err(corrupt("ntfs", "$MFT record is not in use"));
        }
        let data = n
            .attribute(r, &rec0, AT_DATA, "")?
            .filter(|a| a.resident.is_none() && !a.runs.is_empty())
            .ok_or_else(|| corrupt("ntfs", "$MFT has no non-resident data attribute"))?;
        if data.runs[0].lcn != Some(mft_lcn) {
            return Err(corrupt(
                "ntfs",
                "$MFT's data does not start at the cluster the boot sector names",
            ));
        }
        n.mft_runs = data.runs;
        Ok(n)
    }
}

impl Ntfs {
    /// Read and parse MFT record `n`.
    pub fn record(&self, r: &Region<'_>, n: u64) -> Result<Record> {
        let rs = self.record_size;
        let mut b = vec![0u8; rs as usize];
        let off = n
            .checked_mul(rs)
            .ok_or_else(|| corrupt("ntfs", format!("MFT record {n} does not exist")))?;
        self.read_runs(r, &self.mft_runs, off, &mut b, "$MFT")?;
        apply_fixups(&mut b, &format!("MFT record {n}"))?;
        parse_record(&b, n, self.nr_clusters)
    }

    /// Read `buf.len()` bytes at byte `off` of a non-resident stream.
    /// Sparse runs and unmapped ranges are errors: the metadata read here
    /// is never sparse.
    pub fn read_runs(
        &self,
        r: &Region<'_>,
        runs: &[Run],
        off: u64,
        buf: &mut [u8],
        what: &str,
    ) -> Result<()> {
        let cs = self.cluster_size;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off
                .checked_add(done as u64)
                .ok_or_else(|| corrupt("ntfs", format!("{what}: offset overflows")))?;
            let vcn = pos / cs;
            let run = runs
                .iter()
                .find(|x| x.vcn <= vcn && vcn < x.vcn + x.len)
                .ok_or_else(|| {
                    corrupt(
                        "ntfs",
                        format!("{what}: byte {pos} is not mapped by its runlist"),
                    )
                })?;
            let lcn = run
                .lcn
                .ok_or_else(|| corrupt("ntfs", format!("{what}: byte {pos} is in a sparse run")))?;
            let in_run = (run.vcn + run.len - vcn) * cs - pos % cs;
            let n = (buf.len() - done).min(in_run as usize);
            let disk = (lcn + (vcn - run.vcn)) * cs + pos % cs;
            r.read("ntfs", &mut buf[done..done + n], disk)?;
            done += n;
        }
        Ok(())
    }

    /// Every piece of attribute (`kind`, `name`) of base record `n`,
    /// following `$ATTRIBUTE_LIST` into extension records; non-resident
    /// pieces come back sorted by lowest VCN with their runs concatenated
    /// into the first.
    pub fn attribute(
        &self,
        r: &Region<'_>,
        rec: &Record,
        kind: u32,
        name: &str,
    ) -> Result<Option<Attr>> {
        let list = rec.attrs.iter().find(|a| a.kind == AT_ATTRIBUTE_LIST);
        let mut pieces: Vec<Attr> = Vec::new();
        match list {
            None => pieces.extend(
                rec.attrs
                    .iter()
                    .filter(|a| a.kind == kind && a.name == name)
                    .cloned(),
            ),
            Some(l) => {
                let data = match &l.resident {
                    Some(v) => v.clone(),
                    None => {
                        if l.data_size > 1 << 24 {
                            return Err(corrupt("ntfs", "attribute list is implausibly large"));
                        }
                        let mut v = vec![0u8; l.data_size as usize];
                        self.read_runs(r, &l.runs, 0, &mut v, "$ATTRIBUTE_LIST")?;
                        v
                    }
                };
                let mut wanted = Vec::new();
                let mut off = 0;
                while off + 0x1A <= data.len() {
                    let t = data.le32(off).unwrap_or(0);
                    let len = data.le16(off + 4).unwrap_or(0) as usize;
                    if len < 0x1A || off + len > data.len() {
                        return Err(corrupt(
                            "ntfs",
                            "attribute list entry has an invalid length",
                        ));
                    }
                    let nl = data[off + 6] as usize;
                    let no = data[off + 7] as usize;
                    let ename = if nl == 0 {
                        String::new()
                    } else {
                        let units: Vec<u16> = sub(&data[off..off + len], no, nl * 2)
                            .ok_or_else(|| {
                                corrupt("ntfs", "attribute list entry name lies outside it")
                            })?
                            .chunks_exact(2)
                            .map(|c| u16::from_le_bytes([c[0], c[1]]))
                            .collect();
                        String::from_utf16_lossy(&units)
                    };
                    if t == kind && ename == name {
                        let mref = data.le64(off + 0x10).unwrap_or(0) & 0x0000_FFFF_FFFF_FFFF;
                        if !wanted.contains(&mref) {
                            wanted.push(mref);
                        }
                    }
                    off += len;
                }
                for mref in wanted {
                    let ext = if mref == rec.number {
                        None
                    } else {
                        Some(self.record(r, mref)?)
                    };
                    let src = ext.as_ref().unwrap_or(rec);
                    if let Some(e) = &ext {
                        if e.base != rec.number || !e.in_use() {
                            return Err(corrupt(
                                "ntfs",
                                format!(
                                    "extension record {mref} does not belong to record {}",
                                    rec.number
                                ),
                            ));
                        }
                    }
                    pieces.extend(
                        src.attrs
                            .iter()
                            .filter(|a| a.kind == kind && a.name == name)
                            .cloned(),
                    );
                }
            }
        }
        if pieces.is_empty() {
            return Ok(None);
        }
        if pieces.len() == 1 || pieces[0].resident.is_some() {
            return Ok(pieces.into_iter().next());
        }
        pieces.sort_by_key(|p| p.lowest_vcn);
        let mut first = pieces[0].clone();
        if first.lowest_vcn != 0 {
            return Err(corrupt(
                "ntfs",
                format!("attribute {kind:#x} does not start at VCN 0"),
            ));
        }
        for p in &pieces[1..] {
            let end = first.runs.last().map_or(0, |x| x.vcn + x.len);
            if p.resident.is_some() || p.lowest_vcn != end {
                return Err(corrupt(
                    "ntfs",
                    format!("attribute {kind:#x} pieces do not join up"),
                ));
            }
            first.runs.extend_from_slice(&p.runs);
        }
        Ok(Some(first))
    }
}

impl Ntfs {
    /// Read `buf.len()` bytes at `off` of an attribute's value, resident or
    /// not; bytes past the initialized size read as zero, past the data
    /// size are an error.
    pub(crate) fn read_stream(
        &self,
        r: &Region<'_>,
        a: &Attr,
        off: u64,
        buf: &mut [u8],
        what: &str,
    ) -> Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= a.data_size)
            .ok_or_else(|| {
                corrupt(
                    "ntfs",
                    format!("{what}: read past its {} bytes", a.data_size),
                )
            })?;
        if let Some(v) = &a.resident {
            buf.copy_from_slice(&v[off as usize..end as usize]);
            return Ok(());
        }
        let init = a.init_size.min(a.data_size);
        let n = init.saturating_sub(off).min(buf.len() as u64) as usize;
        if n > 0 {
            self.read_runs(r, &a.runs, off, &mut buf[..n], what)?;
        }
        buf[n..].fill(0);
        Ok(())
    }
}
