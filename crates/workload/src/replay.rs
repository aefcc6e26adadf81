//! `replay` (the seed's blksim, and TransCom's IOEmu for many clients):
//! a trace is read into one command stream per partition (or per client),
//! then every stream is applied by its own thread, one request at a time:
//! a request is issued when the previous one completed, so a flush waits
//! for everything before it and nothing after it starts before the flush
//! is done (end-to-end barrier semantics). Requests go as fast as possible
//! or at their recorded times. The trace is loaded before the clock starts
//! (about 40 bytes per record), so reading it is not measured.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use roamdisk_blockdev::context::{self, IoContext};
use roamdisk_blockdev::progress::{Progress, Unit};
use roamdisk_blockdev::{BlockDev, Registry, WriteFlags, ZeroFlags};
use serde::Serialize;

use crate::target::{AlignedBuf, Target, TargetOptions};
use roamdisk_trace::format::payload::{PayloadFile, PayloadIndex};
use roamdisk_trace::format::{Reader, TraceError, TraceOp};

/// When requests are issued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    /// Each request as soon as the previous one of its stream completed.
    Fast,
    /// At its recorded time divided by `speed` (or as soon as possible
    /// when the stream is late).
    Recorded { speed: f64 },
}

/// How the trace is cut into streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// One stream per (client, partition), as blksim.
    Partition,
    /// One stream per client across its partitions, as IOEmu.
    Client,
}

/// What written bytes contain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// A fixed pseudo-random pattern that depends only on the offset, so
    /// two replays of a trace produce the same image.
    Pattern,
    /// The bytes recorded in a payload file (`trace[data=on]`), for a
    /// byte-identical image.
    Recorded(PathBuf),
}

/// Options of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub timing: Timing,
    pub grouping: Grouping,
    /// Run the streams one after the other (blksim) instead of together.
    pub one_at_a_time: bool,
    /// Replay a single-client trace as this many clients (IOEmu).
    pub clients: Option<u32>,
    /// Start client k this much after client k-1.
    pub stagger: Duration,
    pub data: DataSource,
    /// Count failed requests and go on, instead of stopping.
    pub keep_going: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            timing: Timing::Fast,
            grouping: Grouping::Partition,
            one_at_a_time: false,
            clients: None,
            stagger: Duration::ZERO,
            data: DataSource::Pattern,
            keep_going: false,
        }
    }
}

const NO_PAYLOAD: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    time_ns: u64,
    offset: u64,
    payload: u64,
    device: u32,
    len: u32,
    op: TraceOp,
}

struct Stream {
    client: u32,
    /// The partition, for per-partition streams.
    device: Option<u32>,
    entries: Arc<Vec<Entry>>,
    start_offset_ns: u64,
}

/// A trace loaded into streams.
pub struct Loaded {
    streams: Vec<Stream>,
    t0: u64,
    records: u64,
    /// Largest end offset per device.
    pub extent: BTreeMap<u32, u64>,
}

impl Loaded {
    /// Requests to issue.
    pub fn requests(&self) -> u64 {
        self.streams.iter().map(|s| s.entries.len() as u64).sum()
    }
    /// Records in the trace file.
    pub fn records(&self) -> u64 {
        self.records
    }
    pub fn streams(&self) -> usize {
        self.streams.len()
    }
}

