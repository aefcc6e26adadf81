//! NBD URIs, as the NBD URI specification (the `nbd` project's
//! `doc/uri.md`) and libnbd's `nbd_connect_uri` read them:
//!
//! ```text
//! nbd://[USER@]HOST[:PORT][/EXPORT][?PARAMS]        plain TCP
//! nbds://[USER@]HOST[:PORT][/EXPORT][?PARAMS]       TCP, TLS required (STARTTLS)
//! nbd+unix://[USER@]/[EXPORT]?socket=PATH[&PARAMS]  Unix socket
//! nbds+unix://[USER@]/[EXPORT]?socket=PATH[&PARAMS] Unix socket, TLS required
//! ```
//!
//! TLS parameters: `tls-certificates=DIR` (ca-cert.pem, optional
//! client-cert.pem + client-key.pem: the qemu/libnbd folder),
//! `tls-psk-file=FILE` (psktool's `identity:hexkey` lines; the identity is
//! USER, else the login name), `tls-verify-peer=0|1`, `tls-hostname=NAME`
//! and `tls-type=x509|psk` (the specification's). Parameters starting
//! with `x-` are ignored, as the specification asks; any other unknown
//! parameter, a duplicate, or a TLS parameter on a non-TLS URI is an error
//! (a `tls-psk-file` on `nbd://` would otherwise connect in the clear).

use std::net::Ipv6Addr;
use std::path::PathBuf;

use roamdisk_blockdev::spec::parse_on_off;

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Where an NBD export is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    /// `HOST:PORT`, an IPv6 HOST in brackets.
    Tcp(String),
    Unix(PathBuf),
}

impl NbdAddr {
    /// The host of a TCP address, without brackets or port.
    pub fn host(&self) -> Option<&str> {
        let NbdAddr::Tcp(a) = self else {
            return None;
        };
        let h = a.rsplit_once(':').map_or(a.as_str(), |(h, _)| h);
        Some(
            h.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(h),
        )
    }
}

/// What an `nbds://` or `nbds+unix://` URI says about TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    /// `tls-certificates=DIR`.
    pub certificates: Option<PathBuf>,
    /// `tls-psk-file=FILE`.
    pub psk_file: Option<PathBuf>,
    /// The URI's user part: the PSK identity.
    pub username: Option<String>,
    /// `tls-verify-peer` (default on): check the server's certificate.
    pub verify_peer: bool,
    /// `tls-hostname=NAME`: the name the server's certificate must carry
    /// (default: the URI's host; none over a Unix socket).
    pub hostname: Option<String>,
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
    /// `Some` for `nbds://` and `nbds+unix://`: the connection must be TLS.
    pub tls: Option<TlsParams>,
}

fn pct_decode(s: &str) -> std::result::Result<String, Problem> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("'{s}' is not UTF-8").into())
}

/// What is wrong with a URI (without the URI: [`UriError`] adds it).
struct Problem(String);

impl From<&str> for Problem {
    fn from(m: &str) -> Problem {
        Problem(m.to_string())
    }
}

impl From<String> for Problem {
    fn from(m: String) -> Problem {
        Problem(m)
    }
}

/// An NBD URI that cannot be used: the URI, and what is wrong with it
/// (and how to write it instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{uri}': {problem}")]
pub struct UriError {
    pub uri: String,
    pub problem: String,
}

/// A bad URI given to open a layer or a target is a bad argument.
impl From<UriError> for roamdisk_blockdev::Error {
    fn from(e: UriError) -> roamdisk_blockdev::Error {
        use roamdisk_blockdev::{ErrorKind, Op};
        roamdisk_blockdev::Error::new(ErrorKind::InvalidArgument, Op::Open, "nbd", e.to_string())
    }
}

