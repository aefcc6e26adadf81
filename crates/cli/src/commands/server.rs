//! `roamdisk server`: one NBD server for many clients, each seeing only
//! the images it is granted; `server reset`, `server promote` and
//! `server status`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::{copy_sparse, Access, BlockDev, CopyOptions, NoProgress};
use roamdisk_nbd::{
    serve_until, signalled, Listen, ServeOptions, TlsAcceptor, TlsMode, TlsOptions,
};
use roamdisk_server::access::grant;
use roamdisk_server::state::{overlay_path, StateLock};
use roamdisk_server::views::{open_golden, open_view};
use roamdisk_server::{ServerConfig, Views};

use crate::store_args::StoreArgs;
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, Source};

/// Serve golden images to many clients over NBD, each seeing only its grants.
///
/// CONFIG names the listeners, TLS credentials, a state directory, the
/// golden images and the clients (format: docs/formats/server-config.md;
/// manual: docs/server.md). Clients prove who they are at connect: a TLS client certificate
/// (checked against tls-verify-ca, matched by subject CN or SHA-256
/// fingerprint), a TLS-PSK identity, or, on the Unix socket, their uid.
/// A client granted an image as a `view` gets its own writable copy: the
/// golden image under a private copy-on-write overlay in
/// STATE/clients/CLIENT/IMAGE.cow, made on its first connect and kept
/// across restarts; a `read-only` grant serves the golden image itself.
/// With a [cache] table, one memory cache (FMPQ unless told otherwise)
/// sits in front of the golden images, shared by every client; with
/// metrics = "ADDR:PORT", /metrics (Prometheus) and /status.json are
/// served there over HTTP (see `roamdisk server status --help`).
/// A client lists (NBD_OPT_LIST) only its own grants; asking for anything
/// else gets "no export named ..." and a warning in the log with the
/// client's identity. TCP clients must use TLS.
///
/// Examples:
///   roamdisk server /etc/roamdisk/server.toml
///   nbdinfo --list 'nbds://alice@10.0.0.1/?tls-psk-file=alice.psk'
///   qemu-system-x86_64 -object tls-creds-x509,id=tls0,endpoint=client,dir=CERTS \
///     -drive driver=nbd,host=10.0.0.1,export=win10,tls-creds=tls0 ...
///
///   roamdisk server reset alice win10 --config server.toml   # back to golden
///   roamdisk server promote alice win10 --config server.toml --to win10-v2.img
///   roamdisk server status server.toml                       # who does what
///
/// A minimal CONFIG:
///
///   format = "roamdisk-server"
///   version = 1
///   state = "/var/lib/roamdisk"
///   socket = "/run/roamdisk.sock"
///   metrics = "127.0.0.1:9477"
///   [cache]
///   size = "2G"                  # policy = "fmpq", block = "4K", shards = 16
///   [[image]]
///   name = "win10"
///   stack = "raw:/images/win10.img"
///   [[client]]
///   name = "alice"
///   uid = 1000
///   view = ["win10"]
#[derive(Parser)]
#[command(verbatim_doc_comment, args_conflicts_with_subcommands = true)]
pub struct Args {
    /// The server's config file.
    #[arg(value_name = "CONFIG.toml")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Requests processed at once per connection.
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_in_flight: usize,
    /// Connections served at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_connections: usize,
    /// Threads doing block I/O.
    #[arg(long, default_value_t = 64, value_name = "N")]
    io_threads: usize,
}

#[derive(Subcommand)]
enum Cmd {
    Reset(ResetArgs),
    Promote(PromoteArgs),
    Status(StatusArgs),
}