/// Errors of a replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Dev(#[from] roamdisk_blockdev::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Read a trace into streams, reporting a phase "loading" over the
/// file's bytes (estimated from the records read).
pub fn load(
    trace: &Path,
    opts: &ReplayOptions,
    progress: &dyn Progress,
) -> Result<Loaded, ReplayError> {
    let size = std::fs::metadata(trace).map(|m| m.len()).unwrap_or(1);
    progress.start("loading", size.max(1), Unit::Bytes);
    let mut idx = match &opts.data {
        DataSource::Pattern => None,
        DataSource::Recorded(p) => Some(PayloadIndex::open(p)?),
    };
    let mut by_key: BTreeMap<(u32, Option<u32>), Vec<Entry>> = BTreeMap::new();
    let mut t0 = u64::MAX;
    let mut records = 0u64;
    let mut extent: BTreeMap<u32, u64> = BTreeMap::new();
    for r in Reader::open(trace)? {
        let r = r?;
        records += 1;
        if records.is_multiple_of(1 << 16) {
            progress.set((records * 5).min(size));
        }
        t0 = t0.min(r.time_ns);
        let payload = match (&mut idx, r.op) {
            (Some(i), TraceOp::Write) => i.next(r.len)?,
            _ => NO_PAYLOAD,
        };
        if r.op != TraceOp::Flush {
            let e = extent.entry(r.device).or_default();
            *e = (*e).max(r.end());
        }
        let key = match opts.grouping {
            Grouping::Partition => (r.client, Some(r.device)),
            Grouping::Client => (r.client, None),
        };
        by_key.entry(key).or_default().push(Entry {
            time_ns: r.time_ns,
            offset: r.offset,
            payload,
            device: r.device,
            len: r.len,
            op: r.op,
        });
    }
    let clients: BTreeSet<u32> = by_key.keys().map(|k| k.0).collect();
    let mut streams = Vec::new();
    match opts.clients {
        Some(n) => {
            if clients.len() > 1 {
                return Err(ReplayError::Invalid(format!(
                    "--clients replicates a single-client trace, but this one has {} clients; replay it without --clients",
                    clients.len()
                )));
            }
            let shared: Vec<(Option<u32>, Arc<Vec<Entry>>)> = by_key
                .into_iter()
                .map(|((_, d), e)| (d, Arc::new(e)))
                .collect();
            for c in 0..n {
                for (d, e) in &shared {
                    streams.push(Stream {
                        client: c,
                        device: *d,
                        entries: Arc::clone(e),
                        start_offset_ns: opts.stagger.as_nanos() as u64 * c as u64,
                    });
                }
            }
        }
        None => {
            for ((c, d), e) in by_key {
                streams.push(Stream {
                    client: c,
                    device: d,
                    entries: Arc::new(e),
                    start_offset_ns: 0,
                });
            }
        }
    }
    progress.end();
    Ok(Loaded {
        streams,
        t0: if t0 == u64::MAX { 0 } else { t0 },
        records,
        extent,
    })
}

/// Where each client's requests for each device go.
pub trait Targets: Sync {
    /// A device for `client`'s requests to `device` (a new connection per
    /// call where the target is remote).
    fn connect(&self, client: u32, device: u32) -> Result<Arc<dyn BlockDev>, ReplayError>;
    /// Simulated time of the targets' card models, if any.
    fn simulated_ns(&self) -> Option<u64>;
}

/// Targets from strings: a default and per-device ones, each of which may
/// contain `{client}` and `{device}`, opened once per distinct string.
pub struct TargetMap {
    default: Option<String>,
    per_device: BTreeMap<u32, String>,
    registry: Registry,
    opts: TargetOptions,
    open: Mutex<HashMap<String, Arc<Target>>>,
}