/// `s` with every byte but ASCII letters, digits, `-._~` and those in
/// `keep` percent-encoded.
fn pct_encode(s: &str, keep: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.as_bytes().contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Query parameters this parser knows.
const KNOWN: &str =
    "socket, tls-certificates, tls-psk-file, tls-verify-peer, tls-hostname, tls-type";

/// `HOST[:PORT]` as `host:port` for [`std::net::TcpStream::connect`].
fn tcp_addr(hostport: &str) -> std::result::Result<String, Problem> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address without its closing ']'")?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| format!("'{v6}' is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after ']'")?),
        };
        (format!("[{v6}]"), port)
    } else {
        let (h, p) = match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        };
        if p.is_some_and(|p| p.contains(':')) {
            return Err("an IPv6 address must be in brackets ([::1]:10809)".into());
        }
        let h = pct_decode(h)?;
        if h.is_empty() {
            return Err("no host (nbd://HOST[:PORT]/EXPORT)".into());
        }
        if !h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
        {
            return Err(format!("'{h}' is not a host name or address").into());
        }
        (h, p)
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|c| c.is_ascii_digit()) => n,
            _ => return Err(format!("'{p}' is not a port (1-65535)").into()),
        },
    };
    Ok(format!("{host}:{port}"))
}

impl NbdUri {
    /// Whether `s` looks like an NBD URI (any of the four schemes).
    pub fn is_uri(s: &str) -> bool {
        ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
            .iter()
            .any(|p| s.starts_with(p))
    }

    /// Parse `s`; what is wrong with it comes back with the URI.
    pub fn parse(s: &str) -> std::result::Result<NbdUri, UriError> {
        Self::parse_inner(s).map_err(|Problem(problem)| UriError {
            uri: s.to_string(),
            problem,
        })
    }

    fn parse_inner(s: &str) -> std::result::Result<NbdUri, Problem> {
        if let Some(c) = s.chars().find(|c| c.is_control() || *c == ' ') {
            return Err(format!(
                "{c:?} is not allowed in a URI; percent-encode it (a space is %20)"
            )
            .into());
        }
        let (scheme, rest) = s.split_once("://").ok_or(
            "not an NBD URI (nbd://HOST:PORT/EXPORT, nbds://..., nbd+unix:///EXPORT?socket=PATH)",
        )?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            "nbd+vsock" | "nbds+vsock" => return Err("AF_VSOCK is not supported".into()),
            _ => {
                return Err(format!(
                    "'{scheme}' is not an NBD URI scheme (nbd, nbds, nbd+unix, nbds+unix)"
                )
                .into())
            }
        };
        if rest.contains('#') {
            return Err("an NBD URI has no fragment ('#'); percent-encode it (%23)".into());
        }
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
        let (userinfo, hostport) = match authority.split_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let username = match userinfo {
            None => None,
            Some("") => return Err("an empty user name before '@'".into()),
            Some(u) if u.contains(':') || hostport.contains('@') => {
                return Err(
                    "a password or a second '@' in the user part; only a user name (the PSK identity) goes there"
                        .into(),
                )
            }
            Some(u) => Some(pct_decode(u)?),
        };
        let export = pct_decode(path)?;

