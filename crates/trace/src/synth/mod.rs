//! Generators of the seeds' workloads: the five Android traces of LBS
//! Table 3, the TransCom desktop mix, a many-client boot trace and
//! Machine Bank's Windows XP traces under Virtual PC. Every
//! generator is seeded (the same seed gives the same trace), streams its
//! records in time order, and produces any length.
//!
//! The published statistics each generator reproduces, and the choices the
//! seeds leave open (partition sizes, durations, placement), are listed in
//! `docs/formats/trace.md` ("Synthetic workloads").

pub mod android;
pub mod boot;
pub mod desktop;
mod sizes;
pub mod vpc;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::rngs::Xoshiro256PlusPlus;
use rand::SeedableRng;

use crate::format::{Record, TraceOp};

/// A workload to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One of the Android traces of LBS Table 3 (index into
    /// [`android::TRACES`]).
    Android(usize),
    /// The TransCom desktop mix (seed section 3.2).
    Desktop,
    /// Many clients booting one shared image.
    Boot,
    /// Machine Bank's Windows XP boot under Virtual PC (section 3.3).
    VpcBoot,
    /// Machine Bank's Office launch under Virtual PC (section 3.3).
    VpcOffice,
}

impl Kind {
    /// Every kind, by name.
    pub fn all() -> Vec<(String, Kind, &'static str)> {
        let mut v: Vec<(String, Kind, &'static str)> = android::TRACES
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("android-{}", t.name), Kind::Android(i), t.title))
            .collect();
        v.push((
            "desktop".into(),
            Kind::Desktop,
            "TransCom desktop mix: 0.5-64 KB, 60% 4 KB, read:write traffic 1:3, working sets 4:5, half sequential",
        ));
        v.push((
            "boot".into(),
            Kind::Boot,
            "many clients booting one shared image: sequential reads, a shared hot set, few writes",
        ));
        v.push((
            "vpc-boot".into(),
            Kind::VpcBoot,
            "Machine Bank 3.3: Windows XP booting under Virtual PC: 32/64 KiB reads, 65% sequential",
        ));
        v.push((
            "vpc-office".into(),
            Kind::VpcOffice,
            "Machine Bank 3.3: Word, Excel, PowerPoint launched under Virtual PC: 32/64 KiB reads, 40% sequential",
        ));
        v
    }

    /// The kind with this name.
    pub fn parse(name: &str) -> Result<Kind, String> {
        Kind::all()
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, k, _)| k)
            .ok_or_else(|| {
                let names: Vec<String> = Kind::all().into_iter().map(|(n, _, _)| n).collect();
                format!("unknown workload '{name}' (known: {})", names.join(", "))
            })
    }
}

/// How much to generate.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub seed: u64,
    /// Android traces: multiple of the published trace length (1.0 = the
    /// published counts; 5.0 = the seed's five repetitions).
    pub scale: f64,
    /// Desktop, boot and vpc-*: requests per client (default per kind).
    pub requests: Option<u64>,
    /// Number of clients (boot default 50, others 1).
    pub clients: Option<u32>,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            seed: 1,
            scale: 1.0,
            requests: None,
            clients: None,
        }
    }
}

/// A stream of records in time order.
pub type RecordStream = Box<dyn Iterator<Item = Record> + Send>;

