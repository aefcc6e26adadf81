//! The S3 store itself: its state, the connection to the bucket (client
//! options, retries, the runtime that runs the requests), `open` (which
//! reads the store's settings) and `init`.

use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::batch::Batcher;
use super::index_cache::IndexCache;
use super::location::S3Location;
use super::table::Table;
use crate::error::{bad_arg, err, not_found};
use crate::store::api::S3Env;
use crate::store::api::StoreLayer;
use crate::store::config::StoreConfig;

/// An S3 chunk store.
pub struct S3Store {
    /// Runs the requests (`bridge.rs`); taken on drop.
    pub(super) rt: Option<tokio::runtime::Runtime>,
    pub(super) os: Arc<dyn ObjectStore>,
    pub(super) loc: S3Location,
    pub(super) config: StoreConfig,
    pub(super) table: RwLock<Table>,
    /// Containers (packs, loose objects) touched, and when.
    pub(super) touched: Mutex<HashMap<String, Instant>>,
    /// When this process last began a lease: a touch before it does not
    /// count for that lease.
    pub(super) epoch: Mutex<Instant>,
    /// Leases begun by this process (ended by a marker, not deleted).
    pub(super) mine: Mutex<HashSet<String>>,
    /// Allowance for listings that lag writes (`gc-margin=`).
    pub(super) margin: Duration,
    /// Where pack indexes are kept between runs (packs never change).
    pub(super) index_cache: IndexCache,
    /// Single objects put at once by several threads, gathered.
    pub(super) batcher: Batcher,
    /// When an object was last found missing after every retry.
    pub(super) last_missing: Mutex<Option<Instant>>,
}

impl Drop for S3Store {
    fn drop(&mut self) {
        // A runtime may not be dropped inside another's async context
        // (a store server holds this store).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// An endpoint the S3 client can use: an `http://` or `https://` URL
/// with a host (the client panics on anything else).
fn check_endpoint(endpoint: &str) -> Result<()> {
    if endpoint.is_empty() {
        return Ok(()); // AWS's own, from the region
    }
    let bad = |why: String| {
        bad_arg(format!(
            "S3 endpoint '{endpoint}' {why}: give a URL such as http://127.0.0.1:9000 or https://s3.example.com (in AWS_ENDPOINT_URL, or ?endpoint= in the location)"
        ))
    };
    let u = url::Url::parse(endpoint).map_err(|e| bad(format!("is not a URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("does not start with http:// or https://".into()));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host".into()));
    }
    Ok(())
}

/// Credentials from somewhere the user named: keys, a web identity,
/// container credentials, unsigned requests, or `credentials=instance`.
/// Without any, the client would ask the cloud's instance metadata
/// address (169.254.169.254) — a surprise on a laptop, and a wait.
fn check_credentials(b: &object_store::aws::AmazonS3Builder, loc: &S3Location) -> Result<()> {
    use object_store::aws::AmazonS3ConfigKey as K;
    let set = |k: K| b.get_config_value(&k).is_some_and(|v| !v.is_empty());
    // As object_store reads a boolean setting.
    let yes = |k: K| {
        b.get_config_value(&k).is_some_and(|v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "true" | "1" | "yes" | "on" | "y"
            )
        })
    };
    let named = set(K::AccessKeyId)
        || set(K::SecretAccessKey)
        || (set(K::WebIdentityTokenFile) && set(K::RoleArn))
        || set(K::ContainerCredentialsRelativeUri)
        || (set(K::ContainerCredentialsFullUri) && set(K::ContainerAuthorizationTokenFile))
        || yes(K::SkipSignature)
        // Naming the metadata service's address is asking for it.
        || set(K::MetadataEndpoint);
    if named || loc.instance_credentials {
        return Ok(());
    }
    Err(bad_arg(format!(
        "no credentials for {}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN; AWS_PROFILE and ~/.aws/credentials are not read), or add ?credentials=instance to the location to ask the cloud's instance metadata service (an EC2 instance profile)",
        loc.describe()
    )))
}

/// A region name the client can put into a host name and a signature.
fn check_region(region: &str) -> Result<()> {
    let ok = !region.is_empty()
        && region.len() <= 64
        && region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(bad_arg(format!(
            "S3 region '{region}' is not a region name (letters, digits, '-', e.g. us-east-1; in AWS_REGION, or ?region= in the location)"
        )))
    }
}

impl S3Store {
    /// Connect to the store at `location` (`s3://BUCKET/PREFIX?...`) and
    /// read its settings (`store.toml`).
    pub fn open(location: &str, env: &S3Env) -> Result<S3Store> {
        Self::read_settings(Self::connect(location, env)?)
    }

    /// Read the store's settings (`store.toml`) into `s`.
    fn read_settings(mut s: S3Store) -> Result<S3Store> {
        let text = s.block(s.get_text("store.toml"));
        let text = match text {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Err(not_found(format!(
                    "no chunk store at {}: create one with `roamdisk store init {}` (the bucket must exist)",
                    s.loc.describe(),
                    s.loc.describe()
                )))
            }
            Err(e) => return Err(e),
        };
        let (config, _) = StoreConfig::parse_versioned(&text)
            .map_err(|e| crate::error::context(e, format!("store.toml of {}", s.loc.describe())))?;
        s.config = config;
        Ok(s)
    }

