//! A running VM's memory as a page-addressed image (`RDCASMEM`), kept in
//! a version package: each RAM block of QEMU's migration stream is a
//! sparse image addressed by its offset in the block, chunked at fixed
//! offsets like a disk (an [`Index`] per block: an unchanged region of
//! RAM is the same chunk in the next suspend, an all-zero chunk is stored
//! as nothing), beside the bytes a destination needs verbatim — the
//! stream's header and configuration, the device sections — and the
//! memory working set (the chunks the VM touched first after its last
//! lazy resume). Byte layout: `docs/formats/cas-memory.md`. Pure encoding
//! and parsing (fuzz target `cas_memory`).

use crate::bytes::{Reader, Writer};
use crate::error::{bad_arg, corrupt};
use crate::hash::ChunkId;
use crate::index::Index;
use roamdisk_blockdev::Result;

pub const MAGIC: [u8; 8] = *b"RDCASMEM";
pub const VERSION: u32 = 1;
/// Sections of the stream end with a footer.
pub const FLAG_FOOTERS: u32 = 1;
/// The source QEMU opened a return path in its stream.
pub const FLAG_RETURN_PATH: u32 = 2;
const KNOWN_FLAGS: u32 = FLAG_FOOTERS | FLAG_RETURN_PATH;

/// The only page size kept: QEMU's target page on x86, and every block's
/// host page (huge-page RAM is not kept in this format).
pub const PAGE: u32 = 4096;
/// Bounds checked on both sides.
pub const MAX_PROLOGUE: usize = 64 << 10;
pub const MAX_BLOCKS: usize = 1024;
pub const MAX_DEVICES: usize = 256 << 20;
pub const MAX_VMDESC: usize = 64 << 20;
/// Largest block (1 TiB).
pub const MAX_BLOCK: u64 = 1 << 40;

/// One RAM block: its name, length and chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageBlock {
    /// QEMU's id string (`pc.ram`).
    pub name: String,
    pub length: u64,
    /// Its chunks: `disk_size` = `length`; all-zero chunks have no id.
    pub index: Index,
}

/// A memory image of pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPages {
    /// The stream's first bytes: `QEVM`, its version, the configuration.
    pub prologue: Vec<u8>,
    /// The `ram` section's id, instance and version, as the source wrote
    /// them (the device sections' footers are checked against ids).
    pub section_id: u32,
    pub instance_id: u32,
    pub version_id: u32,
    pub flags: u32,
    pub blocks: Vec<PageBlock>,
    /// The device sections, verbatim (every `04` FULL section after the
    /// RAM, before the end mark).
    pub devices: Vec<u8>,
    /// QEMU's JSON description of the stream, if it sent one.
    pub vmdesc: Option<Vec<u8>>,
    /// Pages of data and of zeroes in the stream.
    pub data_pages: u64,
    pub zero_pages: u64,
    /// Chunks (block, chunk number) in the order a lazy resume's guest
    /// first touched them; pushed first on the next one. Unique.
    pub working_set: Vec<(u32, u32)>,
}

/// A chunk of a block, for fetching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageChunk {
    pub block: u32,
    pub chunk: u32,
    pub id: ChunkId,
    pub len: usize,
}

impl MemoryPages {
    /// The chunk size (every block's).
    pub fn chunk_size(&self) -> u32 {
        self.blocks.first().map_or(0, |b| b.index.chunk_size)
    }

