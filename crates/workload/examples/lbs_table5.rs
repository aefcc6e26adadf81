//! LBS Table 5 at its real size (seed section 5.3; issue 15): the
//! Contacts and Email traces, scaled to Table 5's request counts (219,124
//! and 216,057 1 KiB writes), replayed (blksim: one partition at a time,
//! barriers kept) onto LBS images of the Table 2 partitions they write,
//! each filled first and given 12% spare space, with the data file on a
//! real file (O_DIRECT, as the `lbs:` layer opens it) and on the flashsim
//! card model. Prints Table 5's columns: blocks requested, blocks written
//! without and with garbage collection, clusters (and how many were
//! contiguous), GC moves, and the amplification, plus the trace's
//! working set against the partition size (what the amplification
//! follows from).
//!
//! Partition sizes: the seed's Table 2 names the partitions but gives no
//! sizes; these are the trace generator's (`android::PARTITIONS`: /data
//! 1 GiB, /cache 128 MiB, /sdcard 2 GiB), overridable with `--size`.
//! The read-only squashfs partitions (/system, /flex) are flat files in
//! the seed and are left out.
//!
//! The collector runs in the foreground (when a write finds the free
//! clusters below the low watermark), so a run is deterministic: the same
//! seed gives the same numbers.
//!
//! Run: cargo run --release -p roamdisk-workload --example lbs_table5 -- [OPTIONS] [TRACE...]
//!   TRACE            contacts, email (default both), or any Android trace
//!                    name with --kib
//!   --kib N          1 KiB writes to scale to (default: Table 5's count)
//!   --trace-file F   replay this trace file as well (devices numbered as
//!                    Table 2; requested = its write KiB)
//!   --seed S         generator seed (default 1)
//!   --spare PCT      spare space for GC, % of the logical size (default 12)
//!   --fill PCT       share of each partition written before the trace,
//!                    from its start (default 100: a full image)
//!   --media LIST     file,card (default both)
//!   --card NAME      flashsim preset (default class6)
//!   --size DEV=SIZE  partition size, e.g. /data=256M (repeatable)
//!   --no-gc-run      skip the run with 100% spare (Table 5's column 2)
//!   --dir D          where image files go (default: a temporary directory)
//!   --json           one JSON line per run as well
//!   --background-gc  the collector in its thread between its watermarks
//!                    (as the `lbs:` layer runs it; timing-dependent, so
//!                    not repeatable to the block)

#![allow(
    clippy::disallowed_macros,
    reason = "an example program prints its results"
)]

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::layers::raw::RawDev;
use roamdisk_blockdev::progress::NoProgress;
use roamdisk_blockdev::{BlockDev, Result as DevResult, WriteFlags};
use roamdisk_lbs::create::{create, plan, CreateOptions, Paths};
use roamdisk_lbs::storage::FileLog;
use roamdisk_lbs::{ChecksumKind, Lbs, LbsOptions, StatsSnapshot};
use roamdisk_trace::format::{Format, Reader, TraceOp, Writer};
use roamdisk_trace::synth::android;
use roamdisk_workload::flashsim::{parse_params, FlashParams, FlashSimDev, FlashSimOptions};
use roamdisk_workload::replay::{self, Grouping, ReplayError, ReplayOptions, Targets};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BLOCK: u64 = 1024;
const CLUSTER: u64 = 256 * 1024;

/// Counts the clusters the image opens in its data file (a write that
/// starts a cluster) and how many of them follow the cluster opened just
/// before (Table 5's "contiguous").
struct ClusterCount {
    next: Arc<dyn BlockDev>,
    data_offset: u64,
    st: Mutex<Opened>,
}

#[derive(Default, Clone, Copy)]
struct Opened {
    clusters: u64,
    contiguous: u64,
    last: Option<u64>,
}

