//! The hook a multi-client server uses to decide, per connection, which
//! exports a client sees and may open: [`ExportResolver`]. The handshake
//! asks it for NBD_OPT_LIST, NBD_OPT_INFO/GO, SET_META_CONTEXT and
//! EXPORT_NAME, with the [`Peer`] the connection has proved to be so far
//! (its Unix uid, its TLS certificate or PSK identity). Without a resolver
//! the server's fixed export list is used, for everyone.

use std::fmt;
use std::sync::Arc;

use crate::export::Export;

/// What the TLS handshake proved about a client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsPeer {
    /// Common name of the client certificate's subject (only for a
    /// certificate the server verified against its CA).
    pub cert_cn: Option<String>,
    /// SHA-256 of the client certificate (DER), lower-case hex.
    pub cert_sha256: Option<String>,
    /// The PSK identity the session was keyed with.
    pub psk_identity: Option<String>,
}

/// Who is on the other end of a connection, as far as the server knows.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The TCP address, or `unix pid P uid U` for a Unix socket.
    pub addr: String,
    /// Connected through a Unix socket.
    pub unix: bool,
    /// The peer's uid (SO_PEERCRED), on a Unix socket only.
    pub uid: Option<u32>,
    /// Set once STARTTLS succeeded.
    pub tls: Option<TlsPeer>,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr)?;
        match &self.tls {
            None => write!(f, " (no TLS)"),
            Some(t) => {
                if let Some(cn) = &t.cert_cn {
                    write!(f, " cert CN={cn}")?;
                }
                if let Some(fp) = &t.cert_sha256 {
                    write!(f, " cert sha256={fp}")?;
                }
                if let Some(id) = &t.psk_identity {
                    write!(f, " psk={id}")?;
                }
                if t.cert_cn.is_none() && t.cert_sha256.is_none() && t.psk_identity.is_none() {
                    write!(f, " (TLS, anonymous)")?;
                }
                Ok(())
            }
        }
    }
}

/// A refused request for an export: the reason goes to the server's log
/// only. The client gets NBD_REP_ERR_UNKNOWN ("no export named ..."), the
/// same answer as for a name that does not exist, so that a client cannot
/// probe which exports others have.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Who the client is (for the log; e.g. the configured client name)
    /// and why it may not open the export.
    pub reason: String,
    /// The kind of refusal, a short stable label for counters
    /// (`unknown_client`, `not_granted`, ...).
    pub kind: &'static str,
}

/// Refusal kinds the server itself decides (the resolver has its own).
pub mod refusal_kind {
    /// A plain client on a TLS-only listener.
    pub const TLS_REQUIRED: &str = "tls_required";
    /// A TLS handshake that failed (unknown certificate, wrong key...).
    pub const TLS_FAILED: &str = "tls_failed";
    /// A name not in the fixed export list (no resolver).
    pub const NO_SUCH_EXPORT: &str = "no_such_export";
}

/// Whatever a resolver wants kept for as long as a connection runs
/// (dropped when it ends): e.g. a guard counting open connections.
pub type ConnectionGuard = Box<dyn Send + Sync>;

/// Decides per connection which exports a client may list and open.
pub trait ExportResolver: Send + Sync {
    /// The exports `peer` may see: (name, description).
    fn list(&self, peer: &Peer) -> Vec<(String, String)>;
    /// The export `name` as `peer` sees it (e.g. its own view of an
    /// image), opened if needed. May block briefly (file creation).
    fn resolve(&self, peer: &Peer, name: &str) -> Result<Arc<Export>, Refusal>;
    /// Every export opened so far, flushed by the server when it stops.
    fn opened(&self) -> Vec<Arc<Export>>;
    /// A connection was refused: its request to open an export
    /// (NBD_OPT_GO or EXPORT_NAME; `kind` from its [`Refusal`]), or its
    /// TLS ([`refusal_kind`]). Called once per refusal, for counting; the
    /// server has logged it already.
    fn refused(&self, _peer: &Peer, _kind: &'static str) {}
    /// `peer` starts transmission on `export`; what is returned is kept
    /// until the connection ends.
    fn connected(&self, _peer: &Peer, _export: &Arc<Export>) -> Option<ConnectionGuard> {
        None
    }
}
