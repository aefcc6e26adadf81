//! The frame of a roamdisk file header: an 8-byte magic at offset 0, the
//! format version as a little-endian `u32` at 8, the format's own fields
//! from 12, and a CRC-32C of every byte before the checksum field. The
//! overlay map (`docs/formats/overlay-map.md`) and both LBS headers
//! (`docs/formats/lbs.md`) are framed this way; each format keeps its own
//! fields and its own error type, and calls [`Frame::check`] and
//! [`Frame::seal`] for the frame, once. Pure encoding and parsing, no I/O.

/// Byte offsets of a fixed layout, declared once by the size of each field
/// in order: every field becomes a `usize` constant holding its offset
/// (chained, so no offset is a bare number), and the end of the layout
/// becomes a closing constant, checked at compile time against the size
/// the format's spec gives.
///
/// ```
/// roamdisk_blockdev::offsets! {
///     // A record (docs/formats/overlay-map.md).
///     R_KIND: 1, R_STATE: 1, R_RESERVED: 2, R_COUNT: 4, R_START: 8, R_RESERVED2: 12, R_CRC: 4;
///     /// Size of one record in bytes.
///     pub RECORD_SIZE == 32
/// }
/// assert_eq!([R_KIND, R_STATE, R_COUNT, R_START, R_CRC], [0, 1, 4, 8, 28]);
/// assert_eq!(RECORD_SIZE, 32);
///
/// roamdisk_blockdev::offsets! {
///     from 8; // after the magic
///     I_VERSION: 4, I_COUNT: 8;
///     I_ENTRIES
/// }
/// assert_eq!([I_VERSION, I_COUNT, I_ENTRIES], [8, 12, 20]);
/// ```
///
/// - `from START;` (optional, first): the first field's offset, 0 if not
///   given.
/// - The fields, `NAME: SIZE` separated by commas and closed by a
///   semicolon, each with its own doc comments and visibility where it
///   has them (`pub(crate) R_CRC: 4`).
/// - The end of the layout: `NAME == TOTAL` (a constant, checked
///   against TOTAL), `NAME` (a constant, unchecked) or `== TOTAL` (only
///   the check), again with doc comments and visibility.
#[macro_export]
macro_rules! offsets {
    (@field $at:expr; $(#[$m:meta])* $vis:vis $name:ident: $size:expr, $($rest:tt)+) => {
        $(#[$m])* $vis const $name: usize = $at;
        $crate::offsets!(@field $name + $size; $($rest)+);
    };
    (@field $at:expr; $(#[$m:meta])* $vis:vis $name:ident: $size:expr; $($end:tt)+) => {
        $(#[$m])* $vis const $name: usize = $at;
        $crate::offsets!(@end $name + $size; $($end)+);
    };
    (@end $at:expr; == $total:expr) => {
        const _: () = assert!($at == $total);
    };
    (@end $at:expr; $(#[$m:meta])* $vis:vis $name:ident $(== $total:expr)?) => {
        $(#[$m])* $vis const $name: usize = $at;
        $(const _: () = assert!($name == $total);)?
    };
    (from $start:expr; $($layout:tt)+) => {
        $crate::offsets!(@field $start; $($layout)+);
    };
    ($($layout:tt)+) => {
        $crate::offsets!(@field 0; $($layout)+);
    };
}

crate::offsets! {
    // The frame: magic, version.
    F_MAGIC: 8, F_VERSION: 4;
    /// Offset of a format's first own field (right after magic and version).
    pub FIELDS == 12
}

/// One format's frame: what its header starts with and where its
/// checksum sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub magic: [u8; 8],
    /// The version this build writes and reads.
    pub version: u32,
    /// Offset of the header checksum (CRC-32C of bytes `0..crc_at`).
    pub crc_at: usize,
}

/// Why a header's frame was rejected; each format turns it into its own
/// error (naming what the file is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The bytes (this many) are shorter than the header.
    Truncated(usize),
    BadMagic,
    /// The version found.
    BadVersion(u32),
    BadCrc,
}

impl Frame {
    /// Bytes from the start of the header to the end of its checksum.
    pub const fn size(&self) -> usize {
        self.crc_at + 4
    }

    /// Validate length, magic, version and checksum, in that order.
    pub fn check(&self, b: &[u8]) -> Result<(), FrameError> {
        if b.len() < self.size() {
            return Err(FrameError::Truncated(b.len()));
        }
        if b[F_MAGIC..F_VERSION] != self.magic {
            return Err(FrameError::BadMagic);
        }
        let found = u32_at(b, F_VERSION);
        if found != self.version {
            return Err(FrameError::BadVersion(found));
        }
        if crc32c::crc32c(&b[..self.crc_at]) != self.stored_crc(b) {
            return Err(FrameError::BadCrc);
        }
        Ok(())
    }

    /// Write magic and version, then the checksum over everything before
    /// it: call once the format's own fields are in `b`.
    pub fn seal(&self, b: &mut [u8]) {
        b[F_MAGIC..F_VERSION].copy_from_slice(&self.magic);
        put_u32(b, F_VERSION, self.version);
        let crc = crc32c::crc32c(&b[..self.crc_at]);
        put_u32(b, self.crc_at, crc);
    }

    /// The checksum stored in a header.
    pub fn stored_crc(&self, b: &[u8]) -> u32 {
        u32_at(b, self.crc_at)
    }
}

/// Read a little-endian `u32` at `o`.
pub fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Read a little-endian `u64` at `o`.
pub fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Copy the `N` bytes at `o`.
pub fn array_at<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    b[o..o + N].try_into().expect("N bytes")
}

/// Write a little-endian `u32` at `o`.
pub fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// Write a little-endian `u64` at `o`.
pub fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::offsets! {
        from FIELDS;
        /// Documented and public, as the fields may be.
        pub(crate) T_A: 1, T_B: 2, T_C: 8;
        T_END == 23
    }
    crate::offsets! {
        U_A: 4, U_B: T_C - FIELDS;
        == 7
    }

    #[test]
    fn offsets_chain_the_sizes() {
        assert_eq!((F_MAGIC, F_VERSION, FIELDS), (0, 8, 12));
        assert_eq!((T_A, T_B, T_C, T_END), (12, 13, 15, 23));
        assert_eq!((U_A, U_B), (0, 4));
    }

    const T: Frame = Frame {
        magic: *b"RDTESTHD",
        version: 3,
        crc_at: 28,
    };

    #[test]
    fn sealed_header_checks_and_every_damage_is_named() {
        let mut b = [0u8; 32];
        put_u64(&mut b, FIELDS, 42);
        T.seal(&mut b);
        assert_eq!(array_at::<8>(&b, 0), *b"RDTESTHD");
        assert_eq!(u32_at(&b, 8), 3);
        assert_eq!(T.stored_crc(&b), crc32c::crc32c(&b[..28]));
        assert_eq!(T.check(&b), Ok(()));
        assert_eq!(T.check(&b[..31]), Err(FrameError::Truncated(31)));
        let mut m = b;
        m[0] ^= 1;
        assert_eq!(T.check(&m), Err(FrameError::BadMagic));
        let mut v = b;
        put_u32(&mut v, 8, 4);
        assert_eq!(T.check(&v), Err(FrameError::BadVersion(4)));
        let mut c = b;
        c[FIELDS] ^= 1;
        assert_eq!(T.check(&c), Err(FrameError::BadCrc));
    }
}
