//! The `lbs:PATH` layer kind for stack specs.

use std::path::PathBuf;
use std::sync::Arc;

use roamdisk_blockdev::{BlockDev, LayerKind, OpenCtx};

use crate::create::{open_files, KeyOptions, Paths};
use crate::image::LbsOptions;

/// `lbs[key-file=F,passphrase-file=F,meta-dir=D,gc=on|off,buffer=SIZE]:PATH`.
pub static LBS: LayerKind = LayerKind {
    name: "lbs",
    summary: "a Logging Block Store image PATH(.lbsd/.lbsm): log-structured, checksummed, optionally encrypted, crash-safe",
    args: &["path"],
    options: &[
        ("key-file", "key file of an encrypted image"),
        ("passphrase-file", "file holding the passphrase of an encrypted image"),
        ("meta-dir", "directory of the .lbsm metadata file (default: beside the data file)"),
        ("gc", "background garbage collection: on (default) or off"),
        ("buffer", "write buffer size (default 256K)"),
    ],
    open: |ctx: &OpenCtx<'_>, _next| {
        let path = ctx.path("lbs", "path")?;
        let paths = Paths::resolve(&path, ctx.opt("meta-dir").map(std::path::Path::new));
        let keys = KeyOptions {
            key_file: ctx.opt("key-file").map(PathBuf::from),
            passphrase_file: ctx.opt("passphrase-file").map(PathBuf::from),
        };
        let mut opts = LbsOptions { read_only: ctx.read_only, ..LbsOptions::default() };
        if ctx.flag("lbs", "gc")? == Some(false) {
            opts.background_gc = false;
        }
        if let Some(b) = ctx.size_opt("lbs", "buffer")? {
            opts.buffer_size = b.clamp(4096, 16 << 20) as usize;
        }
        let (lbs, _direct) = open_files(&paths, &keys, opts)?;
        Ok(Arc::new(lbs) as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};
