//! The `roamdisk server CONFIG.toml` file: listeners, TLS, the state
//! directory, the server cache, the metrics endpoint, golden images and
//! clients with their identities and grants.
//! Specified in `docs/formats/server-config.md`; every check here is listed
//! there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use roamdisk_blockdev::units::parse_size;
use roamdisk_cachesim::layer::{CacheOptions, DEFAULT_SHARDS, MAX_BLOCK, MIN_BLOCK};
use roamdisk_cachesim::PolicySpec;
use serde::Deserialize;

/// The value of the `format` key.
pub const FORMAT: &str = "roamdisk-server";
/// The only version of the format so far.
pub const VERSION: i64 = 1;

/// A parsed and checked config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServerConfig {
    pub format: String,
    pub version: i64,
    /// Overlays and the lock live here (relative paths: to the file).
    pub state: PathBuf,
    pub socket: Option<PathBuf>,
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_verify_ca: Option<PathBuf>,
    pub tls_psk: Option<PathBuf>,
    /// Serve `/metrics` and `/status.json` over HTTP here.
    pub metrics: Option<MetricsAddr>,
    /// A file holding the token every metrics request must carry
    /// (`Authorization: Bearer TOKEN`).
    pub metrics_token_file: Option<PathBuf>,
    /// Serve the metrics over HTTPS with `tls-cert` and `tls-key`.
    #[serde(default)]
    pub metrics_tls: bool,
    /// The memory cache in front of the golden images.
    pub cache: Option<CacheConfig>,
    #[serde(default)]
    pub image: Vec<ImageConfig>,
    #[serde(default)]
    pub client: Vec<ClientConfig>,
}

/// One `[[image]]`: a golden image.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ImageConfig {
    pub name: String,
    /// The stack in its string form, opened read-only.
    pub stack: String,
    #[serde(default)]
    pub description: String,
    /// Whether the server cache (if any) holds this image's blocks.
    #[serde(default = "yes")]
    pub cache: bool,
    /// Wrapping layers put over each client's view of this image, in the
    /// string form without a bottom layer (`hdd[head=srv,charge=writes]`:
    /// the views' writes charged to the server's emulated disk).
    pub view_layers: Option<String>,
}

fn yes() -> bool {
    true
}

/// A byte size: an integer or a string with a unit (`"1G"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Bytes(n)),
            Raw::S(s) => parse_size(&s).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

/// Where the metrics endpoint listens: `"ADDR:PORT"` or `"unix:PATH"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl<'de> Deserialize<'de> for MetricsAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MetricsAddr, D::Error> {
        let s = String::deserialize(d)?;
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(serde::de::Error::custom(
                    "'unix:' needs a path after it (unix:/run/roamdisk/metrics.sock)",
                ));
            }
            return Ok(MetricsAddr::Unix(PathBuf::from(p)));
        }
        s.parse().map(MetricsAddr::Tcp).map_err(|_| {
            serde::de::Error::custom(format!(
                "'{s}' is neither ADDR:PORT (an IP address and a port: \"127.0.0.1:9477\") nor unix:PATH"
            ))
        })
    }
}

impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "{a}"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The `[cache]` table: one memory cache in front of every golden image.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CacheConfig {
    /// The replacement policy, as `roamdisk sim --policy` takes it.
    #[serde(default = "fmpq")]
    pub policy: String,
    /// Bytes of cached data; 0: no cache.
    pub size: Bytes,
    /// The unit of caching.
    #[serde(default = "min_block")]
    pub block: Bytes,
    /// Independently locked parts; default 16 (fewer for a tiny cache).
    pub shards: Option<usize>,
}

fn fmpq() -> String {
    "fmpq".into()
}

fn min_block() -> Bytes {
    Bytes(MIN_BLOCK)
}

