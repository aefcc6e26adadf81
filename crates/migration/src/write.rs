//! Writing migration streams: the precopy stream a destination loads at
//! once (the eager resume), and the frames of a postcopy *source* — the
//! commands that put a destination in postcopy, the device state packaged
//! between LISTEN and RUN, and sections of page records sent on demand or
//! pushed. Pure encoding into byte vectors; the caller owns the socket.

use crate::proto::*;
use crate::stream::RamSection;

/// Append a command: `08`, be16 command, be16 length, data.
pub fn command(out: &mut Vec<u8>, cmd: u16, data: &[u8]) {
    let len = u16::try_from(data.len()).expect("a command's data fits its be16 length");
    out.push(VM_COMMAND);
    out.extend_from_slice(&cmd.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
}

/// `POSTCOPY_ADVISE` for RAM of ordinary pages: the page-size summary and
/// the target page size, both 4 KiB.
pub fn advise(out: &mut Vec<u8>) {
    let mut d = Vec::with_capacity(16);
    d.extend_from_slice(&(TARGET_PAGE as u64).to_be_bytes());
    d.extend_from_slice(&(TARGET_PAGE as u64).to_be_bytes());
    command(out, CMD_POSTCOPY_ADVISE, &d);
}

/// `POSTCOPY_RAM_DISCARD` of byte ranges (start, length) of one block.
pub fn discard(out: &mut Vec<u8>, block: &str, ranges: &[(u64, u64)]) {
    let mut d = vec![DISCARD_VERSION, block.len() as u8];
    d.extend_from_slice(block.as_bytes());
    d.push(0);
    for (start, len) in ranges {
        d.extend_from_slice(&start.to_be_bytes());
        d.extend_from_slice(&len.to_be_bytes());
    }
    command(out, CMD_POSTCOPY_RAM_DISCARD, &d);
}

/// `RECV_BITMAP` for one block (postcopy recovery).
pub fn recv_bitmap(out: &mut Vec<u8>, block: &str) {
    let mut d = vec![block.len() as u8];
    d.extend_from_slice(block.as_bytes());
    command(out, CMD_RECV_BITMAP, &d);
}

/// `PACKAGED` with `blob` after it: the destination reads the blob whole,
/// then loads it as a stream of its own.
pub fn packaged(out: &mut Vec<u8>, blob: &[u8]) {
    let len = u32::try_from(blob.len()).expect("a package fits its be32 length");
    command(out, CMD_PACKAGED, &len.to_be_bytes());
    out.extend_from_slice(blob);
}

/// The blob of a postcopy start: LISTEN (the destination registers its RAM
/// for faults and reads pages from here on), the device sections, RUN.
/// No end mark: it would end the blob's loop before RUN.
pub fn postcopy_blob(devices: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(devices.len() + 10);
    command(&mut b, CMD_POSTCOPY_LISTEN, &[]);
    b.extend_from_slice(devices);
    command(&mut b, CMD_POSTCOPY_RUN, &[]);
    b
}

fn str8(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.push(u8::try_from(b.len()).expect("names are at most 255 bytes"));
    out.extend_from_slice(b);
}

fn footer(out: &mut Vec<u8>, ram: &RamSection) {
    if ram.footers {
        out.push(VM_SECTION_FOOTER);
        out.extend_from_slice(&ram.section_id.to_be_bytes());
    }
}

/// The RAM section's START: its header and the block list (no page
/// sizes: every block is of ordinary pages).
pub fn ram_start(out: &mut Vec<u8>, ram: &RamSection) {
    out.push(VM_SECTION_START);
    out.extend_from_slice(&ram.section_id.to_be_bytes());
    str8(out, RAM_IDSTR);
    out.extend_from_slice(&ram.instance_id.to_be_bytes());
    out.extend_from_slice(&ram.version_id.to_be_bytes());
    let total: u64 = ram.blocks.iter().map(|b| b.length).sum();
    out.extend_from_slice(&(total | RAM_FLAG_MEM_SIZE).to_be_bytes());
    for b in &ram.blocks {
        str8(out, &b.name);
        out.extend_from_slice(&b.length.to_be_bytes());
    }
    out.extend_from_slice(&RAM_FLAG_EOS.to_be_bytes());
    footer(out, ram);
}

/// Page records of one RAM PART or END section. The destination keeps
/// the block of the last record it read, across sections, and a record
/// flagged CONTINUE means that block; [`Records`] names the block in a
/// section's first record and whenever it changes, so each section stands
/// on its own (a recovered connection starts with no last block).
pub struct Records<'r> {
    ram: &'r RamSection,
    out: Vec<u8>,
    last: Option<usize>,
    pages: usize,
}

