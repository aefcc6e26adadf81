//! The free-extent filters `borrow scan` and `borrow run` share.

use clap::Args as ClapArgs;
use roamdisk_blockdev::units::parse_size;
use roamdisk_borrow::ScanOptions;

#[derive(ClapArgs, Clone)]
pub struct Filters {
    /// Ignore free extents shorter than this.
    #[arg(long, default_value = "4M", value_parser = parse_size, value_name = "SIZE")]
    min_extent: u64,
    /// Keep at most this many extents (the largest).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    max_extents: u64,
}

impl Filters {
    /// Scan options with these filters.
    pub fn scan_options(&self) -> ScanOptions {
        ScanOptions {
            min_extent: self.min_extent,
            max_extents: self.max_extents,
            ..ScanOptions::default()
        }
    }
}
