//! Seeds of the lazy-resume targets, made by the crates' own encoders:
//! QEMU migration streams (`migration_stream`: one a stopped VM's
//! precopy stream as roamdisk takes it, and ones it must refuse), return
//! paths (`migration_return_path`), page images (`cas_memory`) and memory
//! working sets (`cas_memory_working_set`). A seed cut from a real QEMU
//! 7.2 stream is committed in `fuzz/seeds/migration_stream/`.

use roamdisk_chunkstore::index::Index;
use roamdisk_chunkstore::memimage::{MemoryPages, PageBlock, FLAG_FOOTERS};
use roamdisk_chunkstore::{ChunkId, HashKind};
use roamdisk_migration::proto::*;
use roamdisk_migration::stream::{RamBlock, RamSection};
use roamdisk_migration::write;

use crate::corpus::Seeds;
use crate::fixup::FIXUP;

fn ram() -> RamSection {
    RamSection {
        section_id: 2,
        instance_id: 0,
        version_id: RAM_VERSION,
        blocks: vec![
            RamBlock {
                name: "pc.ram".into(),
                length: 64 << 10,
            },
            RamBlock {
                name: "pc.rom".into(),
                length: 8 << 10,
            },
        ],
        footers: true,
    }
}

/// `QEVM`, version 3, a configuration naming the machine, with a UUID.
fn prologue() -> Vec<u8> {
    let mut b = FILE_MAGIC.to_be_bytes().to_vec();
    b.extend(FILE_VERSION.to_be_bytes());
    b.push(VM_CONFIGURATION);
    let m = b"pc-i440fx-7.2";
    b.extend((m.len() as u32).to_be_bytes());
    b.extend(m);
    b.push(VM_SUBSECTION);
    let n = b"configuration/uuid";
    b.push(n.len() as u8);
    b.extend(n);
    b.extend(1u32.to_be_bytes());
    b.extend([0x11; 16]);
    b
}

