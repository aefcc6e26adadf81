//! Who a connection is ([`identify`]) and what a client may open
//! ([`Grant`], [`views_of`]).

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

/// Why a client's views cannot be worked on (`server reset`, `server
/// promote`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("no [[client]] named '{0}' in the config")]
    NoClient(String),
    #[error("client '{client}' has '{image}' read-only: it has no view of it")]
    ReadOnly { client: String, image: String },
    #[error("client '{client}' has no grant for an image '{image}'")]
    NoGrant { client: String, image: String },
}

/// The images whose views of `client` to work on: `image` (which the
/// client must have as a view), or all its views.
pub fn views_of(
    cfg: &ServerConfig,
    client: &str,
    image: Option<&str>,
) -> Result<Vec<String>, GrantError> {
    let c = cfg
        .client(client)
        .ok_or_else(|| GrantError::NoClient(client.to_string()))?;
    let Some(im) = image else {
        return Ok(c.view.clone());
    };
    let named = || (client.to_string(), im.to_string());
    match grant(c, im) {
        Some(Grant::View) => Ok(vec![im.to_string()]),
        Some(Grant::ReadOnly) => {
            let (client, image) = named();
            Err(GrantError::ReadOnly { client, image })
        }
        None => {
            let (client, image) = named();
            Err(GrantError::NoGrant { client, image })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_nbd::TlsPeer;

    const FP: &str = "de7c8accfe6ba1ef9587ccf7e0fcad818c5aed6fe87e3fa74984a64a57a3376e";

    fn cfg() -> ServerConfig {
        ServerConfig::parse(&format!(
            r#"format = "roamdisk-server"
version = 1
state = "/s"
socket = "/s.sock"
tls-cert = "c"
tls-key = "k"
tls-verify-ca = "ca"
tls-psk = "p"
[[image]]
name = "a"
stack = "mem:1M"
[[image]]
name = "b"
stack = "mem:1M"
[[client]]
name = "alice"
cert-cn = "alice"
uid = 1000
view = ["a"]
read-only = ["b"]
[[client]]
name = "bob"
cert-sha256 = "{}"
[[client]]
name = "carol"
psk-identity = "carol"
"#,
            FP.to_uppercase()
                .as_bytes()
                .chunks(2)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect::<Vec<_>>()
                .join(":")
        ))
        .unwrap()
    }

    fn tls(cn: Option<&str>, fp: Option<&str>, psk: Option<&str>) -> Peer {
        Peer {
            addr: "10.0.0.1:5".into(),
            unix: false,
            uid: None,
            tls: Some(TlsPeer {
                cert_cn: cn.map(Into::into),
                cert_sha256: fp.map(Into::into),
                psk_identity: psk.map(Into::into),
            }),
        }
    }

    fn who(cfg: &ServerConfig, p: &Peer) -> Option<String> {
        identify(cfg, p).map(|c| c.name.clone())
    }

    #[test]
    fn identities_match_only_what_they_prove() {
        let c = cfg();
        assert_eq!(
            who(&c, &tls(Some("alice"), Some("00"), None)).as_deref(),
            Some("alice")
        );
        // A fingerprint written with colons in upper case matches.
        assert_eq!(
            who(&c, &tls(Some("x"), Some(FP), None)).as_deref(),
            Some("bob")
        );
        assert_eq!(
            who(&c, &tls(None, None, Some("carol"))).as_deref(),
            Some("carol")
        );
        assert_eq!(who(&c, &tls(Some("mallory"), Some("00"), None)), None);
        assert_eq!(who(&c, &tls(None, None, None)), None);
        // A uid counts on the Unix socket only.
        let unix = Peer {
            addr: "unix".into(),
            unix: true,
            uid: Some(1000),
            tls: None,
        };
        assert_eq!(who(&c, &unix).as_deref(), Some("alice"));
        let tcp = Peer {
            unix: false,
            ..unix.clone()
        };
        assert_eq!(who(&c, &tcp), None);
        let stranger = Peer {
            uid: Some(1001),
            ..unix
        };
        assert_eq!(who(&c, &stranger), None);
        // Grants, views first.
        let alice = c.client("alice").unwrap();
        assert_eq!(grant(alice, "a"), Some(Grant::View));
        assert_eq!(grant(alice, "b"), Some(Grant::ReadOnly));
        assert_eq!(grant(c.client("bob").unwrap(), "a"), None);
        assert_eq!(
            grants(alice).map(|(n, _)| n).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[test]
    fn views_of_a_client_are_its_views_and_nothing_else() {
        let c = cfg();
        assert_eq!(views_of(&c, "alice", None).unwrap(), vec!["a".to_string()]);
        assert_eq!(
            views_of(&c, "alice", Some("a")).unwrap(),
            vec!["a".to_string()]
        );
        assert!(views_of(&c, "bob", None).unwrap().is_empty());
        for (client, image, want) in [
            ("alice", Some("b"), "read-only: it has no view"),
            ("bob", Some("a"), "no grant for an image 'a'"),
            ("dave", None, "no [[client]] named 'dave'"),
        ] {
            let e = views_of(&c, client, image).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
