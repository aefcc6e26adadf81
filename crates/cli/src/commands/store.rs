//! `roamdisk store`: create, serve, inspect and verify chunk stores; make
//! user keys; the users of a chunk server (`store user`, in
//! `store_user.rs`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use rayon::prelude::*;
use roamdisk_blockdev::units::{format_size, parse_size};
use roamdisk_chunkserver::tls::TlsFiles;
use roamdisk_chunkserver::ServerOptions;
use roamdisk_chunkstore::hash::HashKind;
use roamdisk_chunkstore::repo::read_catalog;
use roamdisk_chunkstore::store::{self, local::LocalStore, StoreConfig};
use roamdisk_chunkstore::version::{Header, Version};
use roamdisk_chunkstore::ChunkId;

use super::cas::StoreArgs;

/// Chunk stores: where content-addressed images live. A store is a
/// directory (chunks as hash-named files under 2-hex-digit folders,
/// catalogs, leases) or an HTTP chunk server in front of one.
///
/// Examples:
///   roamdisk store init /srv/store --hash blake3 --compression zstd
///   roamdisk store serve /srv/store --listen 127.0.0.1:8700
///   roamdisk store user add alice --users /srv/users.toml --token-file alice.token
///   roamdisk store serve /srv/store --listen 0.0.0.0:8700 --users /srv/users.toml \
///       --tls-cert cert.pem --tls-key key.pem
///   roamdisk store info --store http://127.0.0.1:8700
///   roamdisk store verify --store /srv/store
///   roamdisk store keygen alice.key
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Init(InitArgs),
    Serve(ServeArgs),
    #[command(subcommand)]
    User(super::store_user::Cmd),
    Info(InfoArgs),
    Verify(VerifyArgs),
    Keygen(KeygenArgs),
}

/// Create a chunk store in a directory, or in an S3 bucket
/// (`s3://BUCKET/PREFIX`; the bucket must exist; endpoint, region and
/// keys from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and
/// AWS_SECRET_ACCESS_KEY, or `?endpoint=URL&region=R`). Manual:
/// docs/deploy.md.
///
/// Example:
///   roamdisk store init /srv/store --hash sha256 --quota 500G
///   roamdisk store init s3://vm-images/team-a
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct InitArgs {
    dir: PathBuf,
    /// Hash function naming every chunk: blake3 or sha256 (fixed for the
    /// store's life).
    #[arg(long, default_value = "blake3")]
    hash: String,
    /// Chunk compression: zstd, zstd:LEVEL (1-19) or none. A chunk is kept
    /// compressed only when that saves space.
    #[arg(long, default_value = "zstd")]
    compression: String,
    /// Refuse writes past this many stored bytes (no-space, like a full
    /// disk).
    #[arg(long, value_name = "SIZE")]
    quota: Option<String>,
}

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
    /// Answer batch gets (POST /v1/objects/get) as a server from before
    /// them did, so clients fetch object by object (tests, benchmarks).
    #[arg(long, hide = true)]
    no_batch_get: bool,
}

/// Show what a store holds: objects, bytes, versions, deduplication, and
/// per-user usage.
///
/// Example:
///   roamdisk store info --store /srv/store --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct InfoArgs {
    #[command(flatten)]
    st: StoreArgs,
}

/// Read every object and check it against its name; then check that
/// every version of every catalog has its package and every object it
/// references. Lists the bad objects and the versions that miss some.
///
/// Example:
///   roamdisk store verify --store /srv/store
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct VerifyArgs {
    #[command(flatten)]
    st: StoreArgs,
}

/// Make a user key file (256 random bits, mode 0600) for encrypted images.
///
/// Example:
///   roamdisk store keygen alice.key
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct KeygenArgs {
    file: PathBuf,
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Init(i) => {
            let mut cfg = StoreConfig {
                hash: HashKind::from_name(&i.hash)?,
                ..Default::default()
            };
            cfg.set_compression(&i.compression)?;
            cfg.quota = match &i.quota {
                Some(q) => Some(parse_size(q).map_err(anyhow::Error::msg)?),
                None => None,
            };
            match i.dir.to_str().filter(|d| store::s3::is_s3(d)) {
                Some(loc) => store::s3::S3Store::init(loc, &cfg)?,
                None => LocalStore::init(&i.dir, &cfg)?,
            }
            if !quiet {
                println!(
                    "created chunk store {} ({}, {})",
                    i.dir.display(),
                    cfg.hash.name(),
                    cfg.compression_name()
                );
            }
            Ok(())
        }
        Cmd::Serve(s) => serve(s, quiet),
        Cmd::User(u) => super::store_user::run(u, quiet),
        Cmd::Info(i) => info(i),
        Cmd::Verify(v) => verify(v, quiet),
        Cmd::Keygen(k) => {
            roamdisk_chunkstore::version::create_key_file(&k.file)?;
            if !quiet {
                println!("wrote a new 256-bit key to {} (keep it safe: without it the encrypted images cannot be read)", k.file.display());
            }
            Ok(())
        }
    }
}

