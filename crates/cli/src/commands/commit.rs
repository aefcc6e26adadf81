//! `roamdisk commit`: store a disk (initial commit) or a session's useful
//! updates (update commit) as a new version of USER/IMAGE.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::{format_size, parse_size};
use roamdisk_blockdev::Access;
use roamdisk_cas::commit::{commit_image, CommitOptions, CommitSummary, Parent, Source};
use roamdisk_cas::guest::FsmetaAnalyzer;
use roamdisk_cas::session::dev::{CasDev, SessionOpen};
use roamdisk_cas::session::update::{commit_session, UpdateOptions};

use super::cas::{short, StoreArgs};

/// Commit a disk as a new version of a content-addressed image.
///
/// Initial commit: SOURCE is any disk — a stack spec (raw:disk.img,
/// lbs:vm.lbsd, ...), an image file of any format qemu-img reads (qcow2,
/// vmdk, ...), or an NBD URI (nbd://HOST/EXPORT, nbd+unix:///?socket=S).
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
    /// Keep written zeroes as data (switch P1 off).
    #[arg(long)]
    no_p1: bool,
    /// Keep writes to free file-system clusters (switch P2 off).
    #[arg(long)]
    no_p2: bool,
    /// Keep writes to guest swap (switch P3 off).
    #[arg(long)]
    no_p3: bool,
    /// Read at most this many bytes per second (e.g. 50M).
    #[arg(long, value_name = "RATE")]
    limit_rate: Option<String>,
    #[command(flatten)]
    st: StoreArgs,
}

/// A temporary raw copy of an image in another format, removed on drop.
struct TempRaw(PathBuf);

impl Drop for TempRaw {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn image_format(path: &Path) -> String {
    Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(path)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["format"].as_str().map(str::to_string))
        .unwrap_or_else(|| "raw".into())
}

