//! `roamdisk borrow run`: the whole TransPart session — borrow the host's
//! free blocks, copy the VM disk in, serve it, copy the changes back,
//! release the blocks.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::{Access, BlockDev};
use roamdisk_borrow::session::{self, CopyIn, Session, SessionOptions};
use roamdisk_borrow::{BorrowOptions, Verify};
use roamdisk_nbd::{Ended, Export, Listen, ServeOptions, Until};

use super::filters::Filters;
use crate::progress::{Output, Reporter};
use crate::render::borrow::{show_timings, started};
use crate::serve::announce;

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

pub fn run(a: RunArgs, quiet: bool) -> anyhow::Result<()> {
    let listen: Vec<Listen> = a
        .socket
        .iter()
        .map(|s| Listen::Unix(s.clone()))
        .chain(a.listen.map(Listen::Tcp))
        .collect();
    if listen.is_empty() {
        bail!("say where to serve the VM disk: --socket PATH and/or --listen ADDR:PORT");
    }
    let reg = crate::commands::registry();
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
