//! NBD URIs: `nbd://HOST[:PORT][/EXPORT]` and
//! `nbd+unix:///[EXPORT]?socket=PATH` (the NBD URI specification's forms).

use std::path::PathBuf;

/// Where an NBD export is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    Tcp(String),
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
}

fn pct_decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' is not UTF-8"))
}

impl NbdUri {
    /// Whether `s` looks like an NBD URI.
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd://") || s.starts_with("nbd+unix://")
    }

    pub fn parse(s: &str) -> std::result::Result<NbdUri, String> {
        if s.starts_with("nbds://") || s.starts_with("nbds+unix://") {
            return Err(format!(
                "'{s}': the nbd layer does not speak TLS yet; reach the export without TLS (a Unix socket or a loopback address)"
            ));
        }
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(|| {
                format!("'{s}': a Unix-socket NBD URI needs ?socket=PATH (nbd+unix:///EXPORT?socket=/tmp/nbd.sock)")
            })?;
            let path = path.strip_prefix('/').unwrap_or(path);
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| format!("'{s}': missing socket=PATH"))?;
            Ok(NbdUri {
                addr: NbdAddr::Unix(PathBuf::from(pct_decode(socket)?)),
                export: pct_decode(path)?,
            })
        } else if let Some(rest) = s.strip_prefix("nbd://") {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(format!("'{s}': no host (nbd://HOST[:PORT]/EXPORT)"));
            }
            let has_port = if host.starts_with('[') {
                host.contains("]:")
            } else {
                host.contains(':')
            };
            let addr = if has_port {
                host.to_string()
            } else {
                format!("{host}:10809")
            };
            Ok(NbdUri {
                addr: NbdAddr::Tcp(addr),
                export: pct_decode(export.split('?').next().unwrap_or(""))?,
            })
        } else {
            Err(format!("'{s}' is not an NBD URI (nbd://HOST:PORT/EXPORT or nbd+unix:///EXPORT?socket=PATH)"))
        }
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.addr {
            NbdAddr::Tcp(a) => write!(f, "nbd://{a}/{}", self.export),
            NbdAddr::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u = NbdUri::parse("nbd+unix:///vm1?socket=/tmp/a%20b.sock").unwrap();
        assert_eq!(u.addr, NbdAddr::Unix("/tmp/a b.sock".into()));
        assert_eq!(u.export, "vm1");
        let u = NbdUri::parse("nbd+unix://?socket=/tmp/s").unwrap();
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://localhost/disk").unwrap();
        assert_eq!(u.addr, NbdAddr::Tcp("localhost:10809".into()));
        let u = NbdUri::parse("nbd://127.0.0.1:1234").unwrap();
        assert_eq!(
            (u.addr, u.export),
            (NbdAddr::Tcp("127.0.0.1:1234".into()), String::new())
        );
        let u = NbdUri::parse("nbd://[::1]:99/x").unwrap();
        assert_eq!(u.addr, NbdAddr::Tcp("[::1]:99".into()));
        assert!(NbdUri::parse("nbd+unix:///x")
            .unwrap_err()
            .contains("socket"));
        assert!(NbdUri::parse("http://x").is_err());
        assert!(NbdUri::parse("nbds://h/x").unwrap_err().contains("TLS"));
        assert!(NbdUri::parse("nbd:///x").is_err());
    }
}
