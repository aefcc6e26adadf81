//! TLS for NBD's STARTTLS, with X.509 certificates or pre-shared keys.
//!
//! OpenSSL rather than rustls: rustls has no server-side support for
//! external pre-shared keys, and qemu, libnbd and nbdkit all offer PSK
//! (GnuTLS `psktool` key files), so PSK interop needs OpenSSL.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use openssl::ex_data::Index;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslAcceptor, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslRef, SslVerifyMode,
    SslVersion,
};
use openssl::x509::X509Ref;

use crate::access::TlsPeer;
use crate::stream::BoxStream;

/// Where the PSK callback notes the identity a client claimed, so that a
/// failed handshake (wrong key) can still be logged with it.
fn psk_index() -> Index<Ssl, String> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// How TLS is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused.
    Off,
    /// Clients may upgrade; plain clients are served too.
    Optional,
    /// Every option but STARTTLS and ABORT is refused until TLS is up.
    Require,
}

impl FromStr for TlsMode {
    type Err = TlsError;

    /// `off`, `on` (clients may upgrade) or `require`, as `--tls` and a
    /// config file's `tls` key give it.
    fn from_str(s: &str) -> Result<TlsMode, TlsError> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::Optional),
            "require" => Ok(TlsMode::Require),
            other => Err(TlsError::BadMode(other.to_string())),
        }
    }
}

impl TlsMode {
    /// The TLS policy of every roamdisk NBD server, in one place.
    ///
    /// Credentials are a certificate with its key, or a PSK file (or
    /// both); a certificate without its key, or a key without its
    /// certificate, is an error that says what to add. With no mode asked
    /// for, TLS is required when there are credentials and off when there
    /// are none; `on` and `require` need credentials. Returns the mode and,
    /// unless it is off, the acceptor built from the credentials.
    pub fn resolve(
        requested: Option<TlsMode>,
        creds: &TlsOptions,
    ) -> Result<(TlsMode, Option<TlsAcceptor>), TlsError> {
        creds.check_pairs()?;
        let mode = requested.unwrap_or(if creds.has_credentials() {
            TlsMode::Require
        } else {
            TlsMode::Off
        });
        if mode == TlsMode::Off {
            return Ok((mode, None));
        }
        Ok((mode, Some(TlsAcceptor::new(creds)?)))
    }
}

/// Why TLS cannot be set up, saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Not a TLS mode.
    #[error("--tls must be off, on or require, not '{0}'")]
    BadMode(String),
    /// A key without the certificate it belongs to.
    #[error("a TLS key needs its certificate: add --tls-cert (tls-cert in a config file), or drop the key")]
    KeyWithoutCert,
    /// A certificate without its private key.
    #[error("a TLS certificate needs its private key: add --tls-key (tls-key in a config file)")]
    CertWithoutKey,
    /// TLS asked for, but no credentials.
    #[error("TLS needs --tls-cert and --tls-key, or --tls-psk")]
    NoCredentials,
    /// The PSK file cannot be read.
    #[error("cannot read PSK file {}: {detail}", path.display())]
    PskUnreadable {
        path: PathBuf,
        detail: std::io::Error,
    },
    /// A line of the PSK file is malformed.
    #[error("{}:{line}: {problem}", path.display())]
    PskLine {
        path: PathBuf,
        line: usize,
        problem: &'static str,
    },
    /// The PSK file has no key in it.
    #[error("PSK file {} holds no keys", path.display())]
    PskEmpty { path: PathBuf },
    /// OpenSSL refused a file (certificate, key, CA) or a setting.
    #[error("{what}: {detail}")]
    Ssl {
        what: String,
        detail: openssl::error::ErrorStack,
    },
}

/// What TLS credentials to use.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
    /// PEM CA bundle: when set, clients must present a certificate it signed.
    pub verify_ca: Option<PathBuf>,
    /// GnuTLS psktool key file (`identity:hexkey` per line).
    pub psk_file: Option<PathBuf>,
}

impl TlsOptions {
    /// A certificate with its key, or a PSK file.
    pub fn has_credentials(&self) -> bool {
        (self.cert.is_some() && self.key.is_some()) || self.psk_file.is_some()
    }

