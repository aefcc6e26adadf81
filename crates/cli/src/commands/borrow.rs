//! `roamdisk borrow`: a transient disk made of a host's free blocks
//! (TransPart): scan, plans, device-mapper tables, the session workflow.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_blockdev::units::parse_size;
use roamdisk_blockdev::Access;
use roamdisk_blockdev::BlockDev;
use roamdisk_borrow::free::list_free;
use roamdisk_borrow::session::{self, CopyIn, Session, SessionOptions};
use roamdisk_borrow::verify::{verify_host, Depth};
use roamdisk_borrow::{BorrowOptions, Plan, ScanOptions, Verify};
use roamdisk_nbd::{Ended, Export, Listen, ServeOptions, Until};

use crate::progress::{Output, Reporter};
use crate::render::borrow::{matches, show_free, show_plan, show_scan, show_timings, started};
use crate::serve::announce;

/// Borrow the free blocks of a host's disks as a fast transient disk for a
/// VM (TransPart). The host's file systems are only read; nothing
/// allocated is ever read or written, and the borrowed blocks are
/// encrypted with a key that never leaves memory.
///
/// Only borrow from a host whose operating system is not running (boot
/// the host from roamdisk's USB stick). Partitions that are not cleanly
/// unmounted, have errors, need journal recovery, hold a hibernation
/// image or Windows fast-startup state are skipped, as are file systems
/// roamdisk does not read (each with its reason).
///
/// Examples:
///   roamdisk borrow scan /dev/sda --plan sda.plan
///   roamdisk borrow scan /dev/sda --min-size 20G --dm-table - | dmsetup create transient
///   roamdisk borrow free disk.img
///   roamdisk serve borrow:sda.plan --socket /tmp/t.sock
///   roamdisk borrow run --host /dev/sda --state /media/usb/vm.img --socket /tmp/vm.sock
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Scan(ScanArgs),
    Free(FreeArgs),
    Show(ShowArgs),
    Check(CheckArgs),
    Run(RunArgs),
}

#[derive(ClapArgs, Clone)]
struct Filters {
    /// Ignore free extents shorter than this.
    #[arg(long, default_value = "4M", value_parser = parse_size, value_name = "SIZE")]
    min_extent: u64,
    /// Keep at most this many extents (the largest).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    max_extents: u64,
}

impl Filters {
    /// Scan options with these filters.
    fn scan_options(&self) -> ScanOptions {
        ScanOptions {
            min_extent: self.min_extent,
            max_extents: self.max_extents,
            ..ScanOptions::default()
        }
    }
}

/// Scan host disks (or disk images): partitions, file systems, safety
/// checks, free extents; print a summary and write a plan.
///
/// Extents shorter than --min-extent are ignored, the largest
/// --max-extents are kept, then they are sorted by partition and offset.
///
/// Examples:
///   roamdisk borrow scan /dev/sda /dev/sdb --plan host.plan
///   roamdisk borrow scan disk.img --min-extent 1M --json
///   roamdisk borrow scan /dev/sda --min-size 20G --dm-table table.txt
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ScanArgs {
    /// Host disks or disk images (read only).
    #[arg(required = true)]
    devices: Vec<PathBuf>,
    #[command(flatten)]
    filters: Filters,
    /// Fail unless at least this much is found (the error says how much
    /// was found and where).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    min_size: Option<u64>,
    /// Use only this much (the largest extents first).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    size: Option<u64>,
    /// Write the plan (JSON) here; serve it with `roamdisk serve borrow:FILE`.
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// Write the device-mapper linear table here ('-': stdout).
    #[arg(long, value_name = "FILE")]
    dm_table: Option<PathBuf>,
    /// Print the plan as JSON instead of the summary.
    #[arg(long)]
    json: bool,
}

/// List every free extent of every partition, before any size filter:
/// exactly what each file system's allocation map says is free.
///
/// Text output: one line per partition `# DEVICE PART FS HEALTH FREE_BYTES
/// EXTENTS`, then one `START LENGTH` line (absolute bytes of the device)
/// per extent.
///
/// Examples:
///   roamdisk borrow free disk.img
///   roamdisk borrow free /dev/sda --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct FreeArgs {
    /// Disks or images (read only).
    #[arg(required = true)]
    devices: Vec<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Show a plan: summary, JSON, device-mapper table, or one tab-separated
/// line per partition (DEVICE NUMBER FS STATUS REASON FREE BORROWED
/// EXTENTS; REASON is - when used).
///
/// Examples:
///   roamdisk borrow show host.plan
///   roamdisk borrow show host.plan --dm-table | dmsetup create transient
///   roamdisk borrow show host.plan --partitions
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct ShowArgs {
    plan: PathBuf,
    /// Print the JSON plan.
    #[arg(long, conflicts_with_all = ["dm_table", "partitions"])]
    json: bool,
    /// Print the device-mapper linear table.
    #[arg(long, conflicts_with = "partitions")]
    dm_table: bool,
    /// Print one tab-separated line per partition.
    #[arg(long)]
    partitions: bool,
}

/// Check that a plan still matches the host (read only): sizes, partition
/// tables, file-system identities, health, and that every extent is still
/// free.
///
/// Examples:
///   roamdisk borrow check host.plan
///   roamdisk borrow check host.plan --identity-only
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct CheckArgs {
    plan: PathBuf,
    /// Compare hashes only; do not re-read the allocation maps.
    #[arg(long)]
    identity_only: bool,
}

