//! The LBS on-disk format: data-file superblock, metadata header and log
//! entries. Pure encoding and parsing, no I/O (fuzzed by
//! `fuzz/fuzz_targets/lbs_log.rs`). The byte layout is specified in
//! `docs/formats/lbs.md`; the constants here follow it.

use roamdisk_blockdev::header::{
    self, array_at, put_u32, put_u64, u32_at, u64_at, Frame, FrameError,
};

use crate::checksum::ChecksumKind;

/// Data-file superblock magic.
pub const DATA_MAGIC: [u8; 8] = *b"RDLBSDAT";
/// Metadata-file magic.
pub const META_MAGIC: [u8; 8] = *b"RDLBSMET";
/// Format version of the metadata file this build writes. Version 1 logs
/// (no MOVED entries) and version 2 logs (no STAMPS or CLUSTERS entries)
/// are still read; a writable open rewrites them as version 3 at its
/// first compaction.
pub const VERSION: u32 = 3;
/// Oldest metadata version this build reads.
pub const OLDEST_VERSION: u32 = 1;
/// Format version of the data file's superblock (unchanged by metadata
/// version 2: the data file's layout is the same).
pub const DATA_VERSION: u32 = 1;

/// Bytes reserved for the data-file superblock (the data area starts at a
/// cluster boundary at or after this).
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Metadata header size.
pub const META_HEADER_SIZE: usize = 256;

roamdisk_blockdev::offsets! {
    // Data superblock fields; magic and version (bytes 0..12) are the
    // frame's ([`roamdisk_blockdev::header`]).
    from header::FIELDS;
    D_BLOCK: 4, D_CLUSTER: 4, D_FLAGS: 4, D_CLUSTERS: 8, D_DATA_OFFSET: 8, D_UUID: 16,
    D_RESERVED: 68, D_CRC: 4;
    == 128
}
const DATA_FRAME: Frame = Frame {
    magic: DATA_MAGIC,
    version: DATA_VERSION,
    crc_at: D_CRC,
};

roamdisk_blockdev::offsets! {
    // Metadata header fields, after the frame's magic and version.
    from header::FIELDS;
    M_HEADER_SIZE: 4, M_UUID: 16, M_LOGICAL: 8, M_BLOCK: 4, M_CLUSTER: 4, M_CLUSTERS: 8,
    M_CHECKSUM: 1, M_CIPHER: 1, M_KEY_SOURCE: 1, M_RESERVED1: 1,
    M_ARGON_M: 4, M_ARGON_T: 4, M_ARGON_P: 4, M_SALT: 32, M_KEY_CHECK: 16, M_GENERATION: 8,
    M_RESERVED2: 124, M_CRC: 4;
    == META_HEADER_SIZE
}
const META_FRAME: Frame = Frame {
    magic: META_MAGIC,
    version: VERSION,
    crc_at: M_CRC,
};
/// The frame of an older version's metadata header (same layout).
const fn meta_frame(version: u32) -> Frame {
    Frame {
        version,
        ..META_FRAME
    }
}

/// Entry header size (kind, reserved, length, seq).
pub const ENTRY_HEADER: usize = 16;
/// Entry trailer size (crc32c).
pub const ENTRY_TRAILER: usize = 4;
/// Largest entry accepted.
pub const MAX_ENTRY: usize = 1 << 20;

/// Entry kinds.
pub const KIND_MAP: u8 = 1;
pub const KIND_ZERO: u8 = 2;
pub const KIND_TRIM: u8 = 3;
pub const KIND_BARRIER: u8 = 4;
/// Since version 2.
pub const KIND_MOVED: u8 = 5;
/// Since version 3: the collector's hints (write stamps, cluster ages).
pub const KIND_STAMPS: u8 = 6;
pub const KIND_CLUSTERS: u8 = 7;
/// Most stamps in one STAMPS entry, clusters in one CLUSTERS entry.
pub const STAMPS_PER_ENTRY: usize = 1 << 17;
pub const CLUSTERS_PER_ENTRY: usize = 1 << 14;
const STAMPS_FIXED: usize = 8 + 4 + 4 + 8;
const CLUSTER_HINT: usize = 24;

/// Accepted block sizes.
pub const BLOCK_SIZES: [u32; 2] = [1024, 4096];