/// What a running server is doing, per client and image: connections,
/// requests, bytes, latency, overlay sizes; and its cache: policy, size,
/// hit ratio, evictions. Read from the server's metrics endpoint (the
/// config's `metrics` key), /status.json; the same counters are at
/// /metrics for Prometheus.
///
/// Latency percentiles come from the server's histogram buckets (10 us to
/// 1 s), interpolated within a bucket: good to a bucket's width. They
/// count the time the server spends on a request (its cache, overlay and
/// image), not the network.
///
/// Examples:
///   roamdisk server status /etc/roamdisk/server.toml
///   roamdisk server status server.toml --json | jq '.cache.hit_ratio'
///   curl -s http://127.0.0.1:9477/metrics | grep roamdisk_server_cache_hits_total
#[derive(ClapArgs)]
#[command(verbatim_doc_comment)]
struct StatusArgs {
    /// The server's config file (its `metrics` key says where to ask).
    #[arg(value_name = "CONFIG.toml")]
    config: PathBuf,
    /// Print the status document as JSON (docs/server.md, "Status").
    #[arg(long)]
    json: bool,
}

/// Return a client to its golden image: delete its overlay of IMAGE (or of
/// every image it has as a view), so that its next connection starts
/// from the golden image again. Its changes are lost.
///
/// The server must be stopped: reset takes the state directory's lock
/// (STATE/server.lock), which a running server holds, and refuses while
/// it cannot.
///
/// Examples:
///   roamdisk server reset alice win10 --config server.toml
///   roamdisk server reset alice --config server.toml      # every view of alice
#[derive(ClapArgs)]
#[command(verbatim_doc_comment)]
struct ResetArgs {
    /// The client (its `name` in the config).
    client: String,
    /// The image; default: every image the client has as a view.
    image: Option<String>,
    /// The server's config file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

/// Make a client's view of an image (golden image + its overlay) a new
/// golden image: a new raw image file (--to PATH), or, with --store, a new
/// version of an image in a chunk store (--to USER/IMAGE), deduplicated
/// against what the store has. The overlay is left as it is (`server
/// reset` drops it).
///
/// The server must be stopped (the state directory's lock is taken), so
/// the view does not change while it is copied. A PATH must not exist; it
/// is written sparse (unwritten and zero ranges become holes) and flushed.
///
/// Examples:
///   roamdisk server promote alice win10 --config server.toml --to /images/win10-v2.img
///   then: stack = "raw:/images/win10-v2.img" in a new [[image]]
///
///   roamdisk server promote alice win10 --config server.toml --to lab/win10 --store /srv/store
///   then: stack = "cas-version[store=/srv/store]:lab/win10"
#[derive(ClapArgs)]
#[command(verbatim_doc_comment)]
struct PromoteArgs {
    /// The client (its `name` in the config).
    client: String,
    /// The image, granted to the client as a view.
    image: String,
    /// The server's config file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The raw image file to write, or with --store the image to commit
    /// a new version of.
    #[arg(long, value_name = "PATH|USER/IMAGE")]
    to: String,
    /// The new version's description (with --store).
    #[arg(short, long, default_value = "", value_name = "TEXT")]
    message: String,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    match a.cmd {
        Some(Cmd::Reset(r)) => return reset(r, quiet),
        Some(Cmd::Promote(p)) => return promote(p, quiet),
        Some(Cmd::Status(s)) => return status(s),
        None => {}
    }
    let Some(path) = &a.config else {
        bail!("give the config file: roamdisk server CONFIG.toml (see roamdisk server --help)");
    };
    let cfg = Arc::new(ServerConfig::read(path)?);
    let lock = StateLock::take(&cfg.state)?;
    let views = Views::open(cfg.clone(), &lock.dir, &super::registry())
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{}", path.display()))?;
    let metrics = match cfg.metrics {
        Some(addr) => Some(roamdisk_server::http::serve(addr, views.metrics().clone())?),
        None => None,
    };
    let mut listen = Vec::new();
    if let Some(s) = &cfg.socket {
        listen.push(Listen::Unix(s.clone()));
    }
    listen.extend(cfg.listen.iter().copied().map(Listen::Tcp));
    let tls = TlsOptions {
        cert: cfg.tls_cert.clone(),
        key: cfg.tls_key.clone(),
        verify_ca: cfg.tls_verify_ca.clone(),
        psk_file: cfg.tls_psk.clone(),
    };
    let has_creds = tls.cert.is_some() || tls.psk_file.is_some();
    let (mode, acceptor) = if has_creds {
        let acc = TlsAcceptor::new(&tls)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}", path.display()))?;
        (TlsMode::Require, Some(acc))
    } else {
        (TlsMode::Off, None)
    };
    let opts = ServeOptions {
        tls: acceptor,
        tls_mode: mode,
        max_in_flight: a.max_in_flight,
        max_connections: a.max_connections,
        io_threads: a.io_threads,
        busy_poll: Duration::from_micros(100),
        resolver: Some(Arc::new(views)),
        unix_without_tls: true,
        ..ServeOptions::default()
    };
    let what = format!(
        "{} image(s) to {} client(s)",
        cfg.image.len(),
        cfg.client.len()
    );
    if let (Some(c), false) = (&cfg.cache, quiet) {
        if let Some(o) = cfg.cache_options() {
            eprintln!(
                "roamdisk: server cache {} of {} in blocks of {} ({} shards) in front of {} image(s)",
                o.policy.label(),
                format_size(o.size),
                format_size(o.block),
                o.shards,
                cfg.image.iter().filter(|i| i.cache).count()
            );
        } else if c.size.0 == 0 {
            eprintln!("roamdisk: server cache off (size 0)");
        }
    }
    if let (Some(m), false) = (&metrics, quiet) {
        eprintln!("roamdisk: server metrics on http://{}/metrics", m.addr);
    }
    serve_until(Vec::new(), listen, opts, |bound| {
        if !quiet {
            for uri in &bound.uris {
                eprintln!("roamdisk: server serving {what} on {uri}");
            }
        }
        signalled()
    })?;
    drop(metrics);
    drop(lock);
    if !quiet {
        eprintln!("roamdisk: server stopped cleanly (views flushed)");
    }
    Ok(())
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let cfg = ServerConfig::read(&a.config)?;
    let Some(addr) = cfg.metrics else {
        bail!(
            "{} has no metrics key: add metrics = \"127.0.0.1:PORT\" and restart the server",
            a.config.display()
        );
    };
    let st = roamdisk_server::http::fetch_status(addr).map_err(anyhow::Error::msg)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut rows = vec![[
        "client", "image", "grant", "conns", "reads", "writes", "read", "written", "p50 us",
        "p99 us", "overlay",
    ]
    .map(String::from)];
    for c in &st.clients {
        let op = |k: &str| c.ops.get(k);
        let reads = op("read").map_or(0, |o| o.requests);
        let writes = ["write", "write_zeroes", "trim"]
            .iter()
            .filter_map(|k| op(k))
            .map(|o| o.requests)
            .sum::<u64>();
        let r = op("read");
        rows.push([
            c.client.clone(),
            c.image.clone(),
            c.grant.clone(),
            c.connections_open.to_string(),
            reads.to_string(),
            writes.to_string(),
            format_size(r.map_or(0, |o| o.bytes)),
            format_size(op("write").map_or(0, |o| o.bytes)),
            opt(r.and_then(|o| o.latency_p50_us)),
            opt(r.and_then(|o| o.latency_p99_us)),
            c.overlay_allocated_bytes.map_or("-".into(), format_size),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (v, w))| {
                if i < 3 {
                    format!("{v:<w$}")
                } else {
                    format!("{v:>w$}")
                }
            })
            .collect();
        outln!("{}", line.join("  ").trim_end());
    }
    outln!("(p50/p99: read latency at the server, from its histogram buckets)");
    match &st.cache {
        None => outln!("cache: none"),
        Some(c) => {
            let ratio = c
                .hit_ratio
                .map_or("-".into(), |r| format!("{:.1}%", r * 100.0));
            outln!(
                "cache: {} {} in blocks of {}, {} shards: {} held, hit ratio {ratio} ({} hits, {} misses), {} evictions",
                c.policy,
                format_size(c.size),
                format_size(c.block),
                c.shards,
                format_size(c.bytes_held),
                c.hits,
                c.misses,
                c.evictions
            );
            for im in &st.images {
                match &im.cache {
                    Some(ic) => outln!(
                        "  {}: {} held, hit ratio {} ({} hits, {} misses), {} evictions",
                        im.name,
                        format_size(ic.bytes_held),
                        ic.hit_ratio
                            .map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
                        ic.hits,
                        ic.misses,
                        ic.evictions
                    ),
                    None => outln!("  {}: not cached", im.name),
                }
            }
        }
    }
    let refused: Vec<String> = st
        .refusals
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    outln!(
        "refusals: {}",
        if refused.is_empty() {
            "none".to_string()
        } else {
            refused.join(", ")
        }
    );
    outln!("uptime: {:.0} s", st.uptime_seconds);
    Ok(())
}

