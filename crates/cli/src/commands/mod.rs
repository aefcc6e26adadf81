//! One module per subcommand.

pub mod info;
pub mod layers;
pub mod lbs;
pub mod progress;
pub mod serve;

use roamdisk_blockdev::Registry;

/// Every layer kind this binary can build.
pub fn registry() -> Registry {
    let mut r = Registry::with_builtin();
    r.add(&roamdisk_lbs::layer::LBS);
    r
}