impl TargetMap {
    pub fn new(
        default: Option<String>,
        per_device: BTreeMap<u32, String>,
        registry: Registry,
        opts: TargetOptions,
    ) -> Self {
        TargetMap {
            default,
            per_device,
            registry,
            opts,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn target(&self, client: u32, device: u32) -> Result<Arc<Target>, ReplayError> {
        let tmpl = self
            .per_device
            .get(&device)
            .or(self.default.as_ref())
            .ok_or_else(|| {
                ReplayError::Invalid(format!(
                    "the trace has requests for device {device} but no target is given for it (--map {device}=TARGET)"
                ))
            })?;
        let s = tmpl
            .replace("{client}", &client.to_string())
            .replace("{device}", &device.to_string());
        let mut open = self.open.lock();
        if let Some(t) = open.get(&s) {
            return Ok(Arc::clone(t));
        }
        let t = Arc::new(Target::open(&self.registry, &s, &self.opts)?);
        open.insert(s, Arc::clone(&t));
        Ok(t)
    }
}

impl Targets for TargetMap {
    fn connect(&self, client: u32, device: u32) -> Result<Arc<dyn BlockDev>, ReplayError> {
        Ok(self.target(client, device)?.connect()?)
    }
    fn simulated_ns(&self) -> Option<u64> {
        let open = self.open.lock();
        let v: Vec<u64> = open.values().filter_map(|t| t.simulated_ns()).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }
}

/// Latency summary of one op type.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpReport {
    pub count: u64,
    pub bytes: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// One stream's or one client's times.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    pub client: u32,
    pub device: Option<u32>,
    pub requests: u64,
    pub bytes: u64,
    /// From its first issue to its last completion.
    pub runtime_s: f64,
    /// Requests issued more than 1 ms after their recorded time.
    pub late: u64,
    pub errors: u64,
}

/// The result of a replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub wall_s: f64,
    /// Simulated card time, when the targets contain flashsim layers.
    pub simulated_s: Option<f64>,
    pub requests: u64,
    pub bytes: u64,
    pub requests_per_s: f64,
    pub ops: BTreeMap<String, OpReport>,
    pub clients: Vec<RunReport>,
    pub streams: Vec<RunReport>,
    pub errors: u64,
    pub first_error: Option<String>,
}

fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let mut x: u64 = 0x853c_49e6_748f_ea9b;
        (0..PATTERN_LEN * 2 / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    })
}

/// The pattern repeats every this many bytes of offset.
const PATTERN_LEN: usize = 1 << 20;
/// Largest piece a request is issued in.
const PIECE: u64 = 8 << 20;

struct StreamResult {
    run: RunReport,
    start: Option<Instant>,
    end: Option<Instant>,
    hist: Vec<Histogram<u64>>,
    bytes_by_op: [u64; 5],
    first_error: Option<String>,
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

struct Shared<'a> {
    done: &'a AtomicU64,
    stop: &'a AtomicBool,
    keep_going: bool,
    timing: Timing,
    t0: u64,
    payload: Option<&'a PayloadFile>,
}

