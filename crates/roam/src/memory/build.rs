//! A stopped VM's migration stream into the store as a page image, as it
//! arrives: every RAM block chunked at fixed offsets (like a disk, so the
//! unchanged parts of RAM are the same chunks next time and all-zero
//! chunks are nothing), the device state and the stream's prologue kept
//! as bytes. A stream the parser does not take fails here, before the
//! version exists (the caller then lets the VM run on).

use std::io::Read;

use roamdisk_blockdev::{ErrorKind, Op, Progress, Result};
use roamdisk_chunkstore::error::err;
use roamdisk_chunkstore::index::Index;
use roamdisk_chunkstore::memimage::{MemoryPages, PageBlock, FLAG_FOOTERS, FLAG_RETURN_PATH};
use roamdisk_chunkstore::store::{ChunkWrite, LeaseStore};
use roamdisk_chunkstore::upload::Uploader;
use roamdisk_migration::proto::TARGET_PAGE;
use roamdisk_migration::stream::{Event, PageData, Parser};
use roamdisk_migration::write::is_zero;

/// The memory image's chunk size unless told (measured: BENCHMARKS,
/// "Memory chunk size").
pub const DEFAULT_CHUNK: u32 = 16 << 10;

/// Bytes of chunks of one block uploaded together.
const BATCH_BYTES: usize = 8 << 20;

/// A migration-stream error as the program's error.
pub fn stream_error(e: roamdisk_migration::Error) -> roamdisk_blockdev::Error {
    let kind = match &e {
        roamdisk_migration::Error::Unsupported { .. } => ErrorKind::Unsupported,
        roamdisk_migration::Error::Corrupt { .. } => ErrorKind::Corrupt,
        roamdisk_migration::Error::Io { .. } => ErrorKind::Io,
    };
    err(kind, Op::Read, e.to_string())
}

/// One block being assembled: the chunk open now and the batch of full
/// chunks waiting for upload.
struct Assembly {
    index: Index,
    /// The chunk open now: its number, bytes, whether any is not zero,
    /// and each page's state (0 not seen, 1 zero, 2 data).
    open: Option<(usize, Vec<u8>, bool, Vec<u8>)>,
    /// Distinct pages of data and of zeroes so far.
    data_pages: u64,
    zero_pages: u64,
    batch: Vec<(usize, Vec<u8>)>,
    batch_bytes: usize,
    chunk: usize,
}

impl Assembly {
    /// Close the open chunk into the batch (nothing if all zero).
    fn close(&mut self) {
        if let Some((c, buf, data, seen)) = self.open.take() {
            self.data_pages += seen.iter().filter(|&&s| s == 2).count() as u64;
            self.zero_pages += seen.iter().filter(|&&s| s == 1).count() as u64;
            if data {
                self.batch_bytes += buf.len();
                self.batch.push((c, buf));
            }
        }
    }

    fn flush<S: ChunkWrite + LeaseStore + ?Sized>(
        &mut self,
        up: &mut Uploader<'_, S>,
    ) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let items: Vec<(usize, &[u8])> = self.batch.iter().map(|(c, b)| (*c, &b[..])).collect();
        up.upload(&mut self.index, &items)?;
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }

    /// Put a page at `offset`: the chunk it falls in must be the open one
    /// or a later one (a stopped VM's stream sends each block's pages in
    /// ascending order, once).
    fn put(&mut self, offset: u64, data: &PageData<'_>, name: &str) -> Result<bool> {
        let c = (offset / self.chunk as u64) as usize;
        match &self.open {
            Some((k, ..)) if *k == c => {}
            Some((k, ..)) if *k > c => {
                return Err(err(
                    ErrorKind::Unsupported,
                    Op::Read,
                    format!("QEMU's migration stream sent page {offset:#x} of RAM block {name:?} after later ones: roamdisk stores one pass over a stopped VM's memory (was the VM running?)"),
                ))
            }
            _ => {
                self.close();
                let len = self.index.chunk_len(c);
                self.open = Some((c, vec![0u8; len], false, vec![0; len / TARGET_PAGE]));
            }
        }
        let (_, buf, any, seen) = self.open.as_mut().expect("opened");
        let at = (offset % self.chunk as u64) as usize;
        let dst = &mut buf[at..at + TARGET_PAGE];
        let data_page = match data {
            PageData::Fill(0) => {
                dst.fill(0);
                false
            }
            PageData::Fill(b) => {
                dst.fill(*b);
                true
            }
            PageData::Bytes(p) => {
                dst.copy_from_slice(&p[..]);
                !is_zero(&p[..])
            }
        };
        *any |= data_page;
        seen[at / TARGET_PAGE] = if data_page { 2 } else { 1 };
        Ok(self.batch_bytes >= BATCH_BYTES)
    }
}

