//! TLS for NBD's STARTTLS, with X.509 certificates or pre-shared keys.
//!
//! OpenSSL rather than rustls: rustls has no server-side support for
//! external pre-shared keys, and qemu, libnbd and nbdkit all offer PSK
//! (GnuTLS `psktool` key files), so PSK interop needs OpenSSL.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;

use openssl::ex_data::Index;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslAcceptor, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslRef, SslVerifyMode,
    SslVersion,
};
use openssl::x509::X509Ref;

use crate::access::TlsPeer;
use crate::server::BoxStream;

/// Where the PSK callback notes the identity a client claimed, so that a
/// failed handshake (wrong key) can still be logged with it.
fn psk_index() -> Index<Ssl, String> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
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

/// A configured TLS server context.
#[derive(Clone)]
pub struct TlsAcceptor {
    ctx: SslContext,
}

/// The server's certificate chain and key (checked to match), and, with
/// a CA, client certificates verified against it in `verify` mode.
fn load_identity(
    b: &mut SslContextBuilder,
    cert: &Path,
    key: &Path,
    verify_ca: Option<&Path>,
    verify: SslVerifyMode,
) -> Result<(), String> {
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
pub(crate) fn read_psk_file(path: &Path) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read PSK file {}: {e}", path.display()))?;
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, hex) = line.split_once(':').ok_or_else(|| {
            format!(
                "{}:{}: expected IDENTITY:HEXKEY (as written by psktool)",
                path.display(),
                i + 1
            )
        })?;
        let key = decode_hex(hex.trim())
            .ok_or_else(|| format!("{}:{}: key is not hexadecimal", path.display(), i + 1))?;
        if key.is_empty() || key.len() > 256 {
            return Err(format!(
                "{}:{}: key must be 1 to 256 bytes",
                path.display(),
                i + 1
            ));
        }
        keys.insert(id.as_bytes().to_vec(), key);
    }
    if keys.is_empty() {
        return Err(format!("PSK file {} holds no keys", path.display()));
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

fn ssl_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Answer a PSK client from `keys`, noting the identity it claimed.
fn install_psk(b: &mut SslContextBuilder, keys: HashMap<Vec<u8>, Vec<u8>>) {
    b.set_psk_server_callback(move |ssl, identity, out| {
        if let Some(id) = identity {
            ssl.set_ex_data(psk_index(), String::from_utf8_lossy(id).into_owned());
        }
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
    pub fn new(o: &TlsOptions) -> Result<Self, String> {
        let mut b: SslContextBuilder = match (&o.cert, &o.key, &o.psk_file) {
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
                });
            }
            (None, None, Some(psk)) => {
                let keys = read_psk_file(psk)?;
                let mut b = SslContextBuilder::new(SslMethod::tls_server())
                    .map_err(|e| ssl_err("TLS setup", e))?;
                b.set_min_proto_version(Some(SslVersion::TLS1_2))
                    .map_err(|e| ssl_err("TLS setup", e))?;
                b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK:!aNULL:!eNULL:!MD5:!RC4:!3DES")
                    .map_err(|e| ssl_err("PSK ciphers", e))?;
                install_psk(&mut b, keys);
                b
            }
            (Some(cert), Some(key), Some(psk)) => {
                // Certificates and PSK on one listener (the multi-client
                // server: some clients have certificates, some keys). A
                // client certificate is asked for but not required by TLS:
                // a PSK client has none, and the caller's access control
                // refuses a client that proved neither.
                let keys = read_psk_file(psk)?;
                let mut b = SslContextBuilder::new(SslMethod::tls_server())
                    .map_err(|e| ssl_err("TLS setup", e))?;
                b.set_min_proto_version(Some(SslVersion::TLS1_2))
                    .map_err(|e| ssl_err("TLS setup", e))?;
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
                install_psk(&mut b, keys);
                b
            }
            (Some(_), None, _) | (None, Some(_), _) => {
                return Err(
                    "TLS needs both a certificate (--tls-cert) and its key (--tls-key)".into(),
                )
            }
            (None, None, None) => {
                return Err("TLS needs --tls-cert and --tls-key, or --tls-psk".into())
            }
        };
        b.set_session_id_context(b"roamdisk")
            .map_err(|e| ssl_err("TLS setup", e))?;
        Ok(TlsAcceptor { ctx: b.build() })
    }
}

/// Run the server side of a TLS handshake over `s`; returns the stream
/// and what the client proved. A failure names the PSK identity the
/// client claimed, if any.
pub async fn accept(a: &TlsAcceptor, s: BoxStream) -> std::io::Result<(BoxStream, TlsPeer)> {
    let ssl = Ssl::new(&a.ctx).map_err(std::io::Error::other)?;
    let mut st = tokio_openssl::SslStream::new(ssl, s).map_err(std::io::Error::other)?;
    if let Err(e) = Pin::new(&mut st).accept().await {
        let claimed = match st.ssl().ex_data(psk_index()) {
            Some(id) => format!(" (PSK identity '{id}')"),
            None => String::new(),
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("TLS handshake failed{claimed}: {e}"),
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
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k.psk");
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
}
