//! The world of one sequence of the model test: the stores, what the
//! model recorded, the session, and the steps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use roamdisk_blockdev::layers::mem::MemDev;
use roamdisk_blockdev::testkit::Rng;
use roamdisk_blockdev::{BlockDev, Registry, WriteFlags};
use roamdisk_chunkstore::chunk::Key;
use roamdisk_chunkstore::commit::{commit_image, CommitOptions, Source};
use roamdisk_chunkstore::gc::{gc, GcOptions};
use roamdisk_chunkstore::repo::{read_catalog, read_full};
use roamdisk_chunkstore::store::fault::{Event, FaultStore, Faults};
use roamdisk_chunkstore::store::mem::MemStore;
use roamdisk_chunkstore::store::{fetch, DynStore, StoreConfig};
use roamdisk_chunkstore::verify::verify;
use roamdisk_chunkstore::version::Version;
use roamdisk_chunkstore::{ChunkId, NoProgress};
use roamdisk_roam::checkout::materialise;
use roamdisk_roam::guest::NoAnalyzer;
use roamdisk_roam::session::dev::CasDev;
use roamdisk_roam::session::update::{commit_session, UpdateOptions};
use roamdisk_roam::session::{create_on, NewSession};
use roamdisk_roam::view::VersionView;

use crate::kit::{count, scratch, session_open, Disks, Recorded, Session, Stats};
use crate::{IMAGES, LEASE_TIMEOUT};

/// The world of one sequence.
pub struct World {
    seed: u64,
    rng: Rng,
    mem: Arc<MemStore>,
    faulty: Arc<FaultStore>,
    /// The store as the operations see it (with faults).
    store: DynStore,
    faults: Faults,
    key: Key,
    key_file: std::path::PathBuf,
    _keys: tempfile::TempDir,
    disks: Disks,
    versions: Vec<Recorded>,
    session: Option<Session>,
    /// Another process's gc in the middle of an operation: its outcome.
    meanwhile: Arc<Mutex<Option<Result<(), String>>>>,
    stats: Stats,
    /// What happened, step by step (printed when a check fails).
    trail: Arc<Mutex<Vec<String>>>,
    verbose: bool,
}

impl World {
    pub fn new(seed: u64, trail: Arc<Mutex<Vec<String>>>, verbose: bool) -> World {
        // Catalogs seal segments of 2 entries: a run's few commits per
        // image exercise sealing, faults and crashes around it.
        roamdisk_chunkstore::catalog::set_segment_len(2);
        let mut rng = Rng::new(seed);
        let config = StoreConfig {
            zstd_level: rng.chance(1, 2).then_some(1),
            ..StoreConfig::default()
        };
        let mem = Arc::new(MemStore::new(config));
        let faulty = Arc::new(FaultStore::new(mem.clone(), Faults::NONE, seed ^ 0xfa17));
        let keys = scratch();
        let key_file = keys.path().join("user.key");
        let key = roamdisk_chunkstore::version::create_key_file(&key_file).unwrap();
        let disks = Disks::new(&mut rng);
        World {
            seed,
            rng,
            store: faulty.clone(),
            mem,
            faulty,
            faults: Faults::NONE,
            key,
            key_file,
            _keys: keys,
            disks,
            versions: Vec::new(),
            session: None,
            meanwhile: Arc::new(Mutex::new(None)),
            stats: Stats {
                seeds: 1,
                ..Default::default()
            },
            trail,
            verbose,
        }
    }

