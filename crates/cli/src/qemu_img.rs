//! The one place the binary runs `qemu-img`: image files of the formats
//! qemu-img reads and writes (qcow2, vmdk, vdi, vhdx...) become temporary
//! raw files going in (`import`) and are written from raw files going out
//! (`export`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// A temporary raw file, removed on drop.
pub struct TempRaw(PathBuf);

impl TempRaw {
    /// A new name in the temporary directory for a copy of `of`.
    fn new(of: &Path) -> TempRaw {
        let name = of
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        TempRaw(std::env::temp_dir().join(format!(".roamdisk-{}-{name}.raw", std::process::id())))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempRaw {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The format of the image file at `path` (`qemu-img info`, run once);
/// `raw` when qemu-img cannot tell or is not installed.
pub fn format(path: &Path) -> String {
    Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(path)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["format"].as_str().map(str::to_string))
        .unwrap_or_else(|| "raw".into())
}

fn convert(from: &Path, from_fmt: &str, to: &Path, to_fmt: &str) -> anyhow::Result<()> {
    let st = Command::new("qemu-img")
        .args(["convert", "-f", from_fmt, "-O", to_fmt])
        .arg(from)
        .arg(to)
        .status()
        .context("cannot run qemu-img (install qemu-utils) to convert between image formats")?;
    if !st.success() {
        bail!(
            "qemu-img could not convert {} ({from_fmt}) to {to_fmt}",
            from.display()
        );
    }
    Ok(())
}

/// A raw copy of the image file `path` of format `fmt` (from [`format`]).
pub fn import(path: &Path, fmt: &str) -> anyhow::Result<TempRaw> {
    let tmp = TempRaw::new(path);
    convert(path, fmt, tmp.path(), "raw")?;
    Ok(tmp)
}

/// Write the raw file `raw` to the new image file `dest` in format `fmt`.
pub fn export(raw: &Path, dest: &Path, fmt: &str) -> anyhow::Result<()> {
    convert(raw, "raw", dest, fmt)
}
