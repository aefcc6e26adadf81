//! Disk images for the `fsmeta_*` targets, and the checks every volume
//! parse must pass.
//!
//! A fuzz input describes a sparse image (real volumes are megabytes of
//! mostly zeroes, far too big for libFuzzer to mutate as a whole):
//!
//! ```text
//! byte 0       size code: the image is 64 KiB << (code % 8) (64 KiB .. 8 MiB)
//! then         segments: offset u32 LE (taken modulo the size), length
//!              u16 LE, that many bytes (fewer if the input ends); each
//!              segment is written over the zero image, cut at its end
//! ```
//!
//! [`segments_of`] turns a real image (made by mke2fs, mkntfs, mkswap,
//! sfdisk in the corpus step) into such an input.

use std::collections::BTreeSet;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::{BlockDev, WriteFlags};
use roamdisk_fsmeta::{FsKind, Probe, Scheme};

/// Smallest image (size code 0).
pub const MIN_IMAGE: u64 = 64 << 10;

/// A zero image with the sectors written so far.
pub struct Image {
    bytes: Vec<u8>,
    /// 512-byte sectors holding written data.
    dirty: BTreeSet<usize>,
}

impl Image {
    pub fn zero(size: u64) -> Image {
        Image {
            bytes: vec![0; size as usize],
            dirty: BTreeSet::new(),
        }
    }

    /// Decode the segment form (see the module comment).
    pub fn from_segments(data: &[u8]) -> Image {
        let Some((&code, mut rest)) = data.split_first() else {
            return Image::zero(MIN_IMAGE);
        };
        let mut img = Image::zero(MIN_IMAGE << (code % 8));
        while rest.len() >= 6 {
            let off = u32::from_le_bytes(rest[..4].try_into().expect("4")) as u64 % img.size();
            let len = u16::from_le_bytes([rest[4], rest[5]]) as usize;
            let body = &rest[6..6 + len.min(rest.len() - 6)];
            img.write(off, body);
            rest = &rest[6 + body.len()..];
        }
        img
    }

    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Write `b` at `off`, cut at the end of the image.
    pub fn write(&mut self, off: u64, b: &[u8]) {
        let Some(room) = (self.bytes.len() as u64).checked_sub(off) else {
            return;
        };
        let n = (b.len() as u64).min(room) as usize;
        if n == 0 {
            return;
        }
        let off = off as usize;
        self.bytes[off..off + n].copy_from_slice(&b[..n]);
        self.dirty.extend(off / 512..(off + n).div_ceil(512));
    }

    /// Byte offsets of the written sectors, in order.
    pub fn written_sectors(&self) -> Vec<usize> {
        self.dirty.iter().map(|s| s * 512).collect()
    }

    /// A sparse device of `shift + size` bytes holding the image at `shift`.
    pub fn device(&self, shift: u64) -> MemDev {
        let dev = MemDev::new(shift + self.size());
        let mut run: Option<(usize, usize)> = None;
        let flush = |r: (usize, usize)| {
            let (a, b) = (r.0 * 512, (r.1 * 512).min(self.bytes.len()));
            dev.write_at(&self.bytes[a..b], shift + a as u64, WriteFlags::default())
                .expect("mem write");
        };
        for &s in &self.dirty {
            run = match run {
                Some((a, b)) if b == s => Some((a, s + 1)),
                Some(r) => {
                    flush(r);
                    Some((s, s + 1))
                }
                None => Some((s, s + 1)),
            };
        }
        if let Some(r) = run {
            flush(r);
        }
        dev
    }
}

/// The segment form of a real image: its non-zero sectors, runs closer
/// than one sector merged, at most 65535 bytes per segment.
pub fn segments_of(size_code: u8, image: &[u8]) -> Vec<u8> {
    let mut out = vec![size_code];
    let sectors = image.len().div_ceil(512);
    let nonzero = |s: usize| {
        image[s * 512..((s + 1) * 512).min(image.len())]
            .iter()
            .any(|&b| b != 0)
    };
    let mut s = 0;
    while s < sectors {
        if !nonzero(s) {
            s += 1;
            continue;
        }
        let start = s;
        let mut end = s + 1;
        while end < sectors && (end - start + 1) * 512 <= 65535 && nonzero(end) {
            end += 1;
        }
        let body = &image[start * 512..(end * 512).min(image.len())];
        out.extend_from_slice(&(start as u32 * 512).to_le_bytes());
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(body);
        s = end;
    }
    out
}

/// What must hold for every probe.
fn check_probe(p: &Probe, len: u64) {
    assert!(
        p.fs_bytes <= len,
        "file system larger than its range: {p:?}"
    );
    if !p.supported() {
        assert_eq!(p.unit, 0, "{p:?}");
        assert!(!p.health.is_clean(), "unsupported but clean: {p:?}");
    } else {
        assert!(p.unit > 0 && p.unit.is_power_of_two(), "{p:?}");
    }
}