/// Encryption of data blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    None = 0,
    /// XTS-AES-256 per block; tweak = the block's seal: the PBN (low 64
    /// bits) and write epoch (high 64 bits) it was first written at, which
    /// a garbage-collection move keeps.
    Aes256Xts = 1,
}

/// Where the encryption key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    None = 0,
    /// A 64-byte key file.
    KeyFile = 1,
    /// A passphrase through Argon2id with the header's parameters.
    Passphrase = 2,
}

/// A parse failure: what was wrong, for the error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("truncated: {0} bytes, need {1}")]
    Truncated(usize, usize),
    #[error("bad magic: not an LBS {0} file")]
    BadMagic(&'static str),
    #[error("unsupported version {0} (this build reads versions {OLDEST_VERSION} to {VERSION})")]
    BadVersion(u32),
    #[error("header checksum mismatch: the header is damaged")]
    BadCrc,
    #[error("invalid header field: {0}")]
    BadField(&'static str),
}

impl FormatError {
    /// The error of a rejected frame of the `what` header.
    fn frame(e: FrameError, f: &Frame, what: &'static str) -> FormatError {
        match e {
            FrameError::Truncated(n) => FormatError::Truncated(n, f.size()),
            FrameError::BadMagic => FormatError::BadMagic(what),
            FrameError::BadVersion(v) => FormatError::BadVersion(v),
            FrameError::BadCrc => FormatError::BadCrc,
        }
    }
}

/// The geometry both files agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub cluster_size: u32,
    /// Physical clusters in the data file.
    pub clusters: u64,
}

impl Geometry {
    pub fn blocks_per_cluster(&self) -> u64 {
        (self.cluster_size / self.block_size) as u64
    }
    pub fn physical_blocks(&self) -> u64 {
        self.clusters * self.blocks_per_cluster()
    }
    /// Byte offset of PBN 0 in the data file.
    pub fn data_offset(&self) -> u64 {
        (self.cluster_size as u64).max(SUPERBLOCK_SIZE as u64)
    }
    /// Total data-file length.
    pub fn data_file_len(&self) -> u64 {
        self.data_offset() + self.clusters * self.cluster_size as u64
    }
    /// The geometry a header keeps at these offsets (block size and
    /// cluster size as `u32`, the cluster count as `u64`), validated.
    fn read(
        b: &[u8],
        block: usize,
        cluster: usize,
        clusters: usize,
    ) -> Result<Geometry, FormatError> {
        let g = Geometry {
            block_size: u32_at(b, block),
            cluster_size: u32_at(b, cluster),
            clusters: u64_at(b, clusters),
        };
        g.validate()?;
        Ok(g)
    }
    /// Write the geometry at the offsets [`Geometry::read`] reads it from.
    fn write(&self, b: &mut [u8], block: usize, cluster: usize, clusters: usize) {
        put_u32(b, block, self.block_size);
        put_u32(b, cluster, self.cluster_size);
        put_u64(b, clusters, self.clusters);
    }
    fn validate(&self) -> Result<(), FormatError> {
        if !BLOCK_SIZES.contains(&self.block_size) {
            return Err(FormatError::BadField("block size must be 1024 or 4096"));
        }
        let c = self.cluster_size;
        if !c.is_power_of_two() || c < 16 * self.block_size || c > (16 << 20) {
            return Err(FormatError::BadField(
                "cluster size must be a power of two, 16 blocks to 16 MiB",
            ));
        }
        if self.clusters < 4 || self.clusters > (u32::MAX as u64 - 2) / self.blocks_per_cluster() {
            return Err(FormatError::BadField("cluster count out of range"));
        }
        Ok(())
    }
}

/// The data file's superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSuper {
    pub geometry: Geometry,
    pub encrypted: bool,
    pub uuid: [u8; 16],
}

