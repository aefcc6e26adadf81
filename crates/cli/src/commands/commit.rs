//! `roamdisk commit`: store a disk (initial commit) or a session's useful
//! updates (update commit) as a new version of USER/IMAGE.

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use roamdisk_blockdev::units::parse_size;
use roamdisk_blockdev::Access;
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, MemoryImage, Parent, Source};
use roamdisk_roam::layer::CAS;
use roamdisk_roam::session::update::commit_dir;

use crate::disk::DiskSpec;
use crate::render::commit::finish;
use crate::store_args::{Filters, StoreArgs};

/// Commit a disk as a new version of a content-addressed image.
///
/// Initial commit: SOURCE is any disk — a stack spec (raw:disk.img,
/// lbs:vm.lbsd, ...), an image file of any format qemu-img reads (qcow2,
/// vmdk, ...), or an NBD URI (nbd://HOST/EXPORT, nbd+unix:///?socket=S,
/// read by the nbd layer, holes skipped).
/// It is cut into chunks, hashed on all cores, and only the chunks the
/// store lacks are uploaded. --to names the image.
///
/// Update commit: SOURCE is cas:SESSION (from `roamdisk checkout
/// --session`). Only useful updates are kept: P1 drops written zeroes
/// (kept as ZERO, no data), P2 drops writes to clusters the guest's ext2/3/4
/// or NTFS marks free, P3 drops writes to guest swap; the report shows what
/// each filter removed. The session then continues on the new version.
///
/// A version is stored before the catalog names it: a crash or a full store
/// leaves the previous version current.
///
/// Examples:
///   roamdisk commit golden.qcow2 --to golden/win10 -m "installed" --store /srv/store
///   roamdisk commit raw:disk.img --to alice/desktop --encrypt --key-file alice.key
///   roamdisk commit cas:~/sessions/alice -m "after work"
///   roamdisk commit 'nbd+unix:///?socket=/tmp/vm.sock' --to bob/vm --store http://10.0.0.5:8700
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The disk: a stack spec, an image file, an NBD URI, or cas:SESSION.
    source: String,
    /// The image the version goes to: USER/IMAGE (an update commit
    /// defaults to its session's).
    #[arg(long, value_name = "USER/IMAGE")]
    to: Option<String>,
    /// Description of the version.
    #[arg(short, long, default_value = "")]
    message: String,
    /// Chunk size of an initial commit (4K..4M, power of two).
    #[arg(long, default_value = "64K", value_name = "SIZE")]
    chunk_size: String,
    /// The VM configuration file to keep with the version.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A memory image to keep with the version (chunked like the disk).
    #[arg(long, value_name = "FILE")]
    memory: Option<PathBuf>,
    /// Tag the new version (moves the tag if another version had it).
    #[arg(long)]
    tag: Option<String>,
    /// Start a new history instead of descending from the latest version.
    #[arg(long)]
    no_parent: bool,
    /// Convergent encryption: chunks encrypted with keys derived from their
    /// content (identical chunks still deduplicate across users), the
    /// index sealed with the user's key (--key-file; created if missing).
    #[arg(long)]
    encrypt: bool,
    #[command(flatten)]
    filters: Filters,
    /// Read at most this many bytes per second (e.g. 50M).
    #[arg(long, value_name = "RATE")]
    limit_rate: Option<String>,
    #[command(flatten)]
    st: StoreArgs,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let progress = a.st.progress(quiet);
    let config = crate::store_args::read_optional(a.config.as_deref())?;
    let mut opts = CommitOptions {
        target: a.to.clone().unwrap_or_default(),
        description: a.message.clone(),
        chunk_size: {
            let n = parse_size(&a.chunk_size).map_err(anyhow::Error::msg)?;
            u32::try_from(n).map_err(|_| {
                anyhow::anyhow!(
                    "--chunk-size {}: too large (chunks are at most a few MiB)",
                    a.chunk_size
                )
            })?
        },
        config,
        memory: a.memory.clone().map(MemoryImage::File),
        parent: if a.no_parent {
            Parent::None
        } else {
            Parent::Latest
        },
        tag: a.tag.clone(),
        rate_limit: match &a.limit_rate {
            Some(r) => Some(parse_size(r).map_err(anyhow::Error::msg)?),
            None => None,
        },
        ..Default::default()
    };
    if let Some(t) = &opts.tag {
        roamdisk_chunkstore::catalog::check_tag(t)?;
    }
    let src = DiskSpec::parse(&a.source)?;
    if src.spec.kind == CAS.name {
        if a.encrypt {
            bail!("--encrypt applies to initial commits; a session keeps its image's encryption");
        }
        let (dir, open) = a.st.session_open(&src.spec)?;
        let reg = super::registry();
        let u = a.filters.update(opts);
        let (summary, _) = commit_dir(&dir, &open, &u, &reg, &progress)?;
        return finish(&summary, progress, quiet, a.st.json);
    }
    let Some(to) = &a.to else {
        bail!("say which image the disk becomes: --to USER/IMAGE");
    };
    roamdisk_chunkstore::store::check_ref_name(to)?;
    if a.filters.any_off() {
        bail!("--no-p1/--no-p2/--no-p3 apply to update commits of cas:SESSION");
    }
    opts.user_key = match (&a.st.key_file, a.encrypt) {
        (Some(k), true) if !k.exists() => Some(roamdisk_chunkstore::version::create_key_file(k)?),
        (Some(k), true) => Some(roamdisk_chunkstore::version::read_key_file(k)?),
        (None, true) => bail!("--encrypt needs --key-file FILE (created if missing)"),
        (Some(_), false) => bail!("--key-file given without --encrypt"),
        (None, false) => None,
    };
    let store = a.st.open(true)?;
    let disk = src.open(Access::ReadOnly)?;
    let summary = commit_image(&*store, Source::Dev(disk.dev.as_ref()), &opts, &progress)?;
    finish(&summary, progress, quiet, a.st.json)
}
