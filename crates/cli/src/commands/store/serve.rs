//! `roamdisk store serve`: a chunk store over HTTP(S).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use roamdisk_blockdev::throttle::LinkSpec;
use roamdisk_blockdev::units::{parse_duration, parse_rate, parse_size, Bare};
use roamdisk_chunkserver::gate::UsersWatch;
use roamdisk_chunkserver::run::{front, run_until_signalled};
use roamdisk_chunkserver::tls::TlsFiles;
use roamdisk_chunkserver::ServerOptions;
use roamdisk_chunkstore::store;

/// Serve a store (a directory or an s3:// bucket) over HTTP or HTTPS (GET/HEAD/PUT of chunks
/// by hash, batch queries, catalogs, leases, gc). Every uploaded chunk is
/// verified before it is stored. With --users only the users of that file
/// get in, each with a token, and each reads and writes only their own
/// catalogs and those shared with them; every refusal is logged. Without
/// --users (and TLS) the server listens only on loopback unless
/// --insecure. Manual: docs/store-server.md.
///
/// Example:
///   roamdisk store serve /srv/store --listen 127.0.0.1:8700
///   roamdisk commit disk.img --to alice/vm --store http://127.0.0.1:8700
///   roamdisk store serve /srv/store --listen 0.0.0.0:8700 --users /srv/users.toml \
///       --tls-cert /etc/roamdisk/cert.pem --tls-key /etc/roamdisk/key.pem
///   roamdisk store serve /srv/store --listen 127.0.0.1:8700 --limit 1Mbit --latency 8ms
///   roamdisk store serve s3://vm-images/team-a --listen 127.0.0.1:8700 --cache 2G
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ServeArgs {
    dir: PathBuf,
    /// Address to listen on (port 0 picks one; the chosen address is
    /// printed).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Speak TLS with this certificate (PEM, then any intermediates).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Let in only the users of this file, each with their token (`roamdisk
    /// store user add`). Read again when it changes, and on SIGHUP.
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// Listen on a non-loopback address without --users or without TLS
    /// (only on a network you trust).
    #[arg(long)]
    insecure: bool,
    /// Emulate a slow link: serve objects at most this fast, each
    /// direction (1Mbit, 100kbit, or bytes per second such as 10M).
    #[arg(long, value_name = "RATE")]
    limit: Option<String>,
    /// Emulate a distant store: add this latency to every request (8ms).
    #[arg(long, value_name = "DELAY")]
    latency: Option<String>,
    /// Keep up to SIZE of the objects clients read in memory, so what many
    /// clients read crosses the store once (default: 256M for an s3://
    /// store, none for a directory, which the page cache already holds).
    #[arg(long, value_name = "SIZE")]
    cache: Option<String>,
    /// Answer batch gets and puts (POST /v1/objects/get, /v1/objects/put)
    /// as a server from before them did, so clients fetch and store object
    /// by object (tests, benchmarks).
    #[arg(long, hide = true)]
    no_batch_get: bool,
}

pub fn run(s: ServeArgs, quiet: bool) -> anyhow::Result<()> {
    let loc = s.dir.to_str().context("store path is not UTF-8")?;
    let st = store::open(
        loc,
        &store::OpenOptions {
            s3: crate::env::get().s3(),
            ..Default::default()
        },
    )?;
    let cache = match &s.cache {
        Some(c) => parse_size(c)?,
        None if store::is_remote(loc) => 256 << 20,
        None => 0,
    };
    let link = match (&s.limit, &s.latency) {
        (None, None) => None,
        (limit, latency) => Some(LinkSpec {
            rate: limit.as_deref().map(parse_rate).transpose()?.unwrap_or(0.0) as u64,
            latency: latency
                .as_deref()
                .map(|l| parse_duration(l, Bare::Refuse))
                .transpose()?
                .unwrap_or_default(),
            burst: 64 << 10,
        }),
    };
    let st = front(st, cache, link);
    let users = s.users.as_deref().map(UsersWatch::open).transpose()?;
    let opts = ServerOptions {
        listen: s.listen,
        tls: match (s.tls_cert, s.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        users,
        insecure: s.insecure,
        batch: !s.no_batch_get,
    };
    let scheme = opts.scheme();
    let who = match &s.users {
        Some(p) => format!("users of {}", p.display()),
        None => "anyone (no --users)".into(),
    };
    run_until_signalled(st, &opts, |addr| {
        if !quiet {
            eprintln!(
                "roamdisk: serving chunk store {} on {scheme}://{addr} to {who}",
                s.dir.display()
            );
        }
    })?;
    Ok(())
}
