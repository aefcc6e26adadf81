//! `roamdisk server status` as text: the clients' table, the cache and
//! each image's share of it, refusals and uptime.

use roamdisk_blockdev::units::format_size;
use roamdisk_server::status::Status;

/// Print the status document `st` for a person.
pub fn status(st: &Status) {
    outln!("{}", crate::output::table(&st.table(), 3).join("\n"));
    outln!("(p50/p99: read latency at the server, from its histogram buckets)");
    let hits = |held, ratio: Option<f64>, hits, misses, evictions| {
        let ratio = ratio.map_or("-".into(), |r| format!("{:.1}%", r * 100.0));
        let held = format_size(held);
        format!(
            "{held} held, hit ratio {ratio} ({hits} hits, {misses} misses), {evictions} evictions"
        )
    };
    match &st.cache {
        None => outln!("cache: none"),
        Some(c) => {
            outln!(
                "cache: {} {} in blocks of {}, {} shards: {}",
                c.policy,
                format_size(c.size),
                format_size(c.block),
                c.shards,
                hits(c.bytes_held, c.hit_ratio, c.hits, c.misses, c.evictions)
            );
            for im in &st.images {
                match &im.cache {
                    Some(i) => outln!(
                        "  {}: {}",
                        im.name,
                        hits(i.bytes_held, i.hit_ratio, i.hits, i.misses, i.evictions)
                    ),
                    None => outln!("  {}: not cached", im.name),
                }
            }
        }
    }
    let refused: Vec<String> = st
        .refusals_seen()
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    match refused.is_empty() {
        true => outln!("refusals: none"),
        false => outln!("refusals: {}", refused.join(", ")),
    }
    outln!("uptime: {:.0} s", st.uptime_seconds);
}