impl BlockDev for ClusterCount {
    roamdisk_blockdev::layer!("cluster-count", next);
    fn write_at(&self, buf: &[u8], off: u64, flags: WriteFlags) -> DevResult<()> {
        if off >= self.data_offset {
            let start = off - self.data_offset;
            let end = start + buf.len() as u64;
            let mut c = start.div_ceil(CLUSTER);
            let mut st = self.st.lock();
            while c * CLUSTER < end {
                st.clusters += 1;
                if c > 0 && st.last == Some(c - 1) {
                    st.contiguous += 1;
                }
                st.last = Some(c);
                c += 1;
            }
        }
        self.next.write_at(buf, off, flags)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Medium {
    File,
    Card,
}

impl Medium {
    fn name(self) -> &'static str {
        match self {
            Medium::File => "file",
            Medium::Card => "card",
        }
    }
}

struct Image {
    lbs: Arc<Lbs>,
    card: Option<Arc<FlashSimDev>>,
    count: Arc<ClusterCount>,
    paths: Paths,
}

struct Args {
    traces: Vec<String>,
    kib: Option<u64>,
    trace_file: Option<PathBuf>,
    seed: u64,
    spare: u32,
    fill: u32,
    media: Vec<Medium>,
    card: String,
    sizes: BTreeMap<u32, u64>,
    no_gc_run: bool,
    dir: Option<PathBuf>,
    json: bool,
    background_gc: bool,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        traces: Vec::new(),
        kib: None,
        trace_file: None,
        seed: 1,
        spare: 12,
        fill: 100,
        media: vec![Medium::File, Medium::Card],
        card: "class6".into(),
        sizes: BTreeMap::new(),
        no_gc_run: true,
        dir: None,
        json: false,
        background_gc: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{x} needs a value"));
        match x.as_str() {
            "--kib" => a.kib = Some(val()?.parse()?),
            "--trace-file" => a.trace_file = Some(val()?.into()),
            "--seed" => a.seed = val()?.parse()?,
            "--spare" => a.spare = val()?.parse()?,
            "--fill" => a.fill = val()?.parse::<u32>()?.min(100),
            "--media" => {
                a.media = val()?
                    .split(',')
                    .map(|m| match m {
                        "file" => Ok(Medium::File),
                        "card" => Ok(Medium::Card),
                        _ => Err(format!("unknown medium {m} (file, card)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--card" => a.card = val()?,
            "--size" => {
                let v = val()?;
                let (name, size) = v.split_once('=').ok_or("--size DEV=SIZE")?;
                let dev = android::PARTITIONS
                    .iter()
                    .position(|(n, _)| *n == name)
                    .ok_or_else(|| format!("unknown partition {name}"))?;
                a.sizes
                    .insert(dev as u32, roamdisk_blockdev::units::parse_size(size)?);
            }
            "--no-gc-run" => a.no_gc_run = false,
            "--dir" => a.dir = Some(val()?.into()),
            "--json" => a.json = true,
            "--background-gc" => a.background_gc = true,
            s if s.starts_with('-') => return Err(format!("unknown option {s}").into()),
            s => a.traces.push(s.to_string()),
        }
    }
    if a.traces.is_empty() && a.trace_file.is_none() {
        a.traces = android::TABLE5_REQUESTED_KIB
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
    }
    Ok(a)
}

/// Generate `name` scaled to `kib` 1 KiB writes, writable partitions
/// only, placed in partitions of `sizes`.
fn generate(name: &str, kib: u64, seed: u64, sizes: &BTreeMap<u32, u64>, out: &Path) -> Res<f64> {
    let t = android::trace(name).ok_or_else(|| format!("unknown Android trace {name}"))?;
    let scale = android::scale_for_write_kib(t, kib);
    let mut part = android::PARTITIONS.map(|(_, s)| s);
    for (&d, &s) in sizes {
        part[d as usize] = s;
    }
    let mut w = Writer::create(out, Format::Binary)?;
    // The generator `roamdisk trace synth android-NAME --scale S --seed N`
    // runs (one client), with the partition sizes given.
    let gen = android::Generator::new(t, scale, seed, 0).with_partition_sizes(part);
    for r in gen.filter(|r| is_writable(r.device)) {
        w.write(&r)?;
    }
    w.finish()?;
    Ok(scale)
}

/// The seed's LBS partitions: /data, /cache, /sdcard (the squashfs ones
/// are flat files).
fn is_writable(device: u32) -> bool {
    device != android::device_of("/system") && device != android::device_of("/flex")
}

/// Per device: bytes written, and the 1 KiB blocks written once and more
/// than once (the working set).
#[derive(Default, Debug, Clone, Copy)]
struct WorkingSet {
    write_bytes: u64,
    writes: u64,
    once: u64,
    rewritten: u64,
}

fn working_sets(trace: &Path, sizes: &BTreeMap<u32, u64>) -> Res<BTreeMap<u32, WorkingSet>> {
    let mut hits: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut out: BTreeMap<u32, WorkingSet> = BTreeMap::new();
    for r in Reader::open(trace)? {
        let r = r?;
        if r.op != TraceOp::Write || r.len == 0 || !is_writable(r.device) {
            continue;
        }
        let ws = out.entry(r.device).or_default();
        ws.write_bytes += r.len as u64;
        ws.writes += 1;
        let size = *sizes
            .get(&r.device)
            .ok_or_else(|| format!("device {} is not a Table 2 partition", r.device))?;
        if r.offset + r.len as u64 > size {
            return Err(format!(
                "a write at {} of {} bytes is beyond device {}'s {size} bytes (--size)",
                r.offset, r.len, r.device
            )
            .into());
        }
        let h = hits
            .entry(r.device)
            .or_insert_with(|| vec![0u8; size.div_ceil(BLOCK) as usize]);
        for b in r.offset / BLOCK..(r.offset + r.len as u64).div_ceil(BLOCK) {
            let x = &mut h[b as usize];
            *x = x.saturating_add(1);
        }
    }
    for (d, h) in hits {
        let ws = out.get_mut(&d).expect("counted");
        ws.once = h.iter().filter(|&&x| x == 1).count() as u64;
        ws.rewritten = h.iter().filter(|&&x| x > 1).count() as u64;
    }
    Ok(out)
}

fn open_image(
    dir: &Path,
    tag: &str,
    size: u64,
    spare: u32,
    medium: Medium,
    card: &FlashParams,
    background_gc: bool,
) -> Res<Image> {
    let paths = Paths::resolve(&dir.join(tag), None);
    let o = CreateOptions {
        size,
        block_size: BLOCK as u32,
        cluster_size: CLUSTER as u32,
        overprovision_pct: 100 + spare,
        checksum: ChecksumKind::Fletcher32,
        ..CreateOptions::default()
    };
    let (data, data_offset, card): (Arc<dyn BlockDev>, u64, Option<Arc<FlashSimDev>>) = match medium
    {
        Medium::File => {
            let header = create(&paths, &o)?;
            let raw = RawDev::open_direct(&paths.data, false)?;
            (Arc::new(raw), header.geometry.data_offset(), None)
        }
        Medium::Card => {
            let (header, ds, _) = plan(&o)?;
            let mem = MemDev::new(header.geometry.data_file_len());
            mem.write_at(&ds.encode(), 0, WriteFlags::default())?;
            FileLog::create(&paths.meta, &header.encode())?;
            let sim = Arc::new(FlashSimDev::new(
                Arc::new(mem),
                card.clone(),
                FlashSimOptions::default(),
            )?);
            (sim.clone(), header.geometry.data_offset(), Some(sim))
        }
    };
    let count = Arc::new(ClusterCount {
        next: data,
        data_offset,
        st: Mutex::new(Opened::default()),
    });
    let log = FileLog::open(&paths.meta, true)?;
    let lbs = Lbs::open(
        count.clone(),
        Box::new(log),
        None,
        LbsOptions {
            background_gc,
            ..LbsOptions::default()
        },
    )?;
    Ok(Image {
        lbs: Arc::new(lbs),
        card,
        count,
        paths,
    })
}

/// Write the first `fill`% of the image, sequentially, 256 KiB at a time
/// (a non-zero pattern: zero blocks take no space in LBS).
fn prefill(lbs: &Lbs, fill: u32) -> Res<()> {
    let len = lbs.size() / 100 * fill as u64 / CLUSTER * CLUSTER;
    let mut chunk = vec![0u8; CLUSTER as usize];
    let mut off = 0;
    while off < len {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = (off / BLOCK + i as u64 / BLOCK) as u8 | 1;
        }
        lbs.write_at(&chunk, off, WriteFlags::default())?;
        off += CLUSTER;
        if off % (64 << 20) == 0 {
            lbs.flush()?;
        }
    }
    lbs.flush()?;
    Ok(())
}

struct Lbses<'a>(&'a BTreeMap<u32, Image>);

impl Targets for Lbses<'_> {
    fn connect(&self, _client: u32, device: u32) -> Result<Arc<dyn BlockDev>, ReplayError> {
        self.0
            .get(&device)
            .map(|i| i.lbs.clone() as Arc<dyn BlockDev>)
            .ok_or_else(|| ReplayError::Invalid(format!("no image for device {device}")))
    }
    fn simulated_ns(&self) -> Option<u64> {
        None
    }
}

/// One run's totals over the partitions.
#[derive(Default, Debug, Clone, Copy, derive_more::AddAssign)]
struct Row {
    client_blocks: u64,
    absorbed: u64,
    written: u64,
    gc_moved: u64,
    gc_clusters: u64,
    clusters: u64,
    contiguous: u64,
    card_s: f64,
    prefill_s: f64,
    replay_s: f64,
}

fn delta(a: &StatsSnapshot, b: &StatsSnapshot) -> Row {
    Row {
        client_blocks: b.client_blocks - a.client_blocks,
        absorbed: b.absorbed - a.absorbed,
        written: b.physical_blocks - a.physical_blocks,
        gc_moved: b.gc_moved - a.gc_moved,
        gc_clusters: b.gc_clusters - a.gc_clusters,
        ..Row::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    dir: &Path,
    tag: &str,
    loaded: &replay::Loaded,
    sizes: &BTreeMap<u32, u64>,
    spare: u32,
    fill: u32,
    medium: Medium,
    card: &FlashParams,
    background_gc: bool,
) -> Res<Row> {
    let mut images = BTreeMap::new();
    let mut row = Row::default();
    let t = Instant::now();
    for &d in loaded.extent.keys() {
        let img = open_image(
            dir,
            &format!("{tag}-{}-{d}", medium.name()),
            sizes[&d],
            spare,
            medium,
            card,
            background_gc,
        )?;
        prefill(&img.lbs, fill)?;
        images.insert(d, img);
    }
    row.prefill_s = t.elapsed().as_secs_f64();
    let before: BTreeMap<u32, (StatsSnapshot, u64)> = images
        .iter()
        .map(|(&d, i)| {
            *i.count.st.lock() = Opened::default();
            let ns = i.card.as_ref().map_or(0, |c| c.stats().elapsed_ns);
            (d, (i.lbs.stats(), ns))
        })
        .collect();
    let opts = ReplayOptions {
        grouping: Grouping::Partition,
        one_at_a_time: true,
        ..ReplayOptions::default()
    };
    let t = Instant::now();
    let rep = replay::replay(loaded, &Lbses(&images), &opts, &NoProgress)?;
    if rep.errors > 0 {
        return Err(format!("{tag}: {:?}", rep.first_error).into());
    }
    // blksim ends with the device flushed: LBS writes out its buffer.
    for i in images.values() {
        i.lbs.flush()?;
    }
    row.replay_s = t.elapsed().as_secs_f64();
    for (d, i) in &images {
        let (s0, ns0) = before[d];
        let o = *i.count.st.lock();
        row += Row {
            clusters: o.clusters,
            contiguous: o.contiguous,
            ..delta(&s0, &i.lbs.stats())
        };
        if let Some(c) = &i.card {
            row.card_s += (c.stats().elapsed_ns - ns0) as f64 / 1e9;
        }
    }
    for (_, i) in images {
        i.lbs.close()?;
        let paths = i.paths.clone();
        drop(i);
        let _ = std::fs::remove_file(&paths.data);
        let _ = std::fs::remove_file(&paths.meta);
    }
    Ok(row)
}

fn main() -> Res<()> {
    let a = parse_args()?;
    let card = parse_params(&a.card)?;
    let tmp;
    let dir: &Path = match &a.dir {
        Some(d) => d,
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path()
        }
    };
    let mut sizes: BTreeMap<u32, u64> = android::PARTITIONS
        .iter()
        .enumerate()
        .map(|(d, (_, s))| (d as u32, *s))
        .collect();
    sizes.extend(a.sizes.iter().map(|(&d, &s)| (d, s)));
    let mut jobs: Vec<(String, PathBuf, String)> = Vec::new();
    if let Some(f) = &a.trace_file {
        let name = f
            .file_stem()
            .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
        jobs.push((name, f.clone(), "file".into()));
    }
    for name in &a.traces {
        let kib = match a.kib.or_else(|| android::table5_requested_kib(name)) {
            Some(k) => k,
            None => return Err(format!("{name} has no Table 5 row: give --kib").into()),
        };
        let path = dir.join(format!("{name}.rdtrace"));
        let scale = generate(name, kib, a.seed, &sizes, &path)?;
        jobs.push((name.clone(), path, format!("{scale:.6}")));
    }
    println!(
        "LBS Table 5 at full size: 1 KiB blocks, 256 KiB clusters, {}% spare, partitions {}% filled first, seed {}, card {}, {} GC",
        a.spare,
        a.fill,
        a.seed,
        a.card,
        if a.background_gc {
            "background"
        } else {
            "foreground"
        }
    );
    for (name, path, scale) in &jobs {
        let ws = working_sets(path, &sizes)?;
        for (d, w) in &ws {
            let part = android::partition_name(*d).unwrap_or("?");
            let blocks = sizes[d] / BLOCK;
            println!(
                "{name} (scale {scale}) {part}: {} KiB written by {} requests; {} blocks written ({:.1}% of the {} MiB partition): {} once, {} more than once; spare {} blocks",
                w.write_bytes / 1024,
                w.writes,
                w.once + w.rewritten,
                (w.once + w.rewritten) as f64 * 100.0 / blocks as f64,
                sizes[d] >> 20,
                w.once,
                w.rewritten,
                blocks * a.spare as u64 / 100,
            );
        }
        let requested: u64 = ws.values().map(|w| w.write_bytes).sum::<u64>() / 1024;
        let opts = ReplayOptions {
            grouping: Grouping::Partition,
            one_at_a_time: true,
            ..ReplayOptions::default()
        };
        let loaded = replay::load(path, &opts, &NoProgress)?;
        for (d, &e) in &loaded.extent {
            if e > sizes[d] {
                return Err(
                    format!("{name}: device {d} addressed up to {e}, beyond its size").into(),
                );
            }
        }
        let no_gc = if a.no_gc_run {
            Some(run(
                dir,
                name,
                &loaded,
                &sizes,
                100,
                0,
                Medium::Card,
                &card,
                false,
            )?)
        } else {
            None
        };
        println!(
            "| trace | medium | requested | LBS writes without GC (100% spare) | written with GC | clusters (contiguous) | GC moved | GC clusters | amplification | card s (without GC) | prefill s | replay s |"
        );
        println!(
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for &m in &a.media {
            let row = run(
                dir,
                name,
                &loaded,
                &sizes,
                a.spare,
                a.fill,
                m,
                &card,
                a.background_gc,
            )?;
            let amp = (row.written as f64 / requested as f64 - 1.0) * 100.0;
            let ng = no_gc.map_or("-".into(), |n| {
                format!("{} blocks, {} clusters", n.written, n.clusters)
            });
            let card_s = if m == Medium::Card {
                format!(
                    "{:.1} ({})",
                    row.card_s,
                    no_gc.map_or("-".into(), |n| format!("{:.1}", n.card_s))
                )
            } else {
                "-".into()
            };
            println!(
                "| {name} | {} | {requested} | {ng} | {} | {} ({}) | {} | {} | {amp:.2}% | {card_s} | {:.1} | {:.1} |",
                m.name(),
                row.written,
                row.clusters,
                row.contiguous,
                row.gc_moved,
                row.gc_clusters,
                row.prefill_s,
                row.replay_s,
            );
            if a.json {
                println!(
                    "{{\"trace\":\"{name}\",\"scale\":\"{scale}\",\"medium\":\"{}\",\"spare_pct\":{},\"fill_pct\":{},\"seed\":{},\"requested\":{requested},\"client_blocks\":{},\"absorbed\":{},\"written\":{},\"clusters\":{},\"contiguous\":{},\"gc_moved\":{},\"gc_clusters\":{},\"amplification_pct\":{amp:.3},\"card_s\":{:.3},\"no_gc_written\":{},\"no_gc_card_s\":{:.3}}}",
                    m.name(),
                    a.spare,
                    a.fill,
                    a.seed,
                    row.client_blocks,
                    row.absorbed,
                    row.written,
                    row.clusters,
                    row.contiguous,
                    row.gc_moved,
                    row.gc_clusters,
                    row.card_s,
                    no_gc.map_or(0, |n| n.written),
                    no_gc.map_or(0.0, |n| n.card_s),
                );
            }
        }
    }
    Ok(())
}
