//! The checksums ext2/3/4 metadata carries: CRC16 (`uninit_bg`, old
//! `gdt_csum`) and raw CRC32C (`metadata_csum`), both as e2fsprogs
//! computes them (no pre/post inversion beyond the seed).

/// `ext2fs_crc16`: CRC-16/ARC polynomial (0x8005 reflected), seed passed
/// through.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= b as u16;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// `ext2fs_crc32c_le`: CRC32C update without the usual inversions.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // CRC-16/ARC of "123456789" with init 0 is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
        // Standard CRC32C of "123456789" is 0xE3069283 (init !0, final !).
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
    }
}
