//! The state directory: `STATE/server.lock`, held by a running server, and
//! `STATE/clients/CLIENT/IMAGE.cow` (+ `.cowmap`), each client's overlay
//! over a golden image. Reset and promote work on a stopped server only:
//! they take the lock first.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use roamdisk_blockdev::layers::cow::map_path;

use crate::access::{views_of, GrantError};
use crate::config::{ServerConfig, ServerConfigError};

/// The lock file's name in the state directory.
pub const LOCK: &str = "server.lock";

/// `STATE/clients/CLIENT/IMAGE.cow`.
pub fn overlay_path(state: &Path, client: &str, image: &str) -> PathBuf {
    state
        .join("clients")
        .join(client)
        .join(format!("{image}.cow"))
}

/// The state directory, locked for as long as this value lives.
pub struct StateLock {
    _file: File,
    pub dir: PathBuf,
}

impl StateLock {
    /// Create the directory if needed and take its lock; fails when a
    /// server (or a reset) holds it.
    pub fn take(dir: &Path) -> std::io::Result<StateLock> {
        std::fs::create_dir_all(dir.join("clients")).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot create the state directory {}: {e}", dir.display()),
            )
        })?;
        let path = dir.join(LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "{} is locked: a roamdisk server is running on this state directory; stop it first",
                        path.display()
                    ),
                ))
            }
            Err(e) => return Err(std::io::Error::from(e)),
        }
        Ok(StateLock {
            _file: file,
            dir: dir.to_path_buf(),
        })
    }

    /// Drop `client`'s overlay of `image`, so that its next connection sees
    /// the golden image again. Returns whether there was one.
    pub fn reset(&self, client: &str, image: &str) -> std::io::Result<bool> {
        let ovl = overlay_path(&self.dir, client, image);
        let map = map_path(&ovl);
        let mut had = false;
        // An overlay without its map (or a map without its overlay) is
        // refused at open, so a crash between the two removals never shows
        // a half-reset view; running reset again removes the other half.
        for p in [&map, &ovl] {
            match std::fs::remove_file(p) {
                Ok(()) => had = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("cannot remove {}: {e}", p.display()),
                    ))
                }
            }
        }
        if had {
            roamdisk_blockdev::durable::sync_parent(&ovl)?;
        }
        Ok(had)
    }
}

/// Why `server reset` failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    #[error(transparent)]
    Config(#[from] ServerConfigError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The state directory is locked (a server runs on it) or an overlay
    /// cannot be removed.
    #[error(transparent)]
    State(#[from] std::io::Error),
}

/// `server reset`: with the config at `path`, return `client` to the
/// golden image of `image` (which it must have as a view), or of every
/// image it has as a view, taking the state directory's lock first.
/// `done` is told each image reset and whether it had an overlay.
pub fn reset(
    path: &Path,
    client: &str,
    image: Option<&str>,
    mut done: impl FnMut(&str, bool),
) -> Result<(), ResetError> {
    let cfg = ServerConfig::read(path)?;
    let images = views_of(&cfg, client, image)?;
    let lock = StateLock::take(&cfg.state)?;
    for im in images {
        done(&im, lock.reset(client, &im)?);
    }
    Ok(())
}
