//! What the commands that serve NBD share (`serve`, `server`, `checkout
//! --serve`, `resume --socket`, `borrow`): serving one disk until the user
//! stops the command, the limits options, and the line announcing each
//! bound listener. The serving itself is `roamdisk_nbd::serve`'s.

use std::sync::Arc;

use clap::Args;
use roamdisk_blockdev::{Access, BlockDev, Checked};
use roamdisk_nbd::{Bound, Ended, Export, Listen, ServeOptions, Until};

/// Serve `dev` as the default export on `listen` until `until` (a signal,
/// or the end of an --exec command).
pub fn serve_one(
    dev: Arc<dyn BlockDev>,
    access: Access,
    describe: &str,
    listen: Vec<Listen>,
    until: Until,
    quiet: bool,
) -> anyhow::Result<Ended> {
    let export = Export {
        name: String::new(),
        description: describe.to_string(),
        dev: Arc::new(Checked::new(dev, access)),
    };
    let how = if access == Access::ReadOnly {
        " read-only"
    } else {
        ""
    };
    let what = format!("serving {describe}{how}");
    let opts = ServeOptions::default();
    Ok(roamdisk_nbd::serve(
        vec![export],
        listen,
        opts,
        until,
        announce(quiet, &what),
    )?)
}

/// How much a server takes on at once.
#[derive(Args, Debug, Clone, Copy)]
pub struct Limits {
    /// Requests processed at once per connection.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_in_flight: usize,
    /// Connections served at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_connections: usize,
    /// Threads doing block I/O.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub io_threads: usize,
}

impl Limits {
    /// These limits on top of `opts`.
    pub fn apply(&self, opts: ServeOptions) -> ServeOptions {
        ServeOptions {
            max_in_flight: self.max_in_flight,
            max_connections: self.max_connections,
            io_threads: self.io_threads,
            ..opts
        }
    }
}

impl From<Limits> for roamdisk_server::RunOptions {
    fn from(l: Limits) -> Self {
        roamdisk_server::RunOptions {
            max_in_flight: l.max_in_flight,
            max_connections: l.max_connections,
            io_threads: l.io_threads,
        }
    }
}

/// What a serving command writes to stderr once its listeners are bound:
/// `roamdisk: WHAT on URI` for each (scripts and tests wait for that
/// line); nothing when `quiet`.
pub fn announce(quiet: bool, what: &str) -> impl FnOnce(&Bound) + '_ {
    move |bound| {
        if !quiet {
            for uri in &bound.uris {
                eprintln!("roamdisk: {what} on {uri}");
            }
        }
    }
}
