//! What the content-addressed image commands share (`commit`, `log`,
//! `checkout`, `tag`, `rm`, `gc`, `store`, `suspend`, `resume`): where the
//! chunk store is, the user's key, how progress is shown (terminal bar,
//! periodic lines, JSON lines, or nothing), and the update-commit filters.

use std::path::{Path, PathBuf};

use crate::progress::{Output, Reporter};
use anyhow::Context;
use clap::Args as ClapArgs;
use roamdisk_blockdev::{LayerSpec, OpenCtx};
use roamdisk_chunkstore::commit::CommitOptions;
use roamdisk_chunkstore::store::http::Credentials;
use roamdisk_chunkstore::store::{self, DynStore, StoreConfig};
use roamdisk_roam::session::dev::SessionOpen;
use roamdisk_roam::session::update::UpdateOptions;
use roamdisk_roam::session::{CacheKind, NewSession};

/// Where the chunk store is, and the user's key.
#[derive(ClapArgs, Clone, Debug)]
pub struct StoreArgs {
    /// Chunk store: a directory, the http:// or https:// URL of
    /// `roamdisk store serve`, or an S3 bucket s3://BUCKET/PREFIX
    /// (credentials and endpoint from the AWS_* environment variables;
    /// docs/deploy.md) (default: $ROAMDISK_STORE, else
    /// ~/.local/share/roamdisk/store).
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// Token file for an HTTP store (made by `roamdisk store user add`;
    /// default $ROAMDISK_STORE_TOKEN_FILE). Keep it mode 0600.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) trusted for an https:// store: the private CA
    /// that signed its certificate (default $ROAMDISK_STORE_CA, else the
    /// system's roots).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// The user's key file (encrypted images; make one with `roamdisk
    /// store keygen`).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Parallel requests to an HTTP store.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub parallel: usize,
    /// Machine-readable output: the result as JSON on stdout, progress as
    /// JSON lines on stderr.
    #[arg(long)]
    pub json: bool,
}

impl StoreArgs {
    /// The progress display these options ask for.
    pub fn progress(&self, quiet: bool) -> Reporter {
        Reporter::new(Output {
            quiet,
            json: self.json,
        })
    }

    pub fn location(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| crate::env::get().store.clone())
    }

    /// Open the store; a local default store is created on first use.
    pub fn open(&self, create: bool) -> anyhow::Result<DynStore> {
        let loc = self.location();
        let opts = store::OpenOptions {
            create: create.then(StoreConfig::default),
            parallel: Some(self.parallel),
            credentials: self.credentials(),
            ..Default::default()
        };
        store::open(&loc, &opts).with_context(|| format!("cannot open chunk store {loc}"))
    }

    /// The token file and CA given on the command line, else in the
    /// environment.
    pub fn credentials(&self) -> Credentials {
        crate::env::get().credentials(&Credentials {
            token_file: self.token_file.clone(),
            ca_file: self.ca.clone(),
        })
    }

    /// The session folder of a `cas:SESSION` spec and how to open it: the
    /// spec's options, then this command's store, key file and
    /// credentials over the session's own.
    pub fn session_open(&self, spec: &LayerSpec) -> anyhow::Result<(PathBuf, SessionOpen)> {
        let reg = crate::commands::registry();
        let params = reg.params_of(spec);
        let ctx = OpenCtx {
            read_only: false,
            params: &params,
            registry: &reg,
        };
        let (dir, mut open) = roamdisk_roam::layer::session_open(&ctx)?;
        if self.store.is_some() {
            open.store = self.store.clone();
        }
        if self.key_file.is_some() {
            open.key_file = self.key_file.clone();
        }
        let c = self.credentials();
        open.credentials.token_file = c.token_file.or(open.credentials.token_file);
        open.credentials.ca_file = c.ca_file.or(open.credentials.ca_file);
        Ok((dir, open))
    }

    /// A new session committing to `target` with a `cache` (raw or lbs)
    /// private cache: the store and files as absolute paths, for the
    /// session opens with them later from any folder; the token file and
    /// CA as given or from the environment, never the token itself.
    pub fn new_session(&self, target: String, cache: &str) -> anyhow::Result<NewSession> {
        let location = self.location();
        let credentials = if store::is_url(&location) {
            let c = self.credentials();
            Credentials {
                token_file: c.token_file.as_deref().map(absolute),
                ca_file: c.ca_file.as_deref().map(absolute),
            }
        } else {
            Credentials::default()
        };
        Ok(NewSession {
            target,
            store: if store::is_remote(&location) {
                location
            } else {
                absolute(Path::new(&location)).display().to_string()
            },
            key_file: self.key_file.as_deref().map(absolute),
            credentials,
            cache: CacheKind::parse(cache)?,
            lookaside: Vec::new(),
        })
    }

    pub fn key(&self) -> anyhow::Result<Option<[u8; 32]>> {
        match &self.key_file {
            Some(p) => Ok(Some(roamdisk_chunkstore::version::read_key_file(p)?)),
            None => Ok(None),
        }
    }
}

/// The useful-update filters of an update commit, each on by default.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Filters {
    /// Keep written zeroes as data (switch P1 off).
    #[arg(long)]
    no_p1: bool,
    /// Keep writes to free file-system clusters (switch P2 off).
    #[arg(long)]
    no_p2: bool,
    /// Keep writes to guest swap (switch P3 off).
    #[arg(long)]
    no_p3: bool,
}

impl Filters {
    /// Update-commit options with these filters.
    pub fn update(&self, commit: CommitOptions) -> UpdateOptions {
        UpdateOptions {
            commit,
            p1: !self.no_p1,
            p2: !self.no_p2,
            p3: !self.no_p3,
        }
    }

    pub fn any_off(&self) -> bool {
        self.no_p1 || self.no_p2 || self.no_p3
    }
}

/// The bytes of a file a command keeps with a version (`--config`), or
/// nothing when none is given.
pub fn read_optional(path: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    match path {
        Some(p) => std::fs::read(p).with_context(|| format!("cannot read {}", p.display())),
        None => Ok(Vec::new()),
    }
}

/// `p` made absolute (as it is, if it cannot be).
pub fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// `3f2a1b9c0d1e` from a hex version id.
pub fn short(hex: &str) -> &str {
    &hex[..12.min(hex.len())]
}