impl<'r> Records<'r> {
    /// A PART section (END with `end`).
    pub fn new(ram: &'r RamSection, end: bool) -> Records<'r> {
        let mut out = Vec::with_capacity(64 << 10);
        out.push(if end { VM_SECTION_END } else { VM_SECTION_PART });
        out.extend_from_slice(&ram.section_id.to_be_bytes());
        Records {
            ram,
            out,
            last: None,
            pages: 0,
        }
    }

    fn header(&mut self, block: usize, offset: u64, kind: u64) {
        debug_assert!(offset.is_multiple_of(TARGET_PAGE as u64));
        debug_assert!(offset < self.ram.blocks[block].length);
        if self.last == Some(block) {
            self.out
                .extend_from_slice(&(offset | kind | RAM_FLAG_CONTINUE).to_be_bytes());
        } else {
            self.out.extend_from_slice(&(offset | kind).to_be_bytes());
            str8(&mut self.out, &self.ram.blocks[block].name);
            self.last = Some(block);
        }
        self.pages += 1;
    }

    /// A page of zeroes.
    pub fn zero(&mut self, block: usize, offset: u64) {
        self.header(block, offset, RAM_FLAG_ZERO);
        self.out.push(0);
    }

    /// A page of data (`TARGET_PAGE` bytes).
    pub fn page(&mut self, block: usize, offset: u64, data: &[u8]) {
        assert_eq!(data.len(), TARGET_PAGE, "a page record holds one page");
        self.header(block, offset, RAM_FLAG_PAGE);
        self.out.extend_from_slice(data);
    }

    /// A page: a zero record if it is all zeroes, else its bytes.
    pub fn any(&mut self, block: usize, offset: u64, data: &[u8]) {
        if is_zero(data) {
            self.zero(block, offset);
        } else {
            self.page(block, offset, data);
        }
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        self.pages
    }

    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Bytes so far.
    pub fn bytes(&self) -> usize {
        self.out.len()
    }

    /// The section's bytes, ended (EOS and footer).
    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&RAM_FLAG_EOS.to_be_bytes());
        footer(&mut self.out, self.ram);
        self.out
    }
}

/// Whether every byte of `b` is zero.
pub fn is_zero(b: &[u8]) -> bool {
    let (pre, mid, post) = {
        // SAFETY: reinterpreting initialised bytes as u64 words (any bit
        // pattern is a valid u64); align_to keeps the borrow and the
        // bounds.
        unsafe { b.align_to::<u64>() }
    };
    pre.iter().all(|&x| x == 0) && mid.iter().all(|&x| x == 0) && post.iter().all(|&x| x == 0)
}

/// The end of a stream: the end mark, then the description if there is
/// one (`06`, be32 length, the JSON).
pub fn end(out: &mut Vec<u8>, vmdesc: Option<&[u8]>) {
    out.push(VM_EOF);
    if let Some(j) = vmdesc {
        out.push(VM_VMDESCRIPTION);
        out.extend_from_slice(&(j.len() as u32).to_be_bytes());
        out.extend_from_slice(j);
    }
}

// Return-path messages, as a destination sends them: what tests (and the
// fuzz seeds) answer a source with.

fn rp(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

/// `REQ_PAGES_ID` (with the block) or `REQ_PAGES` (the same block as the
/// last request).
pub fn rp_request(out: &mut Vec<u8>, block: Option<&str>, start: u64, len: u32) {
    let mut d = Vec::with_capacity(13 + block.map_or(0, str::len));
    d.extend_from_slice(&start.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    match block {
        Some(b) => {
            str8(&mut d, b);
            rp(out, RP_REQ_PAGES_ID, &d);
        }
        None => rp(out, RP_REQ_PAGES, &d),
    }
}

/// `SHUT` (0: the destination loaded everything).
pub fn rp_shut(out: &mut Vec<u8>, status: u32) {
    rp(out, RP_SHUT, &status.to_be_bytes());
}

/// `RECV_BITMAP` with the bitmap after it (little-endian bits, one per
/// target page, padded to 8 bytes) and the end mark.
pub fn rp_recv_bitmap(out: &mut Vec<u8>, block: &str, bitmap: &[u8]) {
    let mut d = Vec::new();
    str8(&mut d, block);
    rp(out, RP_RECV_BITMAP, &d);
    out.extend_from_slice(&(bitmap.len() as u64).to_be_bytes());
    out.extend_from_slice(bitmap);
    out.extend_from_slice(&RECV_BITMAP_ENDING.to_be_bytes());
}

/// `RESUME_ACK`.
pub fn rp_resume_ack(out: &mut Vec<u8>) {
    rp(out, RP_RESUME_ACK, &RESUME_ACK_VALUE.to_be_bytes());
}
