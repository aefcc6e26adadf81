//! Checksum and length fix-ups: rewrite what a parser checks before it
//! looks at the structure (CRCs, length fields, update sequence numbers),
//! so that the fuzzer's mutations reach the logic behind those checks.
//! Each target applies one of these when the first byte of its input is
//! odd ([`FIXUP`]); even inputs are parsed exactly as given.
//!
//! Field offsets are those of the format documents under `docs/formats/`
//! (and `crates/fsmeta` for the foreign formats); a fix-up that no longer
//! matches its format only makes the fuzzer shallower, and the corpus test
//! (`corpus::tests`) catches that: every fix-up seed must still parse.

use roamdisk_fsmeta::ext_csum::{crc16, crc32c_raw};

/// First-byte bit: fix checksums before parsing.
pub const FIXUP: u8 = 1;

/// A target's input: `data` without its mode byte, passed through `fix`
/// when the mode has [`FIXUP`]. `None` for an empty input.
pub fn input(data: &[u8], fix: fn(&mut [u8])) -> Option<Vec<u8>> {
    let (&mode, rest) = data.split_first()?;
    let mut b = rest.to_vec();
    if mode & FIXUP != 0 {
        fix(&mut b);
    }
    Some(b)
}

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}
fn get16(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn get32(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn get64(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// `docs/formats/cas-http.md`: the count of a have or batch get request
/// (after its 8-byte magic) made to match its body of 32-byte ids.
pub fn cas_id_request(b: &mut [u8]) {
    if b.len() >= 12 {
        put32(b, 8, ((b.len() - 12) / 32) as u32);
    }
}

/// `docs/formats/cas-http.md`, a batch put answer: the count rewritten to
/// the statuses after it (one byte each).
pub fn cas_status_answer(b: &mut [u8]) {
    if b.len() >= 12 {
        put32(b, 8, (b.len() - 12) as u32);
    }
}

/// `docs/formats/cas-pack.md`: the trailer's index offset and count made
/// to fit the file (the count kept where it fits) and its checksum
/// rewritten.
pub fn cas_pack(b: &mut [u8]) {
    const HEADER: usize = 16;
    const TRAILER: usize = 56;
    if b.len() < HEADER + TRAILER {
        return;
    }
    let t = b.len() - TRAILER;
    let room = (t - HEADER) / 48;
    let count = (get32(b, t + 8).unwrap_or(0) as usize).min(room);
    let index = t - 48 * count;
    put64(b, t, index as u64);
    put32(b, t + 8, count as u32);
    let sum = roamdisk_chunkstore::store::pack::checksum(&b[..HEADER], &b[index..t], &b[t..t + 16]);
    b[t + 16..t + 48].copy_from_slice(&sum);
}

/// `docs/formats/cas-catalog.md`: header CRC over bytes 0..28 at 28, and
/// the trailing CRC over everything before it.
pub fn cas_catalog(b: &mut [u8]) {
    if b.len() < 36 {
        return;
    }
    let c = crc32c::crc32c(&b[..28]);
    put32(b, 28, c);
    let n = b.len() - 4;
    let c = crc32c::crc32c(&b[..n]);
    put32(b, n, c);
}

/// `docs/formats/cas-index.md`: records (from disk and chunk size),
/// payload length and CRC, header CRC.
pub fn cas_index(b: &mut [u8]) {
    if b.len() < 64 {
        return;
    }
    let chunk = get32(b, 20).unwrap_or(0) as u64;
    let disk = get64(b, 24).unwrap_or(0);
    if chunk > 0 {
        put64(b, 32, disk.div_ceil(chunk));
    }
    let payload_len = (b.len() - 64) as u64;
    put64(b, 40, payload_len);
    let c = crc32c::crc32c(&b[64..]);
    put32(b, 48, c);
    let c = crc32c::crc32c(&b[..60]);
    put32(b, 60, c);
}

/// `docs/formats/cas-version.md`: the section lengths and header CRC; in
/// a plain package also the index length field and the index inside.
pub fn cas_version(b: &mut [u8]) {
    if b.len() < 64 {
        return;
    }
    let encrypted = get32(b, 12).unwrap_or(0) & 1 != 0;
    let rest = (b.len() - 64) as u64;
    let mut refs = get64(b, 40).unwrap_or(0);
    if !encrypted || refs > rest {
        refs = 0;
    }
    put64(b, 40, refs);
    put64(b, 48, rest - refs);
    let c = crc32c::crc32c(&b[..60]);
    put32(b, 60, c);
    if encrypted {
        return;
    }
    // Walk the plain body to the index: created, parent, description,
    // config, memory size, memory chunk ids, index length, index.
    let mut at = 64 + 8 + 32;
    let Some(n) = get16(b, at) else { return };
    at += 2 + n as usize;
    let Some(n) = get32(b, at) else { return };
    at += 4 + n as usize;
    at += 8;
    let Some(n) = get32(b, at) else { return };
    at = match (n as usize)
        .checked_mul(32)
        .and_then(|m| m.checked_add(at + 4))
    {
        Some(x) => x,
        None => return,
    };
    if at + 8 > b.len() {
        return;
    }
    // Version 1: the index runs to the end. Version 2: a working set
    // follows it, so keep an index length that fits.
    let to_end = (b.len() - at - 8) as u64;
    let ilen = match get64(b, at) {
        Some(l) if get32(b, 8) == Some(2) && l <= to_end => l,
        _ => to_end,
    };
    put64(b, at, ilen);
    cas_index(&mut b[at + 8..at + 8 + ilen as usize]);
}

/// `docs/formats/cas-session.md`: the header CRC and the record chain.
pub fn cas_session_map(b: &mut [u8]) {
    if b.len() < 64 {
        return;
    }
    let mut chain = crc32c::crc32c(&b[..60]);
    put32(b, 60, chain);
    for r in b[64..].chunks_exact_mut(32) {
        chain = crc32c::crc32c_append(chain, &r[..28]);
        put32(r, 28, chain);
    }
}

/// `docs/formats/cas-session.md` (the write-ahead log): both header
/// slots' CRCs, then, from offset 4096 while a record's length field is
/// sane, its generation, sequence number, chain, log id and CRC.
pub fn cas_session_wal(b: &mut [u8]) {
    use roamdisk_roam::session::wal;
    for o in [0, wal::SLOT_SIZE] {
        if b.len() >= o + wal::SLOT_SIZE {
            let c = crc32c::crc32c(&b[o..o + wal::SLOT_SIZE - 4]);
            put32(b, o + wal::SLOT_SIZE - 4, c);
        }
    }
    let Ok((head, mut chain)) = wal::current(b) else {
        return;
    };
    let mut at = wal::RECORDS_AT as usize;
    let mut seq = 1u64;
    while let Some(len) = get64(b, at + 40) {
        let len = len as usize;
        if len < wal::RECORD_HEADER || len % 512 != 0 || at.saturating_add(len) > b.len() {
            break;
        }
        put64(b, at + 8, head.generation);
        put64(b, at + 16, seq);
        put32(b, at + 48, chain);
        put64(b, at + 52, head.id);
        put32(b, at + 60, 0);
        chain = crc32c::crc32c(&b[at..at + len]);
        put32(b, at + 60, chain);
        at += len;
        seq += 1;
    }
}

/// `docs/formats/cas-chunk.md`: the payload length field; an uncompressed
/// chunk's original length equals it.
pub fn cas_chunk(b: &mut [u8]) {
    if b.len() < 16 {
        return;
    }
    let n = (b.len() - 16) as u32;
    put32(b, 8, n);
    if b[5] & 1 == 0 {
        put32(b, 12, n);
    }
}

/// GPT: for both sector sizes, the entry-array CRC and the header CRC of
/// the primary (LBA 1) and backup (last LBA) headers, when they carry the
/// "EFI PART" signature and describe an array inside the image.
pub fn gpt(img: &mut crate::disk::Image) {
    for sector in [512u64, 4096] {
        let sectors = img.size() / sector;
        if sectors < 3 {
            continue;
        }
        for lba in [1, sectors - 1] {
            let at = (lba * sector) as usize;
            if img.bytes().get(at..at + 8) != Some(b"EFI PART") {
                continue;
            }
            let mut h = img.bytes()[at..at + sector as usize].to_vec();
            let hsize = get32(&h, 12).unwrap_or(0) as usize;
            let count = get32(&h, 80).unwrap_or(0) as u64;
            let esize = get32(&h, 84).unwrap_or(0) as u64;
            let elba = get64(&h, 72).unwrap_or(0);
            let len = count * esize;
            if len <= 4 << 20 {
                if let Some(off) = elba.checked_mul(sector) {
                    if off.checked_add(len).is_some_and(|e| e <= img.size()) {
                        let c = crc32fast::hash(&img.bytes()[off as usize..(off + len) as usize]);
                        put32(&mut h, 88, c);
                    }
                }
            }
            if (92..=sector as usize).contains(&hsize) {
                put32(&mut h, 16, 0);
                let c = crc32fast::hash(&h[..hsize]);
                put32(&mut h, 16, c);
            }
            img.write(at as u64, &h);
        }
    }
}

/// ext2/3/4 at offset 0 of the image: block bitmap checksums, group
/// descriptor checksums (classic descriptor table only, not `meta_bg`)
/// and the superblock checksum, for `metadata_csum` and `uninit_bg`.
pub fn ext(img: &mut crate::disk::Image) {
    let Some(sb) = img.bytes().get(1024..2048).map(<[u8]>::to_vec) else {
        return;
    };
    let f32 = |o| get32(&sb, o).unwrap_or(0);
    let log = f32(0x18);
    if log > 6 {
        return;
    }
    let bs = 1024u64 << log;
    let incompat = f32(0x60);
    let ro = f32(0x64);
    let metadata_csum = ro & 0x400 != 0;
    let gdt_csum = ro & 0x10 != 0;
    if !metadata_csum && !gdt_csum {
        return;
    }
    let is64 = incompat & 0x80 != 0;
    let ds = if is64 {
        get16(&sb, 0xFE).unwrap_or(0) as u64
    } else {
        32
    };
    if !(32..=1024).contains(&ds) || !ds.is_power_of_two() {
        return;
    }
    let seed = if incompat & 0x2000 != 0 {
        f32(0x270)
    } else {
        crc32c_raw(!0, &sb[0x68..0x78])
    };
    let blocks = f32(0x04) as u64 | if is64 { (f32(0x150) as u64) << 32 } else { 0 };
    let fdb = f32(0x14) as u64;
    let bpg = f32(0x20) as u64;
    let cpg = f32(0x24) as u64;
    // The parser's own limits (one bitmap block per group); beyond them a
    // fix-up would only burn time checksumming huge "bitmaps".
    if bpg == 0 || blocks <= fdb || cpg == 0 || cpg > 8 * bs {
        return;
    }
    let groups = (blocks - fdb).div_ceil(bpg).min(1 << 12);
    let bigalloc_1k = ro & 0x200 != 0 && bs == 1024;
    let desc_at = (fdb + 1 + u64::from(bigalloc_1k)) * bs;
    let bitmap_bytes = (cpg / 8) as usize;
    for g in 0..groups {
        let at = desc_at + g * ds;
        let Some(mut d) = img
            .bytes()
            .get(at as usize..(at + ds) as usize)
            .map(<[u8]>::to_vec)
        else {
            break;
        };
        if metadata_csum && bitmap_bytes > 0 {
            let bb = get32(&d, 0).unwrap_or(0) as u64
                | if ds >= 64 {
                    (get32(&d, 0x20).unwrap_or(0) as u64) << 32
                } else {
                    0
                };
            let off = bb.checked_mul(bs).unwrap_or(u64::MAX);
            if let Some(bits) = off
                .checked_add(bitmap_bytes as u64)
                .filter(|&e| e <= img.size())
                .and_then(|_| img.bytes().get(off as usize..off as usize + bitmap_bytes))
            {
                let c = crc32c_raw(seed, bits);
                d[0x18..0x1A].copy_from_slice(&(c as u16).to_le_bytes());
                if ds >= 0x3A {
                    d[0x38..0x3A].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
                }
            }
        }
        let c = if metadata_csum {
            let mut copy = d.clone();
            copy[0x1E..0x20].fill(0);
            let c = crc32c_raw(seed, &(g as u32).to_le_bytes());
            (crc32c_raw(c, &copy) & 0xFFFF) as u16
        } else {
            let mut c = crc16(!0, &sb[0x68..0x78]);
            c = crc16(c, &(g as u32).to_le_bytes());
            c = crc16(c, &d[..0x1E]);
            crc16(c, &d[0x20..])
        };
        d[0x1E..0x20].copy_from_slice(&c.to_le_bytes());
        img.write(at, &d);
    }
    if metadata_csum {
        let mut sb = sb;
        let c = crc32c_raw(!0, &sb[..0x3FC]);
        put32(&mut sb, 0x3FC, c);
        img.write(1024, &sb);
    }
}

/// NTFS: make the update sequence of every multi-sector structure
/// (`FILE` records, `INDX` blocks, `RSTR`/`CHKD` restart pages) at a
/// 512-byte boundary consistent, so that mutations inside a record are
/// not all "torn writes".
pub fn ntfs(img: &mut crate::disk::Image) {
    let mut fixes = Vec::new();
    for at in img.written_sectors() {
        let b = img.bytes();
        let magic = &b[at..at + 4];
        if !matches!(magic, b"FILE" | b"INDX" | b"RSTR" | b"CHKD") {
            continue;
        }
        let ofs = get16(b, at + 4).unwrap_or(0) as usize;
        let count = get16(b, at + 6).unwrap_or(0) as usize;
        if ofs < 8 || count < 2 || count > 129 || ofs + 2 * count > 510 {
            continue;
        }
        let usn = [b[at + ofs], b[at + ofs + 1]];
        for i in 1..count {
            fixes.push((at + i * 512 - 2, usn));
        }
    }
    for (at, usn) in fixes {
        if at + 2 <= img.bytes().len() {
            img.write(at as u64, &usn);
        }
    }
}

/// A format whose last 4 bytes are the CRC-32C of everything before them
/// (the shared cache's pin sets, lookaside indexes).
pub fn trailing_crc(b: &mut [u8]) {
    if b.len() >= 4 {
        let end = b.len() - 4;
        let crc = crc32c::crc32c(&b[..end]);
        put32(b, end, crc);
    }
}