        let mut seen: Vec<String> = Vec::new();
        let mut socket = None;
        let mut certificates = None;
        let mut psk_file = None;
        let mut verify_peer = None;
        let mut hostname = None;
        let mut tls_type = None;
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let (k, v) = (pct_decode(k)?, pct_decode(v)?);
            if k.starts_with("x-") {
                continue;
            }
            if seen.contains(&k) {
                return Err(format!("'{k}' is given twice").into());
            }
            let nonempty = |v: &str| {
                if v.is_empty() {
                    Err(Problem(format!("'{k}=' needs a value")))
                } else {
                    Ok(v.to_string())
                }
            };
            match k.as_str() {
                "socket" => socket = Some(nonempty(&v)?),
                "tls-certificates" => certificates = Some(PathBuf::from(nonempty(&v)?)),
                "tls-psk-file" => psk_file = Some(PathBuf::from(nonempty(&v)?)),
                "tls-hostname" => hostname = Some(nonempty(&v)?),
                "tls-verify-peer" => {
                    verify_peer = Some(parse_on_off(&v).ok_or_else(|| {
                        format!("tls-verify-peer={v}: expected 0 or 1 (or false, true)")
                    })?)
                }
                "tls-type" => tls_type = Some(nonempty(&v)?),
                _ => {
                    return Err(format!(
                        "unknown query parameter '{k}' (known: {KNOWN}; the PSK identity is the user part, nbds://NAME@HOST/...)"
                    ).into())
                }
            }
            if !tls && k.starts_with("tls-") {
                return Err(format!(
                    "'{k}' needs an nbds:// or nbds+unix:// URI (with {scheme}:// the connection would not be encrypted)"
                ).into());
            }
            seen.push(k);
        }

        let addr = if unix {
            if !hostport.is_empty() {
                return Err(format!(
                    "a Unix-socket URI takes no host ('{hostport}'): {scheme}:///EXPORT?socket=PATH"
                )
                .into());
            }
            let socket = socket.ok_or(
                "a Unix-socket NBD URI needs ?socket=PATH (nbd+unix:///EXPORT?socket=/tmp/nbd.sock)",
            )?;
            if socket.contains('\0') {
                return Err("abstract Unix sockets (socket=%00...) are not supported".into());
            }
            NbdAddr::Unix(PathBuf::from(socket))
        } else {
            if socket.is_some() {
                return Err(format!(
                    "socket= is for nbd+unix:// and nbds+unix:// URIs, not {scheme}://"
                )
                .into());
            }
            NbdAddr::Tcp(tcp_addr(hostport)?)
        };

        let tls = if tls {
            match tls_type.as_deref() {
                None => {}
                Some("x509") if psk_file.is_some() => {
                    return Err("tls-type=x509 with tls-psk-file".into())
                }
                Some("psk") if psk_file.is_none() => {
                    return Err("tls-type=psk needs tls-psk-file=FILE".into())
                }
                Some("x509") | Some("psk") => {}
                Some("anon") => {
                    return Err("tls-type=anon: anonymous TLS is not supported (use certificates or a pre-shared key)".into())
                }
                Some(t) => return Err(format!("tls-type={t}: expected x509 or psk").into()),
            }
            if certificates.is_some() && psk_file.is_some() {
                return Err(
                    "tls-certificates and tls-psk-file together: a connection uses one or the other"
                        .into(),
                );
            }
            Some(TlsParams {
                certificates,
                psk_file,
                username,
                verify_peer: verify_peer.unwrap_or(true),
                hostname,
            })
        } else {
            None
        };
        Ok(NbdUri { addr, export, tls })
    }
}

