//! How a session is opened: the options, and this host's folders.

use std::path::PathBuf;

use crate::cache::SharedChoice;
use roamdisk_chunkstore::store::http::Credentials;

/// Options for opening a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOpen {
    pub read_only: bool,
    /// Use this store instead of the one in session.toml.
    pub store: Option<String>,
    /// Use this key file instead of the one in session.toml.
    pub key_file: Option<PathBuf>,
    /// Use this token file or CA instead of those in session.toml.
    pub credentials: Credentials,
    /// The token file or CA when neither these options nor session.toml
    /// name one (the program's environment).
    pub fallback_credentials: Credentials,
    /// This host's folders.
    pub host: Host,
    /// Override P1 at write time.
    pub zero_detect: Option<bool>,
    /// The host's shared cache to read through.
    pub shared_cache: SharedChoice,
    /// Lookaside media, besides those in session.toml.
    pub lookaside: Vec<PathBuf>,
    /// Do not fetch the base version's working set in the background
    /// ([`CasDev::start_prefetch`] does nothing).
    pub no_prefetch: bool,
    /// Do not fetch ahead of the guest's sequential reads
    /// ([`CasDev::start_readahead`] does nothing).
    pub no_readahead: bool,
    /// The file system the session map, the write-ahead log and the open
    /// marker are kept on (default: the real one; crash tests pass a
    /// simulated one).
    pub files: Files,
    /// The capacity of a new write-ahead log (default
    /// [`wal::FIRST_CAPACITY`](crate::session::wal::FIRST_CAPACITY); crash
    /// tests keep it small).
    pub wal_capacity: Option<u64>,
}

/// A file system for a session's files ([`SessionOpen::files`]).
#[derive(Clone)]
pub struct Files(pub std::sync::Arc<dyn roamdisk_blockdev::vfs::Vfs>);

impl Default for Files {
    fn default() -> Files {
        Files(roamdisk_blockdev::vfs::os())
    }
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Files")
    }
}

/// This host's folders and how it reaches S3, as the program resolved
/// them (engines read no environment). The `roamdisk` command hands one to
/// the layers through the registry (`Registry::set_context`).
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// Its cache folder (`~/.cache/roamdisk`): lookaside media's chunk
    /// indexes are kept under `lookaside/`.
    pub cache: Option<PathBuf>,
    /// The `AWS_*` settings and where S3 stores keep their pack indexes.
    pub s3: roamdisk_chunkstore::store::s3::S3Env,
}

impl Host {
    /// Where lookaside image media's chunk indexes are kept.
    pub fn lookaside_index(&self) -> Option<PathBuf> {
        self.cache.as_ref().map(|c| c.join("lookaside"))
    }
}
