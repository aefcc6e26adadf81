//! Read-only parsers of partition tables and file-system allocation
//! metadata, over any [`BlockDev`] (a host disk, a guest image, a stack).
//!
//! # API summary
//!
//! ```text
//! partitions(dev)                     -> Result<Vec<Partition>>
//!     Data partitions: MBR (primary + logical in the extended chain), GPT
//!     (primary header, else the backup), or one whole-disk entry
//!     (number 0) when there is no table. Partition { number, start, len
//!     (bytes), type_id ("0x83" | GUID), type_name, name, guid, logical }.
//! read_table(dev)                     -> Result<PartitionTable>
//!     The same plus scheme (mbr|gpt|none), sector size, disk id, warnings
//!     and an identity hash of the table sectors.
//! probe(dev, start, len)              -> Result<Probe>
//!     Which file system the byte range holds and its read-only safety
//!     check. Probe { kind (ext2|ext3|ext4|ntfs|swap|unsupported),
//!     type_name ("ext4", "vfat", "LVM2_member", "empty", "unknown"...),
//!     uuid, label, unit (allocation unit, bytes), fs_bytes, health,
//!     notes, identity (SHA-256 of the superblock-like metadata) }.
//!     Health::Clean, or Health::Unsafe { reason, detail } with reason
//!     not-clean | errors-recorded | needs-recovery | mmp-in-use | dirty |
//!     hibernated | fast-startup | unsupported.
//! free_space(dev, start, len)         -> Result<FreeSpace>
//!     probe + every free extent as an absolute byte range of `dev`,
//!     sorted, touching extents merged, + the free total. Unsupported
//!     volumes have no extents. Trust the extents only when
//!     `probe.health.is_clean()`: an unclean volume's bitmap may be stale.
//!     A Linux swap area's free space is its whole page area (pages 1 ..=
//!     last_page minus bad pages): everything but the header.
//! for_each_free_extent(dev, start, len, &mut f) -> Result<(Probe, u64)>
//!     The same, streamed (bounded memory on huge, fragmented volumes).
//! ```
//!
//! Errors are [`roamdisk_blockdev::Error`]s: `Corrupt` for malformed or
//! truncated metadata (the message says what and where), `OutOfRange`
//! for a range outside the device, I/O kinds from the device. No parser
//! panics on hostile input; where a structure is not understood the
//! volume is reported `unsupported` rather than guessed at.
//!
//! Guide: `docs/fsmeta.md`.
//!
//! ```
//! use roamdisk_blockdev::layers::mem::MemDev;
//! let disk = MemDev::new(1 << 20);
//! let parts = roamdisk_fsmeta::partitions(&disk).unwrap();
//! assert_eq!(parts.len(), 1); // no table: the whole disk
//! let p = roamdisk_fsmeta::probe(&disk, 0, disk_size(&disk)).unwrap();
//! assert_eq!(p.type_name, "empty");
//! # fn disk_size(d: &MemDev) -> u64 { roamdisk_blockdev::BlockDev::size(d) }
//! ```

mod bytes;
mod ext;
mod extent;
mod ntfs;
mod part;
mod probe;
mod signatures;
mod swap;
mod volume;

pub use bytes::{hex, Region};
/// The ext2/3/4 metadata checksums as e2fsprogs computes them (also for
/// tools that rewrite ext metadata, such as the fuzzers' fix-ups).
pub use ext::csum as ext_csum;
pub use extent::{clear_runs, normalize, Extent};
pub use part::{guid_text, partitions, read_table, Partition, PartitionTable, Scheme};
pub use probe::{for_each_free_extent, free_space, probe, FreeSpace};
pub use volume::{FsKind, Health, Probe, Reason};

#[doc(hidden)]
pub use roamdisk_blockdev::BlockDev;
