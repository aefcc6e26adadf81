//! The one place the `roamdisk` command reads its environment: where the
//! default chunk store and this host's caches are, and how to reach a
//! chunk server. Engines read no environment: the command hands them
//! paths, and gives the content-addressed layers their defaults through
//! the layer registry ([`Env::layer_defaults`]).
//!
//! | variable | what |
//! | --- | --- |
//! | `ROAMDISK_STORE` | the chunk store used when none is named (else `$XDG_DATA_HOME/roamdisk/store`, else `~/.local/share/roamdisk/store`) |
//! | `ROAMDISK_SHARED_CACHE` | this host's shared chunk cache, or `off` (else `CACHE/shared`) |
//! | `ROAMDISK_S3_INDEX_CACHE` | where S3 pack indexes are kept, or `off` (else `CACHE/s3-index`) |
//! | `ROAMDISK_STORE_TOKEN_FILE`, `ROAMDISK_STORE_CA` | a chunk server's token file and CA, when not given |
//! | `ROAMDISK_CATALOG_SEGMENT` | entries sealed into one catalog segment (default 512; tests use a few) |
//! | `XDG_CACHE_HOME`, `XDG_DATA_HOME`, `HOME` | the bases of the defaults (`CACHE` is `$XDG_CACHE_HOME/roamdisk`, else `~/.cache/roamdisk`) |
//!
//! The `AWS_*` variables (endpoint, region, keys) go to the S3 client as
//! settings ([`Env::s3`]).

#![allow(
    clippy::disallowed_methods,
    reason = "this module is the one place the environment is read"
)]

use std::path::PathBuf;

use roamdisk_blockdev::Registry;
use roamdisk_chunkstore::store::http::Credentials;
use roamdisk_chunkstore::store::s3::S3Env;
use roamdisk_roam::cache::SharedChoice;
use roamdisk_roam::session::dev::Host;

/// What the environment says, resolved once.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// The default chunk store's location.
    pub store: String,
    /// The `AWS_*` variables (the S3 client's endpoint, region, keys).
    pub aws: Vec<(String, String)>,
    /// This host's cache folder (`~/.cache/roamdisk`), if there is a home.
    pub cache_home: Option<PathBuf>,
    /// The shared chunk cache (`None`: off).
    pub shared_cache: Option<PathBuf>,
    /// Where S3 pack indexes are kept (`None`: not kept on disk).
    pub s3_index_cache: Option<PathBuf>,
    /// A chunk server's token file and CA, when a command does not say.
    pub credentials: Credentials,
    /// Entries per catalog segment, when not the default.
    pub catalog_segment: Option<usize>,
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn path(k: &str) -> Option<PathBuf> {
    var(k).map(PathBuf::from)
}

impl Env {
    /// Read the environment.
    pub fn read() -> Env {
        let home = path("HOME");
        let data = path("XDG_DATA_HOME").or_else(|| home.as_ref().map(|h| h.join(".local/share")));
        let cache_home = path("XDG_CACHE_HOME")
            .or_else(|| home.as_ref().map(|h| h.join(".cache")))
            .map(|c| c.join("roamdisk"));
        let under_cache = |k: &str, sub: &str| match var(k).as_deref() {
            Some("off") => None,
            Some(d) => Some(PathBuf::from(d)),
            None => cache_home.as_ref().map(|c| c.join(sub)),
        };
        Env {
            aws: std::env::vars()
                .filter(|(k, _)| k.starts_with("AWS_"))
                .collect(),
            store: var("ROAMDISK_STORE").unwrap_or_else(|| {
                data.unwrap_or_else(|| PathBuf::from("."))
                    .join("roamdisk/store")
                    .display()
                    .to_string()
            }),
            shared_cache: under_cache("ROAMDISK_SHARED_CACHE", "shared"),
            s3_index_cache: under_cache("ROAMDISK_S3_INDEX_CACHE", "s3-index"),
            cache_home,
            credentials: Credentials {
                token_file: path("ROAMDISK_STORE_TOKEN_FILE"),
                ca_file: path("ROAMDISK_STORE_CA"),
            },
            catalog_segment: var("ROAMDISK_CATALOG_SEGMENT").and_then(|v| v.parse().ok()),
        }
    }

    /// `c` with what it lacks taken from the environment.
    pub fn credentials(&self, c: &Credentials) -> Credentials {
        Credentials {
            token_file: c.token_file.clone().or(self.credentials.token_file.clone()),
            ca_file: c.ca_file.clone().or(self.credentials.ca_file.clone()),
        }
    }

    /// The `shared-cache` option's value: the folder, or `off`.
    pub fn shared_cache_option(&self) -> String {
        match &self.shared_cache {
            Some(d) => d.display().to_string(),
            None => "off".into(),
        }
    }

    /// The shared cache a command's `--shared-cache` names (`off`, or a
    /// folder), else the host's.
    pub fn shared_cache_choice(&self, given: Option<&str>) -> SharedChoice {
        match given {
            Some(v) => SharedChoice::parse(Some(v)),
            None => self
                .shared_cache
                .clone()
                .map_or(SharedChoice::Off, SharedChoice::Dir),
        }
    }

    /// Where lookaside image media's chunk indexes are kept.
    pub fn lookaside_index(&self) -> Option<PathBuf> {
        self.cache_home.as_ref().map(|c| c.join("lookaside"))
    }

    /// This host's folders and S3 settings, for a session.
    pub fn host(&self) -> Host {
        Host {
            cache: self.cache_home.clone(),
            s3: self.s3(),
        }
    }

    /// How S3 stores are reached.
    pub fn s3(&self) -> S3Env {
        S3Env {
            aws: self.aws.clone(),
            index_cache: self.s3_index_cache.clone(),
        }
    }

    /// Give the content-addressed layers their defaults from here. The
    /// token file and CA are the last resort (`default-token-file`,
    /// `default-ca`: after the layer's options and a session's own).
    pub fn layer_defaults(&self, r: &mut Registry) {
        r.set_context(self.host());
        for kind in ["cas", "cas-version"] {
            r.set_default(kind, "shared-cache", self.shared_cache_option());
            if let Some(t) = &self.credentials.token_file {
                r.set_default(kind, "default-token-file", t.display().to_string());
            }
            if let Some(c) = &self.credentials.ca_file {
                r.set_default(kind, "default-ca", c.display().to_string());
            }
        }
        r.set_default("cas-version", "store", self.store.clone());
    }
}

/// The environment, read once.
pub fn get() -> &'static Env {
    static ENV: std::sync::OnceLock<Env> = std::sync::OnceLock::new();
    ENV.get_or_init(Env::read)
}
