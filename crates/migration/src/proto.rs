//! QEMU's migration stream: the constants and the byte-level pieces, no
//! I/O. The subset roamdisk reads and writes is specified in
//! `docs/formats/qemu-migration.md`; the protocol itself is QEMU's
//! (`migration/savevm.c`, `migration/ram.c`, `migration/migration.c`),
//! identical in the parts used here from QEMU 7.2 to 10.0.

#![allow(missing_docs)]

/// `QEVM`, the stream's first four bytes.
pub const FILE_MAGIC: u32 = 0x5145_564d;
/// The stream version every QEMU since 1.x writes.
pub const FILE_VERSION: u32 = 3;

// Section types (one byte each).
pub const VM_EOF: u8 = 0x00;
pub const VM_SECTION_START: u8 = 0x01;
pub const VM_SECTION_PART: u8 = 0x02;
pub const VM_SECTION_END: u8 = 0x03;
pub const VM_SECTION_FULL: u8 = 0x04;
pub const VM_SUBSECTION: u8 = 0x05;
pub const VM_VMDESCRIPTION: u8 = 0x06;
pub const VM_CONFIGURATION: u8 = 0x07;
pub const VM_COMMAND: u8 = 0x08;
pub const VM_SECTION_FOOTER: u8 = 0x7e;

// Commands (`08`, be16 command, be16 length, data).
pub const CMD_OPEN_RETURN_PATH: u16 = 1;
pub const CMD_PING: u16 = 2;
pub const CMD_POSTCOPY_ADVISE: u16 = 3;
pub const CMD_POSTCOPY_LISTEN: u16 = 4;
pub const CMD_POSTCOPY_RUN: u16 = 5;
pub const CMD_POSTCOPY_RAM_DISCARD: u16 = 6;
pub const CMD_PACKAGED: u16 = 7;
pub const CMD_ENABLE_COLO: u16 = 8;
pub const CMD_POSTCOPY_RESUME: u16 = 9;
pub const CMD_RECV_BITMAP: u16 = 10;
/// QEMU 10.0 and later (machine types ≥ 10.0): sent before the last RAM
/// section; a 7.2 destination does not know it.
pub const CMD_SWITCHOVER_START: u16 = 11;

/// A command's name, for messages.
pub fn command_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_OPEN_RETURN_PATH => "OPEN_RETURN_PATH",
        CMD_PING => "PING",
        CMD_POSTCOPY_ADVISE => "POSTCOPY_ADVISE",
        CMD_POSTCOPY_LISTEN => "POSTCOPY_LISTEN",
        CMD_POSTCOPY_RUN => "POSTCOPY_RUN",
        CMD_POSTCOPY_RAM_DISCARD => "POSTCOPY_RAM_DISCARD",
        CMD_PACKAGED => "PACKAGED",
        CMD_ENABLE_COLO => "ENABLE_COLO",
        CMD_POSTCOPY_RESUME => "POSTCOPY_RESUME",
        CMD_RECV_BITMAP => "RECV_BITMAP",
        CMD_SWITCHOVER_START => "SWITCHOVER_START",
        _ => "unknown",
    }
}

// RAM page record flags (the low bits of the be64 offset).
pub const RAM_FLAG_ZERO: u64 = 0x02;
pub const RAM_FLAG_MEM_SIZE: u64 = 0x04;
pub const RAM_FLAG_PAGE: u64 = 0x08;
pub const RAM_FLAG_EOS: u64 = 0x10;
pub const RAM_FLAG_CONTINUE: u64 = 0x20;
pub const RAM_FLAG_XBZRLE: u64 = 0x40;
pub const RAM_FLAG_HOOK: u64 = 0x80;
pub const RAM_FLAG_COMPRESS_PAGE: u64 = 0x100;
pub const RAM_FLAG_MULTIFD_FLUSH: u64 = 0x200;

/// The RAM section's name and the only version QEMU's `ram_load` takes.
pub const RAM_IDSTR: &str = "ram";
pub const RAM_VERSION: u32 = 4;

/// The target page: the unit of every page record (x86 and most targets;
/// a stream of another size is refused).
pub const TARGET_PAGE_BITS: u32 = 12;
pub const TARGET_PAGE: usize = 1 << TARGET_PAGE_BITS;
const TARGET_PAGE_MASK: u64 = !(TARGET_PAGE as u64 - 1);

/// Split a record's first word into (offset, flags).
pub fn split_addr(word: u64) -> (u64, u64) {
    (word & TARGET_PAGE_MASK, word & !TARGET_PAGE_MASK)
}

// Return-path messages (be16 type, be16 length, data).
pub const RP_SHUT: u16 = 1;
pub const RP_PONG: u16 = 2;
pub const RP_REQ_PAGES_ID: u16 = 3;
pub const RP_REQ_PAGES: u16 = 4;
pub const RP_RECV_BITMAP: u16 = 5;
pub const RP_RESUME_ACK: u16 = 6;
/// QEMU 10.0, only with the `switchover-ack` capability.
pub const RP_SWITCHOVER_ACK: u16 = 7;

/// The end mark after a received-pages bitmap on the return path.
pub const RECV_BITMAP_ENDING: u64 = 0x0123_4567_89ab_cdef;
/// The value of a `RESUME_ACK` (`MIGRATION_RESUME_ACK_VALUE`).
pub const RESUME_ACK_VALUE: u32 = 1;
/// The version byte of a `POSTCOPY_RAM_DISCARD` command.
pub const DISCARD_VERSION: u8 = 0;
