//! One module per subcommand.

pub mod info;
pub mod layers;
pub mod serve;

use roamdisk_blockdev::Registry;

/// Every layer kind this binary can build.
pub fn registry() -> Registry {
    Registry::with_builtin()
}
