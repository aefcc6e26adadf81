//! The eager resume of a page image: a whole precopy stream rebuilt and
//! written to the destination (QEMU loads it, then runs) — the prologue,
//! the RAM section with every page (zero pages as zero records, so the
//! destination's own ROM contents are overwritten as the source's stream
//! would), the device sections, the end mark and the description. What a
//! QEMU without postcopy gets, and `resume --eager`.

use std::io::Write;
use std::sync::Arc;

use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::memimage::MemoryPages;
use roamdisk_migration::proto::TARGET_PAGE;
use roamdisk_migration::write::{end, ram_start, Records};

use crate::fetch::{GatherStats, Wanted};
use crate::memory::ram_section;
use crate::view::{VersionView, GATHER_BATCH};

/// Bytes of chunks gathered per batch.
const BATCH_BYTES: usize = 4 << 20;

fn put(w: &mut dyn Write, b: &[u8]) -> Result<()> {
    w.write_all(b)
        .map_err(|e| roamdisk_blockdev::Error::io(Op::Write, "cas", e))
}

/// Write the page image of `view` to `w` as a precopy stream; the bytes
/// of its chunks by source.
pub fn write_precopy(view: &VersionView, w: &mut dyn Write) -> Result<GatherStats> {
    let pages: &MemoryPages = view.version.pages.as_ref().expect("a page image");
    let ram = ram_section(pages);
    let mut stats = GatherStats::default();
    put(w, &pages.prologue)?;
    let mut start = Vec::new();
    ram_start(&mut start, &ram);
    put(w, &start)?;
    // Chunks gathered a batch ahead of the one written: the store's
    // round trips overlap QEMU's loading.
    let per = (BATCH_BYTES / pages.chunk_size().max(1) as usize).max(GATHER_BATCH);
    let batches: Vec<(usize, Vec<usize>)> = pages
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(b, blk)| {
            let n = blk.index.records();
            (0..n)
                .step_by(per)
                .map(move |first| (b, (first..(first + per).min(n)).collect()))
        })
        .collect();
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let batches = &batches;
        let fetcher = scope.spawn(move || {
            for (b, chunks) in batches {
                let wanted: Vec<Wanted> = chunks
                    .iter()
                    .map(|&c| view.page_chunk(*b, c))
                    .filter(|w| !w.id.is_zero())
                    .collect();
                let got = view.gather(&wanted, true);
                let failed = got.is_err();
                if tx.send(got).is_err() || failed {
                    return;
                }
            }
        });
        for (b, chunks) in batches {
            let blk = &pages.blocks[*b];
            let mut got = rx.recv().expect("one result per batch")?.into_iter();
            let mut rec = Records::new(&ram, false);
            for &c in chunks {
                let base = c as u64 * blk.index.chunk_size as u64;
                let len = blk.index.chunk_len(c);
                if blk.index.ids[c].is_zero() {
                    for at in (0..len).step_by(TARGET_PAGE) {
                        rec.zero(*b, base + at as u64);
                    }
                    continue;
                }
                let g = got.next().expect("one result per chunk");
                stats.add(&g, len);
                let data: Arc<Vec<u8>> = g.data.expect("gathered with data");
                for (k, page) in data.chunks(TARGET_PAGE).enumerate() {
                    rec.any(*b, base + (k * TARGET_PAGE) as u64, page);
                }
            }
            put(w, &rec.finish())?;
        }
        fetcher.join().expect("the fetcher does not panic");
        Ok(())
    })?;
    let mut tail = Records::new(&ram, true).finish();
    tail.extend_from_slice(&pages.devices);
    end(&mut tail, pages.vmdesc.as_deref());
    put(w, &tail)?;
    Ok(stats)
}
