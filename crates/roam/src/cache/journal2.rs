//! The slot layout's journal (version 2): what entered the cache and
//! where its bytes are in the slot file, what was referenced, what left,
//! and how far the journal and the data are durable. The layout that uses
//! it, the crash argument and the reuse protocol are specified in
//! `docs/formats/cas-shared-cache.md` ("Version 3: slot files"); this
//! module is the byte codec only, pure, with no I/O.
//!
//! ```text
//! header (28 bytes)
//!   0  magic     8   "RDSCJRN\0"
//!   8  version   4   u32 LE = 2
//!  12  flags     4   u32 LE = 0 (reserved)
//!  16  unit      4   u32 LE: bytes per slot, a power of two, 4 KiB..=256 KiB
//!  20  granule   4   u32 LE = 4096
//!  24  crc       4   CRC-32C of bytes 0..24
//! record (56 bytes), repeated
//!   0  kind      1   1 insert, 2 touch, 3 evict, 4 move, 5 sync, 6 capacity
//!   1  reserved  1   0
//!   2  gran      2   u16 LE: first granule in the slot (insert, move)
//!   4  size      4   u32 LE: chunk bytes (insert, move); low half (sync);
//!                    chunks (capacity)
//!   8  slot      4   u32 LE: slot (insert, move); high half (sync)
//!  12  gen       4   u32 LE: generation of the granules (insert, move)
//!  16  data_crc  4   u32 LE: CRC-32C of the chunk's bytes (insert, move)
//!  20  id       32   chunk id (insert, touch, evict, move); zero otherwise
//!  52  crc       4   CRC-32C of bytes 0..52
//! ```
//!
//! A chunk of `size` bytes takes `granules(size)` = the next power of two
//! of `ceil(size / 4096)` granules, aligned to that count inside one slot.
//! Every field a kind does not use must be zero, and a placed chunk must
//! fit its slot, aligned: anything else is not a record, so decoding stops
//! there (only a torn tail can be; the lock holder cuts it away).

use roamdisk_blockdev::header::{put_u32, u32_at, Frame, FrameError};
use roamdisk_chunkstore::hash::{ChunkId, ID_LEN};

pub const MAGIC: [u8; 8] = *b"RDSCJRN\0";
pub const VERSION: u32 = 2;
/// Bytes per granule: the unit of placement inside a slot.
pub const GRANULE: u32 = 4096;
/// The largest slot: granule numbers are 16 bits, occupancy masks 64.
pub const MAX_UNIT: u32 = 64 * GRANULE;

roamdisk_blockdev::offsets! {
    from roamdisk_blockdev::header::FIELDS;
    H_FLAGS: 4, H_UNIT: 4, H_GRANULE: 4, H_CRC: 4;
    /// Header length.
    pub HEADER_LEN == 28
}

roamdisk_blockdev::offsets! {
    R_KIND: 1, R_RESERVED: 1, R_GRAN: 2, R_SIZE: 4, R_SLOT: 4, R_GEN: 4, R_DATA_CRC: 4,
    R_ID: ID_LEN, R_CRC: 4;
    /// Record length.
    pub RECORD_LEN == 56
}

const FRAME: Frame = Frame {
    magic: MAGIC,
    version: VERSION,
    crc_at: H_CRC,
};

/// Granules a chunk of `size` bytes takes (0 for 0 bytes).
pub fn granules(size: u32) -> u32 {
    size.div_ceil(GRANULE).next_power_of_two() * (size > 0) as u32
}

/// Where a chunk's bytes are: granule `gran` of slot `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Place {
    pub slot: u32,
    pub gran: u16,
}

impl Place {
    /// Byte offset in the slot file, for slots of `unit` bytes.
    pub fn offset(&self, unit: u32) -> u64 {
        self.slot as u64 * unit as u64 + self.gran as u64 * GRANULE as u64
    }
}

