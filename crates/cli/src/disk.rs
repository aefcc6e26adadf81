//! Opening the disk a command reads or writes, the same way for every
//! command: a stack spec, an NBD URI or `cas:SESSION` through the layer
//! registry, or an image file of a format qemu-img reads (imported to a
//! temporary raw file first); and creating the image file a command
//! writes ([`NewImage`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use roamdisk_blockdev::{Access, BlockDev, Checked, LayerSpec};

use crate::qemu_img::{self, TempRaw};

/// A disk named on the command line, parsed but not opened yet.
pub struct DiskSpec {
    /// The stack to open; a command may adjust it (its `--store` becoming
    /// the `cas` layer's `store=`).
    pub spec: LayerSpec,
    /// The format of an image file that is not raw (imported on open).
    image: Option<(PathBuf, String)>,
    name: String,
}

impl DiskSpec {
    /// Parse `src` (and ask qemu-img, once, what format an image file is).
    pub fn parse(src: &str) -> anyhow::Result<DiskSpec> {
        let spec = crate::commands::registry().parse(src)?;
        let image = plain_file(&spec, src)
            .map(|p| (p.to_path_buf(), qemu_img::format(p)))
            .filter(|(_, fmt)| fmt != "raw");
        Ok(DiskSpec {
            spec,
            image,
            name: src.to_string(),
        })
    }

    /// Open the stack, with the validation layer on top; an image file in
    /// another format than raw is imported to a temporary raw file first.
    pub fn open(mut self, access: Access) -> anyhow::Result<Disk> {
        let reg = crate::commands::registry();
        let tmp = match &self.image {
            Some((path, fmt)) => {
                let t = qemu_img::import(path, fmt)?;
                self.spec = reg.parse(&format!("raw:{}", t.path().display()))?;
                Some(t)
            }
            None => None,
        };
        let dev = reg
            .build_spec(&self.spec, access)
            .with_context(|| format!("cannot open '{}'", self.name))?;
        Ok(Disk { dev, _tmp: tmp })
    }
}

/// An opened disk.
pub struct Disk {
    pub dev: Arc<Checked>,
    _tmp: Option<TempRaw>,
}

impl Disk {
    /// Parse and open `src`.
    pub fn open(src: &str, access: Access) -> anyhow::Result<Disk> {
        DiskSpec::parse(src)?.open(access)
    }
}

/// The path of `src` when it is a plain file the registry read as `raw`
/// (no layer named), the case where qemu-img may know better.
fn plain_file<'a>(spec: &LayerSpec, src: &'a str) -> Option<&'a Path> {
    let path = Path::new(src);
    let plain = spec.kind == "raw" && spec.params.get("path").map(String::as_str) == Some(src);
    (plain && path.is_file()).then_some(path)
}

/// A new image file being written: raw directly, `lbs`, or any format
/// qemu-img writes (through a temporary raw file). Its files are removed on
/// drop unless [`NewImage::finish`] succeeded.
pub struct NewImage {
    dest: PathBuf,
    format: String,
    target: Target,
    /// What to remove if the image is not finished.
    files: Vec<PathBuf>,
}

enum Target {
    Lbs(roamdisk_lbs::Lbs),
    /// A raw file: `dest` itself, or the temporary one qemu-img converts.
    Raw(PathBuf, Arc<Checked>),
}

impl NewImage {
    /// Create `dest` (which must not exist) of `size` bytes in `format`.
    pub fn create(dest: &Path, format: &str, size: u64) -> anyhow::Result<NewImage> {
        if dest.exists() {
            bail!("{} exists; remove it first", dest.display());
        }
        if format == "lbs" {
            let paths = roamdisk_lbs::Paths::resolve(dest, None);
            let o = roamdisk_lbs::CreateOptions {
                size,
                ..Default::default()
            };
            roamdisk_lbs::create(&paths, &o)?;
            let files = vec![paths.data.clone(), paths.meta.clone()];
            let opened = roamdisk_lbs::create::open_files(
                &paths,
                &Default::default(),
                roamdisk_lbs::LbsOptions::default(),
            );
            let lbs = match opened {
                Ok((lbs, _)) => lbs,
                Err(e) => {
                    files.iter().for_each(|f| drop(std::fs::remove_file(f)));
                    return Err(e.into());
                }
            };
            return Ok(NewImage {
                dest: dest.to_path_buf(),
                format: format.to_string(),
                target: Target::Lbs(lbs),
                files,
            });
        }
        let raw = if format == "raw" {
            dest.to_path_buf()
        } else {
            dest.with_extension("checkout-tmp.raw")
        };
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&raw)
            .with_context(|| format!("cannot create {}", raw.display()))?;
        let made = f.set_len(size).map_err(anyhow::Error::from).and_then(|()| {
            Ok(crate::commands::registry()
                .build(&format!("raw:{}", raw.display()), Access::ReadWrite)?)
        });
        match made {
            Ok(dev) => Ok(NewImage {
                dest: dest.to_path_buf(),
                format: format.to_string(),
                files: vec![raw.clone()],
                target: Target::Raw(raw, dev),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&raw);
                Err(e)
            }
        }
    }

    /// The device to write the image's contents to.
    pub fn dev(&self) -> &dyn BlockDev {
        match &self.target {
            Target::Lbs(l) => l,
            Target::Raw(_, d) => d.as_ref(),
        }
    }

    /// Make the written image durable, in its format.
    pub fn finish(mut self) -> anyhow::Result<()> {
        match &self.target {
            Target::Lbs(lbs) => lbs.close()?,
            Target::Raw(raw, dev) => {
                dev.flush()?;
                if self.format != "raw" {
                    qemu_img::export(raw, &self.dest, &self.format)?;
                    let _ = std::fs::remove_file(raw);
                }
            }
        }
        self.files.clear();
        Ok(())
    }
}

impl Drop for NewImage {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}
