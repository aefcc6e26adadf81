//! Serving one disk until the user stops the command: what `checkout
//! --serve` and `resume --socket` share.

use std::sync::Arc;

use roamdisk_blockdev::{Access, BlockDev, Checked};
use roamdisk_nbd::{serve_until, signalled, Export, Listen, ServeOptions};

/// Serve `dev` as the default export on `listen` until SIGINT/SIGTERM.
pub fn serve_one(
    dev: Arc<dyn BlockDev>,
    access: Access,
    describe: &str,
    listen: Vec<Listen>,
    quiet: bool,
) -> anyhow::Result<()> {
    let export = Export {
        name: String::new(),
        description: describe.to_string(),
        dev: Arc::new(Checked::new(dev, access)),
    };
    let how = if access == Access::ReadOnly {
        " read-only"
    } else {
        ""
    };
    serve_until(vec![export], listen, ServeOptions::default(), |bound| {
        if !quiet {
            for uri in &bound.uris {
                eprintln!("roamdisk: serving {describe}{how} on {uri}");
            }
        }
        signalled()
    })?;
    Ok(())
}