/// The client's images to work on: `image` (granted as a view) or all its
/// views.
fn client_views(
    cfg: &ServerConfig,
    client: &str,
    image: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let Some(c) = cfg.client(client) else {
        bail!("no [[client]] named '{client}' in the config");
    };
    match image {
        None => Ok(c.view.clone()),
        Some(im) => match grant(c, im) {
            Some(roamdisk_server::access::Grant::View) => Ok(vec![im.to_string()]),
            Some(_) => bail!("client '{client}' has '{im}' read-only: it has no view of it"),
            None => bail!("client '{client}' has no grant for an image '{im}'"),
        },
    }
}

fn reset(r: ResetArgs, quiet: bool) -> anyhow::Result<()> {
    let cfg = ServerConfig::read(&r.config)?;
    let images = client_views(&cfg, &r.client, r.image.as_deref())?;
    let lock = StateLock::take(&cfg.state)?;
    for im in images {
        let had = lock.reset(&r.client, &im)?;
        if !quiet {
            if had {
                outln!(
                    "{}/{im}: overlay removed; back to the golden image",
                    r.client
                );
            } else {
                outln!("{}/{im}: already the golden image (no overlay)", r.client);
            }
        }
    }
    Ok(())
}

fn promote(p: PromoteArgs, quiet: bool) -> anyhow::Result<()> {
    let cfg = ServerConfig::read(&p.config)?;
    client_views(&cfg, &p.client, Some(&p.image))?;
    let lock = StateLock::take(&cfg.state)?;
    let to = PathBuf::from(&p.to);
    if p.st.store.is_some() {
        roamdisk_chunkstore::store::check_ref_name(&p.to)?;
    } else if to.exists() {
        bail!("{} exists; promote writes a new file", to.display());
    }
    let reg = super::registry();
    let mut golden = open_golden(&cfg, &reg).map_err(anyhow::Error::msg)?;
    let base = golden.remove(&p.image).expect("checked image");
    let ovl = overlay_path(&lock.dir, &p.client, &p.image);
    let src: Arc<dyn BlockDev> = if ovl.exists() {
        open_view(&lock.dir, &p.client, &p.image, base, true)?
    } else {
        base
    };
    if p.st.store.is_some() {
        let progress = p.st.progress(quiet);
        let store = p.st.open(true)?;
        let opts = CommitOptions {
            target: p.to.clone(),
            description: p.message.clone(),
            ..Default::default()
        };
        let summary = commit_image(&*store, Source::Dev(src.as_ref()), &opts, &progress)?;
        return crate::render::commit::finish(&summary, progress, quiet, p.st.json);
    }
    let size = src.size();
    std::fs::File::create_new(&to)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("cannot create {}", to.display()))?;
    let escaped = to
        .display()
        .to_string()
        .replace('\\', "\\\\")
        .replace(':', "\\:");
    let dst = reg.build(&format!("raw:{escaped}"), Access::ReadWrite)?;
    let written = copy_sparse(
        src.as_ref(),
        dst.as_ref(),
        &CopyOptions::default(),
        &NoProgress,
    )?;
    dst.flush()?;
    if !quiet {
        outln!(
            "{}/{} written to {} ({size} bytes, {written} bytes of data)",
            p.client,
            p.image,
            to.display()
        );
    }
    Ok(())
}