impl DataSuper {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_SIZE];
        self.geometry.write(&mut b, D_BLOCK, D_CLUSTER, D_CLUSTERS);
        put_u32(&mut b, D_FLAGS, self.encrypted as u32);
        put_u64(&mut b, D_DATA_OFFSET, self.geometry.data_offset());
        b[D_UUID..D_UUID + 16].copy_from_slice(&self.uuid);
        DATA_FRAME.seal(&mut b);
        b
    }

    pub fn parse(b: &[u8]) -> Result<DataSuper, FormatError> {
        DATA_FRAME
            .check(b)
            .map_err(|e| FormatError::frame(e, &DATA_FRAME, "data (.lbsd)"))?;
        let flags = u32_at(b, D_FLAGS);
        if flags > 1 {
            return Err(FormatError::BadField("unknown data flags"));
        }
        let geometry = Geometry::read(b, D_BLOCK, D_CLUSTER, D_CLUSTERS)?;
        if u64_at(b, D_DATA_OFFSET) != geometry.data_offset() {
            return Err(FormatError::BadField("data offset"));
        }
        Ok(DataSuper {
            geometry,
            encrypted: flags == 1,
            uuid: array_at(b, D_UUID),
        })
    }
}

/// The metadata file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaHeader {
    /// Format version: [`VERSION`] for new images, 1 for old ones until
    /// their first compaction.
    pub version: u32,
    pub uuid: [u8; 16],
    pub logical_size: u64,
    pub geometry: Geometry,
    pub checksum: ChecksumKind,
    pub cipher: Cipher,
    pub key_source: KeySource,
    /// Argon2id memory (KiB), iterations, lanes.
    pub argon: (u32, u32, u32),
    pub salt: [u8; 32],
    /// First 16 bytes of SHA-256("roamdisk-lbs-key-check" || key).
    pub key_check: [u8; 16],
    pub generation: u64,
}

impl MetaHeader {
    /// The first header of an unencrypted image (generation 1); an
    /// encrypted one sets the cipher, key source and key fields over it.
    pub fn plain(
        uuid: [u8; 16],
        logical_size: u64,
        geometry: Geometry,
        checksum: ChecksumKind,
    ) -> MetaHeader {
        MetaHeader {
            version: VERSION,
            uuid,
            logical_size,
            geometry,
            checksum,
            cipher: Cipher::None,
            key_source: KeySource::None,
            argon: (0, 0, 0),
            salt: [0; 32],
            key_check: [0; 16],
            generation: 1,
        }
    }

    pub fn logical_blocks(&self) -> u64 {
        self.logical_size / self.geometry.block_size as u64
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; META_HEADER_SIZE];
        put_u32(&mut b, M_HEADER_SIZE, META_HEADER_SIZE as u32);
        b[M_UUID..M_UUID + 16].copy_from_slice(&self.uuid);
        put_u64(&mut b, M_LOGICAL, self.logical_size);
        self.geometry.write(&mut b, M_BLOCK, M_CLUSTER, M_CLUSTERS);
        b[M_CHECKSUM] = self.checksum.id();
        b[M_CIPHER] = self.cipher as u8;
        b[M_KEY_SOURCE] = self.key_source as u8;
        put_u32(&mut b, M_ARGON_M, self.argon.0);
        put_u32(&mut b, M_ARGON_T, self.argon.1);
        put_u32(&mut b, M_ARGON_P, self.argon.2);
        b[M_SALT..M_SALT + 32].copy_from_slice(&self.salt);
        b[M_KEY_CHECK..M_KEY_CHECK + 16].copy_from_slice(&self.key_check);
        put_u64(&mut b, M_GENERATION, self.generation);
        let frame = meta_frame(self.version);
        frame.seal(&mut b);
        b
    }

    pub fn parse(b: &[u8]) -> Result<MetaHeader, FormatError> {
        let version = match META_FRAME.check(b) {
            Ok(()) => VERSION,
            Err(FrameError::BadVersion(v)) if (OLDEST_VERSION..VERSION).contains(&v) => {
                let f = meta_frame(v);
                f.check(b)
                    .map_err(|e| FormatError::frame(e, &f, "metadata (.lbsm)"))?;
                v
            }
            Err(e) => return Err(FormatError::frame(e, &META_FRAME, "metadata (.lbsm)")),
        };
        if u32_at(b, M_HEADER_SIZE) as usize != META_HEADER_SIZE {
            return Err(FormatError::BadField("header size"));
        }
        let geometry = Geometry::read(b, M_BLOCK, M_CLUSTER, M_CLUSTERS)?;
        let logical_size = u64_at(b, M_LOGICAL);
        let bs = geometry.block_size as u64;
        if logical_size == 0 || !logical_size.is_multiple_of(bs) {
            return Err(FormatError::BadField(
                "logical size must be a positive multiple of the block size",
            ));
        }
        if logical_size / bs > geometry.physical_blocks() {
            return Err(FormatError::BadField(
                "logical size exceeds the physical space",
            ));
        }
        let checksum = ChecksumKind::from_id(b[M_CHECKSUM])
            .ok_or(FormatError::BadField("checksum algorithm"))?;
        let cipher = match b[M_CIPHER] {
            0 => Cipher::None,
            1 => Cipher::Aes256Xts,
            _ => return Err(FormatError::BadField("cipher")),
        };
        let key_source = match b[M_KEY_SOURCE] {
            0 => KeySource::None,
            1 => KeySource::KeyFile,
            2 => KeySource::Passphrase,
            _ => return Err(FormatError::BadField("key source")),
        };
        if (cipher == Cipher::None) != (key_source == KeySource::None) {
            return Err(FormatError::BadField("cipher and key source disagree"));
        }
        Ok(MetaHeader {
            version,
            uuid: array_at(b, M_UUID),
            logical_size,
            geometry,
            checksum,
            cipher,
            key_source,
            argon: (
                u32_at(b, M_ARGON_M),
                u32_at(b, M_ARGON_T),
                u32_at(b, M_ARGON_P),
            ),
            salt: array_at(b, M_SALT),
            key_check: array_at(b, M_KEY_CHECK),
            generation: u64_at(b, M_GENERATION),
        })
    }
}

