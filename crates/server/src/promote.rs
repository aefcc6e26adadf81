//! `server promote`: a client's view of an image, as it is now, made a new
//! golden image. The server must be stopped: the caller holds the state
//! directory's lock, so the view does not change while it is copied.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use roamdisk_blockdev::{copy_sparse, Access, BlockDev, CopyOptions, NoProgress, Registry};

use crate::access::{views_of, GrantError};
use crate::config::ServerConfig;
use crate::state::{overlay_path, StateLock};
use crate::views::{open_golden, open_view, ViewsError};

/// Why a view cannot be promoted.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// The client has no view of the image.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The golden images do not open.
    #[error(transparent)]
    Views(#[from] ViewsError),
    /// The view, or the new file, does not open, read or write.
    #[error(transparent)]
    Dev(#[from] roamdisk_blockdev::Error),
    /// The new file cannot be created (it exists, or its directory is not
    /// writable).
    #[error("cannot create {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
}

/// `client`'s view of `image` as a read-only device: the golden image
/// under its overlay, or the golden image itself while the client has
/// written nothing. `image` must be granted to the client as a view.
pub fn open_source(
    cfg: &ServerConfig,
    lock: &StateLock,
    client: &str,
    image: &str,
    reg: &Registry,
) -> Result<Arc<dyn BlockDev>, PromoteError> {
    views_of(cfg, client, Some(image))?;
    let mut golden = open_golden(cfg, reg)?;
    let base = golden.remove(image).expect("a granted image is configured");
    if !overlay_path(&lock.dir, client, image).exists() {
        return Ok(base);
    }
    Ok(open_view(&lock.dir, client, image, base, true)?)
}

/// Write `src` to the new raw file `to` (which must not exist): sparse,
/// unwritten and zero ranges left as holes, flushed. Returns the bytes of
/// data written.
pub fn write_new_file(src: &dyn BlockDev, to: &Path, reg: &Registry) -> Result<u64, PromoteError> {
    std::fs::File::create_new(to)
        .and_then(|f| f.set_len(src.size()))
        .map_err(|error| PromoteError::Create {
            path: to.to_path_buf(),
            error,
        })?;
    let escaped = to
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace(':', "\\:");
    let dst = reg.build(&format!("raw:{escaped}"), Access::ReadWrite)?;
    let written = copy_sparse(src, dst.as_ref(), &CopyOptions::default(), &NoProgress)?;
    dst.flush()?;
    Ok(written)
}