/// A whole session: scan the host, allocate a borrowed disk as large as
/// the VM disk, copy the VM disk in (whole, or on demand), serve it over
/// NBD, and when the session ends (SIGINT/SIGTERM, or the --exec command
/// exits) copy the modified blocks back to the VM disk and release the
/// host's blocks. Prints the time of each phase.
///
/// Examples:
///   roamdisk borrow run --host /dev/sda --state /media/usb/vm.img --socket /tmp/vm.sock
///   roamdisk borrow run --host host.img --state raw:vm.img --socket /tmp/vm.sock \
///       --exec 'qemu-system-x86_64 -drive file=nbd:unix:/tmp/vm.sock,format=raw' --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Host disk or image to borrow from (repeat for several).
    #[arg(long = "host", required = true, value_name = "DEVICE")]
    hosts: Vec<PathBuf>,
    /// The VM disk on the portable medium: a path or any stack spec.
    #[arg(long, value_name = "SPEC")]
    state: String,
    /// Serve on this Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Serve on this TCP address (loopback recommended).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// Run this shell command once serving (ROAMDISK_NBD_URI is set for
    /// it); the session ends when it exits.
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Fetch each block from the VM disk when first used instead of
    /// copying it all before serving.
    #[arg(long)]
    on_demand: bool,
    /// Write zeroes over every host block written, at release.
    #[arg(long)]
    scrub: bool,
    /// Do not encrypt (the guest's data stays readable on the host).
    #[arg(long)]
    no_encrypt: bool,
    #[command(flatten)]
    filters: Filters,
    /// Also write the plan here.
    #[arg(long, value_name = "FILE")]
    plan_out: Option<PathBuf>,
    /// Print the timings as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Scan(s) => scan(s, quiet),
        Cmd::Free(f) => show_free(&list_free(&f.devices)?, f.json),
        Cmd::Show(s) => show_plan(&Plan::load(&s.plan)?, s.json, s.dm_table, s.partitions),
        Cmd::Check(c) => check(c),
        Cmd::Run(r) => session(r, quiet),
    }
}

fn scan(a: ScanArgs, quiet: bool) -> anyhow::Result<()> {
    let opts = ScanOptions {
        min_size: a.min_size.unwrap_or(0),
        size_limit: a.size.unwrap_or(0),
        ..a.filters.scan_options()
    };
    let plan = roamdisk_borrow::scan(
        &a.devices,
        &opts,
        &Reporter::new(Output::human(quiet || a.json)),
    )?;
    if let Some(p) = &a.plan {
        plan.save(p)?;
    }
    if let Some(t) = &a.dm_table {
        write_out(t, &plan.dm_table())?;
    }
    show_scan(&plan, a.json, a.plan.as_deref(), a.dm_table.as_deref());
    Ok(())
}

fn write_out(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if path == std::path::Path::new("-") {
        std::io::stdout().write_all(text.as_bytes())?;
        Ok(())
    } else {
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }
}

fn check(a: CheckArgs) -> anyhow::Result<()> {
    let plan = Plan::load(&a.plan)?;
    let depth = if a.identity_only {
        Depth::Identity
    } else {
        Depth::Full
    };
    verify_host(&plan, depth)?;
    outln!("{}", matches(&a.plan, &plan, a.identity_only));
    Ok(())
}

fn session(a: RunArgs, quiet: bool) -> anyhow::Result<()> {
    let listen: Vec<Listen> = a
        .socket
        .iter()
        .map(|s| Listen::Unix(s.clone()))
        .chain(a.listen.map(Listen::Tcp))
        .collect();
    if listen.is_empty() {
        bail!("say where to serve the VM disk: --socket PATH and/or --listen ADDR:PORT");
    }
    let reg = super::registry();
    let spec = reg.parse(&a.state)?;
    let state = reg
        .open(&spec, Access::ReadWrite)
        .with_context(|| format!("cannot open the VM disk '{}'", a.state))?;
    let opts = SessionOptions {
        hosts: a.hosts.clone(),
        scan: a.filters.scan_options(),
        borrow: BorrowOptions {
            encrypt: !a.no_encrypt,
            scrub: a.scrub,
            verify: Verify::Full,
            size: None,
        },
        copy_in: if a.on_demand {
            CopyIn::OnDemand
        } else {
            CopyIn::Whole
        },
        plan_out: a.plan_out.clone(),
    };
    if a.no_encrypt {
        tracing::warn!(
            "encryption is off: the VM's data will stay readable in the host's free blocks"
        );
    }
    let bars = Reporter::new(Output::human(quiet || a.json));
    let show_started = |sess: &Session| {
        if !quiet && !a.json {
            eprintln!("roamdisk: {}", started(sess));
        }
    };
    let (t, exec_status) = session::run(&opts, state, &bars, show_started, |dev| {
        serve(dev, listen.clone(), a.exec.as_deref(), quiet || a.json)
    })?;
    show_timings(&t, a.json)?;
    if let Some(st) = exec_status {
        if !st.success() {
            bail!("the --exec command failed ({st}); modified blocks were copied back");
        }
    }
    Ok(())
}

/// Serve `dev` until a signal arrives or the `exec` command exits.
fn serve(
    dev: Arc<dyn BlockDev>,
    listen: Vec<Listen>,
    exec: Option<&str>,
    quiet: bool,
) -> anyhow::Result<Option<ExitStatus>> {
    let export = Export {
        name: String::new(),
        description: "roamdisk borrowed transient disk".into(),
        dev,
    };
    let opts = ServeOptions {
        max_connections: 16,
        io_threads: 512,
        ..ServeOptions::default()
    };
    let until = exec.map_or(Until::Signal, |c| Until::Exec(c.to_string()));
    let what = announce(quiet, "serving the borrowed disk");
    match roamdisk_nbd::serve(vec![export], listen, opts, until, what)? {
        Ended::Exited(st) => Ok(Some(st)),
        Ended::Signalled => Ok(None),
    }
}