    /// Bytes of RAM in all blocks.
    pub fn ram_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.length).sum()
    }

    /// Every stored chunk id (none zero; repeats possible).
    pub fn ids(&self) -> impl Iterator<Item = &ChunkId> {
        self.blocks
            .iter()
            .flat_map(|b| b.index.ids.iter())
            .filter(|id| !id.is_zero())
    }

    /// Bytes of RAM in stored (non-zero) chunks.
    pub fn data_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.index.data_bytes()).sum()
    }

    /// Every non-zero chunk, the working set's first (in its order), then
    /// the rest block by block in address order.
    pub fn chunks_in_push_order(&self) -> Vec<PageChunk> {
        let mut seen: Vec<Vec<bool>> = self
            .blocks
            .iter()
            .map(|b| vec![false; b.index.records()])
            .collect();
        let mut out = Vec::new();
        let mut take = |b: u32, c: u32, out: &mut Vec<PageChunk>| {
            let blk = &self.blocks[b as usize];
            let s = &mut seen[b as usize][c as usize];
            let id = blk.index.ids[c as usize];
            if !*s && !id.is_zero() {
                *s = true;
                out.push(PageChunk {
                    block: b,
                    chunk: c,
                    id,
                    len: blk.index.chunk_len(c as usize),
                });
            }
        };
        for &(b, c) in &self.working_set {
            take(b, c, &mut out);
        }
        for (b, blk) in self.blocks.iter().enumerate() {
            for c in 0..blk.index.records() {
                take(b as u32, c as u32, &mut out);
            }
        }
        out
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.prologue.len() > MAX_PROLOGUE
            || self.devices.len() > MAX_DEVICES
            || self.vmdesc.as_ref().is_some_and(|v| v.len() > MAX_VMDESC)
            || self.blocks.is_empty()
            || self.blocks.len() > MAX_BLOCKS
        {
            return Err(bad_arg("a memory image beyond this format's bounds"));
        }
        let mut w = Writer::new();
        w.bytes(&MAGIC)
            .u32(VERSION)
            .u32(self.flags)
            .u32(self.chunk_size())
            .u32(PAGE)
            .u32(self.prologue.len() as u32)
            .bytes(&self.prologue)
            .u32(self.section_id)
            .u32(self.instance_id)
            .u32(self.version_id)
            .u32(self.blocks.len() as u32);
        for b in &self.blocks {
            let idx = b.index.encode(Some(9));
            w.u8(b.name.len() as u8)
                .bytes(b.name.as_bytes())
                .u64(b.length)
                .u32(idx.len() as u32)
                .bytes(&idx);
        }
        let devices = zstd::bulk::compress(&self.devices, 9).expect("zstd");
        w.u32(self.devices.len() as u32)
            .u32(devices.len() as u32)
            .bytes(&devices);
        match &self.vmdesc {
            Some(j) => {
                let z = zstd::bulk::compress(j, 9).expect("zstd");
                w.u32(j.len() as u32).u32(z.len() as u32).bytes(&z);
            }
            None => {
                w.u32(0).u32(0);
            }
        }
        w.u64(self.data_pages)
            .u64(self.zero_pages)
            .u32(self.working_set.len() as u32);
        for &(b, c) in &self.working_set {
            w.u32(b).u32(c);
        }
        Ok(w.buf)
    }

    /// Parse an image; `encrypted`: whether its indexes must carry keys.
    pub fn parse(b: &[u8], encrypted: bool) -> Result<MemoryPages> {
        let mut r = Reader::new(b, "memory image");
        r.frame(&MAGIC, VERSION)?;
        let flags = r.u32("flags")?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(corrupt(format!(
                "memory image has unknown flags {flags:#x}"
            )));
        }
        let chunk_size = r.u32("chunk size")?;
        let page = r.u32("page size")?;
        if page != PAGE {
            return Err(corrupt(format!("memory image of {page}-byte pages")));
        }
        let plen = r.u32("prologue length")? as usize;
        if plen > MAX_PROLOGUE {
            return Err(corrupt(format!("a stream prologue of {plen} bytes")));
        }
        let prologue = r.bytes(plen, "prologue")?.to_vec();
        let section_id = r.u32("section id")?;
        let instance_id = r.u32("instance id")?;
        let version_id = r.u32("section version")?;
        let n = r.u32("block count")? as usize;
        if n == 0 || n > MAX_BLOCKS {
            return Err(corrupt(format!("a memory image of {n} RAM blocks")));
        }
        let mut blocks: Vec<PageBlock> = Vec::with_capacity(n);
        for _ in 0..n {
            let nl = r.u8("block name length")? as usize;
            let name = std::str::from_utf8(r.bytes(nl, "block name")?)
                .map_err(|_| corrupt("a RAM block name that is not UTF-8"))?
                .to_string();
            if name.is_empty() || blocks.iter().any(|b| b.name == name) {
                return Err(corrupt(format!(
                    "RAM block name {name:?} empty or repeated"
                )));
            }
            let length = r.u64("block length")?;
            if length == 0 || length % PAGE as u64 != 0 || length > MAX_BLOCK {
                return Err(corrupt(format!("RAM block {name:?} of {length} bytes")));
            }
            let ilen = r.u32("index length")? as usize;
            let index = Index::parse(r.bytes(ilen, "block index")?, true)?;
            if index.disk_size != length
                || index.chunk_size != chunk_size
                || index.encrypted() != encrypted
                || blocks.first().is_some_and(|f| f.index.hash != index.hash)
            {
                return Err(corrupt(format!(
                    "RAM block {name:?}: its index disagrees with the image"
                )));
            }
            blocks.push(PageBlock {
                name,
                length,
                index,
            });
        }
        let devices = read_zstd(&mut r, MAX_DEVICES, "device state")?;
        let vmdesc = read_zstd(&mut r, MAX_VMDESC, "stream description")?;
        let data_pages = r.u64("data pages")?;
        let zero_pages = r.u64("zero pages")?;
        let pages: u64 = blocks.iter().map(|b| b.length / PAGE as u64).sum();
        if data_pages.saturating_add(zero_pages) > pages {
            return Err(corrupt(format!(
                "{data_pages} data and {zero_pages} zero pages in {pages} pages of RAM"
            )));
        }
        let wn = r.u32("working set count")? as usize;
        let chunks: usize = blocks.iter().map(|b| b.index.records()).sum();
        if wn > chunks || wn.saturating_mul(8) > r.remaining() {
            return Err(corrupt(format!(
                "a memory working set of {wn} chunks (truncated or damaged)"
            )));
        }
        let mut seen: Vec<Vec<bool>> = blocks
            .iter()
            .map(|b| vec![false; b.index.records()])
            .collect();
        let mut working_set = Vec::with_capacity(wn);
        for _ in 0..wn {
            let bl = r.u32("working set block")?;
            let c = r.u32("working set chunk")?;
            match seen
                .get_mut(bl as usize)
                .and_then(|s| s.get_mut(c as usize))
            {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(corrupt(format!(
                        "the memory working set names chunk {c} of block {bl} twice or beyond the image"
                    )))
                }
            }
            working_set.push((bl, c));
        }
        r.finish()?;
        Ok(MemoryPages {
            prologue,
            section_id,
            instance_id,
            version_id,
            flags,
            blocks,
            devices: devices.unwrap_or_default(),
            vmdesc,
            data_pages,
            zero_pages,
            working_set,
        })
    }
}

