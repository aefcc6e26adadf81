//! `roamdisk lbs`: create, inspect, check, compact, collect, import and
//! export Logging Block Store images.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::{format_size, parse_size};
use roamdisk_blockdev::Access;
use roamdisk_blockdev::BlockDev;
use roamdisk_lbs::create::{
    open_files, read_passphrase, CreateOptions, Encryption, KeyOptions, Paths,
};
use roamdisk_lbs::{inspect, maintain, transfer, ChecksumKind, Lbs, LbsOptions};

use crate::disk::Disk;
use crate::progress::{Output, Reporter};
use crate::render::lbs::{collected, created, show_check, show_info};

/// Logging Block Store images: log-structured, write-buffered, checksummed,
/// optionally encrypted (XTS-AES-256), crash-safe, garbage-collected. An
/// image is two files: IMAGE.lbsd (data) and IMAGE.lbsm (metadata log, can
/// live elsewhere with --meta-dir). Serve one with `roamdisk serve lbs:IMAGE`.
///
/// Examples:
///   roamdisk lbs create vm.lbsd --size 20G
///   roamdisk lbs create vm.lbsd --size 20G --encrypt --key-file vm.key --checksum blake3
///   roamdisk lbs import disk.qcow2 vm.lbsd
///   roamdisk serve lbs[key-file=vm.key]:vm.lbsd --socket /tmp/vm.sock
///   roamdisk lbs check vm.lbsd --key-file vm.key
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Create(CreateArgs),
    Info(InfoArgs),
    /// Verify every block's checksum, reporting corrupt blocks by LBN.
    ///
    /// Example:
    ///   roamdisk lbs check vm.lbsd --key-file vm.key
    #[command(verbatim_doc_comment)]
    Check(OpenArgs),
    /// Rewrite the metadata log from the current map (through a second
    /// file and an atomic rename), dropping superseded entries.
    ///
    /// Example:
    ///   roamdisk lbs compact vm.lbsd --key-file vm.key
    #[command(verbatim_doc_comment)]
    Compact(OpenArgs),
    /// Collect free clusters now, as the background collector would.
    ///
    /// Example:
    ///   roamdisk lbs gc vm.lbsd --key-file vm.key
    #[command(verbatim_doc_comment)]
    Gc(OpenArgs),
    Import(ImportArgs),
    Export(ExportArgs),
}

#[derive(ClapArgs, Clone)]
struct Where {
    /// The image: IMAGE, IMAGE.lbsd or IMAGE.lbsm.
    image: PathBuf,
    /// Directory holding the .lbsm metadata file (default: beside the data).
    #[arg(long, value_name = "DIR")]
    meta_dir: Option<PathBuf>,
    /// Key file of an encrypted image.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// File holding the passphrase of an encrypted image.
    #[arg(long, value_name = "FILE")]
    passphrase_file: Option<PathBuf>,
}

impl Where {
    fn paths(&self) -> Paths {
        Paths::resolve(&self.image, self.meta_dir.as_deref())
    }
    fn keys(&self) -> KeyOptions {
        KeyOptions {
            key_file: self.key_file.clone(),
            passphrase_file: self.passphrase_file.clone(),
        }
    }

    /// Open the image read-only.
    fn open_read_only(&self) -> anyhow::Result<Lbs> {
        let opts = LbsOptions {
            read_only: true,
            ..LbsOptions::default()
        };
        Ok(open_files(&self.paths(), &self.keys(), opts)?.0)
    }
}

#[derive(ClapArgs, Clone)]
struct Geometry {
    /// Block size: 1K (as in the seed) or 4K.
    #[arg(long, default_value = "4K", value_name = "SIZE")]
    block_size: String,
    /// Cluster size (unit of garbage collection).
    #[arg(long, default_value = "256K", value_name = "SIZE")]
    cluster_size: String,
    /// Physical space as a percentage of the logical size.
    #[arg(long, default_value_t = 112, value_name = "PCT")]
    overprovision: u32,
    /// Per-block checksum: crc32c, fletcher32, sha256, blake3, or none
    /// (no integrity checking; only to measure the others' cost).
    #[arg(long, default_value = "crc32c")]
    checksum: String,
    /// Encrypt with XTS-AES-256 (needs --key-file or --passphrase-file).
    #[arg(long)]
    encrypt: bool,
}

/// Create an empty image (fully preallocated).
///
/// Example:
///   roamdisk lbs create vm.lbsd --size 20G --encrypt --key-file vm.key
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct CreateArgs {
    #[command(flatten)]
    at: Where,
    /// Logical size (e.g. 20G).
    #[arg(long)]
    size: String,
    #[command(flatten)]
    geo: Geometry,
}

/// Show an image's geometry, algorithms, space and memory figures.
///
/// Example:
///   roamdisk lbs info vm.lbsd --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct InfoArgs {
    #[command(flatten)]
    at: Where,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// An existing image to open.
#[derive(Parser)]
pub struct OpenArgs {
    #[command(flatten)]
    at: Where,
}

