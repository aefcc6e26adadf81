//! Whole disks into and out of an image: import any block device into a
//! new image, export an image to a raw file. Both copy only what is not a
//! hole or zeroes.

use std::path::{Path, PathBuf};

use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::progress::Progress;
use roamdisk_blockdev::{copy_sparse, BlockDev, CopyOptions, Error, Result};

use crate::create::{create, open_files, CreateOptions, KeyOptions, Paths};
use crate::image::{Lbs, LbsOptions};

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The new image could not be created (nothing was left behind).
    #[error(transparent)]
    Create(Error),
    /// Opening or filling it failed; its two files were removed.
    #[error("import failed; the partial image was removed")]
    Fill(#[source] Error),
}

/// Create an image at `paths` of `src`'s size with `o` (its `size` is
/// replaced) and copy `src` into it, skipping holes and zeroes, reporting
/// the copy through `progress`. Returns the bytes copied. When anything
/// after the creation fails, the partial image is removed.
pub fn import(
    src: &dyn BlockDev,
    paths: &Paths,
    o: &CreateOptions,
    keys: &KeyOptions,
    progress: &dyn Progress,
) -> std::result::Result<u64, ImportError> {
    let o = CreateOptions {
        size: src.size(),
        ..o.clone()
    };
    create(paths, &o).map_err(ImportError::Create)?;
    let fill = || -> Result<u64> {
        let (lbs, _) = open_files(paths, keys, LbsOptions::default())?;
        let copied = copy(src, &lbs, "importing", progress)?;
        lbs.close()?;
        Ok(copied)
    };
    fill().map_err(|e| {
        let _ = std::fs::remove_file(&paths.data);
        let _ = std::fs::remove_file(&paths.meta);
        ImportError::Fill(e)
    })
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The destination file could not be created.
    #[error("cannot create {}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The destination could not be sized.
    #[error(transparent)]
    Size(std::io::Error),
    /// Opening or copying failed.
    #[error(transparent)]
    Copy(#[from] Error),
}

/// Copy the image `lbs` into a new raw file at `dest` of the image's size
/// (sparse: holes and zeroes are not written), reporting the copy through
/// `progress`. Returns the bytes copied.
pub fn export_raw(
    lbs: &Lbs,
    dest: &Path,
    progress: &dyn Progress,
) -> std::result::Result<u64, ExportError> {
    let f = std::fs::File::create(dest).map_err(|source| ExportError::Create {
        path: dest.to_path_buf(),
        source,
    })?;
    f.set_len(lbs.size()).map_err(ExportError::Size)?;
    drop(f);
    let dst = RawDev::open(dest, false)?;
    Ok(copy(lbs, &dst, "exporting", progress)?)
}

/// Copy `src` into `dst` in a progress phase `what`, skipping holes and
/// zeroes, then flush `dst` and end the phase. Returns the bytes copied.
fn copy(
    src: &dyn BlockDev,
    dst: &dyn BlockDev,
    what: &'static str,
    progress: &dyn Progress,
) -> Result<u64> {
    let opts = CopyOptions {
        what,
        ..Default::default()
    };
    let copied = copy_sparse(src, dst, &opts, progress)?;
    dst.flush()?;
    progress.end();
    Ok(copied)
}