/// A log entry's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// LBNs `lbn..lbn+count` live at PBNs `pbn..pbn+count`, written in
    /// epoch `epoch`, with one checksum per block.
    Map {
        lbn: u64,
        pbn: u64,
        count: u64,
        epoch: u64,
        sums: Vec<u8>,
    },
    /// LBNs `lbn..lbn+count` live at PBNs `pbn..pbn+count` of a cluster
    /// in epoch `epoch`, as copies (moved by the garbage collector, bytes
    /// unchanged) of blocks sealed — encrypted and checksummed — at PBNs
    /// `seal_pbn..seal_pbn+count` in epoch `seal_epoch`; one checksum per
    /// block, as it was sealed. Since version 2.
    Moved {
        lbn: u64,
        pbn: u64,
        count: u64,
        epoch: u64,
        seal_pbn: u64,
        seal_epoch: u64,
        sums: Vec<u8>,
    },
    /// LBNs `lbn..lbn+count` read as zeroes and use no data block.
    Zero { lbn: u64, count: u64 },
    /// LBNs `lbn..lbn+count` are unmapped (trimmed); they read as zeroes.
    Trim { lbn: u64, count: u64 },
    /// Everything since the previous barrier is durable; `crc` is the
    /// CRC-32C of all entry bytes since the previous barrier's end.
    Barrier { number: u64, crc: u32 },
    /// The collector's write stamps of LBNs `lbn..lbn+stamps.len()`, taken
    /// on activation clock `clock` (hints: they place writes, never data).
    /// Since version 3.
    Stamps {
        lbn: u64,
        clock: u64,
        stamps: Vec<u16>,
    },
    /// The collector's knowledge of clusters `first..first+hints.len()` at
    /// activation clock `clock`. Since version 3.
    Clusters {
        first: u64,
        clock: u64,
        hints: Vec<ClusterHint>,
    },
}

/// What the collector knew of a cluster when the log was compacted: valid
/// while the cluster is still in the use of `epoch` (0: no hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterHint {
    pub epoch: u64,
    /// Activation clock when it became a write position.
    pub activated: u64,
    /// Blocks written into it since.
    pub written: u32,
    /// The write stream that filled it.
    pub stream: u8,
}

const MAP_FIXED: usize = 8 + 8 + 4 + 4 + 8;
const MOVED_FIXED: usize = MAP_FIXED + 8 + 8;

/// The blocks a MAP or MOVED entry places ([`Entry::placed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed<'a> {
    pub lbn: u64,
    pub pbn: u64,
    pub count: u64,
    pub epoch: u64,
    /// Where and when the blocks were sealed, for MOVED copies.
    pub seal: Option<(u64, u64)>,
    pub sums: &'a [u8],
}