    /// Create a store at `location` (refused if one is there).
    pub fn init(location: &str, config: &StoreConfig, env: &S3Env) -> Result<()> {
        Self::write_settings(&Self::connect(location, env)?, config)
    }

    /// Write the settings of a new store (refused if there are some).
    fn write_settings(s: &S3Store, config: &StoreConfig) -> Result<()> {
        if s.block(s.get_text("store.toml"))?.is_some() {
            return Err(err(
                ErrorKind::InvalidArgument,
                Op::Write,
                format!("{} already holds a chunk store", s.loc.describe()),
            ));
        }
        if config.quota.is_some() {
            return Err(bad_arg(
                "--quota is for local stores; limit an S3 bucket with the object store's own quotas",
            ));
        }
        let mut text = config.to_toml();
        text = text.replace("version = 1\n", "version = 2\n");
        s.block(s.put("store.toml", text.into_bytes()))
    }

    fn connect(location: &str, env: &S3Env) -> Result<S3Store> {
        // reqwest is built without a default TLS provider: use ring's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let loc = S3Location::parse(location)?;
        let mut b = AmazonS3Builder::new().with_bucket_name(&loc.bucket);
        // The AWS_* settings first (as the AWS tools read them), the
        // location's query over them.
        for (k, v) in &env.aws {
            if v.is_empty() {
                continue; // set but empty: unset, as the AWS tools take it
            }
            if let Ok(key) = k
                .to_ascii_lowercase()
                .parse::<object_store::aws::AmazonS3ConfigKey>()
            {
                b = b.with_config(key, v);
            }
        }
        for (k, v) in &loc.settings {
            let key: object_store::aws::AmazonS3ConfigKey = k
                .parse()
                .map_err(|_| bad_arg(format!("{location}: unknown S3 setting '{k}'")))?;
            b = b.with_config(key, v);
        }
        let endpoint = b
            .get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint)
            .unwrap_or_default();
        check_endpoint(&endpoint)?;
        check_credentials(&b, &loc)?;
        if let Some(region) = b.get_config_value(&object_store::aws::AmazonS3ConfigKey::Region) {
            check_region(&region)?;
        }
        let client = object_store::ClientOptions::new()
            .with_allow_http(endpoint.starts_with("http://"))
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(60));
        let mut client = client;
        for (k, v) in &loc.settings {
            if let Ok(ck) = k.parse::<object_store::ClientConfigKey>() {
                client = client.with_config(ck, v);
            }
        }
        b = b
            .with_client_options(client)
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: loc.retries,
                retry_timeout: loc.retry_timeout,
            });
        let os = b.build().map_err(|e| {
            bad_arg(format!(
                "cannot use {}: {e} (set AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ?endpoint=...&region=...)",
                loc.describe()
            ))
        })?;
        Self::over(Arc::new(os), loc, &endpoint, env)
    }

    /// A store over any object store (the tests' in-memory ones).
    fn over(
        os: Arc<dyn ObjectStore>,
        loc: S3Location,
        endpoint: &str,
        env: &S3Env,
    ) -> Result<S3Store> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("roamdisk-s3")
            .enable_all()
            .build()
            .map_err(|e| {
                err(
                    ErrorKind::Io,
                    Op::Open,
                    format!("cannot start the S3 client: {e}"),
                )
            })?;
        Ok(S3Store {
            rt: Some(rt),
            os,
            config: StoreConfig::default(),
            table: RwLock::new(Table::default()),
            touched: Mutex::new(HashMap::new()),
            epoch: Mutex::new(Instant::now()),
            mine: Mutex::new(HashSet::new()),
            margin: loc.gc_margin,
            index_cache: IndexCache::for_bucket(env.index_cache.as_deref(), endpoint, &loc),
            batcher: Batcher::default(),
            last_missing: Mutex::new(None),
            loc,
        })
    }

    /// Create a store at `location` over `os` and open it (tests).
    #[cfg(test)]
    pub(super) fn init_over(os: Arc<dyn ObjectStore>, location: &str) -> Result<S3Store> {
        let env = S3Env::default();
        let fresh = Self::over(Arc::clone(&os), S3Location::parse(location)?, "", &env)?;
        Self::write_settings(&fresh, &StoreConfig::default())?;
        Self::open_over(os, location)
    }

    /// Open the store at `location` over `os` (tests).
    #[cfg(test)]
    pub(super) fn open_over(os: Arc<dyn ObjectStore>, location: &str) -> Result<S3Store> {
        let env = S3Env::default();
        Self::read_settings(Self::over(os, S3Location::parse(location)?, "", &env)?)
    }

    /// The allowance for listings that lag writes: gc removes nothing
    /// younger, and a finished commit's lease stays this long.
    pub fn margin(&self) -> Duration {
        self.margin
    }
}

impl StoreLayer for S3Store {
    fn describe(&self) -> String {
        self.loc.describe()
    }
    fn config(&self) -> &StoreConfig {
        &self.config
    }
}