/// A chunk at its place (an insert or a move record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub id: ChunkId,
    pub size: u32,
    pub at: Place,
    /// The generation its granules carry while it is there.
    pub gen: u32,
    /// CRC-32C of its `size` bytes: what the open after a crash checks the
    /// records after the last sync against.
    pub data_crc: u32,
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The chunk's bytes are at their place.
    Insert(Placed),
    /// The chunk was referenced (a hit, or kept because it is pinned).
    Touch(ChunkId),
    /// The chunk left the cache: its granules are free once a sync record
    /// covers this one.
    Evict(ChunkId),
    /// The chunk's bytes were copied to a new place (the cap shrank).
    Move(Placed),
    /// Every record before this journal offset, and the bytes they name,
    /// are durable.
    Sync(u64),
    /// The policy holds this many chunks from here on (`cache resize`).
    Capacity(u32),
}

/// Why a journal's header is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("the journal is {0} bytes, shorter than its 28-byte header")]
    Short(usize),
    #[error("not a shared-cache journal (bad magic)")]
    Magic,
    #[error("the journal header's checksum does not match")]
    Checksum,
    #[error(
        "journal version {0} is not supported here (this build reads version 2 of the slot layout)"
    )]
    Version(u32),
    #[error("the journal header is not valid: {0}")]
    Field(String),
}

/// The slots' shape a journal was written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per slot.
    pub unit: u32,
}

impl Geometry {
    /// A geometry of `unit`-byte slots, if `unit` is one.
    pub fn new(unit: u32) -> Result<Geometry, HeaderError> {
        if unit.is_power_of_two() && (GRANULE..=MAX_UNIT).contains(&unit) {
            Ok(Geometry { unit })
        } else {
            Err(HeaderError::Field(format!(
                "a slot of {unit} bytes (a power of two from {GRANULE} to {MAX_UNIT})"
            )))
        }
    }
    /// Granules per slot.
    pub fn granules(&self) -> u32 {
        self.unit / GRANULE
    }
    /// Whether a chunk of `size` bytes at `at` fits its slot, aligned.
    pub fn fits(&self, size: u32, at: Place) -> bool {
        let n = granules(size);
        size > 0
            && size <= self.unit
            && (at.gran as u32).is_multiple_of(n)
            && at.gran as u32 + n <= self.granules()
    }
}

pub fn encode_header(g: Geometry) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    put_u32(&mut h, H_UNIT, g.unit);
    put_u32(&mut h, H_GRANULE, GRANULE);
    FRAME.seal(&mut h);
    h
}

/// The geometry a journal header names.
pub fn check_header(b: &[u8]) -> Result<Geometry, HeaderError> {
    FRAME.check(b).map_err(|e| match e {
        FrameError::Truncated(n) => HeaderError::Short(n),
        FrameError::BadMagic => HeaderError::Magic,
        FrameError::BadVersion(v) => HeaderError::Version(v),
        FrameError::BadCrc => HeaderError::Checksum,
    })?;
    if u32_at(b, H_FLAGS) != 0 {
        return Err(HeaderError::Field(format!(
            "flags {:#x} (this build knows none)",
            u32_at(b, H_FLAGS)
        )));
    }
    if u32_at(b, H_GRANULE) != GRANULE {
        return Err(HeaderError::Field(format!(
            "granules of {} bytes (this build places in {GRANULE})",
            u32_at(b, H_GRANULE)
        )));
    }
    Geometry::new(u32_at(b, H_UNIT))
}