/// A whole stream: prologue, commands, the RAM in two sections, devices,
/// the end mark and a description.
fn stream(extra_before_ram: &[u8], records: impl Fn(&mut write::Records<'_>)) -> Vec<u8> {
    let r = ram();
    let mut b = prologue();
    write::command(&mut b, CMD_OPEN_RETURN_PATH, &[]);
    write::command(&mut b, CMD_PING, &7u32.to_be_bytes());
    write::advise(&mut b);
    b.extend(extra_before_ram);
    write::ram_start(&mut b, &r);
    let mut part = write::Records::new(&r, false);
    records(&mut part);
    b.extend(part.finish());
    write::command(&mut b, CMD_SWITCHOVER_START, &[]);
    let mut end = write::Records::new(&r, true);
    end.zero(1, 4096);
    b.extend(end.finish());
    // One device section (FULL, id 3, "timer", instance 0, version 2, a
    // payload, its footer).
    b.push(VM_SECTION_FULL);
    b.extend(3u32.to_be_bytes());
    b.push(5);
    b.extend(b"timer");
    b.extend(0u32.to_be_bytes());
    b.extend(2u32.to_be_bytes());
    b.extend([0x06, 0, 0, 0, 0, 0, 0, 9]);
    b.push(VM_SECTION_FOOTER);
    b.extend(3u32.to_be_bytes());
    write::end(&mut b, Some(br#"{"page_size": 4096, "devices": []}"#));
    b
}

pub fn migration_stream() -> Seeds {
    let page: Vec<u8> = (0..TARGET_PAGE).map(|i| (i * 7) as u8).collect();
    let pages = |r: &mut write::Records<'_>| {
        r.zero(0, 0);
        r.page(0, 4096, &page);
        r.page(0, 32768, &page);
        r.zero(0, 65536 - 4096);
        r.page(1, 0, &page);
    };
    let good = stream(&[], pages);
    let mut s: Seeds = vec![("stopped-vm".into(), good.clone())];
    let mut no_desc = good.clone();
    let json = br#"{"page_size": 4096, "devices": []}"#;
    no_desc.truncate(good.len() - json.len() - 5);
    s.push(("no-vmdesc".into(), no_desc));
    // Refused: another iterable section, a page flag, an unknown command.
    let mut bitmap = Vec::new();
    bitmap.push(VM_SECTION_START);
    bitmap.extend(5u32.to_be_bytes());
    bitmap.push(12);
    bitmap.extend(b"dirty-bitmap");
    bitmap.extend([0; 8]);
    s.push(("dirty-bitmap".into(), stream(&bitmap, pages)));
    let mut colo = Vec::new();
    write::command(&mut colo, CMD_ENABLE_COLO, &[]);
    s.push(("colo-command".into(), stream(&colo, pages)));
    let mut xbzrle = stream(&[], pages);
    // The first record's flags: PAGE -> XBZRLE.
    if let Some(at) = xbzrle
        .windows(8)
        .position(|w| w == (4096u64 | RAM_FLAG_PAGE | RAM_FLAG_CONTINUE).to_be_bytes())
    {
        xbzrle[at + 7] = (RAM_FLAG_XBZRLE | RAM_FLAG_CONTINUE) as u8;
    }
    s.push(("xbzrle-page".into(), xbzrle));
    s.push(("truncated".into(), good[..good.len() / 2].to_vec()));
    s
}

pub fn migration_return_path() -> Seeds {
    let mut b = Vec::new();
    write::rp_request(&mut b, Some("pc.ram"), 0xca000, 4096);
    write::rp_request(&mut b, None, 0x1000, 4096);
    write::rp_request(&mut b, Some("/rom@etc/acpi/tables"), 0, 4096);
    write::rp_shut(&mut b, 0);
    let mut rec = Vec::new();
    write::rp_recv_bitmap(&mut rec, "pc.ram", &[0xf0; 16]);
    write::rp_resume_ack(&mut rec);
    write::rp_request(&mut rec, None, 0x2000, 4096);
    vec![("requests".into(), b), ("recovery".into(), rec)]
}

pub fn sample_pages(encrypted: bool) -> MemoryPages {
    let mut ram = Index::new_zero(HashKind::Blake3, 16384, 1 << 20, encrypted).unwrap();
    ram.set_record(
        3,
        ChunkId([7; 32]),
        encrypted.then_some([9; 32]),
        &[1u8; 16384],
    );
    ram.set_record(
        9,
        ChunkId([8; 32]),
        encrypted.then_some([10; 32]),
        &[2u8; 16384],
    );
    let rom = Index::new_zero(HashKind::Blake3, 16384, 8192, encrypted).unwrap();
    MemoryPages {
        prologue: prologue(),
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
        devices: vec![4; 3000],
        vmdesc: Some(br#"{"page_size": 4096}"#.to_vec()),
        data_pages: 8,
        zero_pages: 250,
        working_set: vec![(0, 9), (0, 3), (1, 0)],
    }
}

pub fn cas_memory() -> Seeds {
    let mut s = Seeds::new();
    for enc in [false, true] {
        let b = sample_pages(enc).encode().unwrap();
        let name = if enc { "encrypted" } else { "plain" };
        s.push((name.into(), [&[enc as u8][..], &b].concat()));
    }
    s
}

pub fn cas_memory_working_set() -> Seeds {
    let b = roamdisk_roam::memory::workset::encode(&[(0, 9), (0, 3), (1, 0), (4, 70000)]);
    vec![
        ("recording-raw".into(), [&[0u8][..], &b].concat()),
        ("recording-fixup".into(), [&[FIXUP][..], &b].concat()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_migration::stream::{Event, Parser};

    /// The stream seeds parse as their names say: the good ones to their
    /// end, the others to the refusal they are made for.
    #[test]
    fn the_stream_seeds_parse_as_named() {
        for (name, b) in migration_stream() {
            let mut p = Parser::new(&b[..]);
            let mut pages = 0;
            let r = loop {
                match p.read() {
                    Ok(Some(Event::Page { .. })) => pages += 1,
                    Ok(Some(Event::End(t))) => break Ok(t),
                    Ok(Some(_)) => {}
                    Ok(None) => unreachable!("End comes first"),
                    Err(e) => break Err(e.to_string()),
                }
            };
            match name.as_str() {
                "stopped-vm" | "no-vmdesc" => {
                    let t = r.unwrap_or_else(|e| panic!("{name}: {e}"));
                    assert_eq!(pages, 6, "{name}");
                    assert_eq!(t.vmdesc.is_some(), name == "stopped-vm");
                    assert!(p.return_path);
                }
                "dirty-bitmap" => assert!(r.unwrap_err().contains("dirty-bitmap"), "{name}"),
                "colo-command" => assert!(r.unwrap_err().contains("ENABLE_COLO"), "{name}"),
                "xbzrle-page" => assert!(r.unwrap_err().contains("XBZRLE"), "{name}"),
                _ => assert!(r.is_err(), "{name}"),
            }
        }
        // Cut from a real QEMU 7.2 stream (pc-i440fx-7.2, 128 MiB, TCG):
        // its prologue, RAM list, 40 of its page records, an empty RAM
        // end, its device sections and end mark (its description cut).
        let real = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("seeds/migration_stream/qemu-7.2-pc-cut"),
        )
        .unwrap();
        let mut p = Parser::new(&real[..]);
        let mut pages = 0;
        let tail = loop {
            match p.read().unwrap() {
                Some(Event::Page { .. }) => pages += 1,
                Some(Event::End(t)) => break t,
                Some(_) => {}
                None => unreachable!(),
            }
        };
        assert_eq!(pages, 40);
        assert_eq!(tail.devices.len(), 13076);
        assert!(tail.vmdesc.is_none());
        for (name, b) in cas_memory() {
            assert!(MemoryPages::parse(&b[1..], b[0] & 1 != 0).is_ok(), "{name}");
        }
    }
}