fn serve(s: ServeArgs, quiet: bool) -> anyhow::Result<()> {
    let loc = s.dir.to_str().context("store path is not UTF-8")?;
    let mut st = store::open(loc, &Default::default())?;
    let cache = match &s.cache {
        Some(c) => parse_size(c).map_err(anyhow::Error::msg)?,
        None if store::is_remote(loc) => 256 << 20,
        None => 0,
    };
    if cache > 0 {
        st = std::sync::Arc::new(roamdisk_chunkstore::store::cached::CachedStore::new(
            st, cache,
        ));
    }
    if s.limit.is_some() || s.latency.is_some() {
        use roamdisk_blockdev::units::{parse_duration, parse_rate, Bare};
        let spec = roamdisk_blockdev::throttle::LinkSpec {
            rate: s
                .limit
                .as_deref()
                .map(parse_rate)
                .transpose()?
                .unwrap_or(0.0) as u64,
            latency: s
                .latency
                .as_deref()
                .map(|l| parse_duration(l, Bare::Refuse))
                .transpose()?
                .unwrap_or_default(),
            burst: 64 << 10,
        };
        st = std::sync::Arc::new(roamdisk_chunkstore::store::throttle::ThrottleStore::new(
            st, spec,
        ));
    }
    let users = s
        .users
        .as_deref()
        .map(roamdisk_chunkserver::gate::UsersWatch::open)
        .transpose()?;
    let opts = ServerOptions {
        listen: s.listen,
        tls: match (s.tls_cert, s.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        users: users.clone(),
        insecure: s.insecure,
        batch_get: !s.no_batch_get,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("roamdisk-store")
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let stop = async {
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        if let Some(w) = users {
            let mut hup = signal(SignalKind::hangup()).context("no SIGHUP handler")?;
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: the users file is read again before the next request");
                    w.reload();
                }
            });
        }
        let dir = s.dir.clone();
        let scheme = opts.scheme();
        let who = match &s.users {
            Some(p) => format!("users of {}", p.display()),
            None => "anyone (no --users)".into(),
        };
        roamdisk_chunkserver::serve(
            st,
            &opts,
            move |addr| {
                if !quiet {
                    eprintln!(
                        "roamdisk: serving chunk store {} on {scheme}://{addr} to {who}",
                        dir.display()
                    );
                }
            },
            stop,
        )
        .await
        .with_context(|| format!("cannot serve on {}", s.listen))
    })
}

fn info(i: InfoArgs) -> anyhow::Result<()> {
    let st = i.st.open(false)?;
    let mut sizes: HashMap<ChunkId, u64> = HashMap::new();
    st.list_objects(&mut |e| {
        sizes.insert(e.id, e.size);
    })?;
    let stored: u64 = sizes.values().sum();
    struct User {
        images: u64,
        versions: u64,
        logical: u64,
        refs: HashSet<ChunkId>,
    }
    let mut users: HashMap<String, User> = HashMap::new();
    let mut all_refs: HashMap<ChunkId, HashSet<String>> = HashMap::new();
    let mut logical_total = 0u64;
    let mut versions = 0u64;
    let mut packages = 0u64;
    let mut unreadable = Vec::new();
    for name in st.ref_list()? {
        let (cat, _) = read_catalog(&*st, &name)?;
        let user = name.split('/').next().unwrap_or("").to_string();
        let u = users.entry(user.clone()).or_insert(User {
            images: 0,
            versions: 0,
            logical: 0,
            refs: HashSet::new(),
        });
        u.images += 1;
        for e in &cat.entries {
            versions += 1;
            u.versions += 1;
            u.logical += e.data_bytes;
            logical_total += e.data_bytes;
            let pkg = match store::fetch(&*st, &e.version, None) {
                Ok(p) => p,
                Err(err) => {
                    unreadable.push(format!("{name}@{}: {err}", e.version.short()));
                    continue;
                }
            };
            packages += 1;
            u.refs.insert(e.version);
            all_refs.entry(e.version).or_default().insert(user.clone());
            let _ = Header::parse(&pkg)?;
            for r in Version::references_of(&pkg)? {
                u.refs.insert(r);
                all_refs.entry(r).or_default().insert(user.clone());
            }
        }
    }
    let referenced: u64 = all_refs.keys().filter_map(|id| sizes.get(id)).sum();
    let mut per_user: Vec<serde_json::Value> = Vec::new();
    let mut names: Vec<_> = users.keys().cloned().collect();
    names.sort();
    for n in &names {
        let u = &users[n];
        let bytes: u64 = u.refs.iter().filter_map(|id| sizes.get(id)).sum();
        let own: u64 = u
            .refs
            .iter()
            .filter(|id| all_refs.get(id).is_some_and(|s| s.len() == 1))
            .filter_map(|id| sizes.get(id))
            .sum();
        per_user.push(serde_json::json!({
            "user": n, "images": u.images, "versions": u.versions,
            "logical_bytes": u.logical, "referenced_bytes": bytes, "unshared_bytes": own,
        }));
    }
    let cfg = st.config();
    let v = serde_json::json!({
        "store": st.describe(), "hash": cfg.hash.name(), "compression": cfg.compression_name(),
        "quota": cfg.quota, "objects": sizes.len(), "stored_bytes": stored,
        "versions": versions, "version_packages": packages, "referenced_bytes": referenced,
        "unreferenced_bytes": stored.saturating_sub(referenced),
        "logical_bytes": logical_total,
        "dedup_ratio": logical_total as f64 / referenced.max(1) as f64,
        "users": per_user, "unreadable_versions": unreadable,
    });
    if i.st.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "store:        {} ({}, {})",
        st.describe(),
        cfg.hash.name(),
        cfg.compression_name()
    );
    if let Some(q) = cfg.quota {
        println!("quota:        {}", format_size(q));
    }
    println!("objects:      {} ({})", sizes.len(), format_size(stored));
    println!(
        "versions:     {versions}; their data {} is stored in {} (dedup ratio {:.2})",
        format_size(logical_total),
        format_size(referenced),
        logical_total as f64 / referenced.max(1) as f64
    );
    println!(
        "unreferenced: {} (freed by `roamdisk gc`)",
        format_size(stored.saturating_sub(referenced))
    );
    println!(
        "{:<16} {:>7} {:>9} {:>12} {:>12} {:>12}",
        "USER", "IMAGES", "VERSIONS", "LOGICAL", "REFERENCED", "UNSHARED"
    );
    for u in &per_user {
        println!(
            "{:<16} {:>7} {:>9} {:>12} {:>12} {:>12}",
            u["user"].as_str().unwrap_or(""),
            u["images"].as_u64().unwrap_or(0),
            u["versions"].as_u64().unwrap_or(0),
            format_size(u["logical_bytes"].as_u64().unwrap_or(0)),
            format_size(u["referenced_bytes"].as_u64().unwrap_or(0)),
            format_size(u["unshared_bytes"].as_u64().unwrap_or(0)),
        );
    }
    for u in &unreadable {
        println!("unreadable version: {u}");
    }
    Ok(())
}

