//! The chunk server's TLS (rustls, the ring provider): its certificate
//! chain and private key from PEM files, TLS 1.2 and 1.3, HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

use roamdisk_blockdev::Result;
use roamdisk_chunkstore::error::bad_arg;

/// The server's certificate chain and key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate, then any intermediate certificates.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

fn unreadable(what: &str, path: &Path, e: impl std::fmt::Display) -> roamdisk_blockdev::Error {
    bad_arg(format!("cannot read the {what} {}: {e}", path.display())).path(path)
}

/// The rustls configuration for `files`.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<std::result::Result<_, _>>())
        .map_err(|e| unreadable("certificate", &files.cert, e))?;
    if certs.is_empty() {
        return Err(unreadable(
            "certificate",
            &files.cert,
            "no CERTIFICATE in it (PEM expected)",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| unreadable("private key", &files.key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad_arg(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            bad_arg(format!(
                "the certificate {} and key {} do not go together: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