/// The generator of `kind`.
pub fn generate(kind: Kind, opts: &SynthOptions) -> Result<RecordStream, String> {
    if !(opts.scale > 0.0 && opts.scale.is_finite()) {
        return Err(format!(
            "scale must be a positive number, not {}",
            opts.scale
        ));
    }
    if opts.clients == Some(0) {
        return Err("clients must be at least 1".into());
    }
    if opts.requests == Some(0) {
        return Err("requests must be at least 1".into());
    }
    Ok(match kind {
        Kind::Android(i) => {
            let t = android::TRACES
                .get(i)
                .ok_or_else(|| format!("no Android trace number {i}"))?;
            per_client(opts, |client, seed| {
                Box::new(android::Generator::new(t, opts.scale, seed, client))
            })
        }
        Kind::Desktop => {
            let n = opts.requests.unwrap_or(desktop::DEFAULT_REQUESTS);
            per_client(opts, |client, seed| {
                Box::new(desktop::Generator::new(n, seed, client))
            })
        }
        Kind::Boot => Box::new(boot::Generator::new(
            &boot::BootParams {
                clients: opts.clients.unwrap_or(boot::DEFAULT_CLIENTS),
                requests: opts.requests.unwrap_or(boot::DEFAULT_REQUESTS),
                ..boot::BootParams::default()
            },
            opts.seed,
        )),
        Kind::VpcBoot | Kind::VpcOffice => {
            let mut p = if kind == Kind::VpcBoot {
                vpc::VpcParams::boot()
            } else {
                vpc::VpcParams::office()
            };
            p.requests = opts.requests.unwrap_or(p.requests);
            p.validate()?;
            per_client(opts, move |client, seed| {
                Box::new(vpc::Generator::new(&p, seed, client))
            })
        }
    })
}

/// Independent copies of a single-client generator, one per client, merged
/// in time order.
fn per_client(opts: &SynthOptions, make: impl Fn(u32, u64) -> RecordStream) -> RecordStream {
    let n = opts.clients.unwrap_or(1);
    if n == 1 {
        return make(0, opts.seed);
    }
    Box::new(Merge::new(
        (0..n)
            .map(|c| make(c, mix_seed(opts.seed, c as u64)))
            .collect(),
    ))
}

/// A request of `client` on device 0, the one disk of the desktop, boot
/// and Virtual PC generators.
pub(crate) fn request(time_ns: u64, client: u32, op: TraceOp, offset: u64, len: u32) -> Record {
    Record {
        time_ns,
        client,
        device: 0,
        op,
        offset,
        len,
        fragment: 0,
    }
}

/// A seed for a sub-generator, decorrelated from its siblings.
pub(crate) fn mix_seed(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The random generator every workload uses: a fixed algorithm, so a seed
/// gives the same trace on every platform and version.
pub fn rng(seed: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

/// k-way merge of time-ordered streams; ties keep stream order.
pub struct Merge {
    streams: Vec<RecordStream>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    heads: Vec<Option<Record>>,
}

impl Merge {
    pub fn new(mut streams: Vec<RecordStream>) -> Self {
        let mut heap = BinaryHeap::new();
        let mut heads = Vec::with_capacity(streams.len());
        for (i, s) in streams.iter_mut().enumerate() {
            let h = s.next();
            if let Some(r) = &h {
                heap.push(Reverse((r.time_ns, i)));
            }
            heads.push(h);
        }
        Merge {
            streams,
            heap,
            heads,
        }
    }
}

impl Iterator for Merge {
    type Item = Record;
    fn next(&mut self) -> Option<Record> {
        let Reverse((_, i)) = self.heap.pop()?;
        let out = self.heads[i].take();
        let n = self.streams[i].next();
        if let Some(r) = &n {
            self.heap.push(Reverse((r.time_ns, i)));
        }
        self.heads[i] = n;
        out
    }
}

/// Split `n` items into `k` non-empty parts at random (the lengths of a
/// generator's runs).
pub(crate) fn split(n: u64, k: u64, rng: &mut impl rand::Rng) -> Vec<u64> {
    if k == 0 || n == 0 {
        return Vec::new();
    }
    let k = k.min(n);
    let mut cuts: Vec<u64> = rand::seq::index::sample(rng, (n - 1) as usize, (k - 1) as usize)
        .into_iter()
        .map(|c| c as u64 + 1)
        .collect();
    cuts.sort_unstable();
    let mut parts = Vec::with_capacity(k as usize);
    let mut prev = 0;
    for c in cuts {
        parts.push(c - prev);
        prev = c;
    }
    parts.push(n - prev);
    parts
}