impl CacheConfig {
    /// The cache's options, checked; `None` for a size of 0.
    pub fn options(&self) -> Result<Option<CacheOptions>, ServerConfigError> {
        let at = |key: &str| format!("[cache] key '{key}'");
        let policy = PolicySpec::parse(&self.policy)
            .map_err(|e| ServerConfigError(format!("{}: {}", at("policy"), e.0)))?;
        let Bytes(block) = self.block;
        if !block.is_power_of_two() || !(MIN_BLOCK..=MAX_BLOCK).contains(&block) {
            return Err(ServerConfigError(format!(
                "{}: {block} must be a power of two from 4K to 1M",
                at("block")
            )));
        }
        let Bytes(size) = self.size;
        if size == 0 {
            return Ok(None);
        }
        let blocks = size / block;
        if blocks == 0 {
            return Err(ServerConfigError(format!(
                "{}: {size} bytes hold no block of {block} bytes; give at least the block size (or 0 for no cache)",
                at("size")
            )));
        }
        let shards = match self.shards {
            Some(0) => return Err(ServerConfigError(format!("{}: give at least 1", at("shards")))),
            Some(n) if n as u64 > blocks => {
                return Err(ServerConfigError(format!(
                    "{}: {n} shards for a cache of {blocks} blocks; give at most {blocks} (or a larger size)",
                    at("shards")
                )))
            }
            Some(n) => n,
            None => DEFAULT_SHARDS.min(blocks as usize),
        };
        Ok(Some(CacheOptions {
            policy,
            size,
            block,
            shards,
            report: None,
        }))
    }
}

/// One `[[client]]`: who it is and what it may open.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClientConfig {
    pub name: String,
    /// Subject CN of its certificate (signed by `tls-verify-ca`).
    pub cert_cn: Option<String>,
    /// SHA-256 of its certificate (DER), hex, colons allowed.
    pub cert_sha256: Option<String>,
    /// Its identity in the `tls-psk` file.
    pub psk_identity: Option<String>,
    /// Its uid, for connections on the Unix socket.
    pub uid: Option<u32>,
    /// Images it opens as its own writable view.
    #[serde(default)]
    pub view: Vec<String>,
    /// Images it opens as they are, read-only.
    #[serde(default)]
    pub read_only: Vec<String>,
}

/// A config file that cannot be used: the file, the key and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServerConfigError(pub String);

/// Names that become file names in the state directory.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Hex digits only, lower case, colons dropped.
pub fn normalize_fingerprint(s: &str) -> String {
    s.chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase()
}

