//! The client side of STARTTLS: credentials from an `nbds://` URI's
//! parameters (a qemu/libnbd certificates folder, or a psktool key file
//! and an identity), loaded once per device and used for every
//! connection, reconnects included. OpenSSL, as the server ([`crate::tls`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use openssl::ssl::{
    HandshakeError, SslConnector, SslFiletype, SslMethod, SslStream, SslVerifyMode, SslVersion,
};
use openssl::x509::X509VerifyResult;
use roamdisk_blockdev::{Error, ErrorKind, Op, Result};

use super::sock::LAYER;
use super::uri::TlsParams;

/// How this client proves itself.
#[derive(Debug, Clone)]
enum Credential {
    /// X.509: the CA file the server's certificate must chain to (None:
    /// the system's trust store, or no check), and whether a client
    /// certificate is sent.
    X509 {
        ca: Option<PathBuf>,
        client_cert: bool,
    },
    Psk {
        identity: String,
        file: PathBuf,
    },
}

/// TLS settings ready to connect with.
#[derive(Clone)]
pub(super) struct ClientTls {
    connector: SslConnector,
    cred: Credential,
    verify_peer: bool,
    hostname: Option<String>,
}

fn err(kind: ErrorKind, m: impl Into<String>) -> Error {
    Error::new(kind, Op::Open, LAYER, m)
}

/// The login name, the PSK identity when the URI names none (the NBD
/// URI specification: "a local operating system credential").
fn login_name() -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data (integers and pointers); all zeroes is
    // a valid value, overwritten by getpwuid_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes only into `pw` and `buf` (of the length
    // given) and sets `out` to `&pw` or null; `pw_name` then points into
    // `buf`, which outlives the CStr read.
    unsafe {
        let rc = libc::getpwuid_r(
            libc::getuid(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        );
        if rc != 0 || out.is_null() || pw.pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(pw.pw_name)
            .to_str()
            .ok()
            .map(str::to_string)
    }
}

fn setup(e: impl std::fmt::Display) -> Error {
    err(ErrorKind::Io, format!("TLS setup: {e}"))
}

/// An existing file in the certificates folder, or None.
fn in_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = dir.join(name);
    p.is_file().then_some(p)
}

