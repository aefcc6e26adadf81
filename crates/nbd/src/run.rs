//! Serving until told to stop, the one way every command serves: start a
//! runtime, bind, serve until a stop future resolves, then finish
//! in-flight requests, flush every export and remove Unix sockets.
//! [`serve`] is that with the usual stops (SIGINT/SIGTERM, or the exit of
//! a command run against the server); [`serve_until`] takes any stop
//! future.

use std::future::Future;
use std::process::ExitStatus;

use crate::export::Export;
use crate::server::{Listen, ServeOptions, Server};

/// What was bound, for the caller to announce.
pub struct Bound {
    /// Each listener as a client would name it (`nbd+unix:///?socket=P`,
    /// `nbd://ADDR` with port 0 resolved).
    pub uris: Vec<String>,
}

/// Serve `exports` on `listen` until the future `stop` returns resolves.
/// `stop` is called once the listeners are bound, inside the server's
/// runtime (so it may spawn tokio tasks and processes); [`signalled`] is
/// the usual one. Binding errors (address in use, no export) come back
/// before anything is served.
pub fn serve_until<F, Fut>(
    exports: Vec<Export>,
    listen: Vec<Listen>,
    opts: ServeOptions,
    stop: F,
) -> std::io::Result<()>
where
    F: FnOnce(&Bound) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(opts.io_threads.max(1))
        .thread_name("roamdisk")
        .build()?;
    rt.block_on(async move {
        let server = Server::bind(exports, listen.clone(), opts).await?;
        let mut uris: Vec<String> = listen
            .iter()
            .filter(|l| matches!(l, Listen::Unix(_)))
            .map(|l| l.to_string())
            .collect();
        uris.extend(server.tcp_addrs().iter().map(|a| format!("nbd://{a}")));
        let stop = stop(&Bound { uris });
        server.run(stop).await
    })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn signalled() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// What ends [`serve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Until {
    /// SIGINT or SIGTERM.
    #[default]
    Signal,
    /// The exit of `sh -c COMMAND`, started once the listeners are bound
    /// with `ROAMDISK_NBD_URI` set to the first of them (a signal kills
    /// it, and ends serving too).
    Exec(String),
}

/// How [`serve`] ended (the exports are flushed either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// SIGINT or SIGTERM.
    Signalled,
    /// The [`Until::Exec`] command exited with this status.
    Exited(ExitStatus),
}

/// Why [`serve`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding, serving or the final flush failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The [`Until::Exec`] command could not be started (serving stopped
    /// at once).
    #[error("cannot run --exec command '{command}'")]
    Exec {
        command: String,
        #[source]
        source: std::io::Error,
    },
}

/// Serve `exports` on `listen` until `until`; `bound` is called with the
/// bound listeners before anything is served, for the caller to announce.
/// Serving plain NBD on a TCP address other than loopback is logged as a
/// warning: anyone on that network can read and write the disks.
pub fn serve(
    exports: Vec<Export>,
    listen: Vec<Listen>,
    opts: ServeOptions,
    until: Until,
    bound: impl FnOnce(&Bound),
) -> Result<Ended, ServeError> {
    if opts.tls.is_none() {
        for l in &listen {
            if let Listen::Tcp(addr) = l {
                if !addr.ip().is_loopback() {
                    tracing::warn!(%addr, "serving without TLS on a non-loopback address: anyone on the network can read and write this disk");
                }
            }
        }
    }
    // What the command did: its exit status, or why it did not run.
    let mut outcome: Option<std::io::Result<ExitStatus>> = None;
    let slot = &mut outcome;
    serve_until(exports, listen, opts, |b| {
        bound(b);
        let first = b.uris.first().cloned().unwrap_or_default();
        let child = match &until {
            Until::Signal => None,
            Until::Exec(c) => Some(
                tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(c)
                    .env("ROAMDISK_NBD_URI", first)
                    .spawn(),
            ),
        };
        async move {
            match child {
                Some(Ok(mut child)) => {
                    tokio::select! {
                        r = child.wait() => *slot = Some(r),
                        _ = signalled() => { let _ = child.kill().await; }
                    }
                }
                Some(Err(e)) => *slot = Some(Err(e)),
                None => signalled().await,
            }
        }
    })?;
    match outcome {
        None => Ok(Ended::Signalled),
        Some(Ok(status)) => Ok(Ended::Exited(status)),
        Some(Err(source)) => Err(ServeError::Exec {
            command: match until {
                Until::Exec(c) => c,
                Until::Signal => String::new(),
            },
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use roamdisk_blockdev::layers::mem::MemDev;

    use super::*;

    #[test]
    fn an_exec_command_ends_serving_with_its_status_and_sees_the_uri() {
        let (d, sock) = roamdisk_blockdev::testkit::scratch("s.sock");
        let seen = d.path().join("uri");
        let export = Export {
            name: String::new(),
            description: String::new(),
            dev: Arc::new(MemDev::new(1 << 20)),
        };
        let mut announced = Vec::new();
        let ended = serve(
            vec![export],
            vec![Listen::Unix(sock.clone())],
            ServeOptions::default(),
            Until::Exec(format!(
                "printf %s \"$ROAMDISK_NBD_URI\" > {}; exit 3",
                seen.display()
            )),
            |b| announced = b.uris.clone(),
        )
        .unwrap();
        let Ended::Exited(status) = ended else {
            panic!("ended by a signal")
        };
        assert_eq!(status.code(), Some(3));
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        assert_eq!(announced, vec![uri.clone()]);
        assert_eq!(std::fs::read_to_string(&seen).unwrap(), uri);
        assert!(!sock.exists(), "the socket is removed");
    }
}