impl ServerConfig {
    /// Read and check `path`; relative paths in it are made relative to
    /// the file's directory.
    pub fn read(path: &Path) -> Result<ServerConfig, ServerConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServerConfigError(format!("cannot read {}: {e}", path.display())))?;
        let mut cfg = ServerConfig::parse(&text).map_err(|ServerConfigError(m)| {
            ServerConfigError(format!("{}: {m}", path.display()))
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let rel = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        rel(&mut cfg.state);
        if let Some(MetricsAddr::Unix(p)) = &mut cfg.metrics {
            rel(p);
        }
        for p in [
            &mut cfg.metrics_token_file,
            &mut cfg.socket,
            &mut cfg.tls_cert,
            &mut cfg.tls_key,
            &mut cfg.tls_verify_ca,
            &mut cfg.tls_psk,
        ]
        .into_iter()
        .flatten()
        {
            rel(p);
        }
        Ok(cfg)
    }

    /// Parse and check a config file's text: `format` and `version` first,
    /// then the rest.
    pub fn parse(text: &str) -> Result<ServerConfig, ServerConfigError> {
        let err = |m: String| Err(ServerConfigError(m));
        let table: toml::Table = text
            .parse()
            .map_err(|e| ServerConfigError(format!("not TOML: {e}")))?;
        match table.get("format").and_then(|v| v.as_str()) {
            Some(FORMAT) => {}
            Some(other) => {
                return err(format!(
                    "key 'format': this is a '{other}' file, not a '{FORMAT}' config"
                ))
            }
            None => {
                return err(format!(
                    "key 'format' is missing: the first line should be format = \"{FORMAT}\""
                ))
            }
        }
        match table.get("version").and_then(|v| v.as_integer()) {
            Some(VERSION) => {}
            Some(v) => {
                return err(format!(
                    "key 'version': version {v} is not known to this roamdisk (it reads version {VERSION})"
                ))
            }
            None => return err(format!("key 'version' is missing (version = {VERSION})")),
        }
        let cfg: ServerConfig =
            toml::from_str(text).map_err(|e| ServerConfigError(e.to_string().trim().into()))?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ServerConfigError> {
        if self.socket.is_none() && self.listen.is_empty() {
            return Err(ServerConfigError(
                "no listener: give socket = \"PATH\" and/or listen = [\"ADDR:PORT\"]".into(),
            ));
        }
        let has_cert = self.tls_cert.is_some() || self.tls_key.is_some();
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ServerConfigError(
                "keys 'tls-cert' and 'tls-key' go together".into(),
            ));
        }
        if !self.listen.is_empty() && !has_cert && self.tls_psk.is_none() {
            return Err(ServerConfigError(
                "key 'listen': TCP clients must use TLS; give tls-cert + tls-key and/or tls-psk"
                    .into(),
            ));
        }
        if self.tls_verify_ca.is_some() && !has_cert {
            return Err(ServerConfigError(
                "key 'tls-verify-ca' needs tls-cert and tls-key".into(),
            ));
        }
        self.check_metrics(has_cert)?;
        if self.image.is_empty() {
            return Err(ServerConfigError("no [[image]] table".into()));
        }
        if let Some(c) = &self.cache {
            c.options()?;
        }
        for (i, im) in self.image.iter().enumerate() {
            if !valid_name(&im.name) {
                return Err(ServerConfigError(format!(
                    "image[{i}] key 'name': '{}' must be 1-64 letters, digits, '.', '_' or '-', not starting with '.'",
                    im.name
                )));
            }
            if self.image[..i].iter().any(|x| x.name == im.name) {
                return Err(ServerConfigError(format!(
                    "image name '{}' appears twice",
                    im.name
                )));
            }
        }
        for (i, c) in self.client.iter().enumerate() {
            let at = |key: &str| format!("client '{}' key '{key}'", c.name);
            if !valid_name(&c.name) {
                return Err(ServerConfigError(format!(
                    "client[{i}] key 'name': '{}' must be 1-64 letters, digits, '.', '_' or '-', not starting with '.'",
                    c.name
                )));
            }
            if self.client[..i].iter().any(|x| x.name == c.name) {
                return Err(ServerConfigError(format!(
                    "client name '{}' appears twice",
                    c.name
                )));
            }
            if c.cert_cn.is_none()
                && c.cert_sha256.is_none()
                && c.psk_identity.is_none()
                && c.uid.is_none()
            {
                return Err(ServerConfigError(format!(
                    "client '{}' has no identity: give cert-cn, cert-sha256, psk-identity and/or uid",
                    c.name
                )));
            }
            if c.cert_cn.is_some() && self.tls_verify_ca.is_none() {
                return Err(ServerConfigError(format!(
                    "{}: a certificate's name proves nothing unless tls-verify-ca checks who signed it",
                    at("cert-cn")
                )));
            }
            if let Some(fp) = &c.cert_sha256 {
                let n = normalize_fingerprint(fp);
                if n.len() != 64 || !n.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ServerConfigError(format!(
                        "{}: expected 64 hex digits (openssl x509 -noout -fingerprint -sha256)",
                        at("cert-sha256")
                    )));
                }
                if self.tls_verify_ca.is_none() {
                    return Err(ServerConfigError(format!(
                        "{}: needs tls-verify-ca (the server asks for client certificates only then)",
                        at("cert-sha256")
                    )));
                }
            }
            if c.psk_identity.is_some() && self.tls_psk.is_none() {
                return Err(ServerConfigError(format!(
                    "{}: needs tls-psk",
                    at("psk-identity")
                )));
            }
            if c.uid.is_some() && self.socket.is_none() {
                return Err(ServerConfigError(format!(
                    "{}: uids are checked on the Unix socket only; give socket",
                    at("uid")
                )));
            }
            for x in &self.client[..i] {
                let same = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
                let clash = if same(&c.cert_cn, &x.cert_cn) {
                    Some("cert-cn")
                } else if c.cert_sha256.is_some()
                    && c.cert_sha256.as_deref().map(normalize_fingerprint)
                        == x.cert_sha256.as_deref().map(normalize_fingerprint)
                {
                    Some("cert-sha256")
                } else if same(&c.psk_identity, &x.psk_identity) {
                    Some("psk-identity")
                } else if c.uid.is_some() && c.uid == x.uid {
                    Some("uid")
                } else {
                    None
                };
                if let Some(key) = clash {
                    return Err(ServerConfigError(format!(
                        "{}: the same identity as client '{}'",
                        at(key),
                        x.name
                    )));
                }
            }
            for (key, list) in [("view", &c.view), ("read-only", &c.read_only)] {
                for name in list {
                    if !self.image.iter().any(|im| &im.name == name) {
                        return Err(ServerConfigError(format!(
                            "{}: no [[image]] named '{name}'",
                            at(key)
                        )));
                    }
                }
            }
            if let Some(name) = c.view.iter().find(|n| c.read_only.contains(n)) {
                return Err(ServerConfigError(format!(
                    "{}: '{name}' is also in view; grant an image one way",
                    at("read-only")
                )));
            }
        }
        Ok(())
    }

    /// The client of that name.
    pub fn client(&self, name: &str) -> Option<&ClientConfig> {
        self.client.iter().find(|c| c.name == name)
    }

    /// The server cache's options: `None` without a `[cache]` table or
    /// with a size of 0 (checked by [`ServerConfig::parse`]).
    pub fn cache_options(&self) -> Option<CacheOptions> {
        self.cache.as_ref().and_then(|c| c.options().ok().flatten())
    }

    /// The metrics keys go together: TLS needs a TCP address and the
    /// server's certificate; a token or TLS needs an endpoint; an address
    /// other hosts reach needs both (the counters name clients and images).
    fn check_metrics(&self, has_cert: bool) -> Result<(), ServerConfigError> {
        let err = |m: &str| Err(ServerConfigError(m.into()));
        let Some(addr) = &self.metrics else {
            if self.metrics_tls || self.metrics_token_file.is_some() {
                return err("keys 'metrics-tls' and 'metrics-token-file' need a metrics address: give metrics = \"ADDR:PORT\" or \"unix:PATH\"");
            }
            return Ok(());
        };
        match addr {
            MetricsAddr::Unix(_) if self.metrics_tls => err(
                "key 'metrics-tls': the metrics endpoint is a Unix socket (no TLS there; who may connect is set by its file mode, 0660)",
            ),
            MetricsAddr::Tcp(_) if self.metrics_tls && !has_cert => {
                err("key 'metrics-tls' serves HTTPS with the server's certificate: give tls-cert and tls-key")
            }
            MetricsAddr::Tcp(a)
                if !a.ip().is_loopback()
                    && (!self.metrics_tls || self.metrics_token_file.is_none()) =>
            {
                Err(ServerConfigError(format!(
                    "key 'metrics': {a} is reachable from other hosts, and the counters name every client and image: give metrics-token-file and metrics-tls = true, or use a loopback address or unix:PATH"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The image of that name.
    pub fn image(&self, name: &str) -> Option<&ImageConfig> {
        self.image.iter().find(|i| i.name == name)
    }

    /// The settings of `next` that differ from these and that only a
    /// restart applies: everything but the `[[client]]` tables (a reload
    /// takes those, and the PSK file's keys).
    pub fn restart_needed(&self, next: &ServerConfig) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut check = |name, same: bool| {
            if !same {
                v.push(name);
            }
        };
        check("state", self.state == next.state);
        check("socket", self.socket == next.socket);
        check("listen", self.listen == next.listen);
        check("tls-cert", self.tls_cert == next.tls_cert);
        check("tls-key", self.tls_key == next.tls_key);
        check("tls-verify-ca", self.tls_verify_ca == next.tls_verify_ca);
        check("tls-psk", self.tls_psk == next.tls_psk);
        check("metrics", self.metrics == next.metrics);
        check("metrics-tls", self.metrics_tls == next.metrics_tls);
        check(
            "metrics-token-file",
            self.metrics_token_file == next.metrics_token_file,
        );
        check("[cache]", self.cache == next.cache);
        check("[[image]]", self.image == next.image);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "format = \"roamdisk-server\"\nversion = 1\nstate = \"/s\"\nsocket = \"/s.sock\"\n[[image]]\nname = \"win\"\nstack = \"mem:1M\"\n";

    #[test]
    fn a_good_file_parses() {
        let c = ServerConfig::parse(&format!(
            "{HEAD}[[client]]\nname = \"alice\"\nuid = 1000\nview = [\"win\"]\n"
        ))
        .unwrap();
        assert_eq!(c.client("alice").unwrap().view, vec!["win".to_string()]);
        assert!(c.cache_options().is_none() && c.metrics.is_none());
        assert!(c.image("win").unwrap().cache);
    }

    #[test]
    fn the_cache_table_has_defaults() {
        let c = ServerConfig::parse(&HEAD.replace(
            "[[image]]",
            "metrics = \"127.0.0.1:9100\"\n[cache]\nsize = \"1G\"\n[[image]]\ncache = false",
        ))
        .unwrap();
        let o = c.cache_options().unwrap();
        assert_eq!(
            (o.policy.label(), o.size, o.block, o.shards),
            ("FMPQ".to_string(), 1 << 30, 4096, 16)
        );
        assert!(!c.image("win").unwrap().cache);
        assert_eq!(
            c.metrics.unwrap(),
            MetricsAddr::Tcp("127.0.0.1:9100".parse().unwrap())
        );
        let c = ServerConfig::parse(&HEAD.replace(
            "[[image]]",
            "[cache]\nsize = 32768\nblock = \"16K\"\npolicy = \"2q[kin=0.3]\"\n[[image]]",
        ))
        .unwrap();
        let o = c.cache_options().unwrap();
        assert_eq!((o.size, o.block, o.shards), (32768, 16384, 2));
        let c = ServerConfig::parse(&HEAD.replace("[[image]]", "[cache]\nsize = 0\n[[image]]"))
            .unwrap();
        assert!(c.cache_options().is_none());
    }

    #[test]
    fn metrics_on_a_socket_or_a_network_address_with_a_token_and_tls() {
        let c = ServerConfig::parse(&HEAD.replace(
            "[[image]]",
            "metrics = \"unix:m.sock\"\nmetrics-token-file = \"t\"\n[[image]]",
        ))
        .unwrap();
        assert_eq!(c.metrics, Some(MetricsAddr::Unix("m.sock".into())));
        assert_eq!(c.metrics.unwrap().to_string(), "unix:m.sock");
        let c = ServerConfig::parse(&HEAD.replace(
            "[[image]]",
            "tls-cert = \"c\"\ntls-key = \"k\"\nmetrics = \"0.0.0.0:9477\"\nmetrics-tls = true\nmetrics-token-file = \"t\"\n[[image]]",
        ))
        .unwrap();
        assert!(c.metrics_tls);
        let mut next = ServerConfig::parse(HEAD).unwrap();
        next.metrics = c.metrics.clone();
        assert_eq!(
            c.restart_needed(&next),
            ["tls-cert", "tls-key", "metrics-tls", "metrics-token-file"]
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (text, want) in [
            ("version = 1".to_string(), "key 'format' is missing"),
            ("format = \"x\"\nversion = 1".into(), "key 'format'"),
            ("format = \"roamdisk-server\"\nversion = 2".into(), "key 'version'"),
            (format!("{HEAD}bogus = 1"), "bogus"),
            (format!("{HEAD}[[client]]\nname = \"a\"\nview = [\"win\"]"), "no identity"),
            (format!("{HEAD}[[client]]\nname = \"a\"\nuid = 1\nview = [\"nope\"]"), "no [[image]] named 'nope'"),
            (format!("{HEAD}[[client]]\nname = \"a\"\nuid = 1\n[[client]]\nname = \"b\"\nuid = 1"), "same identity as client 'a'"),
            (format!("{HEAD}[[client]]\nname = \"a\"\ncert-cn = \"a\""), "tls-verify-ca"),
            (format!("{HEAD}[[client]]\nname = \"../a\"\nuid = 1"), "key 'name'"),
            (format!("{HEAD}[[client]]\nname = \"a\"\nuid = 1\nview = [\"win\"]\nread-only = [\"win\"]"), "one way"),
            (HEAD.replace("socket = \"/s.sock\"", "listen = [\"127.0.0.1:1\"]"), "must use TLS"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"1G\"\npolicy = \"lfu\"\n[[image]]"), "[cache] key 'policy'"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"1G\"\nblock = \"3K\"\n[[image]]"), "[cache] key 'block'"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"1K\"\n[[image]]"), "[cache] key 'size'"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"lots\"\n[[image]]"), "lots"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"64K\"\nshards = 32\n[[image]]"), "[cache] key 'shards'"),
            (HEAD.replace("[[image]]", "[cache]\nsize = \"64K\"\nshards = 0\n[[image]]"), "[cache] key 'shards'"),
            (HEAD.replace("[[image]]", "metrics = \"localhost\"\n[[image]]"), "neither ADDR:PORT"),
            (HEAD.replace("[[image]]", "metrics = \"unix:\"\n[[image]]"), "needs a path"),
            (HEAD.replace("[[image]]", "metrics-tls = true\n[[image]]"), "need a metrics address"),
            (HEAD.replace("[[image]]", "metrics-token-file = \"t\"\n[[image]]"), "need a metrics address"),
            (HEAD.replace("[[image]]", "metrics = \"unix:m.sock\"\nmetrics-tls = true\n[[image]]"), "is a Unix socket"),
            (HEAD.replace("[[image]]", "metrics = \"127.0.0.1:1\"\nmetrics-tls = true\n[[image]]"), "give tls-cert and tls-key"),
            (HEAD.replace("[[image]]", "metrics = \"0.0.0.0:9477\"\n[[image]]"), "reachable from other hosts"),
            (HEAD.replace("[[image]]", "metrics = \"[::]:9477\"\nmetrics-token-file = \"t\"\n[[image]]"), "reachable from other hosts"),
        ] {
            let e = ServerConfig::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}\n=> {e}");
        }
    }
}
