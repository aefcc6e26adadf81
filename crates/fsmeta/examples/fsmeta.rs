//! Print the partitions of a disk image and each one's probe and free
//! extents as JSON: `cargo run -p roamdisk-fsmeta --example fsmeta -- IMAGE`.

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use roamdisk_blockdev::layers::raw::RawDev;

fn main() {
    let path = std::env::args().nth(1).expect("usage: fsmeta IMAGE");
    let dev = RawDev::open(std::path::Path::new(&path), true).expect("open");
    let table = roamdisk_fsmeta::read_table(&dev).expect("partition table");
    let mut out = Vec::new();
    for p in &table.partitions {
        let v = match roamdisk_fsmeta::free_space(&dev, p.start, p.len) {
            Ok(f) => serde_json::json!({"partition": p, "free": f}),
            Err(e) => serde_json::json!({"partition": p, "error": e.to_string()}),
        };
        out.push(v);
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({"table": table, "volumes": out}))
            .expect("json")
    );
}
