//! The `roamdisk` command. Each subcommand is one file in `commands/`,
//! which parses its options and calls the library crates.

#[macro_use]
mod output;
mod args;
mod commands;
mod disk;
mod env;
#[allow(dead_code)]
mod plot;
mod progress;
mod qemu_img;
mod render;
mod serve;
mod store_args;

use clap::{Parser, Subcommand};

/// roamdisk makes a virtual machine's disk independent of the machine that
/// runs it: disks are stacks of layers (files, copy-on-write overlays,
/// caches, ...) served to any VMM over the standard NBD protocol.
///
/// A stack is written as a spec string, innermost layer last:
///
///   raw:disk.img                     a plain file
///   mem:1G                           a RAM disk
///   cow:overlay.img:raw:base.img     copy-on-write over a read-only base
///   lbs:vm.lbsd                      a Logging Block Store image (see `roamdisk lbs`)
///
/// Run `roamdisk layers` for every layer and its options, and
/// `roamdisk COMMAND --help` for each command.
#[derive(Parser)]
#[command(name = "roamdisk", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    /// More log output (-v: info, -vv: debug, -vvv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Serve(commands::serve::Args),
    Server(commands::server::Args),
    Info(commands::info::Args),
    Layers(commands::layers::Args),
    #[command(subcommand)]
    Lbs(commands::lbs::Cmd),
    #[command(subcommand)]
    Trace(commands::trace::Cmd),
    Replay(commands::replay::Args),
    Sperf(commands::sperf::Args),
    Commit(commands::commit::Args),
    Log(commands::log::Args),
    Checkout(commands::checkout::Args),
    Tag(commands::tag::Args),
    Rm(commands::rm::Args),
    Gc(commands::gc::Args),
    Hoard(commands::hoard::Args),
    #[command(subcommand)]
    Cache(commands::cache::Cmd),
    Suspend(commands::suspend::Args),
    Resume(commands::resume::Args),
    #[command(subcommand)]
    Store(commands::store::Cmd),
    #[command(subcommand)]
    Borrow(commands::borrow::Cmd),
    Sim(commands::sim::Args),
    #[command(subcommand)]
    Model(commands::model::Cmd),
}

fn init_logging(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "roamdisk={level},roamdisk_nbd={level},roamdisk_blockdev={level},roamdisk_lbs={level},roamdisk_workload={level},roamdisk_trace={level},roamdisk_chunkstore={level},roamdisk_chunkserver={level},roamdisk_roam={level},roamdisk_borrow={level},roamdisk_cachesim={level},roamdisk_fsmeta={level},roamdisk_server={level}"
        ))
    });
    // Colours only on a terminal: a log file or journal gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// A reader that went away (`roamdisk sim ... | head`) ends the command
/// quietly, as it would end `cat`: `println!` panics on a closed stdout,
/// and this hook turns exactly that panic into exit status 141 (128 +
/// SIGPIPE). SIGPIPE itself stays ignored, so a server or a store client
/// never dies of a peer closing its socket.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> std::process::ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.quiet);
    if let Some(n) = env::get().catalog_segment {
        roamdisk_chunkstore::catalog::set_segment_len(n);
    }
    let result = match cli.command {
        Command::Serve(a) => commands::serve::run(a, cli.quiet),
        Command::Server(a) => commands::server::run(a, cli.quiet),
        Command::Info(a) => commands::info::run(a),
        Command::Layers(a) => commands::layers::run(a),
        Command::Lbs(a) => commands::lbs::run(a, cli.quiet),
        Command::Trace(a) => commands::trace::run(a, cli.quiet),
        Command::Replay(a) => commands::replay::run(a, cli.quiet),
        Command::Sperf(a) => commands::sperf::run(a, cli.quiet),
        Command::Commit(a) => commands::commit::run(a, cli.quiet),
        Command::Log(a) => commands::log::run(a),
        Command::Checkout(a) => commands::checkout::run(a, cli.quiet),
        Command::Tag(a) => commands::tag::run(a, cli.quiet),
        Command::Rm(a) => commands::rm::run(a, cli.quiet),
        Command::Gc(a) => commands::gc::run(a, cli.quiet),
        Command::Hoard(a) => commands::hoard::run(a, cli.quiet),
        Command::Cache(a) => commands::cache::run(a, cli.quiet),
        Command::Suspend(a) => commands::suspend::run(a, cli.quiet),
        Command::Resume(a) => commands::resume::run(a, cli.quiet),
        Command::Store(a) => commands::store::run(a, cli.quiet),
        Command::Borrow(a) => commands::borrow::run(a, cli.quiet),
        Command::Sim(a) => commands::sim::run(a, cli.quiet),
        Command::Model(a) => commands::model::run(a, cli.quiet),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("roamdisk: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
