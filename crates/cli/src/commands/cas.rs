//! What the content-addressed image commands share (`commit`, `log`,
//! `checkout`, `tag`, `rm`, `gc`, `store`): where the chunk store is, the
//! user's key, and how progress is shown (terminal bar, periodic lines,
//! JSON lines, or nothing).

use std::path::PathBuf;

use crate::progress::{Output, Reporter};
use anyhow::Context;
use clap::Args as ClapArgs;
use roamdisk_chunkstore::store::http::Credentials;
use roamdisk_chunkstore::store::{self, DynStore, StoreConfig};

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
            .unwrap_or_else(roamdisk_roam::layer::default_store)
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

    /// The token file and CA given on the command line.
    pub fn credentials(&self) -> Credentials {
        Credentials {
            token_file: self.token_file.clone(),
            ca_file: self.ca.clone(),
        }
    }

    pub fn key(&self) -> anyhow::Result<Option<[u8; 32]>> {
        match &self.key_file {
            Some(p) => Ok(Some(roamdisk_chunkstore::version::read_key_file(p)?)),
            None => Ok(None),
        }
    }
}

/// `3f2a1b9c0d1e` from a hex version id.
pub fn short(hex: &str) -> &str {
    &hex[..12.min(hex.len())]
}