impl Record {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut r = [0u8; RECORD_LEN];
        let placed = |r: &mut [u8; RECORD_LEN], kind: u8, p: &Placed| {
            r[R_KIND] = kind;
            r[R_GRAN..R_SIZE].copy_from_slice(&p.at.gran.to_le_bytes());
            put_u32(r, R_SIZE, p.size);
            put_u32(r, R_SLOT, p.at.slot);
            put_u32(r, R_GEN, p.gen);
            put_u32(r, R_DATA_CRC, p.data_crc);
            r[R_ID..R_CRC].copy_from_slice(&p.id.0);
        };
        match self {
            Record::Insert(p) => placed(&mut r, 1, p),
            Record::Move(p) => placed(&mut r, 4, p),
            Record::Touch(id) | Record::Evict(id) => {
                r[R_KIND] = if matches!(self, Record::Touch(_)) {
                    2
                } else {
                    3
                };
                r[R_ID..R_CRC].copy_from_slice(&id.0);
            }
            Record::Sync(upto) => {
                r[R_KIND] = 5;
                put_u32(&mut r, R_SIZE, *upto as u32);
                put_u32(&mut r, R_SLOT, (*upto >> 32) as u32);
            }
            Record::Capacity(n) => {
                r[R_KIND] = 6;
                put_u32(&mut r, R_SIZE, *n);
            }
        }
        let crc = crc32c::crc32c(&r[..R_CRC]);
        put_u32(&mut r, R_CRC, crc);
        r
    }

    /// One record of a journal of geometry `g`, or `None` if the bytes are
    /// not a whole valid record.
    pub fn decode(b: &[u8], g: Geometry) -> Option<Record> {
        if b.len() < RECORD_LEN || crc32c::crc32c(&b[..R_CRC]) != u32_at(b, R_CRC) {
            return None;
        }
        let gran = u16::from_le_bytes([b[R_GRAN], b[R_GRAN + 1]]);
        let (size, slot, gen, data_crc) = (
            u32_at(b, R_SIZE),
            u32_at(b, R_SLOT),
            u32_at(b, R_GEN),
            u32_at(b, R_DATA_CRC),
        );
        let id = ChunkId::from_slice(&b[R_ID..R_CRC]);
        if b[R_RESERVED] != 0 {
            return None;
        }
        let bare = gran == 0 && gen == 0 && data_crc == 0;
        let r = match b[R_KIND] {
            k @ (1 | 4) => {
                let p = Placed {
                    id,
                    size,
                    at: Place { slot, gran },
                    gen,
                    data_crc,
                };
                if id.is_zero() || !g.fits(size, p.at) {
                    return None;
                }
                if k == 1 {
                    Record::Insert(p)
                } else {
                    Record::Move(p)
                }
            }
            k @ (2 | 3) => {
                if id.is_zero() || !bare || size != 0 || slot != 0 {
                    return None;
                }
                if k == 2 {
                    Record::Touch(id)
                } else {
                    Record::Evict(id)
                }
            }
            5 if bare && id.is_zero() => Record::Sync((slot as u64) << 32 | size as u64),
            6 if bare && id.is_zero() && slot == 0 && size > 0 => Record::Capacity(size),
            _ => return None,
        };
        Some(r)
    }
}