    fn note(&self, s: String) {
        if self.verbose {
            eprintln!("{s}");
        }
        self.trail.lock().push(s);
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.rng.below(xs.len() as u64) as usize]
    }

    /// Run `f` again once the faults went away (and the power is back, an
    /// event due is cancelled), then turn them back on: a retry that must
    /// succeed.
    fn calm<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.faulty.unschedule();
        if self.faulty.power_on() {
            self.stats.power_cuts += 1;
        }
        self.faulty.set(Faults::NONE);
        let r = f();
        self.faulty.set(self.faults);
        r
    }

    /// One random step; then the invariants.
    pub fn step(&mut self, n: usize) {
        let has_versions = !self.versions.is_empty();
        let has_session = self.session.is_some();
        let what = match self.rng.below(100) {
            0..=21 => "commit",
            22..=31 if has_versions => "checkout",
            32..=40 => "gc",
            41..=45 => "crash",
            46..=54 => "faults",
            55..=62 if has_versions && !has_session => "session start",
            55..=58 if has_session => "session end",
            59..=74 if has_session => "session write",
            75..=80 if has_session => "session read",
            81..=93 if has_session => "session commit",
            94..=99 if has_session => "session reopen",
            _ => "commit",
        };
        // Now and then, something happens in the middle of a step that
        // calls the store.
        let calls_store = !matches!(what, "crash" | "faults" | "session end");
        let during = match self.rng.below(100) {
            0..=11 if calls_store => "power cut",
            12..=23 if calls_store => "gc meanwhile",
            24..=25 if calls_store => "pause past the lease timeout",
            _ => "",
        };
        if !during.is_empty() {
            self.schedule(during);
        }
        let outcome = match what {
            "commit" => self.commit(),
            "checkout" => self.checkout(),
            "gc" => self.gc(),
            "crash" => {
                let lost = self.mem.crash();
                self.stats.crashes += 1;
                self.stats.objects_lost += lost as u64;
                format!("{lost} unsynced objects lost")
            }
            "faults" => self.set_faults(),
            "session start" => self.session_start(),
            "session end" => {
                self.session = None;
                String::new()
            }
            "session write" => self.session_write(),
            "session read" => self.session_read(),
            "session commit" => self.session_commit(),
            "session reopen" => self.session_reopen(),
            _ => unreachable!(),
        };
        self.note(format!("step {n}: {what} {during}: {outcome}"));
        self.after_step();
        self.stats.steps += 1;
        self.check(&format!("after step {n} ({what})"));
    }

    /// Schedule a power cut or a gc by another process at a random call
    /// of the coming step.
    fn schedule(&mut self, what: &str) {
        let at = 1 + self.rng.below(80);
        let mem = self.mem.clone();
        let event = if what == "power cut" {
            Event::PowerCut(Box::new(move || {
                mem.crash();
            }))
        } else {
            let slot = self.meanwhile.clone();
            let by = if what == "gc meanwhile" {
                // Less than the lease timeout: a live commit's lease holds.
                Duration::from_secs(*self.pick(&[0, 1, 6, 600]))
            } else {
                LEASE_TIMEOUT + Duration::from_secs(60)
            };
            let margin = Duration::from_secs(*self.pick(&[0, 1, 5]));
            Event::Meanwhile(Box::new(move || {
                mem.advance(by);
                let opts = GcOptions {
                    margin,
                    lease_timeout: LEASE_TIMEOUT,
                    dry_run: false,
                };
                let r = gc(&*mem, &opts, &NoProgress).map(|_| ());
                *slot.lock() = Some(r.map_err(|e| e.to_string()));
            }))
        };
        self.faulty.schedule(at, event);
    }

    /// After a step: cancel an event that did not come; after a power cut,
    /// power on and reopen the session (its process died).
    fn after_step(&mut self) {
        self.faulty.unschedule();
        if self.faulty.power_on() {
            self.stats.power_cuts += 1;
            self.note("  (power cut: the store crashed, the session is reopened)".into());
            if let Some(s) = &mut self.session {
                s.dev = None;
            }
        }
        if let Some(r) = self.meanwhile.lock().take() {
            self.stats.gcs_meanwhile += 1;
            if let Err(e) = r {
                self.fail(&format!("a gc by another process failed: {e}"));
            }
        }
        if self.session.as_ref().is_some_and(|s| s.dev.is_none()) {
            self.reopen_calm();
        }
    }

    fn fail(&self, what: &str) -> ! {
        panic!("seed {}: {what}", self.seed);
    }

    /// Record a version reported committed: read its package (faults off,
    /// straight from the memory store) for what it references. A package
    /// that is not there fails the test here.
    fn record(&mut self, image: &str, id: ChunkId, bytes: Arc<Vec<u8>>, key: Option<Key>) {
        let pkg = fetch(&*self.mem, &id, None).unwrap_or_else(|e| {
            self.fail(&format!(
                "version {id} of {image} was reported committed but its package is not there: {e}"
            ))
        });
        let mut needs = Version::references_of(&pkg).unwrap();
        needs.push(id);
        self.stats.versions_recorded += 1;
        self.versions.push(Recorded {
            image: image.to_string(),
            id,
            bytes,
            key,
            needs,
        });
    }

    fn commit(&mut self) -> String {
        let image = *self.pick(&IMAGES);
        let prev = self
            .versions
            .iter()
            .rev()
            .find(|v| v.image == image)
            .map(|v| v.bytes.clone());
        let from = prev.filter(|_| self.rng.chance(3, 4));
        let bytes = self
            .disks
            .disk(&mut self.rng, from.as_deref().map(|v| v.as_slice()));
        let dev = Disks::device(&mut self.rng, &bytes);
        let key = self.rng.chance(1, 4).then_some(self.key);
        let opts = CommitOptions {
            target: image.into(),
            description: "model".into(),
            chunk_size: *self.pick(&[4096, 8192]),
            user_key: key,
            ..Default::default()
        };
        let r = commit_image(&*self.store, Source::Dev(&dev), &opts, &NoProgress);
        count(&mut self.stats.commits, &r);
        match r {
            Ok(s) => {
                assert_eq!(s.disk_size, bytes.len() as u64);
                let id = ChunkId::from_hex(&s.version).unwrap();
                self.record(image, id, Arc::new(bytes), key);
                format!("{image}: {} ({} bytes)", id.short(), s.disk_size)
            }
            Err(e) => {
                self.follow_advice(&e.to_string());
                format!("{image}: failed: {e}")
            }
        }
    }

    /// After a failed commit: one that could not refresh its lease after
    /// its catalog update and could not take its version out again, or
    /// could not tell whether it is complete, says so and tells the user
    /// to check it and remove it if it is incomplete: the model does, as
    /// `roamdisk store verify` and `roamdisk rm` would.
    fn follow_advice(&mut self, message: &str) {
        if message.contains("vanished") {
            self.stats.lease_lost += 1;
        }
        if !message.contains("remove it with") {
            return;
        }
        let id = message
            .split(|c: char| !c.is_ascii_hexdigit())
            .find_map(|w| (w.len() == 64).then(|| ChunkId::from_hex(w)).flatten())
            .unwrap_or_else(|| self.fail(&format!("no version named in: {message}")));
        let target = message
            .split("added to catalog ")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap_or_else(|| self.fail(&format!("no catalog named in: {message}")))
            .to_string();
        let complete = fetch(&*self.mem, &id, None)
            .and_then(|pkg| Version::references_of(&pkg))
            .is_ok_and(|refs| self.mem.durable(&refs).iter().all(|&d| d));
        if !complete {
            roamdisk_chunkstore::repo::update_full(&*self.mem, &target, |entries| {
                entries.retain(|e| e.version != id);
                Ok(())
            })
            .unwrap();
            self.stats.removed_as_told += 1;
        }
    }

    fn checkout(&mut self) -> String {
        let k = self.rng.below(self.versions.len() as u64) as usize;
        let (id, key, want) = {
            let v = &self.versions[k];
            (v.id, v.key, v.bytes.clone())
        };
        let mut reads = Vec::new();
        for _ in 0..3 {
            let len = 1 + self.rng.below(20_000).min(want.len() as u64 - 1);
            let off = self.rng.below(want.len() as u64 - len + 1);
            reads.push((off, len as usize));
        }
        let r = VersionView::open(self.store.clone(), id, key.as_ref()).and_then(|view| {
            // Reads of the view: each fails or returns the right bytes.
            for &(off, len) in &reads {
                let mut buf = vec![0u8; len];
                let r = view.read_at(&mut buf, off);
                count(&mut self.stats.reads, &r);
                if r.is_ok() && buf[..] != want[off as usize..off as usize + len] {
                    panic!(
                        "seed {}: a read of version {} at {off}+{len} returned wrong bytes",
                        self.seed,
                        id.short()
                    );
                }
            }
            let out = MemDev::new(want.len() as u64);
            materialise(&view, &out, &NoProgress)?;
            let mut got = vec![0u8; want.len()];
            out.read_at(&mut got, 0).unwrap();
            Ok(got)
        });
        count(&mut self.stats.checkouts, &r);
        match r {
            Ok(got) => {
                if got != *want {
                    self.fail(&format!(
                        "checkout of version {} reported success with wrong bytes",
                        id.short()
                    ));
                }
                self.stats.versions_checked += 1;
                format!("{}: identical", id.short())
            }
            Err(e) => format!("{}: failed: {e}", id.short()),
        }
    }

    fn gc(&mut self) -> String {
        let by = Duration::from_secs(*self.pick(&[0, 1, 30, 600, 7200]));
        self.mem.advance(by);
        let opts = GcOptions {
            margin: Duration::from_secs(*self.pick(&[0, 1, 5])),
            lease_timeout: LEASE_TIMEOUT,
            dry_run: false,
        };
        let r = gc(&*self.store, &opts, &NoProgress);
        count(&mut self.stats.gcs, &r);
        match r {
            Ok(r) => format!(
                "+{}s: {} removed, {} kept recent, {} live leases",
                by.as_secs(),
                r.removed_objects,
                r.kept_recent,
                r.live_leases
            ),
            Err(e) => format!("+{}s: failed: {e}", by.as_secs()),
        }
    }

    fn set_faults(&mut self) -> String {
        self.faults = match self.rng.below(4) {
            0 => Faults::NONE,
            _ => Faults {
                error_permille: *self.pick(&[5, 20, 60, 150]),
                short_read_permille: *self.pick(&[0, 10, 50]),
                latency: Duration::ZERO,
            },
        };
        self.faulty.set(self.faults);
        format!("{:?}", self.faults)
    }

    fn session_start(&mut self) -> String {
        let k = self.rng.below(self.versions.len() as u64) as usize;
        let (id, key, bytes, image) = {
            let v = &self.versions[k];
            (v.id, v.key, v.bytes.clone(), v.image.clone())
        };
        // Commits go to its own image or another.
        let target = if self.rng.chance(2, 3) {
            image
        } else {
            self.pick(&IMAGES).to_string()
        };
        let dir = scratch();
        let sdir = dir.path().join("session");
        let store = self.store.clone();
        let new = NewSession {
            target: target.clone(),
            store: "memory (the model's)".into(),
            key_file: key.map(|_| self.key_file.clone()),
            ..Default::default()
        };
        let r = VersionView::open_with_package(store.clone(), id, key.as_ref(), &[])
            .and_then(|(view, pkg)| create_on(&sdir, &view, &pkg, &new))
            .and_then(|()| {
                CasDev::open_on(&sdir, &session_open(), &Registry::with_builtin(), store)
            });
        count(&mut self.stats.sessions_started, &r);
        match r {
            Ok(dev) => {
                self.session = Some(Session {
                    dir,
                    dev: Some(dev),
                    bytes: bytes.to_vec(),
                    target: target.clone(),
                    key,
                });
                format!("on {} for {target}", id.short())
            }
            Err(e) => format!("on {}: failed: {e}", id.short()),
        }
    }

    /// Random writes through the session, each retried with faults off if
    /// it failed (a write of a partial sector reads the base), then a
    /// flush: the model is then exactly what was written.
    fn session_write(&mut self) -> String {
        let n = 1 + self.rng.below(6);
        let size = self.session.as_ref().unwrap().bytes.len() as u64;
        let mut retried = 0;
        for _ in 0..n {
            let len = if self.rng.chance(1, 3) {
                1 + self.rng.below(3000)
            } else {
                512 * (1 + self.rng.below(24))
            }
            .min(size);
            let mut off = self.rng.below(size - len + 1);
            if len % 512 == 0 && self.rng.chance(2, 3) {
                off = off / 512 * 512;
            }
            let data = match self.rng.below(4) {
                0 => vec![0u8; len as usize],
                1 => {
                    let b = self.disks.block(&mut self.rng);
                    b.iter().copied().cycle().take(len as usize).collect()
                }
                _ => self.rng.bytes(len as usize),
            };
            let s = self.session.take().unwrap();
            let dev = s.dev.as_ref().unwrap();
            if dev.write_at(&data, off, WriteFlags::default()).is_err() {
                retried += 1;
                self.calm(|| dev.write_at(&data, off, WriteFlags::default()))
                    .unwrap();
            }
            let s = self.session.insert(s);
            s.bytes[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        let s = self.session.take().unwrap();
        let dev = s.dev.as_ref().unwrap();
        if dev.flush().is_err() {
            self.calm(|| dev.flush()).unwrap();
        }
        self.session = Some(s);
        format!("{n} writes ({retried} retried without faults)")
    }

    fn session_read(&mut self) -> String {
        let s = self.session.as_ref().unwrap();
        let size = s.bytes.len() as u64;
        let len = 1 + self.rng.below(40_000).min(size - 1);
        let off = self.rng.below(size - len + 1);
        let mut buf = vec![0u8; len as usize];
        let r = s.dev.as_ref().unwrap().read_at(&mut buf, off);
        count(&mut self.stats.reads, &r);
        match r {
            Ok(()) => {
                if buf[..] != s.bytes[off as usize..(off + len) as usize] {
                    self.fail(&format!(
                        "a session read at {off}+{len} returned wrong bytes"
                    ));
                }
                format!("{off}+{len}: right")
            }
            Err(e) => format!("{off}+{len}: failed: {e}"),
        }
    }

    fn session_commit(&mut self) -> String {
        let s = self.session.as_ref().unwrap();
        let opts = UpdateOptions {
            commit: CommitOptions {
                description: "model session".into(),
                ..Default::default()
            },
            p1: self.rng.chance(1, 2),
            p2: false,
            p3: false,
        };
        let dev = s.dev.as_ref().unwrap();
        let r = commit_session(dev, &opts, &NoAnalyzer, &NoProgress);
        count(&mut self.stats.session_commits, &r);
        match r {
            Ok(sum) => {
                let id = ChunkId::from_hex(&sum.version).unwrap();
                if dev.base().id != id {
                    self.fail("a session commit succeeded but the session is not on it");
                }
                let (target, bytes, key) = (s.target.clone(), s.bytes.clone(), s.key);
                self.record(&target, id, Arc::new(bytes), key);
                format!("{target}: {}", id.short())
            }
            Err(e) => {
                self.follow_advice(&e.to_string());
                format!("failed: {e}")
            }
        }
    }

    fn session_reopen(&mut self) -> String {
        let s = self.session.as_mut().unwrap();
        s.dev = None;
        let r = CasDev::open_on(
            &s.dir.path().join("session"),
            &session_open(),
            &Registry::with_builtin(),
            self.store.clone(),
        );
        match r {
            Ok(dev) => {
                s.dev = Some(dev);
                "reopened".into()
            }
            Err(e) => format!("failed: {e} (opened again without faults)"),
        }
    }

    /// Open the session again, faults off: it must open.
    fn reopen_calm(&mut self) {
        let mut s = self.session.take().unwrap();
        let dir = s.dir.path().join("session");
        let store = self.store.clone();
        let r =
            self.calm(|| CasDev::open_on(&dir, &session_open(), &Registry::with_builtin(), store));
        match r {
            Ok(dev) => s.dev = Some(dev),
            Err(e) => self.fail(&format!("the session does not open again: {e}")),
        }
        self.session = Some(s);
    }

    /// The invariants: every recorded version is in its catalog, and its
    /// package and every object it references are stored and synced.
    fn check(&self, when: &str) {
        let mut catalogs = HashMap::new();
        for v in &self.versions {
            let cat = catalogs.entry(v.image.clone()).or_insert_with(|| {
                // The segments the catalog names are stored and synced.
                let (head, _) = read_catalog(&*self.mem, &v.image)
                    .unwrap_or_else(|e| self.fail(&format!("{when}: catalog {}: {e}", v.image)));
                let segs: Vec<ChunkId> = head.segments.iter().map(|g| g.id).collect();
                if !self.mem.durable(&segs).iter().all(|&d| d) {
                    self.fail(&format!(
                        "{when}: catalog {} names a segment that is not durable",
                        v.image
                    ));
                }
                read_full(&*self.mem, &v.image)
                    .unwrap_or_else(|e| self.fail(&format!("{when}: catalog {}: {e}", v.image)))
                    .0
            });
            if !cat.entries.iter().any(|e| e.version == v.id) {
                self.fail(&format!(
                    "{when}: committed version {} is not in catalog {}",
                    v.id.short(),
                    v.image
                ));
            }
            let durable = self.mem.durable(&v.needs);
            if let Some(k) = durable.iter().position(|d| !d) {
                self.fail(&format!(
                    "{when}: object {} of committed version {} of {} is missing or not synced",
                    v.needs[k].short(),
                    v.id.short(),
                    v.image
                ));
            }
        }
    }

    /// The end: faults off; a crash; a gc with every lease expired leaves
    /// exactly what the catalogs reference; verify finds nothing wrong;
    /// every recorded version checks out byte for byte.
    pub fn finish(mut self) -> Stats {
        self.faults = Faults::NONE;
        self.faulty.set(Faults::NONE);
        self.session = None;
        self.stats.objects_lost += self.mem.crash() as u64;
        self.check("after the final crash");
        self.mem.advance(LEASE_TIMEOUT * 2);
        let r = gc(&*self.store, &GcOptions::default(), &NoProgress)
            .unwrap_or_else(|e| self.fail(&format!("the final gc failed: {e}")));
        if r.kept_recent != 0 || r.objects - r.removed_objects != r.referenced {
            self.fail(&format!(
                "the final gc left objects no catalog references: {r:?}"
            ));
        }
        self.check("after the final gc");
        let v = verify(&*self.store, &NoProgress).unwrap();
        if !v.ok() {
            self.fail(&format!("verify: {:?} {:?}", v.bad, v.missing));
        }
        for rec in &self.versions {
            let view = VersionView::open(self.store.clone(), rec.id, rec.key.as_ref())
                .unwrap_or_else(|e| self.fail(&format!("version {}: {e}", rec.id.short())));
            let out = MemDev::new(rec.bytes.len() as u64);
            materialise(&view, &out, &NoProgress).unwrap();
            let mut got = vec![0u8; rec.bytes.len()];
            out.read_at(&mut got, 0).unwrap();
            if got != *rec.bytes {
                self.fail(&format!(
                    "version {} of {} does not check out as committed",
                    rec.id.short(),
                    rec.image
                ));
            }
            self.stats.versions_checked += 1;
        }
        self.stats.faults_injected = self.faulty.injected();
        self.stats
    }
}