/// Read QEMU's migration stream from `src` to its end and store it with
/// `up` as a page image of `chunk_size` chunks. The progress shows bytes
/// of the stream (its length is not known ahead).
pub fn upload_vm_state<S: ChunkWrite + LeaseStore + ?Sized>(
    up: &mut Uploader<'_, S>,
    src: impl Read,
    chunk_size: u32,
    encrypted: bool,
    progress: &dyn Progress,
) -> Result<MemoryPages> {
    progress.phase("memory image", 0);
    let mut p = Parser::new(src);
    let mut prologue = Vec::new();
    let mut ram = None;
    let mut blocks: Vec<Assembly> = Vec::new();
    let mut reported = 0u64;
    let tail = loop {
        let at = p.position();
        if at - reported >= 4 << 20 {
            progress.advance(at - reported);
            reported = at;
        }
        let ev = p.read().map_err(stream_error)?;
        match ev {
            None => unreachable!("the stream ends with its End event"),
            Some(Event::Prologue(pr)) => prologue = pr.bytes,
            Some(Event::RamStart(r)) => {
                for b in &r.blocks {
                    let index = Index::new_zero(up.hash(), chunk_size, b.length, encrypted)?;
                    blocks.push(Assembly {
                        index,
                        open: None,
                        batch: Vec::new(),
                        batch_bytes: 0,
                        chunk: chunk_size as usize,
                        data_pages: 0,
                        zero_pages: 0,
                    });
                }
                ram = Some(r);
            }
            Some(Event::Page {
                block,
                offset,
                data,
            }) => {
                let name = &ram.as_ref().expect("pages follow the RAM start").blocks[block].name;
                if blocks[block].put(offset, &data, name)? {
                    blocks[block].flush(up)?;
                }
            }
            Some(Event::End(t)) => break t,
        }
    };
    for b in &mut blocks {
        b.close();
        b.flush(up)?;
        // All-zero chunks are never handed to the uploader: counted here,
        // as a disk's are ("stored as nothing").
        let zero = b.index.ids.iter().filter(|id| id.is_zero()).count() as u64;
        up.stats.chunks += zero;
        up.stats.zero_chunks += zero;
    }
    progress.advance(p.position() - reported);
    progress.end();
    let ram = ram.expect("a stream's End follows its RAM");
    let data_pages = blocks.iter().map(|b| b.data_pages).sum();
    let zero_pages = blocks.iter().map(|b| b.zero_pages).sum();
    let mut flags = 0;
    if ram.footers {
        flags |= FLAG_FOOTERS;
    }
    if p.return_path {
        flags |= FLAG_RETURN_PATH;
    }
    let pages = MemoryPages {
        prologue,
        section_id: ram.section_id,
        instance_id: ram.instance_id,
        version_id: ram.version_id,
        flags,
        blocks: ram
            .blocks
            .into_iter()
            .zip(blocks)
            .map(|(b, a)| PageBlock {
                name: b.name,
                length: b.length,
                index: a.index,
            })
            .collect(),
        devices: tail.devices,
        vmdesc: tail.vmdesc,
        data_pages,
        zero_pages,
        working_set: Vec::new(),
    };
    // What the version will hold must read back, checked now: while QEMU
    // still runs the VM (a failure here lets it run on).
    pages
        .encode()
        .and_then(|b| MemoryPages::parse(&b, encrypted))
        .map_err(|e| {
            roamdisk_chunkstore::error::context(e, "the VM's memory image does not fit its format")
        })?;
    Ok(pages)
}
