//! `roamdisk lbs`: create, inspect, check, compact, collect, import and
//! export Logging Block Store images.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::{format_size, parse_size};
use roamdisk_blockdev::Access;
use roamdisk_blockdev::{copy_sparse, BlockDev, CopyOptions};
use roamdisk_lbs::create::{open_files, read_header, CreateOptions, Encryption, KeyOptions, Paths};
use roamdisk_lbs::{ChecksumKind, Lbs, LbsOptions};

use crate::disk::Disk;
use crate::progress::{Output, Reporter};
use roamdisk_blockdev::progress::{Progress, Unit};

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

    /// Open the image with `opts`.
    fn open(&self, opts: LbsOptions) -> anyhow::Result<Lbs> {
        Ok(open_files(&self.paths(), &self.keys(), opts)?.0)
    }

    /// Open the image read-only.
    fn open_read_only(&self) -> anyhow::Result<Lbs> {
        self.open(LbsOptions {
            read_only: true,
            ..LbsOptions::default()
        })
    }

    /// Open the image writable with no background GC (opening replays,
    /// rolls back and compacts; the command does the rest).
    fn open_foreground(&self) -> anyhow::Result<Lbs> {
        self.open(LbsOptions {
            background_gc: false,
            ..LbsOptions::default()
        })
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
        (true, None, Some(p)) => {
            let mut pw =
                std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
            while pw.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                pw.pop();
            }
            Encryption::Passphrase(pw)
        }
        (true, None, None) => {
            bail!("--encrypt needs --key-file FILE (created if missing) or --passphrase-file FILE")
        }
        (true, Some(_), Some(_)) => bail!("give --key-file or --passphrase-file, not both"),
    };
    Ok(CreateOptions {
        size,
        block_size: parse_size(&g.block_size).map_err(anyhow::Error::msg)? as u32,
        cluster_size: parse_size(&g.cluster_size).map_err(anyhow::Error::msg)? as u32,
        overprovision_pct: g.overprovision,
        checksum,
        encryption,
    })
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create(c) => {
            let size = parse_size(&c.size).map_err(anyhow::Error::msg)?;
            let o = create_options(size, &c.geo, &c.at)?;
            let paths = c.at.paths();
            let h = roamdisk_lbs::create(&paths, &o)?;
            if !quiet {
                eprintln!(
                    "created {} ({} logical, {} physical in {} clusters) and {}",
                    paths.data.display(),
                    format_size(h.logical_size),
                    format_size(h.geometry.physical_blocks() * h.geometry.block_size as u64),
                    h.geometry.clusters,
                    paths.meta.display()
                );
            }
            Ok(())
        }
        Cmd::Info(i) => info(&i),
        Cmd::Check(o) => {
            let lbs = o.at.open_read_only()?;
            let p = Reporter::phase_of(
                Output::human(quiet),
                "checking blocks",
                lbs.header().logical_blocks(),
                Unit::Items,
            );
            let bad = lbs.check(|done, _| p.set(done))?;
            p.finish();
            if bad.is_empty() {
                println!(
                    "ok: every mapped block verifies ({} checksums)",
                    lbs.header().checksum.name()
                );
                Ok(())
            } else {
                for l in &bad {
                    println!(
                        "corrupt block: LBN {l} (bytes {}..{})",
                        l * lbs.header().geometry.block_size as u64,
                        (l + 1) * lbs.header().geometry.block_size as u64
                    );
                }
                bail!("{} corrupt blocks", bad.len())
            }
        }
        Cmd::Compact(o) => {
            let paths = o.at.paths();
            let before = std::fs::metadata(&paths.meta).map(|m| m.len()).unwrap_or(0);
            // Opening writable replays, rolls back and compacts.
            o.at.open_foreground()?.close()?;
            let after = std::fs::metadata(&paths.meta).map(|m| m.len()).unwrap_or(0);
            println!(
                "metadata log: {} -> {}",
                format_size(before),
                format_size(after)
            );
            Ok(())
        }
        Cmd::Gc(o) => {
            let lbs = o.at.open_foreground()?;
            let n = lbs.gc_now()?;
            let s = lbs.stats();
            lbs.close()?;
            println!(
                "reclaimed {n} clusters ({} blocks moved); {} clusters free",
                s.gc_moved, s.free_clusters
            );
            Ok(())
        }
        Cmd::Import(i) => import(&i, quiet),
        Cmd::Export(e) => export(&e, quiet),
    }
}