impl Entry {
    /// The entry placing LBNs `lbn..lbn+count` at PBNs `pbn..` of a
    /// cluster in `epoch`: MAP when they are sealed there (`seal` None),
    /// MOVED when they are copies of blocks sealed at `seal` (PBN, epoch).
    pub fn placing(
        lbn: u64,
        pbn: u64,
        count: u64,
        epoch: u64,
        seal: Option<(u64, u64)>,
        sums: Vec<u8>,
    ) -> Entry {
        match seal {
            None => Entry::Map {
                lbn,
                pbn,
                count,
                epoch,
                sums,
            },
            Some((seal_pbn, seal_epoch)) => Entry::Moved {
                lbn,
                pbn,
                count,
                epoch,
                seal_pbn,
                seal_epoch,
                sums,
            },
        }
    }

    /// What a MAP or MOVED entry places (`None` for the other kinds).
    pub fn placed(&self) -> Option<Placed<'_>> {
        match self {
            Entry::Map {
                lbn,
                pbn,
                count,
                epoch,
                sums,
            } => Some(Placed {
                lbn: *lbn,
                pbn: *pbn,
                count: *count,
                epoch: *epoch,
                seal: None,
                sums,
            }),
            Entry::Moved {
                lbn,
                pbn,
                count,
                epoch,
                seal_pbn,
                seal_epoch,
                sums,
            } => Some(Placed {
                lbn: *lbn,
                pbn: *pbn,
                count: *count,
                epoch: *epoch,
                seal: Some((*seal_pbn, *seal_epoch)),
                sums,
            }),
            _ => None,
        }
    }

    /// Number of blocks an entry maps, zeroes or trims.
    pub fn count(&self) -> u64 {
        match self {
            Entry::Map { count, .. }
            | Entry::Moved { count, .. }
            | Entry::Zero { count, .. }
            | Entry::Trim { count, .. } => *count,
            Entry::Barrier { .. } | Entry::Stamps { .. } | Entry::Clusters { .. } => 0,
        }
    }
}

