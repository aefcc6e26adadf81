//! A session: a version checked out for use, with a private cache of the
//! sectors this session wrote (seed section 3.1: the first-level cache).
//!
//! ```text
//! SESSION/session.toml   store, target catalog, cache, options
//! SESSION/states         per-sector states + base version (map.rs)
//! SESSION/cache.raw      the private cache: a sparse file the size of the
//!                        disk (or an LBS image, cache.lbsd/.lbsm)
//! SESSION/store.toml     a copy of the store's settings, and
//! SESSION/base.version   a copy of the base version's stored object: the
//!                        session opens (and reads what the shared cache and
//!                        lookaside media hold) when the store is unreachable
//! SESSION/working-set    the chunks the guest read, first touch first
//!                        (workset.rs): stored with the next commit
//! SESSION/wal            the write-ahead log a flush syncs (wal.rs),
//!                        brought into the cache and the map at checkpoints
//! ```
//!
//! The `cas:SESSION` layer ([`dev::CasDev`]) serves it; `roamdisk commit
//! cas:SESSION` turns its useful updates into a new version
//! ([`update::commit_session`]) and rebases the session onto it.

pub mod dev;
pub mod map;
pub mod offline;
pub mod open;

pub mod update;
pub mod wal;
pub mod workset;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::error::{bad_arg, corrupt, io};
use roamdisk_chunkstore::hash::ChunkId;
use roamdisk_chunkstore::store::http::Credentials;

pub const CONFIG_MAGIC: &str = "roamdisk-cas-session";
pub const CONFIG_VERSION: u32 = 1;

/// `session.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SessionConfig {
    pub magic: String,
    pub version: u32,
    /// The chunk store: a directory or an `http://`/`https://` URL.
    pub store: String,
    /// The token file of an HTTP store (its path: the token stays in its
    /// own 0600 file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The CA certificates trusted for an `https://` store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Where commits of this session go: `USER/IMAGE`.
    pub target: String,
    /// The private cache as a stack spec; relative paths are inside the
    /// session directory (`raw:cache.raw` or `lbs:cache.lbsd`).
    pub cache: String,
    /// The user's key file (encrypted images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// P1 at write time: a sector written with zeroes becomes ZERO, with
    /// no data written.
    #[serde(default = "yes")]
    pub zero_detect: bool,
    /// Lookaside media tried before the store (chunk-store folders, image
    /// files, block devices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lookaside: Vec<PathBuf>,
}

fn yes() -> bool {
    true
}

impl SessionConfig {
    pub fn new(store: &str, target: &str) -> SessionConfig {
        SessionConfig {
            magic: CONFIG_MAGIC.into(),
            version: CONFIG_VERSION,
            store: store.into(),
            token_file: None,
            ca_file: None,
            target: target.into(),
            cache: "raw:cache.raw".into(),
            key_file: None,
            zero_detect: true,
            lookaside: Vec::new(),
        }
    }

    pub fn load(dir: &Path) -> Result<SessionConfig> {
        let p = dir.join("session.toml");
        let text = std::fs::read_to_string(&p).map_err(|e| {
            io(Op::Open, e, &p).msg(format!(
                "{} is not a cas session (make one with `roamdisk checkout USER/IMAGE --session DIR`)",
                dir.display()
            ))
        })?;
        let c: SessionConfig = toml::from_str(&text)
            .map_err(|e| corrupt(format!("session.toml: {}", e.message())).path(&p))?;
        if c.magic != CONFIG_MAGIC || c.version != CONFIG_VERSION {
            return Err(corrupt(format!(
                "session.toml has magic '{}' version {} (this build reads '{CONFIG_MAGIC}' version {CONFIG_VERSION})",
                c.magic, c.version
            ))
            .path(&p));
        }
        roamdisk_chunkstore::store::check_ref_name(&c.target)?;
        Ok(c)
    }

    /// How to reach the store: `over` (layer options) first, then what
    /// the session was created with.
    pub fn credentials(&self, over: &Credentials) -> Credentials {
        Credentials {
            token_file: over.token_file.clone().or_else(|| self.token_file.clone()),
            ca_file: over.ca_file.clone().or_else(|| self.ca_file.clone()),
        }
    }