fn info(i: &InfoArgs) -> anyhow::Result<()> {
    let paths = i.at.paths();
    let h = read_header(&paths)?;
    let bytes = std::fs::read(&paths.meta)
        .with_context(|| format!("cannot read {}", paths.meta.display()))?;
    let r = roamdisk_lbs::replay::replay(&bytes, &h).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bpc = h.geometry.blocks_per_cluster();
    let live = r.map.live_counts(bpc);
    let mapped: u64 = live.iter().map(|&l| l as u64).sum();
    let moved = r
        .map
        .seal_pbn
        .iter()
        .filter(|&&p| p != roamdisk_lbs::replay::IN_PLACE)
        .count();
    let zero = r
        .map
        .l2p
        .iter()
        .filter(|&&p| p == roamdisk_lbs::replay::ZERO)
        .count() as u64;
    let used = live.iter().filter(|&&l| l > 0).count() as u64;
    let direct = roamdisk_blockdev::layers::raw::RawDev::open_direct(&paths.data, true)
        .map(|d| d.is_direct())
        .unwrap_or(false);
    let bs = h.geometry.block_size as u64;
    let mem_per_gib = roamdisk_lbs::image::map_bytes_per_gib(&h) / 1e6;
    let enc = match h.cipher {
        roamdisk_lbs::format::Cipher::None => "none".to_string(),
        _ => format!(
            "xts-aes-256 ({})",
            if h.key_source == roamdisk_lbs::format::KeySource::Passphrase {
                "passphrase, Argon2id"
            } else {
                "key file"
            }
        ),
    };
    if i.json {
        let v = serde_json::json!({
            "data": paths.data, "meta": paths.meta, "logical_size": h.logical_size,
            "block_size": bs, "cluster_size": h.geometry.cluster_size, "clusters": h.geometry.clusters,
            "overprovision_pct": (h.geometry.physical_blocks() * 100) / h.logical_blocks(),
            "checksum": h.checksum.name(), "encryption": enc, "o_direct": direct,
            "mapped_blocks": mapped, "zero_blocks": zero, "used_clusters": used,
            "log_bytes": bytes.len(), "log_discarded_bytes": r.discarded, "barriers": r.barriers,
            "generation": h.generation, "map_memory_mb_per_gib": mem_per_gib,
            "format_version": h.version, "moved_blocks": moved,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("data:           {}", paths.data.display());
    println!("metadata:       {}", paths.meta.display());
    println!(
        "logical size:   {} ({} blocks of {})",
        format_size(h.logical_size),
        h.logical_blocks(),
        format_size(bs)
    );
    println!(
        "physical:       {} clusters of {} = {} ({}% of logical)",
        h.geometry.clusters,
        format_size(h.geometry.cluster_size as u64),
        format_size(h.geometry.physical_blocks() * bs),
        h.geometry.physical_blocks() * 100 / h.logical_blocks()
    );
    println!("format:         version {}", h.version);
    println!("checksum:       {}", h.checksum.name());
    println!("encryption:     {enc}");
    println!(
        "data I/O:       {}",
        if direct {
            "O_DIRECT (page cache bypassed)"
        } else {
            "buffered: this file system refuses O_DIRECT"
        }
    );
    println!(
        "mapped:         {} blocks ({}), {} zero blocks",
        mapped,
        format_size(mapped * bs),
        zero
    );
    println!("moved:          {moved} blocks copied by the garbage collector (still sealed where first written)");
    println!(
        "clusters:       {used} holding live data, {} free",
        h.geometry.clusters - used
    );
    println!(
        "metadata log:   {} ({} barriers; {} bytes after the last barrier would be rolled back)",
        format_size(bytes.len() as u64),
        r.barriers,
        r.discarded
    );
    println!("map memory:     {mem_per_gib:.1} MB per GiB of logical space (the seed: 12 MB)");
    Ok(())
}

/// Open a source for import the way every command opens a disk
/// ([`crate::disk`]: a stack spec, an NBD URI, or an image file of any
/// format qemu-img reads); the [`Disk`] keeps a temporary raw copy alive.
fn open_source(src: &str) -> anyhow::Result<(Arc<dyn BlockDev>, Disk)> {
    let disk = Disk::open(src, Access::ReadOnly)?;
    Ok((disk.dev.clone(), disk))
}

/// Copy `src` into `dst`, writing only ranges that are not holes/zeroes.
fn copy(
    src: &dyn BlockDev,
    dst: &dyn BlockDev,
    quiet: bool,
    what: &'static str,
) -> anyhow::Result<u64> {
    let p = Reporter::new(Output::human(quiet));
    let opts = CopyOptions {
        what,
        ..Default::default()
    };
    let copied = copy_sparse(src, dst, &opts, &p)?;
    dst.flush()?;
    p.finish();
    Ok(copied)
}

fn import(i: &ImportArgs, quiet: bool) -> anyhow::Result<()> {
    let (src, _tmp) = open_source(&i.source)?;
    let o = create_options(src.size(), &i.geo, &i.at)?;
    let paths = i.at.paths();
    roamdisk_lbs::create(&paths, &o)?;
    let result = (|| {
        let lbs = i.at.open(LbsOptions::default())?;
        let copied = copy(src.as_ref(), &lbs, quiet, "importing")?;
        lbs.close()?;
        Ok::<_, anyhow::Error>(copied)
    })();
    match result {
        Ok(copied) => {
            if !quiet {
                eprintln!(
                    "imported {} of data into {}",
                    format_size(copied),
                    paths.data.display()
                );
            }
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&paths.data);
            let _ = std::fs::remove_file(&paths.meta);
            Err(e.context("import failed; the partial image was removed"))
        }
    }
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
    let f = std::fs::File::create(&raw_path)
        .with_context(|| format!("cannot create {}", raw_path.display()))?;
    f.set_len(lbs.size())?;
    drop(f);
    let dst = super::registry().build(&format!("raw:{}", raw_path.display()), Access::ReadWrite)?;
    let copied = copy(&lbs, dst.as_ref(), quiet, "exporting")?;
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