/// Encode one entry with sequence number `seq`.
pub fn encode_entry(e: &Entry, seq: u64, sum_width: usize) -> Vec<u8> {
    let mut body = Vec::new();
    let kind = match e {
        Entry::Map { .. } | Entry::Moved { .. } => {
            let p = e.placed().expect("MAP or MOVED");
            debug_assert_eq!(p.sums.len(), p.count as usize * sum_width);
            body.extend_from_slice(&p.lbn.to_le_bytes());
            body.extend_from_slice(&p.pbn.to_le_bytes());
            body.extend_from_slice(&(p.count as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&p.epoch.to_le_bytes());
            if let Some((seal_pbn, seal_epoch)) = p.seal {
                body.extend_from_slice(&seal_pbn.to_le_bytes());
                body.extend_from_slice(&seal_epoch.to_le_bytes());
            }
            body.extend_from_slice(p.sums);
            if p.seal.is_some() {
                KIND_MOVED
            } else {
                KIND_MAP
            }
        }
        Entry::Zero { lbn, count } | Entry::Trim { lbn, count } => {
            body.extend_from_slice(&lbn.to_le_bytes());
            body.extend_from_slice(&count.to_le_bytes());
            if matches!(e, Entry::Zero { .. }) {
                KIND_ZERO
            } else {
                KIND_TRIM
            }
        }
        Entry::Barrier { number, crc } => {
            body.extend_from_slice(&number.to_le_bytes());
            body.extend_from_slice(&crc.to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            KIND_BARRIER
        }
        Entry::Stamps { lbn, clock, stamps } => {
            body.extend_from_slice(&lbn.to_le_bytes());
            body.extend_from_slice(&(stamps.len() as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&clock.to_le_bytes());
            for s in stamps {
                body.extend_from_slice(&s.to_le_bytes());
            }
            KIND_STAMPS
        }
        Entry::Clusters {
            first,
            clock,
            hints,
        } => {
            body.extend_from_slice(&first.to_le_bytes());
            body.extend_from_slice(&(hints.len() as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(&clock.to_le_bytes());
            for h in hints {
                body.extend_from_slice(&h.epoch.to_le_bytes());
                body.extend_from_slice(&h.activated.to_le_bytes());
                body.extend_from_slice(&h.written.to_le_bytes());
                body.extend_from_slice(&[h.stream, 0, 0, 0]);
            }
            KIND_CLUSTERS
        }
    };
    while body.len() % 4 != 0 {
        body.push(0);
    }
    let len = ENTRY_HEADER + body.len() + ENTRY_TRAILER;
    let mut v = Vec::with_capacity(len);
    v.push(kind);
    v.push(0);
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&body);
    let crc = crc32c::crc32c(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// Why the log stopped being readable at some offset (the tail after it is
/// cut at recovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailError {
    Truncated,
    BadLength(u32),
    BadCrc,
    BadSequence { expected: u64, found: u64 },
    BadEntry(&'static str),
}

/// Parse the entry starting at `b[0..]`. Returns the entry, its sequence
/// number and its encoded length. Ranges are validated against `lblocks`
/// logical and `pblocks` physical blocks and `bpc` blocks per cluster.
pub fn parse_entry(
    b: &[u8],
    sum_width: usize,
    lblocks: u64,
    pblocks: u64,
    bpc: u64,
) -> Result<(Entry, u64, usize), TailError> {
    if b.len() < ENTRY_HEADER + ENTRY_TRAILER {
        return Err(TailError::Truncated);
    }
    let len = u32_at(b, 4);
    let l = len as usize;
    if !(ENTRY_HEADER + ENTRY_TRAILER..=MAX_ENTRY).contains(&l) || !l.is_multiple_of(4) {
        return Err(TailError::BadLength(len));
    }
    if b.len() < l {
        return Err(TailError::Truncated);
    }
    if crc32c::crc32c(&b[..l - ENTRY_TRAILER]) != u32_at(b, l - ENTRY_TRAILER) {
        return Err(TailError::BadCrc);
    }
    if b[1] != 0 || b[2] != 0 || b[3] != 0 {
        return Err(TailError::BadEntry("reserved header bytes"));
    }
    let seq = u64_at(b, 8);
    let body = &b[ENTRY_HEADER..l - ENTRY_TRAILER];
    let in_range = |start: u64, count: u64, limit: u64| {
        count > 0 && start.checked_add(count).is_some_and(|e| e <= limit)
    };
    let e = match b[0] {
        KIND_MAP | KIND_MOVED => {
            let moved = b[0] == KIND_MOVED;
            let fixed = if moved { MOVED_FIXED } else { MAP_FIXED };
            if body.len() < fixed {
                return Err(TailError::BadEntry("short MAP"));
            }
            let lbn = u64_at(body, 0);
            let pbn = u64_at(body, 8);
            let count = u32_at(body, 16) as u64;
            let epoch = u64_at(body, 24);
            let sums_len = count as usize * sum_width;
            if u32_at(body, 20) != 0
                || body.len() < fixed + sums_len
                || body[fixed + sums_len..].iter().any(|&x| x != 0)
                || body.len() - fixed - sums_len >= 4
            {
                return Err(TailError::BadEntry("MAP layout"));
            }
            if !in_range(lbn, count, lblocks) || !in_range(pbn, count, pblocks) {
                return Err(TailError::BadEntry("MAP range"));
            }
            if pbn / bpc != (pbn + count - 1) / bpc {
                return Err(TailError::BadEntry("MAP run crosses a cluster"));
            }
            if epoch == 0 {
                return Err(TailError::BadEntry("MAP epoch 0"));
            }
            let sums = body[fixed..fixed + sums_len].to_vec();
            let seal = if moved {
                let seal_pbn = u64_at(body, 32);
                let seal_epoch = u64_at(body, 40);
                if !in_range(seal_pbn, count, pblocks)
                    || seal_pbn / bpc != (seal_pbn + count - 1) / bpc
                {
                    return Err(TailError::BadEntry("MOVED seal range"));
                }
                if seal_epoch == 0 {
                    return Err(TailError::BadEntry("MOVED seal epoch 0"));
                }
                Some((seal_pbn, seal_epoch))
            } else {
                None
            };
            Entry::placing(lbn, pbn, count, epoch, seal, sums)
        }
        KIND_ZERO | KIND_TRIM => {
            if body.len() != 16 {
                return Err(TailError::BadEntry("ZERO/TRIM layout"));
            }
            let lbn = u64_at(body, 0);
            let count = u64_at(body, 8);
            if !in_range(lbn, count, lblocks) {
                return Err(TailError::BadEntry("ZERO/TRIM range"));
            }
            if b[0] == KIND_ZERO {
                Entry::Zero { lbn, count }
            } else {
                Entry::Trim { lbn, count }
            }
        }
        KIND_BARRIER => {
            if body.len() != 16 || u32_at(body, 12) != 0 {
                return Err(TailError::BadEntry("BARRIER layout"));
            }
            Entry::Barrier {
                number: u64_at(body, 0),
                crc: u32_at(body, 8),
            }
        }
        KIND_STAMPS | KIND_CLUSTERS => {
            if body.len() < STAMPS_FIXED || u32_at(body, 12) != 0 {
                return Err(TailError::BadEntry("hint layout"));
            }
            let first = u64_at(body, 0);
            let count = u32_at(body, 8) as usize;
            let clock = u64_at(body, 16);
            let stamps = b[0] == KIND_STAMPS;
            let (each, most, limit) = if stamps {
                (2, STAMPS_PER_ENTRY, lblocks)
            } else {
                (CLUSTER_HINT, CLUSTERS_PER_ENTRY, pblocks / bpc)
            };
            let items = STAMPS_FIXED + count * each;
            if count > most
                || body.len() < items
                || body.len() - items >= 4
                || body[items..].iter().any(|&x| x != 0)
            {
                return Err(TailError::BadEntry("hint layout"));
            }
            if !in_range(first, count as u64, limit) {
                return Err(TailError::BadEntry("hint range"));
            }
            let at = |i: usize| &body[STAMPS_FIXED + i * each..STAMPS_FIXED + (i + 1) * each];
            if stamps {
                Entry::Stamps {
                    lbn: first,
                    clock,
                    stamps: (0..count)
                        .map(|i| u16::from_le_bytes([at(i)[0], at(i)[1]]))
                        .collect(),
                }
            } else {
                let mut hints = Vec::with_capacity(count);
                for i in 0..count {
                    let x = at(i);
                    let h = ClusterHint {
                        epoch: u64_at(x, 0),
                        activated: u64_at(x, 8),
                        written: u32_at(x, 16),
                        stream: x[20],
                    };
                    if x[21..24] != [0; 3]
                        || h.stream as usize >= crate::gc::STREAMS
                        || h.activated > clock
                        || h.written as u64 > bpc
                    {
                        return Err(TailError::BadEntry("CLUSTERS hint"));
                    }
                    hints.push(h);
                }
                Entry::Clusters {
                    first,
                    clock,
                    hints,
                }
            }
        }
        _ => return Err(TailError::BadEntry("unknown kind")),
    };
    Ok((e, seq, l))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> MetaHeader {
        let geometry = Geometry {
            block_size: 4096,
            cluster_size: 65536,
            clusters: 20,
        };
        MetaHeader::plain([7; 16], 1 << 20, geometry, ChecksumKind::Crc32c)
    }

    #[test]
    fn headers_round_trip_and_reject_damage() {
        let h = header();
        let b = h.encode();
        assert_eq!(MetaHeader::parse(&b).unwrap(), h);
        for i in 0..M_CRC + 4 {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(MetaHeader::parse(&c).is_err(), "flip at {i}");
        }
        let d = DataSuper {
            geometry: h.geometry,
            encrypted: true,
            uuid: [1; 16],
        };
        assert_eq!(DataSuper::parse(&d.encode()).unwrap(), d);
        assert!(DataSuper::parse(&d.encode()[..100]).is_err());
    }

    #[test]
    fn version_1_headers_are_read_and_others_refused() {
        let h1 = MetaHeader {
            version: 1,
            ..header()
        };
        let b = h1.encode();
        assert_eq!(u32_at(&b, 8), 1);
        assert_eq!(MetaHeader::parse(&b).unwrap(), h1);
        let h2 = MetaHeader {
            version: 2,
            ..header()
        };
        assert_eq!(MetaHeader::parse(&h2.encode()).unwrap(), h2);
        for v in [0, 4, 99] {
            let mut b = header().encode();
            put_u32(&mut b, 8, v);
            let crc = crc32c::crc32c(&b[..M_CRC]);
            put_u32(&mut b, M_CRC, crc);
            assert_eq!(MetaHeader::parse(&b), Err(FormatError::BadVersion(v)));
        }
    }

    #[test]
    fn entries_round_trip() {
        let es = [
            Entry::Map {
                lbn: 3,
                pbn: 17,
                count: 2,
                epoch: 9,
                sums: vec![1, 2, 3, 4, 5, 6, 7, 8],
            },
            Entry::Moved {
                lbn: 40,
                pbn: 33,
                count: 3,
                epoch: 12,
                seal_pbn: 2,
                seal_epoch: 7,
                sums: vec![9; 12],
            },
            Entry::Zero { lbn: 0, count: 5 },
            Entry::Trim {
                lbn: 200,
                count: 56,
            },
            Entry::Barrier {
                number: 4,
                crc: 0xdead_beef,
            },
            Entry::Stamps {
                lbn: 250,
                clock: 77,
                stamps: vec![1, 2, 0x8003, 4, 5, 6],
            },
            Entry::Clusters {
                first: 18,
                clock: 100,
                hints: vec![hint(3, 99, 16), ClusterHint::default()],
            },
        ];
        for (i, e) in es.iter().enumerate() {
            let b = encode_entry(e, i as u64 + 1, 4);
            let (p, seq, l) = parse_entry(&b, 4, 256, 320, 16).unwrap();
            assert_eq!((&p, seq, l), (e, i as u64 + 1, b.len()));
            for n in 0..b.len() {
                assert!(parse_entry(&b[..n], 4, 256, 320, 16).is_err());
            }
            for j in 0..b.len() {
                let mut c = b.clone();
                c[j] ^= 1;
                assert!(
                    parse_entry(&c, 4, 256, 320, 16).is_err(),
                    "flip at {j} of {e:?}"
                );
            }
        }
    }

    fn hint(stream: u8, activated: u64, written: u32) -> ClusterHint {
        ClusterHint {
            epoch: 5,
            activated,
            written,
            stream,
        }
    }

    #[test]
    fn impossible_hints_are_rejected() {
        let clusters = |first, hints| Entry::Clusters {
            first,
            clock: 100,
            hints,
        };
        for (e, why) in [
            (clusters(0, vec![hint(4, 1, 1)]), "CLUSTERS hint"),
            (clusters(0, vec![hint(0, 101, 1)]), "CLUSTERS hint"),
            (clusters(0, vec![hint(0, 1, 17)]), "CLUSTERS hint"),
            (clusters(19, vec![hint(0, 1, 1); 2]), "hint range"),
            (clusters(0, vec![]), "hint range"),
            (
                Entry::Stamps {
                    lbn: 255,
                    clock: 0,
                    stamps: vec![1, 2],
                },
                "hint range",
            ),
        ] {
            let b = encode_entry(&e, 1, 4);
            assert_eq!(
                parse_entry(&b, 4, 256, 320, 16).unwrap_err(),
                TailError::BadEntry(why),
                "{e:?}"
            );
        }
    }

    #[test]
    fn out_of_range_entries_are_rejected() {
        let b = encode_entry(
            &Entry::Zero {
                lbn: 250,
                count: 10,
            },
            1,
            4,
        );
        assert!(parse_entry(&b, 4, 256, 320, 16).is_err());
        let b = encode_entry(
            &Entry::Map {
                lbn: 0,
                pbn: 15,
                count: 2,
                epoch: 1,
                sums: vec![0; 8],
            },
            1,
            4,
        );
        assert_eq!(
            parse_entry(&b, 4, 256, 320, 16),
            Err(TailError::BadEntry("MAP run crosses a cluster"))
        );
        let moved = |seal_pbn, seal_epoch| {
            encode_entry(
                &Entry::Moved {
                    lbn: 0,
                    pbn: 16,
                    count: 2,
                    epoch: 3,
                    seal_pbn,
                    seal_epoch,
                    sums: vec![0; 8],
                },
                1,
                4,
            )
        };
        assert!(parse_entry(&moved(30, 1), 4, 256, 320, 16).is_ok());
        for (p, e, why) in [
            (15, 1, "MOVED seal range"),
            (319, 1, "MOVED seal range"),
            (30, 0, "MOVED seal epoch 0"),
        ] {
            assert_eq!(
                parse_entry(&moved(p, e), 4, 256, 320, 16),
                Err(TailError::BadEntry(why))
            );
        }
    }
}