fn nbd_size(uri: &str) -> anyhow::Result<u64> {
    let out = Command::new("nbdinfo")
        .args(["--size", uri])
        .output()
        .context("cannot run nbdinfo (install libnbd-bin) to read an NBD export")?;
    if !out.status.success() {
        bail!(
            "nbdinfo cannot read {uri}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("nbdinfo printed no size")
}

pub fn print_summary(s: &CommitSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    let u = &s.upload;
    println!(
        "committed {}@{}{}",
        s.catalog,
        short(&s.version),
        s.parent
            .as_deref()
            .map(|p| format!(" (parent {})", short(p)))
            .unwrap_or_default()
    );
    println!(
        "  disk        {} in {} chunks of {}: {} all-zero (stored as nothing), {} hashed ({})",
        format_size(s.disk_size),
        s.disk_size.div_ceil(s.chunk_size as u64),
        format_size(s.chunk_size as u64),
        u.zero_chunks,
        u.chunks - u.zero_chunks,
        format_size(u.hashed_bytes)
    );
    println!(
        "  store       {} new chunks uploaded ({} after compression), {} already there (reused)",
        u.new_objects,
        format_size(u.uploaded_bytes),
        u.reused_objects
    );
    if u.uploaded_bytes == 0 {
        println!("  dedup       nothing new: every chunk was already stored");
    } else {
        println!(
            "  dedup       {:.2}x (bytes hashed / bytes uploaded, compression included)",
            u.hashed_bytes as f64 / u.uploaded_bytes as f64
        );
    }
    println!(
        "  index       {} compressed ({:.3}% of the disk), in a {} version package{}",
        format_size(s.index_bytes as u64),
        s.index_bytes as f64 * 100.0 / s.disk_size as f64,
        format_size(s.package_bytes as u64),
        if s.encrypted {
            ", sealed with the user's key"
        } else {
            ""
        }
    );
    if let Some(f) = &s.filters {
        let pct = |n: u64| n as f64 * 100.0 / f.dirty.max(1) as f64;
        let after1 = f.dirty - f.p1_zero;
        let after2 = after1 - f.p2_free;
        let after3 = after2 - f.p3_swap;
        println!("  useful updates (sectors; the seed's Figure 9):");
        println!("    dirty                       {:>10}  100.0%", f.dirty);
        let on = |b: bool| if b { "" } else { " (off)" };
        println!(
            "    after P1 zero writes{:<6}  {:>10}  {:>5.1}%  (-{})",
            on(f.p1),
            after1,
            pct(after1),
            f.p1_zero
        );
        println!(
            "    after P2 free clusters{:<4}  {:>10}  {:>5.1}%  (-{})",
            on(f.p2),
            after2,
            pct(after2),
            f.p2_free
        );
        println!(
            "    after P3 swap{:<13}  {:>10}  {:>5.1}%  (-{})",
            on(f.p3),
            after3,
            pct(after3),
            f.p3_swap
        );
    }
    println!("  time        {:.2} s ({:.0} MB/s)", s.seconds, s.mb_per_s);
    Ok(())
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let progress = a.st.progress(quiet);
    let config = match &a.config {
        Some(p) => std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
        None => Vec::new(),
    };
    let mut opts = CommitOptions {
        target: a.to.clone().unwrap_or_default(),
        description: a.message.clone(),
        chunk_size: parse_size(&a.chunk_size).map_err(anyhow::Error::msg)? as u32,
        config,
        memory: a.memory.clone(),
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
        roamdisk_cas::catalog::check_tag(t)?;
    }
    let summary = if let Some(dir) = a.source.strip_prefix("cas:") {
        if a.encrypt {
            bail!("--encrypt applies to initial commits; a session keeps its image's encryption");
        }
        let dev = CasDev::open(
            Path::new(dir),
            &SessionOpen {
                store: a.st.store.clone(),
                key_file: a.st.key_file.clone(),
                ..Default::default()
            },
            &super::registry(),
        )
        .with_context(|| format!("cannot open session {dir}"))?;
        let u = UpdateOptions {
            commit: opts,
            p1: !a.no_p1,
            p2: !a.no_p2,
            p3: !a.no_p3,
        };
        commit_session(&dev, &u, &FsmetaAnalyzer, &progress)?
    } else {
        let Some(to) = &a.to else {
            bail!("say which image the disk becomes: --to USER/IMAGE");
        };
        roamdisk_cas::store::check_ref_name(to)?;
        if a.no_p1 || a.no_p2 || a.no_p3 {
            bail!("--no-p1/--no-p2/--no-p3 apply to update commits of cas:SESSION");
        }
        opts.user_key = match (&a.st.key_file, a.encrypt) {
            (Some(k), true) if !k.exists() => Some(roamdisk_cas::version::create_key_file(k)?),
            (Some(k), true) => Some(roamdisk_cas::version::read_key_file(k)?),
            (None, true) => bail!("--encrypt needs --key-file FILE (created if missing)"),
            (Some(_), false) => bail!("--key-file given without --encrypt"),
            (None, false) => None,
        };
        let store = a.st.open(true)?;
        let src = a.source.as_str();
        if src.starts_with("nbd://") || src.starts_with("nbd+unix://") || src.starts_with("nbds://")
        {
            let size = nbd_size(src)?;
            let mut child = Command::new("nbdcopy")
                .args([src, "-"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("cannot run nbdcopy (install libnbd-bin) to read an NBD export")?;
            let out = child.stdout.take().expect("piped stdout");
            let r = commit_image(
                &*store,
                Source::Stream(Box::new(out), size),
                &opts,
                &progress,
            );
            let _ = child.kill();
            let _ = child.wait();
            r?
        } else {
            let path = Path::new(src);
            let _tmp;
            let spec = if path.is_file() && image_format(path) != "raw" {
                let fmt = image_format(path);
                let tmp = std::env::temp_dir()
                    .join(format!(".roamdisk-commit-{}.raw", std::process::id()));
                _tmp = TempRaw(tmp.clone());
                let st = Command::new("qemu-img")
                    .args(["convert", "-O", "raw", "-f", &fmt])
                    .arg(path)
                    .arg(&tmp)
                    .status()
                    .context(
                        "cannot run qemu-img (install qemu-utils) to read this image format",
                    )?;
                if !st.success() {
                    bail!("qemu-img could not convert {src} ({fmt}) to raw");
                }
                format!("raw:{}", tmp.display())
            } else {
                src.to_string()
            };
            let dev = super::registry()
                .build(&spec, Access::ReadOnly)
                .with_context(|| format!("cannot open source '{src}'"))?;
            commit_image(&*store, Source::Dev(dev.as_ref()), &opts, &progress)?
        }
    };
    progress.finish();
    if !quiet || a.st.json {
        print_summary(&summary, a.st.json)?;
    }
    Ok(())
}
