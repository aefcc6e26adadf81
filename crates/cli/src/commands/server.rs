//! `roamdisk server`: one NBD server for many clients, each seeing only
//! the images it is granted; `server reset` and `server promote`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::{copy_sparse, Access, BlockDev, CopyOptions, NoProgress};
use roamdisk_nbd::{
    serve_until, signalled, Listen, ServeOptions, TlsAcceptor, TlsMode, TlsOptions,
};
use roamdisk_server::access::grant;
use roamdisk_server::state::{overlay_path, StateLock};
use roamdisk_server::views::{open_golden, open_view};
use roamdisk_server::{ServerConfig, Views};

use super::cas::StoreArgs;
use roamdisk_cas::commit::{commit_image, CommitOptions, Source};

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
///
/// A minimal CONFIG:
///
///   format = "roamdisk-server"
///   version = 1
///   state = "/var/lib/roamdisk"
///   socket = "/run/roamdisk.sock"
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
    serve_until(Vec::new(), listen, opts, |bound| {
        if !quiet {
            for uri in &bound.uris {
                eprintln!("roamdisk: server serving {what} on {uri}");
            }
        }
        signalled()
    })?;
    drop(lock);
    if !quiet {
        eprintln!("roamdisk: server stopped cleanly (views flushed)");
    }
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
        roamdisk_cas::store::check_ref_name(&p.to)?;
    } else if to.exists() {
        bail!("{} exists; promote writes a new file", to.display());
    }
    let reg = super::registry();
    let mut golden = open_golden(&cfg, &reg).map_err(anyhow::Error::msg)?;
    let base = golden.remove(&p.image).expect("checked image");
    let ovl = overlay_path(&lock.dir, &p.client, &p.image);
    let src = if ovl.exists() {
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
        return super::commit::finish(&summary, progress, quiet, p.st.json);
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