/// Probe and scan `[start, start + len)` of `dev`; on success check that
/// the free extents are sorted, merged, inside the range and add up, that
/// streaming and collecting agree, and that the metadata each format
/// documents as never free (ext primary superblock, NTFS backup boot
/// sector, swap header page) is not in an extent.
pub fn check_volume(dev: &dyn BlockDev, start: u64, len: u64) {
    let probe = roamdisk_fsmeta::probe(dev, start, len);
    let free = roamdisk_fsmeta::free_space(dev, start, len);
    let (probe, free) = match (probe, free) {
        (Ok(p), Ok(f)) => (p, f),
        (Err(e), Err(_)) => {
            let _ = e.to_string();
            return;
        }
        (Ok(_), Err(e)) => {
            // The free scan reads more than the probe: it may fail alone.
            let _ = e.to_string();
            return;
        }
        (Err(e), Ok(f)) => panic!("probe failed ({e}) but the free scan worked: {f:?}"),
    };
    check_probe(&probe, len);
    assert_eq!(
        format!("{probe:?}"),
        format!("{:?}", free.probe),
        "probe and free_space disagree"
    );
    if !probe.supported() {
        assert!(free.extents.is_empty() && free.free_bytes == 0);
    }
    let end = start + len;
    let mut total = 0u64;
    let mut last_end = None;
    for e in &free.extents {
        assert!(e.len > 0, "empty extent {e:?}");
        assert!(
            e.start >= start && e.start.checked_add(e.len).is_some_and(|x| x <= end),
            "extent {e:?} outside {start}..{end}"
        );
        if let Some(le) = last_end {
            assert!(e.start > le, "extents out of order or not merged at {e:?}");
        }
        last_end = Some(e.end());
        total += e.len;
    }
    assert_eq!(total, free.free_bytes, "free total is not the sum");
    let never_free = match probe.kind {
        FsKind::Ext2 | FsKind::Ext3 | FsKind::Ext4 => Some((start + 1024, 1024)),
        // The backup boot sector: the range's last sector (at least 256 bytes).
        FsKind::Ntfs => Some((end - 256.min(len), 256.min(len))),
        FsKind::Swap => Some((start, probe.unit.min(len))),
        FsKind::Unsupported => None,
    };
    if let Some((a, n)) = never_free {
        for e in &free.extents {
            assert!(
                e.end() <= a || e.start >= a + n,
                "{:?} metadata at {a}+{n} reported free in {e:?}",
                probe.kind
            );
        }
    }
    let mut streamed = Vec::new();
    let (p2, t2) =
        roamdisk_fsmeta::for_each_free_extent(dev, start, len, &mut |e| streamed.push(e))
            .expect("free_space worked, streaming must too");
    assert_eq!(format!("{p2:?}"), format!("{probe:?}"));
    assert_eq!(t2, total);
    assert_eq!(streamed, free.extents);
}

/// Read the partition table of `dev` and check it: partitions inside the
/// disk, non-empty, not overlapping, numbered as documented; reading twice
/// gives the same table. Then check the volumes of the first few.
pub fn check_table(dev: &dyn BlockDev, volumes: usize) {
    let size = dev.size();
    let t = match roamdisk_fsmeta::read_table(dev) {
        Ok(t) => t,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let again = roamdisk_fsmeta::read_table(dev).expect("a table read once reads again");
    assert_eq!(again.partitions, t.partitions);
    assert_eq!(again.identity, t.identity);
    assert!(t.sector_size == 512 || t.sector_size == 4096);
    match t.scheme {
        Scheme::None => {
            assert_eq!(t.partitions.len(), 1);
            let p = &t.partitions[0];
            assert_eq!((p.number, p.start, p.len), (0, 0, size));
        }
        Scheme::Mbr => {
            for p in &t.partitions {
                assert_eq!(p.logical, p.number >= 5, "{p:?}");
                assert!(p.number >= 1, "{p:?}");
            }
        }
        Scheme::Gpt => {
            for p in &t.partitions {
                assert!(p.number >= 1 && !p.logical, "{p:?}");
                assert_eq!(p.start % t.sector_size as u64, 0);
                assert_eq!(p.len % t.sector_size as u64, 0);
            }
        }
    }
    let mut v: Vec<_> = t.partitions.iter().collect();
    v.sort_by_key(|p| p.start);
    for p in &v {
        assert!(p.len > 0, "{p:?}");
        assert!(
            p.start.checked_add(p.len).is_some_and(|e| e <= size),
            "{p:?} outside the {size}-byte disk"
        );
    }
    for w in v.windows(2) {
        assert!(w[0].start + w[0].len <= w[1].start, "overlap {w:?}");
    }
    let mut numbers: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), t.partitions.len(), "duplicate numbers");
    if t.scheme != Scheme::None {
        for p in t.partitions.iter().take(volumes) {
            check_volume(dev, p.start, p.len);
        }
    }
}

/// Shift of the volume in the device when bit 1 of the mode is set: a
/// partition's usual start, so extents must come out absolute.
pub const SHIFT: u64 = 1 << 20;

/// The body of the volume targets: byte 0 is the mode (bit 0: apply
/// `fix` to the image; bit 1: place the volume at [`SHIFT`]), the rest
/// the segment form of the image. Checks the volume with
/// [`check_volume`].
pub fn run_volume(data: &[u8], fix: fn(&mut Image)) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut img = Image::from_segments(rest);
    if mode & crate::fixup::FIXUP != 0 {
        fix(&mut img);
    }
    let shift = if mode & 2 != 0 { SHIFT } else { 0 };
    let dev = img.device(shift);
    check_volume(&dev, shift, img.size());
}
