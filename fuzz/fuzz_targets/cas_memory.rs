//! `roamdisk_chunkstore::memimage::MemoryPages::parse` on arbitrary bytes
//! (a VM's memory as a page image, inside a version package). Byte 0 is
//! the mode: bit 0 parses it as the image of an encrypted package (its
//! indexes must carry keys). Checks: an image that parses agrees with
//! itself (every block's index is as long as the block, of the image's
//! chunk size; page counts within the RAM; the working set unique and in
//! range) and re-encodes to an image that parses to the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::memimage::MemoryPages;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, b)) = data.split_first() else {
        return;
    };
    let encrypted = mode & 1 != 0;
    let m = match MemoryPages::parse(b, encrypted) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let pages: u64 = m.blocks.iter().map(|b| b.length / 4096).sum();
    assert!(m.data_pages + m.zero_pages <= pages);
    for b in &m.blocks {
        assert_eq!(b.index.disk_size, b.length);
        assert_eq!(b.index.chunk_size, m.chunk_size());
        assert_eq!(b.index.encrypted(), encrypted);
    }
    let mut seen = std::collections::HashSet::new();
    for &(bl, c) in &m.working_set {
        assert!((c as usize) < m.blocks[bl as usize].index.records());
        assert!(seen.insert((bl, c)));
    }
    let order = m.chunks_in_push_order();
    assert!(order.iter().all(|c| !c.id.is_zero()));
    let again = m.encode().expect("a parsed image encodes");
    assert_eq!(
        MemoryPages::parse(&again, encrypted).expect("re-encoded image"),
        m
    );
});