    /// The cache spec with its path made absolute.
    pub fn cache_spec(&self, dir: &Path) -> String {
        match self.cache.split_once(':') {
            Some((kind, rest)) if !rest.starts_with('/') && !rest.contains(':') => {
                format!("{kind}:{}", dir.join(rest).display())
            }
            _ => self.cache.clone(),
        }
    }

    fn save(&self, dir: &Path) -> Result<()> {
        let p = dir.join("session.toml");
        let text = format!(
            "# roamdisk cas session: docs/layers/cas.md\n{}",
            toml::to_string(self).expect("serialisable")
        );
        roamdisk_blockdev::durable::write_atomically(&p, text.as_bytes())
            .map_err(|e| io(Op::Write, e, &p))
    }
}

/// The private cache of a new session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheKind {
    /// A sparse file the size of the disk (`raw:cache.raw`).
    #[default]
    Raw,
    /// A Logging Block Store image (`lbs:cache.lbsd`): checksummed, and
    /// encrypted if the host's key says so.
    Lbs,
}

impl CacheKind {
    pub fn parse(s: &str) -> Result<CacheKind> {
        match s {
            "raw" => Ok(CacheKind::Raw),
            "lbs" => Ok(CacheKind::Lbs),
            other => Err(bad_arg(format!(
                "the private cache is raw or lbs, not '{other}'"
            ))),
        }
    }
}

/// What a new session is made of. Paths are absolute: the session is
/// opened with them later, from any folder.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// Where commits of the session go: `USER/IMAGE`.
    pub target: String,
    /// The store location, as the session reaches it.
    pub store: String,
    pub key_file: Option<PathBuf>,
    /// How to reach an HTTP store: the paths, never the token.
    pub credentials: Credentials,
    pub cache: CacheKind,
    pub lookaside: Vec<PathBuf>,
}

/// Create a session in `dir` on `base` (its package as stored: `package`),
/// with copies of the store's settings and of the package so that it
/// opens with no network.
pub fn create_on(
    dir: &Path,
    base: &crate::view::VersionView,
    package: &[u8],
    new: &NewSession,
) -> Result<()> {
    roamdisk_chunkstore::store::check_ref_name(&new.target)?;
    let mut cfg = SessionConfig::new(&new.store, &new.target);
    cfg.key_file = new.key_file.clone();
    cfg.token_file = new.credentials.token_file.clone();
    cfg.ca_file = new.credentials.ca_file.clone();
    cfg.lookaside = new.lookaside.clone();
    if new.cache == CacheKind::Lbs {
        std::fs::create_dir_all(dir).map_err(|e| io(Op::Open, e, dir))?;
        let paths = roamdisk_lbs::Paths::resolve(&dir.join("cache.lbsd"), None);
        let o = roamdisk_lbs::CreateOptions {
            size: base.version.index.disk_size,
            ..Default::default()
        };
        roamdisk_lbs::create(&paths, &o)?;
        cfg.cache = "lbs:cache.lbsd".into();
    }
    create(dir, &cfg, base.id, base.version.index.disk_size)?;
    offline::keep_offline_copies(dir, base.store(), package);
    Ok(())
}

/// Create a session directory based on version `base` of a disk of
/// `disk_size` bytes. With the default `raw:cache.raw` cache the sparse
/// file is created here; another cache (an LBS image) must already exist.
pub fn create(dir: &Path, cfg: &SessionConfig, base: ChunkId, disk_size: u64) -> Result<()> {
    if dir.join("session.toml").exists() {
        return Err(bad_arg(format!(
            "{} already holds a session; commit it, or remove it to start over",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| io(Op::Open, e, dir))?;
    if cfg.cache == "raw:cache.raw" {
        let p = dir.join("cache.raw");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(|e| io(Op::Open, e, &p))?;
        f.set_len(disk_size).map_err(|e| io(Op::Open, e, &p))?;
        f.sync_all().map_err(|e| io(Op::Open, e, &p))?;
    }
    let header = map::Header { disk_size, base };
    roamdisk_blockdev::overlay::OverlayMap::create(&dir.join("states"), &header, "cas")?;
    cfg.save(dir)
}
