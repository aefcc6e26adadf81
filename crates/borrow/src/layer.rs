//! The `borrow:PLAN` layer kind for stack specs (manual:
//! `docs/layers/borrow.md`).

use std::sync::Arc;

use roamdisk_blockdev::{BlockDev, Error, ErrorKind, LayerKind, Op, OpenCtx};

use crate::dev::{BorrowDev, BorrowOptions, Verify};
use crate::plan::Plan;

/// `borrow[encrypt=on|off,scrub=on|off,verify=full|identity]:PLAN`.
pub static BORROW: LayerKind = LayerKind {
    name: "borrow",
    summary: "the free blocks of a host's file systems (PLAN from `roamdisk borrow scan`) as one disk: XTS-encrypted with an in-memory key, refuses to open if the host changed",
    args: &["plan"],
    options: &[
        ("encrypt", "on (default): a fresh random key held only in memory; off: the guest's data stays readable on the host"),
        ("scrub", "on: write zeroes over everything written when the export stops; off (default)"),
        ("verify", "full (default): re-read the host's allocation maps and check every extent is still free; identity: compare hashes only"),
    ],
    open: |ctx: &OpenCtx<'_>, _next| {
        if ctx.read_only {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "borrow",
                "a borrowed disk starts empty and is only useful writable; do not export it read-only",
            ));
        }
        let path = ctx.path("borrow", "plan")?;
        let plan = Plan::load(&path)?;
        let verify = match ctx.opt("verify") {
            None | Some("full") => Verify::Full,
            Some("identity") => Verify::Identity,
            Some(v) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    Op::Open,
                    "borrow",
                    format!("verify must be full or identity, not '{v}'"),
                ))
            }
        };
        let opts = BorrowOptions {
            encrypt: ctx.flag("borrow", "encrypt")?.unwrap_or(true),
            scrub: ctx.flag("borrow", "scrub")?.unwrap_or(false),
            verify,
            size: None,
        };
        if !opts.encrypt {
            tracing::warn!("borrow: encryption is off: the guest's data will stay readable in the host's free blocks");
        }
        Ok(Arc::new(BorrowDev::open(&plan, &opts)?) as Arc<dyn BlockDev>)
    },
    ..LayerKind::BOTTOM
};