/// Decode the records of `body` (the bytes after the header) up to the
/// first one that is not whole and valid. Returns the records and how
/// many bytes of `body` they cover.
pub fn decode_records(body: &[u8], g: Geometry) -> (Vec<Record>, usize) {
    let mut out = Vec::with_capacity(body.len() / RECORD_LEN);
    let mut at = 0;
    while let Some(r) = body.get(at..).and_then(|b| Record::decode(b, g)) {
        out.push(r);
        at += RECORD_LEN;
    }
    (out, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ChunkId {
        ChunkId([n; ID_LEN])
    }

    const G: Geometry = Geometry { unit: 65536 };

    fn placed(n: u8, size: u32, slot: u32, gran: u16) -> Placed {
        Placed {
            id: id(n),
            size,
            at: Place { slot, gran },
            gen: 7 + n as u32,
            data_crc: 0xdead_0000 | n as u32,
        }
    }

    fn every_kind() -> Vec<Record> {
        vec![
            Record::Capacity(12),
            Record::Insert(placed(1, 65536, 0, 0)),
            Record::Insert(placed(2, 16384, 1, 4)),
            Record::Insert(placed(3, 3072, 1, 1)),
            Record::Touch(id(1)),
            Record::Evict(id(2)),
            Record::Move(placed(3, 3072, 0xffff_fff0, 15)),
            Record::Sync(0x1_2345_6789),
        ]
    }

    #[test]
    fn granules_are_the_next_power_of_two_of_the_pages() {
        let cases = [
            (0, 0),
            (1, 1),
            (4096, 1),
            (4097, 2),
            (12288, 4),
            (16384, 4),
            (16385, 8),
            (65536, 16),
        ];
        for (size, n) in cases {
            assert_eq!(granules(size), n, "{size}");
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_log() {
        let recs = every_kind();
        let body: Vec<u8> = recs.iter().flat_map(|r| r.encode()).collect();
        let n = recs.len();
        assert_eq!(decode_records(&body, G), (recs.clone(), n * RECORD_LEN));
        for cut in 0..RECORD_LEN {
            let (r, used) = decode_records(&body[..(n - 1) * RECORD_LEN + cut], G);
            assert_eq!((r.len(), used), (n - 1, (n - 1) * RECORD_LEN));
        }
        // Any flipped bit of a record ends the log there.
        for bit in 0..RECORD_LEN * 8 {
            let mut b = body.clone();
            b[2 * RECORD_LEN + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_records(&b, G).1, 2 * RECORD_LEN, "bit {bit}");
        }
    }

    #[test]
    fn ill_filled_records_are_not_records() {
        let reseal = |mut r: [u8; RECORD_LEN]| {
            let crc = crc32c::crc32c(&r[..R_CRC]);
            put_u32(&mut r, R_CRC, crc);
            r
        };
        let bad = [
            // A 16 KiB chunk at granule 2: not aligned to its 4 granules.
            Record::Insert(placed(1, 16384, 0, 2)).encode(),
            // Past the slot's 16 granules.
            Record::Insert(placed(1, 4096, 0, 16)).encode(),
            // Larger than a slot; empty.
            Record::Insert(placed(1, 65537, 0, 0)).encode(),
            Record::Move(placed(1, 0, 0, 0)).encode(),
            // No id.
            Record::Insert(placed(0, 4096, 0, 0)).encode(),
            Record::Touch(ChunkId::default()).encode(),
            Record::Capacity(0).encode(),
            // Unknown kind, reserved byte, stray fields.
            reseal({
                let mut r = Record::Touch(id(1)).encode();
                r[R_KIND] = 7;
                r
            }),
            reseal({
                let mut r = Record::Touch(id(1)).encode();
                r[R_RESERVED] = 1;
                r
            }),
            reseal({
                let mut r = Record::Evict(id(1)).encode();
                put_u32(&mut r, R_GEN, 1);
                r
            }),
            reseal({
                let mut r = Record::Sync(5).encode();
                r[R_ID] = 1;
                r
            }),
        ];
        for (i, b) in bad.iter().enumerate() {
            assert_eq!(Record::decode(b, G), None, "case {i}");
        }
        // A 16 KiB slot journal refuses a 64 KiB chunk the default accepts.
        let big = Record::Insert(placed(1, 65536, 0, 0)).encode();
        assert!(Record::decode(&big, G).is_some());
        assert_eq!(Record::decode(&big, Geometry::new(16384).unwrap()), None);
    }

    #[test]
    fn the_header_names_its_geometry_and_refuses_others() {
        let h = encode_header(G);
        assert_eq!(check_header(&h), Ok(G));
        assert_eq!(check_header(&h[..27]), Err(HeaderError::Short(27)));
        let mut v1 = h;
        put_u32(&mut v1, 8, 1);
        assert_eq!(check_header(&v1), Err(HeaderError::Version(1)));
        let mut bad = h;
        bad[20] ^= 1;
        assert_eq!(check_header(&bad), Err(HeaderError::Checksum));
        for unit in [0, 2048, 3 << 12, MAX_UNIT * 2] {
            let mut h = [0u8; HEADER_LEN];
            put_u32(&mut h, H_UNIT, unit);
            put_u32(&mut h, H_GRANULE, GRANULE);
            FRAME.seal(&mut h);
            assert!(
                matches!(check_header(&h), Err(HeaderError::Field(_))),
                "{unit}"
            );
        }
    }
}