fn run_stream(
    s: &Stream,
    devs: &HashMap<u32, Arc<dyn BlockDev>>,
    start: Instant,
    sh: &Shared<'_>,
) -> StreamResult {
    let mut res = StreamResult {
        run: RunReport {
            client: s.client,
            device: s.device,
            ..RunReport::default()
        },
        start: None,
        end: None,
        hist: (0..5).map(|_| new_hist()).collect(),
        bytes_by_op: [0; 5],
        first_error: None,
    };
    let max_len = s
        .entries
        .iter()
        .map(|e| e.len as u64)
        .max()
        .unwrap_or(0)
        .min(PIECE);
    let mut buf = AlignedBuf::new(max_len as usize);
    let base = start + Duration::from_nanos(s.start_offset_ns);
    if let Timing::Fast = sh.timing {
        std::thread::sleep(base.saturating_duration_since(Instant::now()));
    }
    for e in s.entries.iter() {
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        if let Timing::Recorded { speed } = sh.timing {
            let due = base + Duration::from_nanos(((e.time_ns - sh.t0) as f64 / speed) as u64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            } else if now - due > Duration::from_millis(1) {
                res.run.late += 1;
            }
        }
        let dev = &devs[&e.device];
        let t = Instant::now();
        res.start.get_or_insert(t);
        let r = issue(dev.as_ref(), e, &mut buf, sh.payload);
        let lat = t.elapsed();
        res.end = Some(Instant::now());
        res.run.requests += 1;
        let oi = e.op.code() as usize;
        if e.op != TraceOp::Flush {
            res.run.bytes += e.len as u64;
            res.bytes_by_op[oi] += e.len as u64;
        }
        let _ = res.hist[oi].record((lat.as_nanos() as u64).max(1));
        sh.done.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = r {
            res.run.errors += 1;
            if res.first_error.is_none() {
                res.first_error = Some(format!(
                    "client {} device {} {} at {} (+{}): {err}",
                    s.client, e.device, e.op, e.offset, e.len
                ));
            }
            if !sh.keep_going {
                sh.stop.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    res
}

/// Issue one entry to `dev`, in pieces of at most [`PIECE`] bytes.
fn issue(
    dev: &dyn BlockDev,
    e: &Entry,
    buf: &mut AlignedBuf,
    payload: Option<&PayloadFile>,
) -> Result<(), ReplayError> {
    let len = e.len as u64;
    match e.op {
        TraceOp::Read => {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(PIECE) as usize;
                dev.read_at(buf.get_mut(n), e.offset + done)?;
                done += n as u64;
            }
        }
        TraceOp::Write => {
            let mut done = 0;
            while done < len {
                let off = e.offset + done;
                let n = (len - done).min(PIECE) as usize;
                let b = buf.get_mut(n);
                match (payload, e.payload) {
                    (Some(p), at) if at != NO_PAYLOAD => p.read(b, at + done)?,
                    _ => {
                        let pat = pattern();
                        let mut i = 0;
                        while i < n {
                            let o = ((off + i as u64) % PATTERN_LEN as u64) as usize;
                            let k = (n - i).min(PATTERN_LEN);
                            b[i..i + k].copy_from_slice(&pat[o..o + k]);
                            i += k;
                        }
                    }
                }
                dev.write_at(buf.get(n), off, WriteFlags::default())?;
                done += n as u64;
            }
        }
        TraceOp::Trim => dev.trim(e.offset, len, WriteFlags::default())?,
        TraceOp::WriteZeroes => dev.write_zeroes(
            e.offset,
            len,
            ZeroFlags {
                may_trim: true,
                ..ZeroFlags::default()
            },
        )?,
        TraceOp::Flush => dev.flush()?,
    }
    Ok(())
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Replay a loaded trace against `targets`, reporting a phase
/// "replaying" over the requests from this thread a few times a second.
pub fn replay(
    loaded: &Loaded,
    targets: &dyn Targets,
    opts: &ReplayOptions,
    progress: &dyn Progress,
) -> Result<ReplayReport, ReplayError> {
    progress.start("replaying", loaded.requests().max(1), Unit::Items);
    let payload = match &opts.data {
        DataSource::Pattern => None,
        DataSource::Recorded(p) => Some(PayloadFile::open(p)?),
    };
    // Connect every stream before the clock starts, and check every
    // request fits its device.
    let mut conns: Vec<HashMap<u32, Arc<dyn BlockDev>>> = Vec::with_capacity(loaded.streams.len());
    for s in &loaded.streams {
        let devices: BTreeSet<u32> = match s.device {
            Some(d) => [d].into(),
            None => s.entries.iter().map(|e| e.device).collect(),
        };
        let mut m = HashMap::new();
        for d in devices {
            let dev = targets.connect(s.client, d)?;
            if let Some(&need) = loaded.extent.get(&d) {
                if need > dev.size() {
                    return Err(ReplayError::Invalid(format!(
                        "the trace addresses device {d} up to byte {need}, but its target has only {} bytes; use a larger target",
                        dev.size()
                    )));
                }
            }
            m.insert(d, dev);
        }
        conns.push(m);
    }
    let sim0 = targets.simulated_ns();
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let sh = Shared {
        done: &done,
        stop: &stop,
        keep_going: opts.keep_going,
        timing: opts.timing,
        t0: loaded.t0,
        payload: payload.as_ref(),
    };
    let groups: Vec<Vec<usize>> = if opts.one_at_a_time {
        (0..loaded.streams.len()).map(|i| vec![i]).collect()
    } else {
        vec![(0..loaded.streams.len()).collect()]
    };
    let mut results: Vec<StreamResult> = Vec::new();
    let wall0 = Instant::now();
    for g in groups {
        let barrier = Barrier::new(g.len() + 1);
        let start_at: OnceLock<Instant> = OnceLock::new();
        let finished = AtomicU64::new(0);
        // Woken by the last stream to finish, so the wall time is not
        // rounded up to the progress poll.
        let main = std::thread::current();
        let out: Vec<StreamResult> = std::thread::scope(|scope| {
            let handles: Vec<_> = g
                .iter()
                .map(|&i| {
                    let (s, devs) = (&loaded.streams[i], &conns[i]);
                    let (barrier, start_at, finished, sh) = (&barrier, &start_at, &finished, &sh);
                    let main = main.clone();
                    scope.spawn(move || {
                        barrier.wait();
                        // A recorder in an in-process target records the
                        // replayed client's id.
                        let ctx = IoContext::for_client(s.client);
                        let start = *start_at.get().expect("set before release");
                        let r = context::with_context(ctx, || run_stream(s, devs, start, sh));
                        finished.fetch_add(1, Ordering::Release);
                        main.unpark();
                        r
                    })
                })
                .collect();
            start_at.set(Instant::now()).expect("set once");
            barrier.wait();
            while finished.load(Ordering::Acquire) < g.len() as u64 {
                progress.set(done.load(Ordering::Relaxed));
                std::thread::park_timeout(Duration::from_millis(100));
            }
            handles
                .into_iter()
                .map(|h| h.join().expect("replay thread panicked"))
                .collect()
        });
        results.extend(out);
    }
    let wall = wall0.elapsed();
    progress.set(done.load(Ordering::Relaxed));
    progress.end();
    let sim = match (sim0, targets.simulated_ns()) {
        (Some(a), Some(b)) => Some((b - a) as f64 / 1e9),
        _ => None,
    };
    let mut rep = ReplayReport {
        wall_s: wall.as_secs_f64(),
        simulated_s: sim,
        ..ReplayReport::default()
    };
    let mut hists: Vec<Histogram<u64>> = (0..5).map(|_| new_hist()).collect();
    let mut bytes_by_op = [0u64; 5];
    let mut by_client: BTreeMap<u32, (RunReport, Option<Instant>, Option<Instant>)> =
        BTreeMap::new();
    for r in &results {
        for (h, rh) in hists.iter_mut().zip(&r.hist) {
            h.add(rh).expect("same bounds");
        }
        for (b, rb) in bytes_by_op.iter_mut().zip(&r.bytes_by_op) {
            *b += rb;
        }
        let mut run = r.run.clone();
        if let (Some(a), Some(b)) = (r.start, r.end) {
            run.runtime_s = (b - a).as_secs_f64();
        }
        rep.requests += run.requests;
        rep.bytes += run.bytes;
        rep.errors += run.errors;
        if rep.first_error.is_none() {
            rep.first_error = r.first_error.clone();
        }
        let c = by_client.entry(run.client).or_insert_with(|| {
            (
                RunReport {
                    client: run.client,
                    ..RunReport::default()
                },
                None,
                None,
            )
        });
        c.0.requests += run.requests;
        c.0.bytes += run.bytes;
        c.0.late += run.late;
        c.0.errors += run.errors;
        if let Some(a) = r.start {
            c.1 = Some(c.1.map_or(a, |x: Instant| x.min(a)));
        }
        if let Some(b) = r.end {
            c.2 = Some(c.2.map_or(b, |x: Instant| x.max(b)));
        }
        rep.streams.push(run);
    }
    for (_, (mut run, a, b)) in by_client {
        if let (Some(a), Some(b)) = (a, b) {
            run.runtime_s = (b - a).as_secs_f64();
        }
        rep.clients.push(run);
    }
    for op in TraceOp::ALL {
        let h = &hists[op.code() as usize];
        if h.is_empty() {
            continue;
        }
        rep.ops.insert(
            op.name().to_string(),
            OpReport {
                count: h.len(),
                bytes: bytes_by_op[op.code() as usize],
                mean_us: h.mean() / 1000.0,
                p50_us: us(h.value_at_quantile(0.5)),
                p90_us: us(h.value_at_quantile(0.9)),
                p99_us: us(h.value_at_quantile(0.99)),
                p999_us: us(h.value_at_quantile(0.999)),
                max_us: us(h.max()),
            },
        );
    }
    rep.requests_per_s = rep.requests as f64 / rep.wall_s.max(1e-9);
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roamdisk_blockdev::progress::NoProgress;
    use roamdisk_blockdev::Access;
    use roamdisk_trace::format::{Format, Record, Writer};

    struct One(Arc<dyn BlockDev>);
    impl Targets for One {
        fn connect(&self, _: u32, _: u32) -> Result<Arc<dyn BlockDev>, ReplayError> {
            Ok(Arc::clone(&self.0))
        }
        fn simulated_ns(&self) -> Option<u64> {
            None
        }
    }

    fn write_trace(path: &Path, recs: &[Record]) {
        let mut w = Writer::create(path, Format::Binary).unwrap();
        for r in recs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
    }

    fn rec(time_ns: u64, device: u32, op: TraceOp, offset: u64, len: u32) -> Record {
        Record {
            time_ns,
            client: 0,
            device,
            op,
            offset,
            len,
            fragment: 0,
        }
    }

    #[test]
    fn replays_every_request_and_reports_latencies() {
        let (_dir, p) = roamdisk_blockdev::testkit::scratch("t.rdtrace");
        let mut recs = Vec::new();
        for i in 0..200u64 {
            recs.push(rec(
                i * 1000,
                (i % 2) as u32,
                TraceOp::Write,
                i * 4096,
                4096,
            ));
            recs.push(rec(
                i * 1000 + 1,
                (i % 2) as u32,
                TraceOp::Read,
                i * 4096,
                4096,
            ));
        }
        recs.push(rec(300_000, 0, TraceOp::Flush, 0, 0));
        write_trace(&p, &recs);
        let opts = ReplayOptions {
            clients: Some(3),
            ..ReplayOptions::default()
        };
        let loaded = load(&p, &opts, &NoProgress).unwrap();
        assert_eq!(loaded.streams(), 6);
        let mem = Registry::with_builtin()
            .build("mem:16M", Access::ReadWrite)
            .unwrap();
        let rep = replay(&loaded, &One(mem.clone()), &opts, &NoProgress).unwrap();
        assert_eq!(rep.requests, 3 * 401);
        assert_eq!(rep.clients.len(), 3);
        assert_eq!(rep.ops["write"].count, 600);
        assert_eq!(rep.ops["flush"].count, 3);
        assert!(rep.ops["read"].p99_us >= rep.ops["read"].p50_us);
        assert_eq!(rep.errors, 0);
        // Written with the pattern: a second replay gives the same bytes.
        let mut a = vec![0u8; 4096];
        mem.read_at(&mut a, 4096 * 7).unwrap();
        assert_ne!(a, vec![0u8; 4096]);
        assert_eq!(&a[..], &pattern()[4096 * 7..4096 * 8]);
    }

    /// A recorder in an in-process target sees each replayed request's
    /// client, so re-recording a trace keeps its client ids.
    #[test]
    fn a_recorder_in_the_target_records_the_replayed_clients() {
        let dir = tempfile::tempdir().unwrap();
        let (p, again) = (
            dir.path().join("t.rdtrace"),
            dir.path().join("again.rdtrace"),
        );
        let recs: Vec<Record> = (0..100u64)
            .map(|i| Record {
                client: if i % 3 == 0 { 5 } else { 7 },
                ..rec(i * 1000, 0, TraceOp::Write, i * 4096, 4096)
            })
            .collect();
        write_trace(&p, &recs);
        let opts = ReplayOptions::default();
        let loaded = load(&p, &opts, &NoProgress).unwrap();
        let mut reg = Registry::with_builtin();
        reg.add(&roamdisk_trace::recorder::TRACE);
        let dev = reg
            .build(
                &format!("trace:{}:mem:1M", again.display()),
                Access::ReadWrite,
            )
            .unwrap();
        replay(&loaded, &One(dev), &opts, &NoProgress).unwrap();
        let mut got: Vec<(u32, u64)> = roamdisk_trace::format::Reader::open(&again)
            .unwrap()
            .map(|r| r.map(|r| (r.client, r.offset)).unwrap())
            .collect();
        got.sort_unstable();
        let mut want: Vec<(u32, u64)> = recs.iter().map(|r| (r.client, r.offset)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn wall_time_is_not_rounded_up_to_the_progress_poll() {
        let (_dir, p) = roamdisk_blockdev::testkit::scratch("t.rdtrace");
        let recs: Vec<Record> = (0..8u64)
            .map(|i| rec(i, 0, TraceOp::Read, i * 4096, 4096))
            .collect();
        write_trace(&p, &recs);
        let opts = ReplayOptions::default();
        let loaded = load(&p, &opts, &NoProgress).unwrap();
        let mem = Registry::with_builtin()
            .build("mem:1M", Access::ReadWrite)
            .unwrap();
        // Eight reads of a RAM disk take microseconds; the progress loop
        // polls every 100 ms and must not add its period to the result.
        let best = (0..3)
            .map(|_| {
                replay(&loaded, &One(mem.clone()), &opts, &NoProgress)
                    .unwrap()
                    .wall_s
            })
            .fold(f64::MAX, f64::min);
        assert!(best < 0.05, "{best}");
    }

    #[test]
    fn recorded_timing_waits_for_the_recorded_times() {
        let (_dir, p) = roamdisk_blockdev::testkit::scratch("t.rdtrace");
        write_trace(
            &p,
            &[
                rec(0, 0, TraceOp::Read, 0, 512),
                rec(200_000_000, 0, TraceOp::Read, 0, 512),
            ],
        );
        let opts = ReplayOptions {
            timing: Timing::Recorded { speed: 2.0 },
            ..ReplayOptions::default()
        };
        let loaded = load(&p, &opts, &NoProgress).unwrap();
        let mem = Registry::with_builtin()
            .build("mem:1M", Access::ReadWrite)
            .unwrap();
        let rep = replay(&loaded, &One(mem), &opts, &NoProgress).unwrap();
        assert!(rep.wall_s >= 0.1 && rep.wall_s < 1.0, "{}", rep.wall_s);
    }

    #[test]
    fn errors_stop_the_replay_and_say_where() {
        let (_dir, p) = roamdisk_blockdev::testkit::scratch("t.rdtrace");
        write_trace(&p, &[rec(0, 0, TraceOp::Read, 4 << 20, 4096)]);
        let opts = ReplayOptions::default();
        let loaded = load(&p, &opts, &NoProgress).unwrap();
        let mem = Registry::with_builtin()
            .build("mem:1M", Access::ReadWrite)
            .unwrap();
        let e = replay(&loaded, &One(mem), &opts, &NoProgress).unwrap_err();
        assert!(e.to_string().contains("use a larger target"), "{e}");
        // A trace with several clients cannot be replicated.
        write_trace(
            &p,
            &[
                rec(0, 0, TraceOp::Read, 0, 512),
                Record {
                    client: 1,
                    ..rec(0, 0, TraceOp::Read, 0, 512)
                },
            ],
        );
        let opts = ReplayOptions {
            clients: Some(2),
            ..ReplayOptions::default()
        };
        let e = load(&p, &opts, &NoProgress).err().unwrap();
        assert!(e.to_string().contains("single-client"), "{e}");
    }
}
