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
mod error;
mod sizes;
mod stream;
pub mod vpc;

use std::collections::BTreeSet;
use std::path::Path;

use roamdisk_blockdev::progress::{Progress, Unit};

use crate::format::{Format, Writer};

pub use error::SynthError;
use stream::mix_seed;
pub use stream::{rng, Merge, RecordStream};

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
    pub fn parse(name: &str) -> Result<Kind, SynthError> {
        Kind::all()
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, k, _)| k)
            .ok_or_else(|| {
                let names: Vec<String> = Kind::all().into_iter().map(|(n, _, _)| n).collect();
                SynthError::UnknownKind {
                    name: name.to_string(),
                    known: names.join(", "),
                }
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

/// The generator of `kind`.
pub fn generate(kind: Kind, opts: &SynthOptions) -> Result<RecordStream, SynthError> {
    if !(opts.scale > 0.0 && opts.scale.is_finite()) {
        return Err(SynthError::Scale(opts.scale));
    }
    if opts.clients == Some(0) {
        return Err(SynthError::NoClients);
    }
    if opts.requests == Some(0) {
        return Err(SynthError::NoRequests);
    }
    Ok(match kind {
        Kind::Android(i) => {
            let t = android::TRACES
                .get(i)
                .ok_or(SynthError::NoAndroidTrace(i))?;
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

impl Kind {
    /// About how many records [`generate`] makes of this kind with `opts`
    /// (exact for all but the boot storm, whose barriers are random): the
    /// total of a progress display.
    pub fn expected_records(self, opts: &SynthOptions) -> u64 {
        let clients = opts.clients.unwrap_or(1) as u64;
        match self {
            Kind::Android(i) => {
                let per: u64 = android::TRACES.get(i).map_or(0, |t| {
                    t.partitions
                        .iter()
                        .map(|p| {
                            let rw = p.read.count + p.write.count;
                            rw + rw * p.barrier_pct as u64 / 100
                        })
                        .sum()
                });
                (per as f64 * opts.scale) as u64 * clients
            }
            Kind::Desktop => opts.requests.unwrap_or(desktop::DEFAULT_REQUESTS) * clients,
            Kind::Boot => {
                let n = opts.requests.unwrap_or(boot::DEFAULT_REQUESTS)
                    * opts.clients.unwrap_or(boot::DEFAULT_CLIENTS) as u64;
                n + n / 80
            }
            Kind::VpcBoot | Kind::VpcOffice => {
                let p = if self == Kind::VpcBoot {
                    vpc::VpcParams::boot()
                } else {
                    vpc::VpcParams::office()
                };
                opts.requests.unwrap_or(p.requests) * clients
            }
        }
    }
}

/// What [`write`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Records written.
    pub records: u64,
    /// The devices and clients the records name.
    pub devices: BTreeSet<u32>,
    pub clients: BTreeSet<u32>,
    /// Time of the last record.
    pub last_ns: u64,
}

/// Generate `kind` into the trace file `out` (binary, or CSV when named
/// `*.csv`), reporting a phase "generating" over the expected records.
pub fn write(
    kind: Kind,
    opts: &SynthOptions,
    out: &Path,
    progress: &dyn Progress,
) -> Result<Written, SynthError> {
    let expected = kind.expected_records(opts);
    let gen = generate(kind, opts)?;
    let mut w = Writer::create(out, Format::from_path(out))?;
    progress.start("generating", expected.max(1), Unit::Items);
    let mut done = Written::default();
    for r in gen {
        w.write(&r)?;
        done.devices.insert(r.device);
        done.clients.insert(r.client);
        done.last_ns = r.time_ns;
        done.records += 1;
        if done.records.is_multiple_of(65536) {
            progress.set(done.records.min(expected));
        }
    }
    w.finish()?;
    progress.end();
    Ok(done)
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
