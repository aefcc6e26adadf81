//! [`Export`]: one named block device a server offers, as the handshake,
//! the access hook and the transmission phase see it.

use std::sync::Arc;

use roamdisk_blockdev::BlockDev;

/// One named export.
pub struct Export {
    pub name: String,
    pub description: String,
    /// The stack, already wrapped in `Checked` (validation happens there).
    pub dev: Arc<dyn BlockDev>,
}