/// The URI again, percent-encoded where needed, so that it parses back.
impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let user = match self.tls.as_ref().and_then(|t| t.username.as_deref()) {
            Some(u) => format!("{}@", pct_encode(u, "")),
            None => String::new(),
        };
        let export = pct_encode(&self.export, "/:@!$'()*+,;=");
        let value = |p: &std::path::Path| pct_encode(&p.to_string_lossy(), "/:@,");
        let mut params = Vec::new();
        match &self.addr {
            NbdAddr::Tcp(a) => write!(f, "nbd{s}://{user}{a}/{export}")?,
            NbdAddr::Unix(p) => {
                write!(f, "nbd{s}+unix://{user}/{export}")?;
                params.push(format!("socket={}", value(p)));
            }
        }
        if let Some(t) = &self.tls {
            if let Some(d) = &t.certificates {
                params.push(format!("tls-certificates={}", value(d)));
            }
            if let Some(p) = &t.psk_file {
                params.push(format!("tls-psk-file={}", value(p)));
            }
            if let Some(h) = &t.hostname {
                params.push(format!("tls-hostname={}", pct_encode(h, "")));
            }
            if !t.verify_peer {
                params.push("tls-verify-peer=0".into());
            }
        }
        if !params.is_empty() {
            write!(f, "?{}", params.join("&"))?;
        }
        Ok(())
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
        assert_eq!(u.tls, None);
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
        assert_eq!(u.addr.host(), Some("::1"));
        let u = NbdUri::parse("nbd://example.com//disk").unwrap();
        assert_eq!(u.export, "/disk");
        assert!(NbdUri::parse("nbd+unix:///x")
            .unwrap_err()
            .to_string()
            .contains("socket"));
        assert!(NbdUri::parse("http://x").is_err());
        assert!(NbdUri::parse("nbd:///x").is_err());
    }

    #[test]
    fn tls_uris_parse() {
        let u =
            NbdUri::parse("nbds://lab-03@disks.lab/desktop?tls-psk-file=/k/lab%2003.psk").unwrap();
        assert_eq!(u.addr, NbdAddr::Tcp("disks.lab:10809".into()));
        assert_eq!(u.addr.host(), Some("disks.lab"));
        assert_eq!(u.export, "desktop");
        let t = u.tls.clone().unwrap();
        assert_eq!(t.username.as_deref(), Some("lab-03"));
        assert_eq!(t.psk_file, Some(PathBuf::from("/k/lab 03.psk")));
        assert!(t.verify_peer && t.certificates.is_none());
        // Display round-trips.
        assert_eq!(NbdUri::parse(&u.to_string()).unwrap(), u);
        let odd = NbdUri::parse("nbds://a%40b@h/x%3Fy%26z%20w?tls-psk-file=%26%3D%25").unwrap();
        assert_eq!(odd.export, "x?y&z w");
        assert_eq!(NbdUri::parse(&odd.to_string()).unwrap(), odd);

        let u = NbdUri::parse(
            "nbds+unix://alice@/vm?socket=/run/s.sock&tls-certificates=certs&tls-verify-peer=false&x-debug=1",
        )
        .unwrap();
        assert_eq!(u.addr, NbdAddr::Unix("/run/s.sock".into()));
        let t = u.tls.clone().unwrap();
        assert_eq!(t.certificates, Some(PathBuf::from("certs")));
        assert!(!t.verify_peer);
        assert_eq!(NbdUri::parse(&u.to_string()).unwrap(), u);
        let u = NbdUri::parse("nbds://h:1/?tls-hostname=disks.lab&tls-type=x509").unwrap();
        assert_eq!(u.tls.unwrap().hostname.as_deref(), Some("disks.lab"));
        // A user name on a plain URI is harmless (libnbd ignores it too).
        assert!(NbdUri::parse("nbd://c1@127.0.0.1:5/g")
            .unwrap()
            .tls
            .is_none());
        assert!(NbdUri::is_uri("nbds://h/x") && NbdUri::is_uri("nbds+unix:///?socket=s"));
    }

    /// Hostile or mistaken URIs are refused, each with its reason.
    #[test]
    fn hostile_uris_are_refused_with_a_reason() {
        for (uri, why) in [
            ("nbd://h/x?tls-psk-file=k", "would not be encrypted"),
            (
                "nbd+unix:///x?socket=s&tls-certificates=d",
                "would not be encrypted",
            ),
            ("nbds://h/x?tls-psk-file=a&tls-psk-file=b", "twice"),
            ("nbds://h/x?socket=/s", "socket= is for"),
            ("nbds+unix://host/x?socket=/s", "no host"),
            ("nbds://h/x?tls-username=bob", "unknown query parameter"),
            ("nbds://h/x?tls-verify-peer=maybe", "expected 0 or 1"),
            ("nbds://h/x?tls-type=anon", "anonymous"),
            ("nbds://h/x?tls-type=psk", "needs tls-psk-file"),
            (
                "nbds://h/x?tls-certificates=d&tls-psk-file=k",
                "one or the other",
            ),
            ("nbds://u:pw@h/x", "password"),
            ("nbds://a@b@h/x", "second '@'"),
            ("nbds://@h/x", "empty user"),
            ("nbds:///x", "no host"),
            ("nbds://h:0/x", "not a port"),
            ("nbds://h:99999/x", "not a port"),
            ("nbds://h:+80/x", "not a port"),
            ("nbds://::1/x", "brackets"),
            ("nbds://[::1/x", "closing"),
            ("nbds://[zz]:1/x", "not an IPv6"),
            ("nbds://[::1]x/x", "junk"),
            ("nbds://h%2Fx/y", "not a host"),
            ("nbds://h/x%zz", "percent"),
            ("nbds://h/x%", "percent"),
            ("nbds://h/x%ff", "UTF-8"),
            ("nbds://h/x y", "percent-encode"),
            ("nbds://h/x\n", "percent-encode"),
            ("nbds://h/x#frag", "fragment"),
            ("nbds+unix:///x?socket=", "needs a value"),
            ("nbds+unix:///x?socket=%00abs", "abstract"),
            ("nbd+vsock:///", "AF_VSOCK"),
            ("nbdx://h/", "not an NBD URI scheme"),
            ("nbds:h/x", "not an NBD URI"),
        ] {
            let e = NbdUri::parse(uri).expect_err(uri).to_string();
            assert!(e.contains(why), "{uri}: {e}");
            assert!(e.contains(&format!("'{uri}'")), "{uri}: names the URI: {e}");
        }
    }
}
