//! `roamdisk borrow`: a transient disk made of a host's free blocks
//! (TransPart): scan, plans, device-mapper tables; the session workflow
//! (`borrow run`) is in `run.rs`.

mod filters;
mod run;

use filters::Filters;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use roamdisk_blockdev::units::parse_size;
use roamdisk_borrow::free::list_free;
use roamdisk_borrow::verify::{verify_host, Depth};
use roamdisk_borrow::{Plan, ScanOptions};

use crate::progress::{Output, Reporter};
use crate::render::borrow::{matches, show_free, show_plan, show_scan};

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
    Run(run::RunArgs),
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

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Scan(s) => scan(s, quiet),
        Cmd::Free(f) => show_free(&list_free(&f.devices)?, f.json),
        Cmd::Show(s) => show_plan(&Plan::load(&s.plan)?, s.json, s.dm_table, s.partitions),
        Cmd::Check(c) => check(c),
        Cmd::Run(r) => run::run(r, quiet),
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
