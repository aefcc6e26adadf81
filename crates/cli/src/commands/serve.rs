//! `roamdisk serve`: export stacks over NBD.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::{find_layers, Access, BlockDev, LayerSpec};
use roamdisk_lbs::Lbs;
use roamdisk_nbd::config::ServeConfig;
use roamdisk_nbd::{Export, Listen, ServeOptions, TlsMode, TlsOptions, Until};

use crate::serve::{announce, Limits};

/// Serve a stack (or several, from a TOML file) over NBD until SIGINT or
/// SIGTERM; then finish in-flight requests, flush, and remove the socket.
/// Stopping prints the counters of each LBS image served (blocks clients
/// wrote, blocks the garbage collector moved...) as a JSON line.
///
/// Any NBD client can connect: qemu (-drive file=nbd:unix:SOCK or
/// file.driver=nbd), qemu-img, qemu-io, nbdinfo, nbdcopy, fio's nbd engine,
/// the Linux nbd-client. Each export numbers its connections 1, 2, ...
/// (logged with the peer at -v); a trace: layer records that client id.
///
/// Examples:
///   roamdisk serve raw:disk.img --socket /tmp/disk.sock
///   qemu-img info 'nbd+unix:///?socket=/tmp/disk.sock'
///
///   roamdisk serve cow:overlay.img:raw:base.img --listen 127.0.0.1:10809 --export vm1
///   nbdinfo nbd://127.0.0.1:10809/vm1
///
///   roamdisk serve --config exports.toml
///
///   # a thin client of a roamdisk server: its writes in a local overlay,
///   # the golden image read over TLS (any NBD URI is a stack's bottom)
///   roamdisk serve 'cow:vm.cow:nbd:nbds://lab-03@disks.lab/desktop?tls-psk-file=lab-03.psk' \
///     --socket /run/vm.sock
///
/// A config file names several exports and the listeners (format:
/// docs/formats/serve-config.md):
///
///   socket = "/tmp/roamdisk.sock"       # and/or: listen = ["127.0.0.1:10809"]
///   [[export]]
///   name = "golden"
///   stack = "raw:/images/golden.img"
///   read-only = true
///   [[export]]
///   name = "vm1"
///   description = "user 1"
///   stack = "cow:/var/vm1.ovl:raw:/images/golden.img"
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The stack to export (see `roamdisk layers`). Omit with --config.
    spec: Option<String>,
    /// Listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Listen on this TCP address (e.g. 127.0.0.1:10809; port 0 picks one).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// Export name (clients asking for the empty name get the first export).
    #[arg(long, default_value = "")]
    export: String,
    /// Human description shown by `nbdinfo`.
    #[arg(long, default_value = "")]
    description: String,
    /// Refuse writes, trims and zeroing (EPERM).
    #[arg(long)]
    read_only: bool,
    /// Serve the exports and listeners of a TOML file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["spec", "export", "description", "read_only"])]
    config: Option<PathBuf>,
    /// TLS mode: off, on (clients may upgrade), require (default when
    /// credentials are given).
    #[arg(long, value_name = "MODE")]
    tls: Option<String>,
    /// PEM certificate chain for TLS.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    tls_verify_ca: Option<PathBuf>,
    /// Pre-shared keys for TLS-PSK (psktool format: IDENTITY:HEXKEY per line).
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    #[command(flatten)]
    limits: Limits,
    /// Microseconds a connection keeps polling for the next request before
    /// its thread sleeps, while its client sends requests back to back
    /// (queue depth 1): waking a sleeping CPU costs more than a cached 4 KiB
    /// read on a VM. Uses CPU only while it pays, at most on half the CPUs.
    /// 0 turns it off; at most 10000.
    #[arg(long, default_value_t = 100, value_name = "US",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    busy_poll: u64,
}

fn open_export(
    name: &str,
    description: &str,
    spec: &LayerSpec,
    read_only: bool,
) -> anyhow::Result<Export> {
    let dev: Arc<dyn BlockDev> = super::registry()
        .build_spec(spec, Access::read_only_if(read_only))
        .with_context(|| format!("cannot open the stack of export '{name}'"))?;
    Ok(Export {
        name: name.to_string(),
        description: description.to_string(),
        dev,
    })
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let mut socket = a.socket.clone();
    let mut listen_tcp = a.listen.clone();
    let mut tls = TlsOptions {
        cert: a.tls_cert.clone(),
        key: a.tls_key.clone(),
        verify_ca: a.tls_verify_ca.clone(),
        psk_file: a.tls_psk.clone(),
    };
    let mut tls_mode = a.tls.clone();
    let reg = super::registry();
    let exports = if let Some(path) = &a.config {
        let cfg = ServeConfig::read(path)?;
        socket = socket.or(cfg.socket);
        listen_tcp.extend(cfg.listen);
        tls.cert = tls.cert.or(cfg.tls_cert);
        tls.key = tls.key.or(cfg.tls_key);
        tls.verify_ca = tls.verify_ca.or(cfg.tls_verify_ca);
        tls.psk_file = tls.psk_file.or(cfg.tls_psk);
        tls_mode = tls_mode.or(cfg.tls);
        cfg.export
            .iter()
            .map(|e| open_export(&e.name, &e.description, &e.spec(&reg)?, e.read_only))
            .collect::<anyhow::Result<Vec<_>>>()?
    } else {
        let Some(spec) = &a.spec else {
            bail!("give a stack to serve (e.g. `roamdisk serve raw:disk.img --socket /tmp/s`) or --config FILE");
        };
        vec![open_export(
            &a.export,
            &a.description,
            &reg.parse(spec)?,
            a.read_only,
        )?]
    };
    let mut listen = Vec::new();
    if let Some(s) = socket {
        listen.push(Listen::Unix(s));
    }
    listen.extend(listen_tcp.into_iter().map(Listen::Tcp));
    if listen.is_empty() {
        bail!("say where to listen: --socket PATH and/or --listen ADDR:PORT");
    }
    let requested = tls_mode.as_deref().map(str::parse::<TlsMode>).transpose()?;
    let (tls_mode, tls) = TlsMode::resolve(requested, &tls)?;
    let names: Vec<String> = exports
        .iter()
        .map(|e| {
            if e.name.is_empty() {
                "(default)".into()
            } else {
                e.name.clone()
            }
        })
        .collect();
    // The LBS images of the stacks, for their counters at the end.
    let lbs_images: Vec<(String, Arc<dyn BlockDev>)> = exports
        .iter()
        .zip(&names)
        .filter(|(e, _)| !find_layers::<Lbs>(e.dev.as_ref()).is_empty())
        .map(|(e, n)| (n.clone(), e.dev.clone()))
        .collect();
    let opts = a.limits.apply(ServeOptions {
        tls,
        tls_mode,
        busy_poll: Duration::from_micros(a.busy_poll),
        ..ServeOptions::default()
    });
    let what = format!("serving {}", names.join(", "));
    roamdisk_nbd::serve(exports, listen, opts, Until::Signal, announce(quiet, &what))?;
    if !quiet {
        eprintln!("roamdisk: stopped cleanly (exports flushed)");
        for (name, dev) in &lbs_images {
            for lbs in find_layers::<Lbs>(dev.as_ref()) {
                let counters = serde_json::to_string(&lbs.stats())?;
                eprintln!("roamdisk: lbs counters of {name}: {counters}");
            }
        }
    }
    Ok(())
}
