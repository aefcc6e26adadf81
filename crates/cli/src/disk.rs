//! Opening the disk a command reads or writes, the same way for every
//! command: a stack spec, an NBD URI or `cas:SESSION` through the layer
//! registry, or an image file of a format qemu-img reads (imported to a
//! temporary raw file first).

use std::sync::Arc;

use anyhow::Context;
use roamdisk_blockdev::{BlockDev, Checked, LayerSpec};

use crate::qemu_img::{self, TempRaw};

/// A disk named on the command line, parsed but not opened yet.
pub struct DiskSpec {
    /// The stack to open; a command may adjust it (its `--store` becoming
    /// the `cas` layer's `store=`).
    pub spec: LayerSpec,
    /// The raw copy of a non-raw image file, removed with the disk.
    tmp: Option<TempRaw>,
    name: String,
}

impl DiskSpec {
    /// Parse `src`; an image file qemu-img reads in another format than
    /// raw is imported to a temporary raw file now.
    pub fn parse(src: &str) -> anyhow::Result<DiskSpec> {
        let reg = crate::commands::registry();
        let mut spec = reg.parse(src)?;
        let mut tmp = None;
        if let Some(path) = plain_file(&spec, src) {
            let fmt = qemu_img::format(path);
            if fmt != "raw" {
                let t = qemu_img::import(path, &fmt)?;
                spec = reg.parse(&format!("raw:{}", t.path().display()))?;
                tmp = Some(t);
            }
        }
        Ok(DiskSpec {
            spec,
            tmp,
            name: src.to_string(),
        })
    }

    /// Open the stack, with the validation layer on top.
    pub fn open(self, read_only: bool) -> anyhow::Result<Disk> {
        let dev = crate::commands::registry()
            .open(&self.spec, read_only)
            .with_context(|| format!("cannot open '{}'", self.name))?;
        Ok(Disk {
            dev: Arc::new(Checked::new(dev, read_only)),
            _tmp: self.tmp,
        })
    }
}

/// An opened disk.
pub struct Disk {
    pub dev: Arc<Checked>,
    _tmp: Option<TempRaw>,
}

impl Disk {
    /// Parse and open `src`.
    pub fn open(src: &str, read_only: bool) -> anyhow::Result<Disk> {
        DiskSpec::parse(src)?.open(read_only)
    }

    /// The layer of type `T` in the stack, if there is one.
    pub fn layer<T: BlockDev>(&self) -> Option<&T> {
        roamdisk_blockdev::find_layer::<T>(self.dev.as_ref())
    }
}

/// The path of `src` when it is a plain file the registry read as `raw`
/// (no layer named), the case where qemu-img may know better.
fn plain_file<'a>(spec: &LayerSpec, src: &'a str) -> Option<&'a std::path::Path> {
    let path = std::path::Path::new(src);
    let plain = spec.kind == "raw" && spec.params.get("path").map(String::as_str) == Some(src);
    (plain && path.is_file()).then_some(path)
}
