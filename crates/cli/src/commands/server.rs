//! `roamdisk server`: one NBD server for many clients, each seeing only
//! the images it is granted; `server reset`, `server promote` and
//! `server status`.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::format_size;
use roamdisk_server::{access::views_of, promote, state::StateLock, Server, ServerConfig};

use crate::serve::{announce, Limits};
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
/// metrics = "ADDR:PORT" or "unix:PATH", /metrics (Prometheus) and
/// /status.json are served there over HTTP (HTTPS with metrics-tls =
/// true; a bearer token with metrics-token-file; see
/// `roamdisk server status --help` and docs/server.md).
/// A client lists (NBD_OPT_LIST) only its own grants; asking for anything
/// else gets "no export named ..." and a warning in the log with the
/// client's identity. TCP clients must use TLS.
///
/// SIGHUP reads CONFIG and the PSK file again: clients added, removed or
/// changed (identities, grants) and keys take effect for every new
/// connection at once (revoke a client by removing its key and
/// [[client]], then `kill -HUP`); open connections keep their export until
/// they end. A config changing anything else (images, cache, listeners,
/// state, TLS files, metrics) is refused and logged: restart for those.
/// SIGINT or SIGTERM stop the server (in-flight requests finish, views
/// are flushed).
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
    #[command(flatten)]
    limits: Limits,
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
/// config's `metrics` key: a TCP address or unix:PATH; with the token in
/// metrics-token-file, and over HTTPS trusting the server's tls-cert when
/// metrics-tls = true), /status.json; the same counters are at /metrics
/// for Prometheus.
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
///   curl -s --unix-socket /run/roamdisk/metrics.sock \
///     -H "Authorization: Bearer $(cat /etc/roamdisk/metrics.token)" http://localhost/metrics
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
    let server = Server::open(path, &super::registry())?;
    let cfg = server.config();
    let (images, clients) = (cfg.image.len(), cfg.client.len());
    let what = format!("server serving {images} image(s) to {clients} client(s)");
    let cached = cfg.image.iter().filter(|i| i.cache).count();
    match (cfg.cache_options(), &cfg.cache) {
        _ if quiet => {}
        (Some(o), _) => eprintln!(
            "roamdisk: server cache {} of {} in blocks of {} ({} shards) in front of {cached} image(s)",
            o.policy.label(),
            format_size(o.size),
            format_size(o.block),
            o.shards
        ),
        (None, Some(c)) if c.size.0 == 0 => eprintln!("roamdisk: server cache off (size 0)"),
        _ => {}
    }
    if let (Some(url), false) = (server.metrics_url(), quiet) {
        eprintln!("roamdisk: server metrics on {url} (/metrics, /status.json)");
    }
    server.serve(a.limits.into(), announce(quiet, &what), move |path, r| match r {
        Ok(r) if !quiet => eprintln!(
            "roamdisk: server config reloaded from {}: clients added {:?}, removed {:?}, changed {:?}",
            path.display(),
            r.added,
            r.removed,
            r.changed
        ),
        Ok(_) => {}
        Err(e) => eprintln!(
            "roamdisk: server config not reloaded from {} (still serving the one loaded before): {e}",
            path.display()
        ),
    })?;
    if !quiet {
        eprintln!("roamdisk: server stopped cleanly (views flushed)");
    }
    Ok(())
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let st = roamdisk_server::http::status_of(&a.config)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    crate::render::server::status(&st);
    Ok(())
}

fn reset(r: ResetArgs, quiet: bool) -> anyhow::Result<()> {
    let who = &r.client;
    roamdisk_server::state::reset(&r.config, who, r.image.as_deref(), |im, had| {
        match (quiet, had) {
            (true, _) => {}
            (false, true) => outln!("{who}/{im}: overlay removed; back to the golden image"),
            (false, false) => outln!("{who}/{im}: already the golden image (no overlay)"),
        }
    })?;
    Ok(())
}

fn promote(p: PromoteArgs, quiet: bool) -> anyhow::Result<()> {
    let cfg = ServerConfig::read(&p.config)?;
    views_of(&cfg, &p.client, Some(&p.image))?;
    let lock = StateLock::take(&cfg.state)?;
    let to = PathBuf::from(&p.to);
    if p.st.store.is_some() {
        roamdisk_chunkstore::store::check_ref_name(&p.to)?;
    } else if to.exists() {
        bail!("{} exists; promote writes a new file", to.display());
    }
    let reg = super::registry();
    let src = promote::open_source(&cfg, &lock, &p.client, &p.image, &reg)?;
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
    let written = promote::write_new_file(src.as_ref(), &to, &reg)?;
    if !quiet {
        let (who, to, size) = (
            format!("{}/{}", p.client, p.image),
            to.display(),
            src.size(),
        );
        outln!("{who} written to {to} ({size} bytes, {written} bytes of data)");
    }
    Ok(())
}