impl ClientTls {
    /// Load the credentials `p` names; every missing or malformed file is
    /// an error here, before any connection.
    pub(super) fn new(p: &TlsParams) -> Result<ClientTls> {
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(setup)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup)?;
        let cred = if let Some(file) = &p.psk_file {
            let identity = match &p.username {
                Some(u) => u.clone(),
                None => login_name().ok_or_else(|| {
                    err(
                        ErrorKind::InvalidArgument,
                        "tls-psk-file without an identity, and no login name to use: put it in the URI (nbds://NAME@HOST/EXPORT?tls-psk-file=FILE)",
                    )
                })?,
            };
            let keys = crate::tls::read_psk_file(file).map_err(|m| {
                let kind = if file.exists() {
                    ErrorKind::InvalidArgument
                } else {
                    ErrorKind::NotFound
                };
                err(kind, format!("tls-psk-file: {m}"))
            })?;
            let key = keys.get(identity.as_bytes()).cloned().ok_or_else(|| {
                err(
                    ErrorKind::NotFound,
                    format!(
                        "tls-psk-file {} has no key for identity '{identity}' (the identity is the URI's user part, nbds://{identity}@HOST/...; psktool -u {identity} -p FILE makes one)",
                        file.display()
                    ),
                )
            })?;
            // TLS 1.2's PSK suites, and TLS 1.3 (OpenSSL's PSK callback
            // works for both): the server offers what it offers.
            b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK:!aNULL:!eNULL:!MD5:!RC4:!3DES")
                .map_err(setup)?;
            // The key authenticates the server; there is no certificate.
            b.set_verify(SslVerifyMode::NONE);
            let id = identity.clone().into_bytes();
            b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
                if id.len() >= id_out.len() || key.len() > key_out.len() {
                    return Ok(0);
                }
                id_out[..id.len()].copy_from_slice(&id);
                id_out[id.len()] = 0;
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
            Credential::Psk {
                identity,
                file: file.clone(),
            }
        } else {
            let dir = p.certificates.as_deref();
            if let Some(d) = dir {
                if !d.is_dir() {
                    return Err(err(
                        ErrorKind::NotFound,
                        format!(
                            "tls-certificates={}: no such folder (it holds ca-cert.pem, and client-cert.pem + client-key.pem for a client certificate)",
                            d.display()
                        ),
                    ));
                }
            }
            let ca = dir.and_then(|d| in_dir(d, "ca-cert.pem"));
            if p.verify_peer {
                match (dir, &ca) {
                    (Some(d), None) => {
                        return Err(err(
                            ErrorKind::NotFound,
                            format!(
                                "{}/ca-cert.pem is missing: put there the CA certificate that signed the server's certificate (or tls-verify-peer=0 to skip the check)",
                                d.display()
                            ),
                        ))
                    }
                    (_, Some(ca)) => b.set_ca_file(ca).map_err(|e| {
                        err(
                            ErrorKind::InvalidArgument,
                            format!("{}: not a PEM CA certificate: {e}", ca.display()),
                        )
                    })?,
                    // No folder: the system's trust store (the builder's
                    // default paths).
                    (None, None) => {}
                }
            } else {
                b.set_verify(SslVerifyMode::NONE);
            }
            let cert = dir.and_then(|d| in_dir(d, "client-cert.pem"));
            let key = dir.and_then(|d| in_dir(d, "client-key.pem"));
            let client_cert = match (cert, key) {
                (Some(c), Some(k)) => {
                    b.set_certificate_chain_file(&c).map_err(|e| {
                        err(
                            ErrorKind::InvalidArgument,
                            format!("{}: not a PEM certificate: {e}", c.display()),
                        )
                    })?;
                    b.set_private_key_file(&k, SslFiletype::PEM).map_err(|e| {
                        err(
                            ErrorKind::InvalidArgument,
                            format!("{}: not a PEM private key: {e}", k.display()),
                        )
                    })?;
                    b.check_private_key().map_err(|_| {
                        err(
                            ErrorKind::InvalidArgument,
                            format!(
                                "{} is not the key of {}",
                                k.display(),
                                c.display()
                            ),
                        )
                    })?;
                    true
                }
                (None, None) => false,
                (Some(c), None) | (None, Some(c)) => {
                    return Err(err(
                        ErrorKind::NotFound,
                        format!(
                            "{} without its pair: a client certificate needs both client-cert.pem and client-key.pem",
                            c.display()
                        ),
                    ))
                }
            };
            Credential::X509 { ca, client_cert }
        };
        Ok(ClientTls {
            connector: b.build(),
            cred,
            verify_peer: p.verify_peer,
            hostname: p.hostname.clone(),
        })
    }

    /// Run the TLS handshake over `s`, a connection to `host` (None on a
    /// Unix socket) that has just had STARTTLS accepted.
    pub(super) fn handshake<S: Read + Write>(
        &self,
        s: S,
        host: Option<&str>,
    ) -> Result<SslStream<S>> {
        let cfg = self.connector.configure().map_err(setup)?;
        let name = self.hostname.as_deref().or(host);
        let check_name =
            self.verify_peer && name.is_some() && matches!(self.cred, Credential::X509 { .. });
        let ssl = cfg
            .verify_hostname(check_name)
            .use_server_name_indication(name.is_some())
            .into_ssl(name.unwrap_or(""))
            .map_err(setup)?;
        match ssl.connect(s) {
            Ok(st) => {
                tracing::debug!(
                    version = st.ssl().version_str(),
                    cipher = st.ssl().current_cipher().map_or("?", |c| c.name()),
                    "NBD TLS handshake done"
                );
                Ok(st)
            }
            Err(HandshakeError::SetupFailure(e)) => Err(setup(e)),
            Err(HandshakeError::Failure(mid)) => {
                Err(self.explain(mid.ssl().verify_result(), mid.error(), name))
            }
            Err(HandshakeError::WouldBlock(_)) => {
                Err(err(ErrorKind::Io, "TLS handshake: the socket would block"))
            }
        }
    }

    /// What a failed handshake means, and what to do about it.
    fn explain(
        &self,
        verify: X509VerifyResult,
        e: &openssl::ssl::Error,
        name: Option<&str>,
    ) -> Error {
        let detail = e.to_string();
        match &self.cred {
            Credential::Psk { identity, file } => err(
                ErrorKind::PermissionDenied,
                format!(
                    "the TLS-PSK handshake as identity '{identity}' failed ({detail}): the server does not know this identity or has another key for it; check the line for '{identity}' in {} against the server's PSK file",
                    file.display()
                ),
            ),
            Credential::X509 { ca, .. } if verify != X509VerifyResult::OK => {
                let against = match ca {
                    Some(ca) => format!("the CA in {}", ca.display()),
                    None => "the system's trusted CAs".to_string(),
                };
                let named = match name {
                    Some(n) => format!(" for '{n}'"),
                    None => String::new(),
                };
                err(
                    ErrorKind::PermissionDenied,
                    format!(
                        "the server's certificate{named} failed verification against {against}: {} (error {}); give the CA that signed it (tls-certificates=DIR with DIR/ca-cert.pem), make sure the certificate names the host you dial (or set tls-hostname=NAME), or, on a link you trust, tls-verify-peer=0",
                        verify.error_string(),
                        verify.as_raw(),
                    ),
                )
            }
            Credential::X509 { client_cert, .. } => {
                let hint = if *client_cert {
                    "the server may not accept this client certificate (signed by a CA it does not trust?)"
                } else {
                    "the server may require a client certificate: put client-cert.pem and client-key.pem in the tls-certificates folder"
                };
                err(
                    ErrorKind::PermissionDenied,
                    format!("the TLS handshake failed ({detail}): {hint}"),
                )
            }
        }
    }
}