    /// A certificate and a key come together or not at all.
    fn check_pairs(&self) -> Result<(), TlsError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(TlsError::CertWithoutKey),
            (None, Some(_)) => Err(TlsError::KeyWithoutCert),
            _ => Ok(()),
        }
    }
}

/// A configured TLS server context.
#[derive(Clone)]
pub struct TlsAcceptor {
    ctx: SslContext,
    /// The PSK file and its keys as last read (the handshake callback
    /// reads them here, so [`TlsAcceptor::reload_psk`] takes effect for
    /// the next handshake).
    psk: Option<(PathBuf, Arc<RwLock<PskKeys>>)>,
}

/// The server's certificate chain and key (checked to match), and, with
/// a CA, client certificates verified against it in `verify` mode.
fn load_identity(
    b: &mut SslContextBuilder,
    cert: &Path,
    key: &Path,
    verify_ca: Option<&Path>,
    verify: SslVerifyMode,
) -> Result<(), TlsError> {
    b.set_certificate_chain_file(cert)
        .map_err(|e| ssl_err(&format!("certificate {}", cert.display()), e))?;
    b.set_private_key_file(key, SslFiletype::PEM)
        .map_err(|e| ssl_err(&format!("key {}", key.display()), e))?;
    b.check_private_key()
        .map_err(|e| ssl_err("the key does not match the certificate", e))?;
    if let Some(ca) = verify_ca {
        b.set_ca_file(ca)
            .map_err(|e| ssl_err(&format!("CA {}", ca.display()), e))?;
        b.set_verify(verify);
    }
    Ok(())
}

/// The keys of a GnuTLS psktool file (`identity:hexkey` per line), by
/// identity; the server reads all of them, a client the line of its own.
/// The keys of a PSK file, by identity.
pub(crate) type PskKeys = HashMap<Vec<u8>, Vec<u8>>;

pub(crate) fn read_psk_file(path: &Path) -> Result<PskKeys, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|detail| TlsError::PskUnreadable {
        path: path.to_path_buf(),
        detail,
    })?;
    let bad = |i: usize, problem| TlsError::PskLine {
        path: path.to_path_buf(),
        line: i + 1,
        problem,
    };
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, hex) = line
            .split_once(':')
            .ok_or_else(|| bad(i, "expected IDENTITY:HEXKEY (as written by psktool)"))?;
        let key = decode_hex(hex.trim()).ok_or_else(|| bad(i, "key is not hexadecimal"))?;
        if key.is_empty() || key.len() > 256 {
            return Err(bad(i, "key must be 1 to 256 bytes"));
        }
        keys.insert(id.as_bytes().to_vec(), key);
    }
    if keys.is_empty() {
        return Err(TlsError::PskEmpty {
            path: path.to_path_buf(),
        });
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn ssl_err(what: &str, detail: openssl::error::ErrorStack) -> TlsError {
    TlsError::Ssl {
        what: what.to_string(),
        detail,
    }
}

/// Answer a PSK client from `keys`, noting the identity it claimed.
/// A server context for PSK clients (TLS 1.2 at least) and the keys of
/// the PSK file `psk`, for [`install_psk`] once the context is set up.
fn psk_context(psk: &Path) -> Result<(SslContextBuilder, PskKeys), TlsError> {
    let keys = read_psk_file(psk)?;
    let mut b =
        SslContextBuilder::new(SslMethod::tls_server()).map_err(|e| ssl_err("TLS setup", e))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| ssl_err("TLS setup", e))?;
    Ok((b, keys))
}

