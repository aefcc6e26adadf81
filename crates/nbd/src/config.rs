//! The `roamdisk serve --config FILE` file: listeners, TLS and several
//! named exports. Its format is specified in `docs/formats/serve-config.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use roamdisk_blockdev::{LayerSpec, Registry};
use serde::Deserialize;

/// A parsed config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeConfig {
    pub socket: Option<PathBuf>,
    #[serde(default)]
    pub listen: Vec<SocketAddr>,
    /// `off`, `on` or `require`.
    pub tls: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_verify_ca: Option<PathBuf>,
    pub tls_psk: Option<PathBuf>,
    /// At least one; names are unique.
    #[serde(default)]
    pub export: Vec<ExportConfig>,
}

/// One `[[export]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExportConfig {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub read_only: bool,
    /// A spec string...
    pub stack: Option<String>,
    /// ...or a layer table.
    pub layer: Option<toml::Table>,
}

/// A config file that cannot be used, with what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ServeConfig {
    /// Read and check `path`.
    pub fn read(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        ServeConfig::parse(&text)
            .map_err(|ConfigError(m)| ConfigError(format!("{}: {m}", path.display())))
    }

    /// Parse and check a config file's text.
    pub fn parse(text: &str) -> Result<ServeConfig, ConfigError> {
        let cfg: ServeConfig =
            toml::from_str(text).map_err(|e| ConfigError(format!("bad config file: {e}")))?;
        if cfg.export.is_empty() {
            return Err(ConfigError("no [[export]] table".into()));
        }
        for (i, e) in cfg.export.iter().enumerate() {
            if cfg.export[..i].iter().any(|x| x.name == e.name) {
                return Err(ConfigError(format!(
                    "export name '{}' appears twice",
                    e.name
                )));
            }
            if e.stack.is_some() == e.layer.is_some() {
                return Err(ConfigError(format!(
                    "export '{}' needs exactly one of stack = \"SPEC\" or a [export.layer] table",
                    e.name
                )));
            }
        }
        Ok(cfg)
    }
}

impl ExportConfig {
    /// The export's stack, parsed.
    pub fn spec(&self, reg: &Registry) -> roamdisk_blockdev::Result<LayerSpec> {
        match (&self.stack, &self.layer) {
            (Some(s), _) => reg.parse(s),
            (None, Some(t)) => reg.from_toml(t),
            (None, None) => unreachable!("checked by ServeConfig::parse"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_parse_and_mistakes_are_named() {
        let c = ServeConfig::parse(
            r#"
            socket = "/tmp/s.sock"
            [[export]]
            name = "golden"
            stack = "mem:1M"
            read-only = true
            [[export]]
            name = "vm1"
            [export.layer]
            kind = "mem"
            size = "2M"
            "#,
        )
        .unwrap();
        let reg = Registry::with_builtin();
        assert_eq!(c.export.len(), 2);
        assert!(c.export[0].read_only);
        assert_eq!(
            c.export[1].spec(&reg).unwrap(),
            reg.parse("mem:2M").unwrap()
        );
        for (text, want) in [
            ("socket = \"/s\"", "no [[export]]"),
            (
                "[[export]]\nname = \"a\"\nstack = \"mem:1M\"\n[[export]]\nname = \"a\"\nstack = \"mem:1M\"",
                "appears twice",
            ),
            ("[[export]]\nname = \"a\"", "exactly one of"),
            ("bogus = 1", "bad config file"),
        ] {
            let e = ServeConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