/// Create an image from any stack spec or disk image file and copy it in,
/// skipping holes. qcow2 and other formats go through `qemu-img convert`.
///
/// Example:
///   roamdisk lbs import disk.qcow2 vm.lbsd --encrypt --key-file vm.key
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ImportArgs {
    /// Source: a stack spec (raw:disk.img, ...) or an image file of any format qemu-img reads.
    source: String,
    #[command(flatten)]
    at: Where,
    #[command(flatten)]
    geo: Geometry,
}

/// Copy an image out to a raw file (sparse) or, with --format, any format
/// qemu-img writes.
///
/// Example:
///   roamdisk lbs export vm.lbsd disk.raw
///   roamdisk lbs export vm.lbsd disk.qcow2 --format qcow2
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ExportArgs {
    #[command(flatten)]
    at: Where,
    /// Destination file (must not exist).
    dest: PathBuf,
    /// Output format (raw, or any qemu-img format such as qcow2).
    #[arg(long, default_value = "raw")]
    format: String,
}

fn create_options(size: u64, g: &Geometry, at: &Where) -> anyhow::Result<CreateOptions> {
    let checksum = ChecksumKind::from_name(&g.checksum).with_context(|| {
        format!(
            "unknown checksum '{}': use crc32c, fletcher32, sha256 or blake3",
            g.checksum
        )
    })?;
    let encryption = match (g.encrypt, &at.key_file, &at.passphrase_file) {
        (false, None, None) => Encryption::None,
        (false, _, _) => bail!("--key-file/--passphrase-file given without --encrypt"),
        (true, Some(k), None) => Encryption::KeyFile(k.clone()),
        (true, None, Some(p)) => Encryption::Passphrase(
            read_passphrase(p).with_context(|| format!("cannot read {}", p.display()))?,
        ),
        (true, None, None) => {
            bail!("--encrypt needs --key-file FILE (created if missing) or --passphrase-file FILE")
        }
        (true, Some(_), Some(_)) => bail!("give --key-file or --passphrase-file, not both"),
    };
    Ok(CreateOptions {
        size,
        block_size: u32::try_from(parse_size(&g.block_size)?)
            .map_err(|_| anyhow::anyhow!("--block-size {}: too large", g.block_size))?,
        cluster_size: u32::try_from(parse_size(&g.cluster_size)?)
            .map_err(|_| anyhow::anyhow!("--cluster-size {}: too large", g.cluster_size))?,
        overprovision_pct: g.overprovision,
        checksum,
        encryption,
    })
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create(c) => {
            let size = parse_size(&c.size)?;
            let o = create_options(size, &c.geo, &c.at)?;
            let paths = c.at.paths();
            let h = roamdisk_lbs::create(&paths, &o)?;
            if !quiet {
                eprintln!("{}", created(&paths, &h));
            }
            Ok(())
        }
        Cmd::Info(i) => show_info(&inspect::info(&i.at.paths())?, i.json),
        Cmd::Check(o) => {
            let p = Reporter::new(Output::human(quiet));
            let c = maintain::check(&o.at.paths(), &o.at.keys(), &p)?;
            p.finish();
            show_check(&c)
        }
        Cmd::Compact(o) => {
            let (before, after) = maintain::compact(&o.at.paths(), &o.at.keys())?;
            outln!(
                "metadata log: {} -> {}",
                format_size(before),
                format_size(after)
            );
            Ok(())
        }
        Cmd::Gc(o) => {
            let c = maintain::collect(&o.at.paths(), &o.at.keys())?;
            outln!("{}", collected(&c));
            Ok(())
        }
        Cmd::Import(i) => import(&i, quiet),
        Cmd::Export(e) => export(&e, quiet),
    }
}

fn import(i: &ImportArgs, quiet: bool) -> anyhow::Result<()> {
    // A stack spec, an NBD URI, or an image file of any format qemu-img
    // reads (`crate::disk`); the disk keeps a temporary raw copy alive.
    let src = Disk::open(&i.source, Access::ReadOnly)?;
    let o = create_options(src.dev.size(), &i.geo, &i.at)?;
    let paths = i.at.paths();
    let p = Reporter::new(Output::human(quiet));
    let copied = transfer::import(src.dev.as_ref(), &paths, &o, &i.at.keys(), &p)?;
    p.finish();
    if !quiet {
        eprintln!(
            "imported {} of data into {}",
            format_size(copied),
            paths.data.display()
        );
    }
    Ok(())
}

fn export(e: &ExportArgs, quiet: bool) -> anyhow::Result<()> {
    if e.dest.exists() {
        bail!("{} exists; remove it first", e.dest.display());
    }
    let lbs = e.at.open_read_only()?;
    let raw_path = if e.format == "raw" {
        e.dest.clone()
    } else {
        e.dest.with_extension("export-tmp.raw")
    };
    let p = Reporter::new(Output::human(quiet));
    let copied = transfer::export_raw(&lbs, &raw_path, &p)?;
    p.finish();
    if e.format != "raw" {
        let r = crate::qemu_img::export(&raw_path, &e.dest, &e.format);
        let _ = std::fs::remove_file(&raw_path);
        r?;
    }
    if !quiet {
        eprintln!(
            "exported {} of data to {}",
            format_size(copied),
            e.dest.display()
        );
    }
    Ok(())
}
