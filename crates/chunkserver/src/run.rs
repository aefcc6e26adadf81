//! `roamdisk store serve` from start to stop: the store put behind the
//! decorators the options ask for ([`front`]), served on a runtime of its
//! own until SIGINT or SIGTERM, the users file read again on SIGHUP
//! ([`run_until_signalled`]).

use std::net::SocketAddr;
use std::sync::Arc;

use roamdisk_blockdev::throttle::LinkSpec;
use roamdisk_blockdev::{Error, Op, Result};
use roamdisk_chunkstore::store::cached::CachedStore;
use roamdisk_chunkstore::store::throttle::ThrottleStore;
use roamdisk_chunkstore::store::DynStore;

use crate::ServerOptions;

/// `store` with a memory cache of `cache` bytes of objects in front (none
/// for 0), behind an emulated `link` (a slow or distant store).
pub fn front(store: DynStore, cache: u64, link: Option<LinkSpec>) -> DynStore {
    let mut st = store;
    if cache > 0 {
        st = Arc::new(CachedStore::new(st, cache));
    }
    if let Some(spec) = link {
        st = Arc::new(ThrottleStore::new(st, spec));
    }
    st
}

/// Serve `store` with `opts` until SIGINT or SIGTERM; `on_ready` is told
/// the address bound. With a users file, SIGHUP has it read again before
/// the next request.
pub fn run_until_signalled(
    store: DynStore,
    opts: &ServerOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    let fail = |what: &str, e: std::io::Error| {
        Error::io(Op::Open, "cas", e).msg(format!("{what}: the chunk server cannot start"))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("roamdisk-store")
        .build()
        .map_err(|e| fail("no runtime", e))?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| fail("no SIGTERM handler", e))?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        if let Some(w) = opts.users.clone() {
            let mut hup = signal(SignalKind::hangup()).map_err(|e| fail("no SIGHUP handler", e))?;
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: the users file is read again before the next request");
                    w.reload();
                }
            });
        }
        crate::serve(store, opts, on_ready, stop)
            .await
            .map_err(|e| {
                let m = format!("cannot serve on {}: {}", opts.listen, e.message());
                e.msg(m)
            })
    })
}
