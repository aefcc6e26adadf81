//! `roamdisk_migration::stream::Parser` on arbitrary bytes: QEMU's
//! migration stream as `roamdisk suspend --qmp` reads it. Every event up
//! to the end or the first error. Checks: the prologue comes first and
//! once, pages only after the RAM section's start and inside its blocks
//! (page-aligned, below the block's length), the end last, nothing after
//! it; an error prints.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_migration::proto::TARGET_PAGE;
use roamdisk_migration::stream::{Event, Parser};

fuzz_target!(|data: &[u8]| {
    let mut p = Parser::new(data);
    let mut seen_prologue = false;
    let mut blocks: Option<Vec<u64>> = None;
    let mut ended = false;
    loop {
        match p.read() {
            Ok(None) => break,
            Ok(Some(e)) => {
                assert!(!ended, "an event after the end");
                match e {
                    Event::Prologue(pr) => {
                        assert!(!seen_prologue);
                        assert!(pr.bytes.len() <= data.len());
                        seen_prologue = true;
                    }
                    Event::RamStart(r) => {
                        assert!(seen_prologue && blocks.is_none());
                        assert!(!r.blocks.is_empty());
                        blocks = Some(r.blocks.iter().map(|b| b.length).collect());
                    }
                    Event::Page { block, offset, .. } => {
                        let b = blocks.as_ref().expect("pages after the RAM start");
                        assert!(offset < b[block]);
                        assert_eq!(offset % TARGET_PAGE as u64, 0);
                    }
                    Event::End(t) => {
                        assert!(blocks.is_some());
                        assert!(t.devices.len() < data.len());
                        ended = true;
                    }
                }
            }
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
});
