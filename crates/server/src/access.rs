//! Who a connection is ([`identify`]) and what a client may open
//! ([`Grant`]).

use roamdisk_nbd::Peer;

use crate::config::{normalize_fingerprint, ClientConfig, ServerConfig};

/// How a client may open an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The golden image under the client's own copy-on-write overlay.
    View,
    /// The golden image itself, read-only.
    ReadOnly,
}

/// The configured client `peer` proved to be, if any. TLS identities count
/// only on a TLS session; a uid only on the Unix socket. A certificate
/// name counts only because the server verified the certificate against
/// `tls-verify-ca` (the config refuses `cert-cn` without it).
pub fn identify<'a>(cfg: &'a ServerConfig, peer: &Peer) -> Option<&'a ClientConfig> {
    if let Some(t) = &peer.tls {
        let fp = t.cert_sha256.as_deref();
        let found = cfg.client.iter().find(|c| {
            let by_fp = matches!((&c.cert_sha256, fp), (Some(want), Some(got)) if normalize_fingerprint(want) == got);
            let by_cn = c.cert_cn.is_some() && c.cert_cn == t.cert_cn;
            let by_psk = c.psk_identity.is_some() && c.psk_identity == t.psk_identity;
            by_fp || by_cn || by_psk
        });
        if found.is_some() {
            return found;
        }
    }
    if peer.unix {
        if let Some(uid) = peer.uid {
            return cfg.client.iter().find(|c| c.uid == Some(uid));
        }
    }
    None
}

/// How `client` may open `image`, if at all.
pub fn grant(client: &ClientConfig, image: &str) -> Option<Grant> {
    if client.view.iter().any(|n| n == image) {
        Some(Grant::View)
    } else if client.read_only.iter().any(|n| n == image) {
        Some(Grant::ReadOnly)
    } else {
        None
    }
}

/// Everything `client` may open, in the order of the file: views first.
pub fn grants(client: &ClientConfig) -> impl Iterator<Item = (&str, Grant)> {
    client.view.iter().map(|n| (n.as_str(), Grant::View)).chain(
        client
            .read_only
            .iter()
            .map(|n| (n.as_str(), Grant::ReadOnly)),
    )
}
