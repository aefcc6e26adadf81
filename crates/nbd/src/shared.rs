//! [`Shared`]: the state every connection of a server shares — its
//! exports (or the resolver that decides them per client), TLS, limits,
//! what is known of each export's allocation, client numbering and the
//! shutdown signal. Below the handshake and the transmission phase, which
//! read it, and the server, which makes it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::access::{ConnectionGuard, ExportResolver, Peer, Refusal};
use crate::export::Export;
use crate::tls::{TlsAcceptor, TlsMode};
use crate::transmission::alloc::AllocMap;
use crate::transmission::pace::BusyConns;
use crate::transmission::spin::Spinners;

/// State every connection shares.
pub struct Shared {
    pub exports: Vec<Arc<Export>>,
    /// Per-connection access control, instead of `exports`.
    pub(crate) resolver: Option<Arc<dyn ExportResolver>>,
    pub tls: Option<TlsAcceptor>,
    pub tls_mode: TlsMode,
    /// Unix-socket clients may skip TLS under `Require`.
    pub unix_without_tls: bool,
    pub max_in_flight: usize,
    /// Busy-poll limit per wait for a request (zero: off).
    pub(crate) busy_poll: Duration,
    /// Connections polling right now, bounded.
    pub(crate) spinners: Spinners,
    /// Connections with requests in flight.
    pub(crate) busy: BusyConns,
    shutdown: watch::Receiver<bool>,
    /// What is known of each export's allocation, index for index.
    alloc: Vec<Arc<AllocMap>>,
    /// The last client id given out per export, index for index.
    clients: Vec<AtomicU32>,
    /// The last client id given out for exports from the resolver: all of
    /// them are numbered together, so a `trace:` layer in a golden stack
    /// shared by many clients' views tells every connection apart.
    resolved_clients: AtomicU32,
    /// The runtime whose blocking pool runs requests (sized by the caller,
    /// e.g. `--io-threads`); connections may run on other runtimes.
    blocking: Option<Handle>,
}

impl Shared {
    /// Shared state without listeners, for in-process sessions (fuzzing,
    /// tests). Sending `true` on the returned sender starts a shutdown.
    pub fn detached(
        exports: Vec<Export>,
        tls_mode: TlsMode,
        max_in_flight: usize,
    ) -> (Arc<Shared>, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(false);
        let shared = Shared::new(exports, None, tls_mode, max_in_flight, Duration::ZERO, rx);
        (Arc::new(shared), tx)
    }

    /// The state of a server about to bind (no resolver yet, plain
    /// clients on Unix sockets treated like the others).
    pub(crate) fn new(
        exports: Vec<Export>,
        tls: Option<TlsAcceptor>,
        tls_mode: TlsMode,
        max_in_flight: usize,
        busy_poll: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> Shared {
        let exports: Vec<Arc<Export>> = exports.into_iter().map(Arc::new).collect();
        let alloc = exports
            .iter()
            .map(|e| Arc::new(AllocMap::new(e.dev.size())))
            .collect();
        let clients = exports.iter().map(|_| AtomicU32::new(0)).collect();
        Shared {
            exports,
            resolver: None,
            tls,
            tls_mode,
            unix_without_tls: false,
            max_in_flight: max_in_flight.max(1),
            busy_poll,
            spinners: Spinners::new(),
            busy: BusyConns::new(),
            shutdown,
            alloc,
            clients,
            resolved_clients: AtomicU32::new(0),
            blocking: Handle::try_current().ok(),
        }
    }

    /// Run `f` on the blocking pool of the runtime the server was made in.
    pub(crate) fn spawn_blocking<F, R>(&self, f: F) -> tokio::task::JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        match &self.blocking {
            Some(h) => h.spawn_blocking(f),
            None => tokio::task::spawn_blocking(f),
        }
    }

    /// The allocation knowledge of `export`, shared by its connections.
    pub(crate) fn alloc_map(&self, export: &Arc<Export>) -> Arc<AllocMap> {
        match self.exports.iter().position(|e| Arc::ptr_eq(e, export)) {
            Some(i) => self.alloc[i].clone(),
            None => Arc::new(AllocMap::new(export.dev.size())),
        }
    }

    /// A new client id for a connection to `export`: its connections are
    /// numbered from 1 in the order they reach transmission (for clients
    /// that connect one after another, the order they connect). The layers
    /// see it in [`roamdisk_blockdev::context`] while they run the
    /// connection's requests. Connections to exports from the resolver
    /// share one numbering.
    pub(crate) fn new_client(&self, export: &Arc<Export>) -> u32 {
        match self.exports.iter().position(|e| Arc::ptr_eq(e, export)) {
            // Wraps after 2^32 connections, which no trace tells apart anyway.
            Some(i) => self.clients[i]
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1),
            None => self
                .resolved_clients
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1),
        }
    }

    /// The export of that name; the empty name is the first export.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() {
            return self.exports.first().cloned();
        }
        self.exports.iter().find(|e| e.name == name).cloned()
    }
    /// The export `name` as `peer` may open it: through the resolver when
    /// there is one (a refusal is logged at warn level with the peer's
    /// identity), else from the fixed list.
    pub fn lookup(&self, peer: &Peer, name: &str) -> Result<Arc<Export>, Refusal> {
        let Some(r) = &self.resolver else {
            return self.find(name).ok_or_else(|| Refusal {
                reason: "no such export".into(),
                kind: crate::access::refusal_kind::NO_SUCH_EXPORT,
            });
        };
        r.resolve(peer, name).inspect_err(|refusal| {
            tracing::warn!(
                %peer,
                export = %name,
                reason = %refusal.reason,
                "refused: export not granted"
            );
        })
    }

    /// Tell the resolver, if any, that `peer` was refused (see
    /// [`ExportResolver::refused`]).
    pub fn refused(&self, peer: &Peer, kind: &'static str) {
        if let Some(r) = &self.resolver {
            r.refused(peer, kind);
        }
    }

    /// The exports `peer` may see: (name, description).
    pub fn list(&self, peer: &Peer) -> Vec<(String, String)> {
        match &self.resolver {
            Some(r) => r.list(peer),
            None => self
                .exports
                .iter()
                .map(|e| (e.name.clone(), e.description.clone()))
                .collect(),
        }
    }

    /// What the resolver, if any, keeps while `peer` is connected to
    /// `export` (see [`ExportResolver::connected`]).
    pub(crate) fn connected(&self, peer: &Peer, export: &Arc<Export>) -> Option<ConnectionGuard> {
        self.resolver
            .as_ref()
            .and_then(|r| r.connected(peer, export))
    }

    /// Every export opened so far: the fixed ones and those the resolver
    /// opened, for the final flush.
    pub(crate) fn opened(&self) -> Vec<Arc<Export>> {
        let mut all = self.exports.clone();
        if let Some(r) = &self.resolver {
            all.extend(r.opened());
        }
        all
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }
}
