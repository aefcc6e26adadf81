//! `roamdisk store`: create, serve (`serve.rs`), inspect and verify chunk
//! stores; make user keys; the users of a chunk server (`store user`, in
//! `user.rs`).

mod serve;
mod user;

use std::path::PathBuf;

use anyhow::bail;
use clap::{Parser, Subcommand};
use roamdisk_blockdev::units::parse_size;
use roamdisk_chunkstore::hash::HashKind;
use roamdisk_chunkstore::store::{self, local::LocalStore, StoreConfig};

use crate::store_args::StoreArgs;

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
    Serve(serve::ServeArgs),
    #[command(subcommand)]
    User(user::Cmd),
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
                Some(loc) => store::s3::S3Store::init(loc, &cfg, &crate::env::get().s3())?,
                None => LocalStore::init(&i.dir, &cfg)?,
            }
            if !quiet {
                outln!(
                    "created chunk store {} ({}, {})",
                    i.dir.display(),
                    cfg.hash.name(),
                    cfg.compression_name()
                );
            }
            Ok(())
        }
        Cmd::Serve(s) => serve::run(s, quiet),
        Cmd::User(u) => user::run(u, quiet),
        Cmd::Info(i) => info(i),
        Cmd::Verify(v) => verify(v, quiet),
        Cmd::Keygen(k) => {
            roamdisk_chunkstore::version::create_key_file(&k.file)?;
            if !quiet {
                outln!("wrote a new 256-bit key to {} (keep it safe: without it the encrypted images cannot be read)", k.file.display());
            }
            Ok(())
        }
    }
}

fn info(i: InfoArgs) -> anyhow::Result<()> {
    let st = i.st.open(false)?;
    let u = roamdisk_chunkstore::usage::usage(&*st)?;
    if i.st.json {
        outln!("{}", serde_json::to_string_pretty(&u)?);
    } else {
        crate::render::store::usage(&u);
    }
    Ok(())
}

fn verify(v: VerifyArgs, quiet: bool) -> anyhow::Result<()> {
    let st = v.st.open(false)?;
    let progress = v.st.progress(quiet);
    let r = roamdisk_chunkstore::verify::verify(&*st, &progress)?;
    progress.finish();
    if v.st.json {
        outln!("{}", serde_json::to_string(&r)?);
    } else if r.ok() {
        if !quiet {
            outln!(
                "ok: all {} objects match their names; every object of the {} versions is there",
                r.objects,
                r.versions
            );
        }
    } else {
        for b in &r.bad {
            outln!("bad object {b}");
        }
        for m in &r.missing {
            outln!("missing: {m}");
        }
    }
    match (r.bad.len(), r.missing.len()) {
        (0, 0) => Ok(()),
        (0, m) => bail!("{m} of {} versions miss objects", r.versions),
        (b, 0) => bail!("{b} of {} objects are damaged or unreadable", r.objects),
        (b, m) => bail!(
            "{b} of {} objects are damaged or unreadable, and {m} of {} versions miss objects",
            r.objects,
            r.versions
        ),
    }
}