/// `u32 raw length`, `u32 stored length`, a zstd frame; `None` for 0, 0.
fn read_zstd(r: &mut Reader<'_>, max: usize, what: &str) -> Result<Option<Vec<u8>>> {
    let raw = r.u32(what)? as usize;
    let stored = r.u32(what)? as usize;
    if raw == 0 && stored == 0 {
        return Ok(None);
    }
    if raw > max {
        return Err(corrupt(format!(
            "{what} of {raw} bytes is beyond the format's bound"
        )));
    }
    let z = r.bytes(stored, what)?;
    let out = crate::chunk::decompress_bounded(z, raw)
        .map_err(|e| corrupt(format!("{what} does not decompress: {e}")))?;
    if out.len() != raw {
        return Err(corrupt(format!(
            "{what} holds {} bytes, not {raw}",
            out.len()
        )));
    }
    Ok(Some(out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hash::HashKind;

    pub(crate) fn sample(encrypted: bool) -> MemoryPages {
        let mut ram = Index::new_zero(HashKind::Blake3, 65536, 1 << 20, encrypted).unwrap();
        ram.set_record(
            3,
            ChunkId([7; 32]),
            encrypted.then_some([9; 32]),
            &[1u8; 65536],
        );
        let rom = Index::new_zero(HashKind::Blake3, 65536, 8192, encrypted).unwrap();
        MemoryPages {
            prologue: b"QEVM\0\0\0\x03".to_vec(),
            section_id: 2,
            instance_id: 0,
            version_id: 4,
            flags: FLAG_FOOTERS,
            blocks: vec![
                PageBlock {
                    name: "pc.ram".into(),
                    length: 1 << 20,
                    index: ram,
                },
                PageBlock {
                    name: "pc.rom".into(),
                    length: 8192,
                    index: rom,
                },
            ],
            devices: vec![4; 5000],
            vmdesc: Some(br#"{"page_size": 4096}"#.to_vec()),
            data_pages: 16,
            zero_pages: 242,
            working_set: vec![(0, 3), (1, 0)],
        }
    }

    #[test]
    fn an_image_reads_back_and_damage_is_an_error() {
        for enc in [false, true] {
            let m = sample(enc);
            let b = m.encode().unwrap();
            assert_eq!(MemoryPages::parse(&b, enc).unwrap(), m);
            assert!(MemoryPages::parse(&b, !enc).is_err());
            for cut in [0, 7, 12, 40, b.len() / 2, b.len() - 1] {
                assert!(MemoryPages::parse(&b[..cut], enc).is_err(), "cut {cut}");
            }
            let order: Vec<(u32, u32)> = m
                .chunks_in_push_order()
                .iter()
                .map(|c| (c.block, c.chunk))
                .collect();
            // (1, 0) is all zero: nothing to push.
            assert_eq!(order, vec![(0, 3)]);
        }
        let mut m = sample(false);
        m.working_set.push((0, 3));
        assert!(MemoryPages::parse(&m.encode().unwrap(), false).is_err());
    }
}