fn install_psk(b: &mut SslContextBuilder, keys: Arc<RwLock<PskKeys>>) {
    b.set_psk_server_callback(move |ssl, identity, out| {
        if let Some(id) = identity {
            ssl.set_ex_data(psk_index(), String::from_utf8_lossy(id).into_owned());
        }
        let keys = keys.read();
        let Some(key) = identity.and_then(|id| keys.get(id)) else {
            return Ok(0);
        };
        if key.len() > out.len() {
            return Ok(0);
        }
        out[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
}

fn cert_cn(cert: &X509Ref) -> Option<String> {
    let e = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next()?;
    e.data().to_string().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a finished handshake proved about the client.
fn tls_peer(ssl: &SslRef) -> TlsPeer {
    let cert = ssl.peer_certificate();
    TlsPeer {
        cert_cn: cert.as_deref().and_then(cert_cn),
        cert_sha256: cert
            .as_deref()
            .and_then(|c| c.digest(MessageDigest::sha256()).ok())
            .map(|d| hex(&d)),
        psk_identity: ssl.ex_data(psk_index()).cloned(),
    }
}

impl TlsAcceptor {
    /// Build a context from certificate files or a PSK file.
    pub fn new(o: &TlsOptions) -> Result<Self, TlsError> {
        type Shared = Option<(PathBuf, Arc<RwLock<PskKeys>>)>;
        let (mut b, shared): (SslContextBuilder, Shared) = match (&o.cert, &o.key, &o.psk_file) {
            (Some(cert), Some(key), None) => {
                let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
                    .map_err(|e| ssl_err("TLS setup", e))?;
                load_identity(
                    &mut b,
                    cert,
                    key,
                    o.verify_ca.as_deref(),
                    SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
                )?;
                let built: SslAcceptor = b.build();
                return Ok(TlsAcceptor {
                    ctx: built.into_context(),
                    psk: None,
                });
            }
            (None, None, Some(psk)) => {
                let (mut b, keys) = psk_context(psk)?;
                b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK:!aNULL:!eNULL:!MD5:!RC4:!3DES")
                    .map_err(|e| ssl_err("PSK ciphers", e))?;
                let keys = Arc::new(RwLock::new(keys));
                install_psk(&mut b, keys.clone());
                (b, Some((psk.clone(), keys)))
            }
            (Some(cert), Some(key), Some(psk)) => {
                // Certificates and PSK on one listener (the multi-client
                // server: some clients have certificates, some keys). A
                // client certificate is asked for but not required by TLS:
                // a PSK client has none, and the caller's access control
                // refuses a client that proved neither.
                let (mut b, keys) = psk_context(psk)?;
                b.set_max_proto_version(Some(SslVersion::TLS1_2))
                    .map_err(|e| ssl_err("TLS setup", e))?;
                b.set_cipher_list(
                    "ECDHE-PSK:DHE-PSK:PSK:ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!RC4:!3DES",
                )
                .map_err(|e| ssl_err("TLS ciphers", e))?;
                load_identity(
                    &mut b,
                    cert,
                    key,
                    o.verify_ca.as_deref(),
                    SslVerifyMode::PEER,
                )?;
                b.set_options(openssl::ssl::SslOptions::CIPHER_SERVER_PREFERENCE);
                let keys = Arc::new(RwLock::new(keys));
                install_psk(&mut b, keys.clone());
                (b, Some((psk.clone(), keys)))
            }
            (Some(_), None, _) => return Err(TlsError::CertWithoutKey),
            (None, Some(_), _) => return Err(TlsError::KeyWithoutCert),
            (None, None, None) => return Err(TlsError::NoCredentials),
        };
        b.set_session_id_context(b"roamdisk")
            .map_err(|e| ssl_err("TLS setup", e))?;
        Ok(TlsAcceptor {
            ctx: b.build(),
            psk: shared,
        })
    }

    /// Read the PSK file again: the next handshakes use its keys (a key
    /// removed from it no longer completes one). Returns how many keys it
    /// holds; on an error the keys read before stay in use. Nothing to do
    /// (`Ok(None)`) without a PSK file.
    pub fn reload_psk(&self) -> Result<Option<usize>, TlsError> {
        let Some((path, keys)) = &self.psk else {
            return Ok(None);
        };
        let fresh = read_psk_file(path)?;
        let n = fresh.len();
        *keys.write() = fresh;
        Ok(Some(n))
    }
}

/// Run the server side of a TLS handshake over `s`; returns the stream
/// and what the client proved. A failure names the PSK identity the
/// client claimed, if any.
pub async fn accept(a: &TlsAcceptor, s: BoxStream) -> std::io::Result<(BoxStream, TlsPeer)> {
    let ssl = Ssl::new(&a.ctx).map_err(std::io::Error::other)?;
    let mut st = tokio_openssl::SslStream::new(ssl, s).map_err(std::io::Error::other)?;
    if let Err(e) = Pin::new(&mut st).accept().await {
        // What OpenSSL says of an identity it has no key for depends on the
        // other credentials (with a certificate too: "no suitable signature
        // algorithm"): say it plainly.
        let claimed = st.ssl().ex_data(psk_index()).cloned();
        let known = |id: &str| {
            a.psk
                .as_ref()
                .is_some_and(|(_, keys)| keys.read().contains_key(id.as_bytes()))
        };
        // The connection ending mid-handshake (a reset, an EOF) says
        // nothing of the key.
        let cut = e.io_error().is_some()
            || matches!(
                e.code(),
                openssl::ssl::ErrorCode::SYSCALL | openssl::ssl::ErrorCode::ZERO_RETURN
            );
        let why = match claimed {
            Some(id) if !known(&id) => format!(
                "TLS handshake failed: unknown PSK identity '{id}' (no key for it in the PSK file)"
            ),
            Some(id) if cut => format!(
                "TLS handshake with PSK identity '{id}' cut short: the connection ended ({e})"
            ),
            Some(id) => format!(
                "TLS handshake failed (PSK identity '{id}': the client's key is not the one in the PSK file, or {e})"
            ),
            None => format!("TLS handshake failed: {e}"),
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ));
    }
    let who = tls_peer(st.ssl());
    Ok((Box::new(st), who))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_file_parses_and_rejects_garbage() {
        let (_d, p) = roamdisk_blockdev::testkit::scratch("k.psk");
        std::fs::write(&p, "alice:0123abcd\n").unwrap();
        assert_eq!(
            read_psk_file(&p).unwrap()[b"alice".as_slice()],
            vec![0x01, 0x23, 0xab, 0xcd]
        );
        std::fs::write(&p, "alice:xyz\n").unwrap();
        assert!(read_psk_file(&p).is_err());
        std::fs::write(&p, "\n").unwrap();
        assert!(read_psk_file(&p).is_err());
    }

    #[test]
    fn one_policy_credentials_are_a_certificate_with_its_key_or_a_psk_file() {
        let (d, psk) = roamdisk_blockdev::testkit::scratch("k.psk");
        std::fs::write(&psk, "alice:0123abcd\n").unwrap();
        let file = |n: &str| Some(d.path().join(n));
        // Nothing asked, nothing given: off.
        let (mode, acc) = TlsMode::resolve(None, &TlsOptions::default()).unwrap();
        assert_eq!(mode, TlsMode::Off);
        assert!(acc.is_none());
        // A PSK file is a credential: TLS is required.
        let creds = TlsOptions {
            psk_file: Some(psk.clone()),
            ..TlsOptions::default()
        };
        let (mode, acc) = TlsMode::resolve(None, &creds).unwrap();
        assert_eq!(mode, TlsMode::Require);
        assert!(acc.is_some());
        assert_eq!(
            TlsMode::resolve(Some(TlsMode::Off), &creds).unwrap().0,
            TlsMode::Off
        );
        // A key alone, or a certificate alone, says what to add.
        for (creds, want) in [
            (
                TlsOptions {
                    key: file("k.pem"),
                    ..TlsOptions::default()
                },
                "add --tls-cert",
            ),
            (
                TlsOptions {
                    cert: file("c.pem"),
                    psk_file: Some(psk.clone()),
                    ..TlsOptions::default()
                },
                "add --tls-key",
            ),
        ] {
            for requested in [None, Some(TlsMode::Off), Some(TlsMode::Require)] {
                let e = TlsMode::resolve(requested, &creds).err().unwrap();
                assert!(e.to_string().contains(want), "{e}");
            }
        }
        // TLS asked for without credentials.
        let e = TlsMode::resolve(Some(TlsMode::Optional), &TlsOptions::default())
            .err()
            .unwrap();
        assert!(matches!(e, TlsError::NoCredentials), "{e}");
        assert_eq!("on".parse::<TlsMode>().unwrap(), TlsMode::Optional);
        assert!("maybe"
            .parse::<TlsMode>()
            .unwrap_err()
            .to_string()
            .contains("off, on or require"));
    }
}
