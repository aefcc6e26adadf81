//! `roamdisk sim`: trace-driven cache simulation (TransCom seed sections
//! 5-6): many policies and sizes in one pass, the exact LRU curve, the
//! Table 2 split by temporal distance, and two-level runs.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use roamdisk_blockdev::units::parse_size;
use roamdisk_cachesim::policy::PolicySpec;
use roamdisk_cachesim::run::{simulate, CacheSize, RunOptions};
use roamdisk_cachesim::sim::Sharing;

use crate::progress::{Output, Reporter};
use crate::render::sim::show;

/// Simulate cache policies on a trace, TransCom style. The trace is cut
/// into fixed-size blocks; a block is ⟨block, client⟩ under the
/// copy-on-write sharing model (clients share the base image's blocks until
/// a client's first write creates its private copy). Every policy runs at
/// every size in one pass over the trace; LRU's hit ratio comes exactly for
/// every size at once from stack distances. Hits and misses are split by
/// temporal distance (accesses since the block's previous access; < 32k or
/// ≥ 32k, the seed's Table 2). With --client-size, a client cache per
/// client sits in front and the server sees only its misses.
///
/// Policies: fmpq, 2q, fbr, lru, arc, s3fifo, mq, with parameters in
/// brackets: fmpq[w=8,qoff=4x,duration=4x], 2q[kin=0.25,kout=0.5],
/// fbr[fnew=0.25,fold=0.5,amax=100,cmax=1024], mq[queues=8,qout=4x,lifetime=2x],
/// s3fifo[small=0.1,ghost=0.9,threshold=2]; "4x" means four times the
/// cache's capacity. See docs/cachesim.md for each definition and source.
///
/// Sizes: bytes (256M), or a fraction of the working set (1/16, 6.25%).
///
/// Examples:
///   roamdisk trace synth desktop --clients 15 -o desk.rdtrace
///   roamdisk sim desk.rdtrace --size 1/16 --plot out/desk
///   roamdisk sim desk.rdtrace --policy lru,fmpq[duration=8x] --size 64M,256M --block 8K
///   roamdisk sim desk.rdtrace --client-size 1M,16M --size 1/32,1/16,1/8 --plot out/two-level
///   roamdisk sim desk.rdtrace --policy fmpq --size 256M --shards 16 --sharing shared
///     (the hits of cache[shards=16]:fmpq:256M:... replaying the same one-client trace)
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// The trace (roamdisk binary or CSV trace format).
    trace: PathBuf,
    /// Server cache policies, comma-separated (repeatable).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "fmpq,2q,fbr,lru,arc,s3fifo"
    )]
    policy: Vec<String>,
    /// Server cache sizes, comma-separated: bytes or fractions of the working set.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "1/64,1/32,1/16,1/8,1/4,1/2"
    )]
    size: String,
    /// Block size: the unit of caching.
    #[arg(long, value_name = "SIZE", default_value = "4K")]
    block: String,
    /// How clients' blocks map to cache blocks: cow (TransCom: shared until
    /// a client writes), shared (one disk), private (a disk per client).
    #[arg(long, default_value = "cow")]
    sharing: String,
    /// Temporal-distance threshold of the Table 2 split, in accesses.
    #[arg(long, value_name = "ACCESSES", default_value_t = 32768)]
    split: u64,
    /// Client cache sizes (per client), comma-separated: each adds a
    /// two-level run with that client cache in front of the server.
    #[arg(long, value_name = "LIST")]
    client_size: Option<String>,
    /// Client cache policy.
    #[arg(long, value_name = "SPEC", default_value = "lru")]
    client_policy: String,
    /// Client writes: "through" (also sent to the server, which holds the
    /// private copy) or "absorb" (a write hit stays at the client).
    #[arg(long, default_value = "through")]
    client_writes: String,
    /// The size (bytes or fraction) shown in the seed's Table 2 form and
    /// its plot (default: the configured size nearest 1/16 of the working set).
    #[arg(long, value_name = "SIZE")]
    focus: Option<String>,
    /// Write plots: STEM-hit-ratio, STEM-table2-short, STEM-table2-long
    /// (and STEM-two-level with --client-size), each as .png and .svg.
    #[arg(long, value_name = "STEM")]
    plot: Option<PathBuf>,
    /// Print the whole report as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Write the block keys the (first) server level sees, one decimal id
    /// per line, for another simulator (libCacheSim's txt trace format).
    #[arg(long, value_name = "FILE")]
    export_keys: Option<PathBuf>,
    /// Skip the exact all-sizes LRU curve (LRU then runs as a policy).
    #[arg(long)]
    no_lru_curve: bool,
    /// Stop after this many requests.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Cut each server cache into N shards by block address, as the
    /// `cache` layer does (same engine): with the layer's policy, size,
    /// block size and shard count the hits are the layer's. 1 = one
    /// policy over the whole cache. LRU then runs as a policy, not from
    /// the stack-distance curve.
    #[arg(long, value_name = "N", default_value_t = 1)]
    shards: usize,
}

pub fn run(a: Args, quiet: bool) -> anyhow::Result<()> {
    let block = parse_size(&a.block)?;
    if block == 0 || block > (1 << 30) {
        bail!("--block must lie between 1 byte and 1 GiB");
    }
    let sharing = Sharing::parse(&a.sharing).with_context(|| {
        format!(
            "unknown --sharing '{}': use cow, shared or private",
            a.sharing
        )
    })?;
    if a.split == 0 {
        bail!("--split must be at least 1 access");
    }
    let mut specs = Vec::new();
    for p in &a.policy {
        specs.extend(PolicySpec::parse_list(p).map_err(|e| anyhow::anyhow!("--policy: {e}"))?);
    }
    if specs.is_empty() {
        bail!("--policy: name at least one policy");
    }
    let sizes = CacheSize::parse_list(&a.size).context("--size")?;
    if sizes.is_empty() {
        bail!("--size: give at least one cache size");
    }
    let client_sizes = match &a.client_size {
        Some(s) => CacheSize::parse_list(s).context("--client-size")?,
        None => Vec::new(),
    };
    let client_policy =
        PolicySpec::parse(&a.client_policy).map_err(|e| anyhow::anyhow!("--client-policy: {e}"))?;
    let write_through = match a.client_writes.as_str() {
        "through" => true,
        "absorb" => false,
        o => bail!("unknown --client-writes '{o}': use through or absorb"),
    };
    let focus = a
        .focus
        .as_deref()
        .map(str::parse::<CacheSize>)
        .transpose()
        .context("--focus")?;
    let opts = RunOptions {
        block,
        sharing,
        split: a.split,
        policies: specs.clone(),
        sizes,
        client_sizes,
        client_policy,
        write_through,
        shards: a.shards,
        lru_curve: !a.no_lru_curve,
        limit: a.limit,
        export_keys: a.export_keys.clone(),
    };
    let progress = Reporter::new(Output::human(quiet || a.json));
    let run = simulate(&a.trace, &opts, &progress)?;
    progress.finish();
    let focus_cap = run.focus(focus);
    show(&run, &specs, focus_cap, a.json, a.plot.as_deref())
}
