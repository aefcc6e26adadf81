//! `roamdisk info`: size, capabilities and allocation map of a disk.

use clap::Parser;
use roamdisk_blockdev::units::format_size;
use roamdisk_blockdev::Access;
use roamdisk_blockdev::{extents_covering, Alloc, BlockDev};

/// Show a disk's size, capabilities, layers and allocation map.
///
/// DISK is opened the way every command opens one: a stack spec, an NBD
/// URI, cas:SESSION, or an image file of a format qemu-img reads. It is
/// opened read-only; nothing is changed.
///
/// Examples:
///   roamdisk info raw:disk.img
///   roamdisk info cow:overlay.img:raw:base.img --map
///   roamdisk info 'nbd+unix:///?socket=/tmp/vm.sock' --map
///   roamdisk info raw:disk.img --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The disk: a stack spec (see `roamdisk layers`), an NBD URI, or an
    /// image file.
    spec: String,
    /// Print the allocation map (data / zero / hole runs).
    #[arg(long)]
    map: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let disk = crate::disk::Disk::open(&a.spec, Access::ReadOnly)?;
    let dev = &disk.dev;
    let size = dev.size();
    let caps = dev.inner().caps();
    let mut layers = Vec::new();
    let mut cur: Option<&dyn BlockDev> = Some(dev.inner().as_ref());
    while let Some(d) = cur {
        layers.push(d.describe());
        cur = d.next();
    }
    let extents = if size > 0 {
        extents_covering(dev.as_ref(), 0, size)?
    } else {
        Vec::new()
    };
    let (mut data, mut zero, mut hole) = (0u64, 0u64, 0u64);
    for e in &extents {
        match e.state {
            Alloc::Data => data += e.len,
            Alloc::Zero => zero += e.len,
            Alloc::Hole => hole += e.len,
        }
    }
    if a.json {
        let mut v = serde_json::json!({
            "spec": a.spec,
            "size": size,
            "layers": layers,
            "capabilities": {
                "write": caps.can_write, "flush": caps.can_flush, "fua": caps.can_fua, "trim": caps.can_trim,
                "zero": caps.can_zero, "fast_zero": caps.can_fast_zero, "multi_conn": caps.can_multi_conn,
                "extents": caps.can_extents,
            },
            "allocation": {"data": data, "zero": zero, "hole": hole},
        });
        if a.map {
            let mut off = 0u64;
            let m: Vec<_> = extents
                .iter()
                .map(|e| {
                    let r = serde_json::json!({"offset": off, "length": e.len, "state": format!("{:?}", e.state).to_lowercase()});
                    off += e.len;
                    r
                })
                .collect();
            v["map"] = serde_json::Value::Array(m);
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!("size:         {size} bytes ({})", format_size(size));
    outln!("layers:       {}", layers.join("  ->  "));
    let yn = |b: bool| if b { "yes" } else { "no" };
    outln!(
        "capabilities: write={} (info opens read-only) flush={} fua={} trim={} zero={} fast-zero={} multi-conn={} extents={}",
        yn(dev.inner().caps().can_write), yn(caps.can_flush), yn(caps.can_fua), yn(caps.can_trim),
        yn(caps.can_zero), yn(caps.can_fast_zero), yn(caps.can_multi_conn), yn(caps.can_extents)
    );
    let pct = |n: u64| {
        if size == 0 {
            0.0
        } else {
            n as f64 * 100.0 / size as f64
        }
    };
    outln!(
        "allocation:   data {} ({:.1}%), zero {} ({:.1}%), hole {} ({:.1}%)",
        format_size(data),
        pct(data),
        format_size(zero),
        pct(zero),
        format_size(hole),
        pct(hole)
    );
    if a.map {
        outln!("{:>20} {:>20}  state", "offset", "length");
        let mut off = 0u64;
        for e in &extents {
            outln!(
                "{off:>20} {:>20}  {}",
                e.len,
                format!("{:?}", e.state).to_lowercase()
            );
            off += e.len;
        }
    }
    Ok(())
}
