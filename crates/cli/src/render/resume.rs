//! `roamdisk resume`'s report: the session, its working set, and the VM's
//! state handed to QEMU — when it runs, and for a lazy resume the pages
//! as they arrive (a line every few seconds) and when all are in.

use std::time::{Duration, Instant};

use roamdisk_blockdev::units::format_size;
use roamdisk_roam::fetch::GatherStats;
use roamdisk_roam::memory::handoff::{RestoreEvents, Restored};
use roamdisk_roam::memory::postcopy::LazyStats;
use roamdisk_roam::resume::ResumeReport;

use crate::store_args::short;

pub fn sources(g: &GatherStats) -> String {
    format!(
        "{} from the shared cache, {} from lookaside media, {} fetched",
        format_size(g.shared_cache_bytes),
        format_size(g.lookaside_bytes),
        format_size(g.store_bytes)
    )
}

pub fn print_report(r: &ResumeReport, name: &str) {
    outln!(
        "resumed {name}@{} in {} ({:.2} s)",
        short(&r.version),
        r.session.display(),
        r.seconds
    );
    if r.memory.chunks > 0 {
        outln!(
            "  memory image {}: {}",
            format_size(r.memory.bytes),
            sources(&r.memory)
        );
    }
    let w = &r.working_set;
    outln!(
        "  working set  {} chunks ({}): {}{}",
        w.chunks,
        format_size(w.bytes),
        sources(&w.got),
        w.error
            .as_ref()
            .map(|e| format!("; stopped early: {e}"))
            .unwrap_or_default()
    );
    if r.lookaside_rejected > 0 {
        outln!(
            "  lookaside    {} chunks on the media failed verification (damaged or stale) and were fetched instead",
            r.lookaside_rejected
        );
    }
    outln!(
        "  hoard level  {} of {} chunks of the version on this host ({:.0}%)",
        r.hoard_cached,
        r.hoard_chunks,
        r.hoard_cached as f64 * 100.0 / r.hoard_chunks.max(1) as f64
    );
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// One line of a lazy resume's pages.
pub fn pages_line(s: &LazyStats) -> String {
    format!(
        "{} pages on demand ({} faults, p50 {}, p99 {}), {} pushed, {} to come{}",
        s.demand_pages,
        s.faults,
        ms(s.fault_p50_us),
        ms(s.fault_p99_us),
        s.pushed_pages,
        s.missing_pages,
        if s.stalled > 0 {
            format!("; {} pages waited on past the watchdog", s.stalled)
        } else {
            String::new()
        }
    )
}

/// The `VM state` line and what follows, as the hand-over goes.
pub struct Events {
    json: bool,
    quiet: bool,
    last: Instant,
}

impl Events {
    pub fn new(json: bool, quiet: bool) -> Events {
        Events {
            json,
            quiet,
            last: Instant::now(),
        }
    }

    /// The hand-over is over: the last lines.
    pub fn done(&mut self, r: &Restored) {
        if self.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "restored": r }))
                    .expect("serialisable")
            );
            return;
        }
        let (false, Some(s)) = (self.quiet, &r.lazy) else {
            return;
        };
        let page = 4096u64;
        let never = s.zero_chunk_pages - s.zero_chunk_pages_sent;
        outln!(
            "  memory       all {} of stored pages in QEMU {:.2} s after it answered: {} pages on demand ({} faults; latency p50 {}, p99 {}, max {}), {} pushed, {} zero pages sent as zero records, {} zero pages never sent ({}); {}",
            format_size(s.pages_to_send * page),
            r.all_memory_seconds.unwrap_or(0.0),
            s.demand_pages,
            s.faults,
            ms(s.fault_p50_us),
            ms(s.fault_p99_us),
            ms(s.fault_max_us),
            s.pushed_pages,
            s.zero_records,
            never,
            format_size(never * page),
            sources(&s.sources)
        );
        if r.lookaside_rejected > 0 {
            outln!(
                "  lookaside    {} chunks on the media failed verification (damaged or stale) and were fetched instead",
                r.lookaside_rejected
            );
        }
    }
}

impl RestoreEvents for Events {
    fn running(&mut self, r: &Restored) {
        if self.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "running": r }))
                    .expect("serialisable")
            );
            return;
        }
        if self.quiet {
            return;
        }
        match r.mode {
            "eager" => outln!(
                "  VM state     {} handed to QEMU whole{}: {}; the VM is {} ({:.2} s after QEMU answered)",
                format_size(r.memory.bytes),
                r.eager_because
                    .as_ref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default(),
                sources(&r.memory),
                r.state,
                r.seconds
            ),
            mode => outln!(
                "  VM state     device state handed to QEMU ({}: memory follows on demand); the VM is {} ({:.2} s after QEMU answered); {}",
                if mode == "recovered" {
                    "a paused postcopy taken over"
                } else {
                    "lazily"
                },
                r.state,
                r.seconds,
                r.lazy.as_ref().map(pages_line).unwrap_or_default()
            ),
        }
    }

    fn memory(&mut self, s: &LazyStats) {
        if self.json || self.quiet || self.last.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.last = Instant::now();
        eprintln!("roamdisk: memory: {}", pages_line(s));
    }
}
