//! One module per subcommand.

pub mod borrow;
pub mod cache;

pub mod checkout;
pub mod commit;
pub mod gc;
pub mod hoard;
pub mod info;
pub mod layers;
pub mod lbs;
pub mod log;
pub mod model;
pub mod replay;
pub mod resume;
pub mod rm;
pub mod serve;
pub mod server;
pub mod sim;
pub mod sperf;
pub mod store;

pub mod suspend;
pub mod tag;
pub mod trace;

use roamdisk_blockdev::Registry;

/// Every layer kind this binary can build.
pub fn registry() -> Registry {
    let mut r = Registry::with_builtin();
    r.add(&roamdisk_lbs::layer::LBS);
    for k in roamdisk_trace::LAYERS
        .iter()
        .chain(roamdisk_workload::LAYERS)
    {
        r.add(k);
    }
    r.add(&roamdisk_roam::layer::CAS);
    r.add(&roamdisk_roam::layer::CAS_VERSION);
    r.add(&roamdisk_borrow::layer::BORROW);
    for k in roamdisk_cachesim::layer::LAYERS {
        r.add(k);
    }
    roamdisk_nbd::client::register(&mut r);
    crate::env::get().layer_defaults(&mut r);
    r
}
