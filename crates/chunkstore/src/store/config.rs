//! `STORE/store.toml`: the settings fixed when a store is created (hash
//! function) and its defaults for writers (compression, quota). The same
//! text is served at `GET /v1/store` by the HTTP chunk server.

use serde::{Deserialize, Serialize};

use crate::chunk::ChunkCodec;
use crate::error::{bad_arg, corrupt};
use crate::hash::HashKind;
use roamdisk_blockdev::Result;

pub const MAGIC: &str = "roamdisk-chunk-store";
/// The layout version new stores get (2: objects may be in packs). Stores
/// of version 1 are read as they are and move to 2 when they get a pack.
pub const VERSION: u32 = 2;

/// Parsed store settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub hash: HashKind,
    /// zstd level for new chunks, `None` = store uncompressed.
    pub zstd_level: Option<i32>,
    /// Size limit in bytes: writes past it fail with `no-space`.
    pub quota: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            hash: HashKind::Blake3,
            zstd_level: Some(3),
            quota: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    magic: String,
    version: u32,
    hash: String,
    compression: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zstd_level: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<u64>,
}

impl StoreConfig {
    pub fn codec(&self) -> ChunkCodec {
        ChunkCodec {
            hash: self.hash,
            zstd_level: self.zstd_level,
        }
    }

    /// Compression by name: `zstd`, `zstd:LEVEL` or `none`.
    pub fn set_compression(&mut self, s: &str) -> Result<()> {
        self.zstd_level = match s {
            "none" => None,
            "zstd" => Some(3),
            other => match other
                .strip_prefix("zstd:")
                .and_then(|l| l.parse::<i32>().ok())
            {
                Some(l) if (1..=19).contains(&l) => Some(l),
                _ => {
                    return Err(bad_arg(format!(
                        "compression '{other}': use zstd, zstd:LEVEL (1-19) or none"
                    )))
                }
            },
        };
        Ok(())
    }

    pub fn compression_name(&self) -> String {
        match self.zstd_level {
            None => "none".into(),
            Some(l) => format!("zstd:{l}"),
        }
    }

    pub fn to_toml(&self) -> String {
        let f = File {
            magic: MAGIC.into(),
            version: VERSION,
            hash: self.hash.name().into(),
            compression: if self.zstd_level.is_some() {
                "zstd"
            } else {
                "none"
            }
            .into(),
            zstd_level: self.zstd_level,
            quota: self.quota,
        };
        format!(
            "# roamdisk chunk store: docs/formats/cas-store.md\n{}",
            toml::to_string(&f).expect("serialisable")
        )
    }

    pub fn parse(text: &str) -> Result<StoreConfig> {
        Ok(Self::parse_versioned(text)?.0)
    }

    /// [`StoreConfig::parse`], also giving the layout version (1 or 2).
    pub fn parse_versioned(text: &str) -> Result<(StoreConfig, u32)> {
        let f: File = toml::from_str(text)
            .map_err(|e| corrupt(format!("store.toml is not valid: {}", e.message())))?;
        if f.magic != MAGIC {
            return Err(corrupt(format!(
                "store.toml has magic '{}', not '{MAGIC}'",
                f.magic
            )));
        }
        if !(1..=VERSION).contains(&f.version) {
            return Err(corrupt(format!(
                "store format version {} (this build reads {VERSION})",
                f.version
            )));
        }
        let zstd_level = match (f.compression.as_str(), f.zstd_level) {
            ("none", _) => None,
            ("zstd", None) => Some(3),
            ("zstd", Some(l)) if (1..=19).contains(&l) => Some(l),
            (c, l) => {
                return Err(corrupt(format!(
                    "store.toml: bad compression {c} / level {l:?}"
                )))
            }
        };
        let config = StoreConfig {
            hash: HashKind::from_name(&f.hash).map_err(|e| corrupt(e.message().to_string()))?,
            zstd_level,
            quota: f.quota.filter(|&q| q > 0),
        };
        Ok((config, f.version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let mut c = StoreConfig {
            hash: HashKind::Sha256,
            ..Default::default()
        };
        c.set_compression("zstd:7").unwrap();
        c.quota = Some(1 << 20);
        assert_eq!(StoreConfig::parse(&c.to_toml()).unwrap(), c);
        assert!(StoreConfig::parse("magic = \"x\"").is_err());
        let v1 = c.to_toml().replace("version = 2", "version = 1");
        assert_eq!(StoreConfig::parse_versioned(&v1).unwrap(), (c.clone(), 1));
        let t = c.to_toml().replace("version = 2", "version = 3");
        assert!(StoreConfig::parse(&t)
            .unwrap_err()
            .to_string()
            .contains("version 3"));
    }
}