fn verify(v: VerifyArgs, quiet: bool) -> anyhow::Result<()> {
    let st = v.st.open(false)?;
    let mut ids = Vec::new();
    st.list_objects(&mut |e| ids.push(e.id))?;
    let progress = v.st.progress(quiet);
    roamdisk_chunkstore::Progress::start(
        &progress,
        "verifying",
        ids.len() as u64,
        roamdisk_blockdev::progress::Unit::Items,
    );
    let codec = st.config().codec();
    let bad: Vec<String> = ids
        .par_chunks(256)
        .flat_map_iter(|part| {
            let got = st.get_many(part);
            let out: Vec<String> = part
                .iter()
                .zip(got)
                .filter_map(
                    |(id, r)| match r.and_then(|b| codec.verify(id, &b).map(|_| ())) {
                        Ok(()) => None,
                        Err(e) => Some(format!("{id}: {e}")),
                    },
                )
                .collect();
            roamdisk_chunkstore::Progress::advance(&progress, part.len() as u64);
            out
        })
        .collect();
    // Every version's package, and every object it references, must be
    // in the store.
    let present: HashSet<ChunkId> = ids.iter().copied().collect();
    let mut missing: Vec<String> = Vec::new();
    let mut versions = 0u64;
    for name in st.ref_list()? {
        let (cat, _) = read_catalog(&*st, &name)?;
        for e in &cat.entries {
            versions += 1;
            let at = format!("version {} of {name}", e.version.short());
            if !present.contains(&e.version) {
                missing.push(format!("{at}: its package {} is missing", e.version));
                continue;
            }
            let refs =
                store::fetch(&*st, &e.version, None).and_then(|pkg| Version::references_of(&pkg));
            // A damaged package is already in `bad`.
            if let Ok(refs) = refs {
                let gone: Vec<&ChunkId> = refs.iter().filter(|r| !present.contains(r)).collect();
                if let Some(first) = gone.first() {
                    missing.push(format!(
                        "{at}: {} of its {} objects are missing (first: {first})",
                        gone.len(),
                        refs.len()
                    ));
                }
            }
        }
    }
    progress.finish();
    if v.st.json {
        println!(
            "{}",
            serde_json::json!({"objects": ids.len(), "bad": bad, "versions": versions, "missing": missing})
        );
    }
    if bad.is_empty() && missing.is_empty() {
        if !quiet && !v.st.json {
            println!(
                "ok: all {} objects match their names; every object of the {versions} versions is there",
                ids.len()
            );
        }
        return Ok(());
    }
    if !v.st.json {
        for b in &bad {
            println!("bad object {b}");
        }
        for m in &missing {
            println!("missing: {m}");
        }
    }
    match (bad.len(), missing.len()) {
        (0, m) => bail!("{m} of {versions} versions miss objects"),
        (b, 0) => bail!("{b} of {} objects are damaged or unreadable", ids.len()),
        (b, m) => bail!(
            "{b} of {} objects are damaged or unreadable, and {m} of {versions} versions miss objects",
            ids.len()
        ),
    }
}
