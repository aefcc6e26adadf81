//! The shared cache against its contract: hits served from files, the
//! byte cap, several processes (two instances on one folder: `flock`
//! locks belong to open files, so they exclude each other like two
//! processes do), pins, and recovery from what a crash leaves behind.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::journal::{self, Kind, Record, HEADER_LEN, RECORD_LEN};
use super::{CacheOptions, SharedCache};
use crate::fetch::Admission;
use roamdisk_chunkstore::hash::ChunkId;

const UNIT: u32 = 4096;

fn opts(chunks: u64, policy: &str) -> CacheOptions {
    CacheOptions {
        size: chunks * UNIT as u64,
        unit: UNIT,
        policy: policy.into(),
    }
}

/// The cache in `dir` with an LRU policy over `chunks` chunks.
fn lru(dir: &Path, chunks: u64) -> SharedCache {
    SharedCache::open(dir, &opts(chunks, "lru")).unwrap()
}

/// Why the cache in `dir` does not open.
fn refused(dir: &Path) -> String {
    SharedCache::open(dir, &opts(8, "lru"))
        .err()
        .unwrap()
        .to_string()
}

fn id(n: u32) -> ChunkId {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&n.to_le_bytes());
    b[31] = 1;
    ChunkId(b)
}

fn data(n: u32) -> Vec<u8> {
    (0..UNIT)
        .map(|i| (i ^ n.wrapping_mul(2654435761)) as u8)
        .collect()
}

fn set(c: &SharedCache) -> HashSet<ChunkId> {
    c.resident().unwrap().into_iter().collect()
}

#[test]
fn hits_are_read_from_the_file_at_any_offset() {
    let t = tempfile::tempdir().unwrap();
    let c = lru(t.path(), 8);
    let mut buf = vec![0u8; 100];
    assert!(!c.read(&id(1), UNIT as usize, &mut buf, 0).unwrap());
    c.insert(id(1), Arc::new(data(1)));
    c.sync().unwrap();
    assert!(c.contains(&id(1)).unwrap());
    assert!(c.read(&id(1), UNIT as usize, &mut buf, 1000).unwrap());
    assert_eq!(buf, data(1)[1000..1100]);
    // The file holds exactly the decoded chunk.
    let hex = id(1).to_hex();
    let f = t.path().join("chunks").join(&hex[..2]).join(&hex);
    assert_eq!(std::fs::read(f).unwrap(), data(1));
    // A reader that expects another length never gets these bytes.
    assert!(!c.read(&id(1), 512, &mut buf, 0).unwrap());
    assert_eq!(c.stats().hits, 1);
}

#[test]
fn the_cap_holds_and_lru_evicts_the_oldest() {
    let t = tempfile::tempdir().unwrap();
    let c = lru(t.path(), 4);
    for n in 1..=4 {
        assert_eq!(c.insert_now(id(n), &data(n)).unwrap(), Admission::Admitted);
    }
    let mut b = [0u8; 8];
    assert!(c.read(&id(1), UNIT as usize, &mut b, 0).unwrap()); // 1 is now recent
    c.insert_now(id(5), &data(5)).unwrap();
    assert_eq!(set(&c), [1, 3, 4, 5].map(id).into_iter().collect());
    assert_eq!(c.usage().unwrap(), (4, 4 * UNIT as u64));
    let files: usize = std::fs::read_dir(t.path().join("chunks"))
        .unwrap()
        .map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(files, 4);
    // Too large for the unit: refused, nothing stored.
    let big = vec![1u8; UNIT as usize + 1];
    assert_eq!(c.insert_now(id(9), &big).unwrap(), Admission::Refused);
    // Refused inline: the caller knows; nothing is kept for a session.
    assert!(c.take_refused(&|_| true).is_empty());
    // Refused in the background: kept until the session takes it.
    c.insert(id(9), std::sync::Arc::new(big.clone()));
    c.sync().unwrap();
    assert!(c.has_refused());
    assert!(c.take_refused(&|i| *i == id(8)).is_empty());
    let got = c.take_refused(&|i| *i == id(9));
    assert_eq!(got.len(), 1);
    assert_eq!(*got[0].1, big);
    assert!(!c.has_refused());
}

#[test]
fn processes_sharing_a_folder_agree_on_every_victim() {
    let t = tempfile::tempdir().unwrap();
    for policy in ["lru", "fmpq", "arc", "2q", "s3fifo"] {
        let dir = t.path().join(policy);
        let a = SharedCache::open(&dir, &opts(6, policy)).unwrap();
        let b = SharedCache::open(&dir, &opts(6, policy)).unwrap();
        let mut buf = [0u8; 16];
        for n in 0..60u32 {
            let (w, r) = if n % 3 == 0 { (&a, &b) } else { (&b, &a) };
            w.insert_now(id(n % 17), &data(n % 17)).unwrap();
            // Hits from both sides feed the policy through the journal.
            r.read(&id((n * 7) % 17), UNIT as usize, &mut buf, 0)
                .unwrap();
            if n % 5 == 0 {
                r.sync().unwrap();
            }
        }
        assert_eq!(set(&a), set(&b), "{policy}");
        assert!(set(&a).len() <= 6, "{policy}");
        // A third process opening now replays to the same state.
        let c = SharedCache::open(&dir, &opts(6, policy)).unwrap();
        assert_eq!(set(&c), set(&a), "{policy}");
        // And the next victim is the same whoever inserts.
        a.insert_now(id(100), &data(100)).unwrap();
        assert_eq!(set(&b), set(&a), "{policy}");
        assert_eq!(set(&c), set(&a), "{policy}");
    }
}

#[test]
fn pinned_chunks_stay_and_a_full_pinned_cache_refuses() {
    let t = tempfile::tempdir().unwrap();
    let a = lru(t.path(), 3);
    let b = lru(t.path(), 3);
    for n in 1..=3 {
        a.insert_now(id(n), &data(n)).unwrap();
    }
    let pin = a.pin(&[id(1), id(2)]).unwrap();
    // 1 and 2 are the oldest, but pinned: 3 goes, then each newcomer
    // replaces the last unpinned one.
    for n in 4..=8 {
        assert_eq!(b.insert_now(id(n), &data(n)).unwrap(), Admission::Admitted);
        let s = set(&b);
        assert!(
            s.contains(&id(1)) && s.contains(&id(2)) && s.contains(&id(n)),
            "{n}"
        );
        assert_eq!(s.len(), 3);
    }
    // Everything pinned and full: refused, nothing lost.
    let pin2 = a.pin(&[id(8)]).unwrap();
    assert_eq!(b.insert_now(id(9), &data(9)).unwrap(), Admission::Refused);
    assert_eq!(set(&a), [1, 2, 8].map(id).into_iter().collect());
    // When the session ends its pins go, and eviction resumes.
    drop(pin);
    drop(pin2);
    assert_eq!(b.insert_now(id(9), &data(9)).unwrap(), Admission::Admitted);
    assert_eq!(set(&a).len(), 3);
}

#[test]
fn a_pinned_set_of_a_dead_process_does_not_hold_anything() {
    let t = tempfile::tempdir().unwrap();
    let c = lru(t.path(), 2);
    c.insert_now(id(1), &data(1)).unwrap();
    c.insert_now(id(2), &data(2)).unwrap();
    // A pin file nobody holds a lock on: its process is gone.
    std::fs::write(
        t.path().join("pins/4242-0-0"),
        super::pins::encode(&[id(1), id(2)]),
    )
    .unwrap();
    assert_eq!(c.insert_now(id(3), &data(3)).unwrap(), Admission::Admitted);
    assert!(!t.path().join("pins/4242-0-0").exists());
}

#[test]
fn reopening_reconciles_files_and_journal() {
    let t = tempfile::tempdir().unwrap();
    {
        let c = lru(t.path(), 8);
        for n in 1..=3 {
            c.insert_now(id(n), &data(n)).unwrap();
        }
    }
    let path = |n: u32| {
        let hex = id(n).to_hex();
        t.path().join("chunks").join(&hex[..2]).join(hex)
    };
    // What a crash can leave: a file renamed in but never journaled, a
    // journaled file whose data was lost, a torn record, a temporary.
    std::fs::create_dir_all(path(7).parent().unwrap()).unwrap();
    std::fs::write(path(7), data(7)).unwrap();
    std::fs::write(path(2), b"short").unwrap();
    std::fs::remove_file(path(3)).unwrap();
    let j = t.path().join("journal");
    let mut bytes = std::fs::read(&j).unwrap();
    bytes.extend_from_slice(
        &Record {
            kind: Kind::Touch,
            id: id(1),
        }
        .encode()[..20],
    );
    std::fs::write(&j, &bytes).unwrap();
    std::fs::write(t.path().join("tmp/x.999999999.0"), b"partial").unwrap();

    // Opening goes by names (no stat of every file): the file cut short
    // is still named until it is first read.
    let c = lru(t.path(), 8);
    assert_eq!(set(&c), [id(1), id(2)].into_iter().collect());
    assert!(!path(7).exists() && path(2).exists());
    assert!(!t.path().join("tmp/x.999999999.0").exists());
    let len = std::fs::metadata(&j).unwrap().len() as usize;
    assert_eq!((len - HEADER_LEN) % RECORD_LEN, 0, "torn tail cut");
    let mut buf = vec![0u8; UNIT as usize];
    assert!(c.read(&id(1), UNIT as usize, &mut buf, 0).unwrap());
    assert_eq!(buf, data(1));
    // Read, it is found cut short: not served, dropped from the journal
    // and its file removed, so that the fetch that follows puts it back.
    assert!(!c.read(&id(2), UNIT as usize, &mut buf, 0).unwrap());
    assert_eq!(set(&c), [id(1)].into_iter().collect());
    assert!(!path(2).exists());
    assert_eq!(c.insert_now(id(2), &data(2)).unwrap(), Admission::Admitted);
    assert!(c.read(&id(2), UNIT as usize, &mut buf, 0).unwrap());
    assert_eq!(buf, data(2));
    // A file removed by hand after the cache opened, while the journal
    // names it: not served, dropped at its first read.
    drop(c);
    let c = lru(t.path(), 8);
    std::fs::remove_file(path(1)).unwrap();
    assert!(!c.read(&id(1), UNIT as usize, &mut buf, 0).unwrap());
    assert_eq!(set(&c), [id(2)].into_iter().collect());
}

#[test]
fn a_damaged_journal_header_is_an_error_that_says_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    drop(lru(t.path(), 8));
    std::fs::write(t.path().join("journal"), b"not a journal at all").unwrap();
    let e = refused(t.path());
    assert!(e.contains("remove the shared cache folder"), "{e}");
}

#[test]
fn compaction_keeps_the_state_for_every_process() {
    let t = tempfile::tempdir().unwrap();
    let a = lru(t.path(), 64);
    let b = lru(t.path(), 64);
    let mut buf = [0u8; 4];
    for round in 0..200u32 {
        let n = round % 80;
        a.insert_now(id(n), &data(n)).unwrap();
        for k in 0..30 {
            b.read(&id((n + k) % 80), UNIT as usize, &mut buf, 0)
                .unwrap();
        }
        b.sync().unwrap();
    }
    // Far more records were written than the journal now holds.
    let len = std::fs::metadata(t.path().join("journal")).unwrap().len() as usize;
    assert!((len - HEADER_LEN) / RECORD_LEN < 4096 + 64 * 8 + 64);
    assert_eq!(set(&a), set(&b));
    let c = lru(t.path(), 64);
    assert_eq!(set(&c), set(&a));
    // Check the journal parses record by record to the end.
    let bytes = std::fs::read(t.path().join("journal")).unwrap();
    journal::check_header(&bytes).unwrap();
    let (_, used) = journal::decode_records(&bytes[HEADER_LEN..]);
    assert_eq!(used, bytes.len() - HEADER_LEN);
}

fn mark(version: u32, ids: &[u32]) -> super::hoard_marks::HoardMark {
    super::hoard_marks::HoardMark::new(
        id(1000 + version),
        &format!("u/vm{version}"),
        ids.len() as u64 * UNIT as u64,
        ids.iter().map(|&n| id(n)).collect(),
    )
}

#[test]
fn hoarded_chunks_stay_in_every_process_until_released() {
    let t = tempfile::tempdir().unwrap();
    let a = lru(t.path(), 4);
    let b = lru(t.path(), 4);
    a.mark_hoard(&mark(1, &[1, 2])).unwrap();
    for n in 1..=2 {
        a.insert_now(id(n), &data(n)).unwrap();
    }
    // Another process streams many chunks through: 1 and 2 are the oldest
    // but hoarded, so the newcomers take turns in the other two places.
    for n in 3..=12 {
        assert_eq!(b.insert_now(id(n), &data(n)).unwrap(), Admission::Admitted);
        let s = set(&b);
        assert!(s.contains(&id(1)) && s.contains(&id(2)), "{n}");
        assert_eq!(s.len(), (n as usize).min(4));
    }
    // Full of hoarded chunks: refused like a cache full of pinned ones.
    a.mark_hoard(&mark(2, &[11, 12])).unwrap();
    assert_eq!(b.insert_now(id(13), &data(13)).unwrap(), Admission::Refused);
    assert_eq!(set(&a), [1, 2, 11, 12].map(id).into_iter().collect());
    // A third version would not fit beside them: refused before anything.
    let e = a.mark_hoard(&mark(3, &[20])).unwrap_err();
    assert_eq!(e.kind(), roamdisk_blockdev::ErrorKind::NoSpace);
    let msg = e.to_string();
    assert!(
        msg.contains("needs 1 chunks")
            && msg.contains("at most 4 chunks")
            && msg.contains("2 other hoarded versions keep 4 more"),
        "{msg}"
    );
    assert_eq!(a.hoard_marks().unwrap().len(), 2);
    // Hoarding a version again replaces its mark (not counted twice).
    a.mark_hoard(&mark(2, &[11, 12])).unwrap();
    // Released: evicted like any other chunk.
    assert!(a.release_hoard(&id(1001)).unwrap());
    assert!(!a.release_hoard(&id(1001)).unwrap());
    for n in 14..=15 {
        assert_eq!(b.insert_now(id(n), &data(n)).unwrap(), Admission::Admitted);
    }
    assert_eq!(set(&b), [11, 12, 14, 15].map(id).into_iter().collect());
}

#[test]
fn a_version_1_cache_opens_and_becomes_version_2_at_its_first_hoard() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("cache.toml"),
        "magic = \"roamdisk-shared-cache\"\nversion = 1\nsize = 16384\nunit = 4096\npolicy = \"lru\"\n",
    )
    .unwrap();
    let c = lru(t.path(), 8);
    assert_eq!((c.format_version(), c.capacity()), (1, 4));
    c.insert_now(id(1), &data(1)).unwrap();
    c.mark_hoard(&mark(1, &[1])).unwrap();
    assert_eq!(c.format_version(), 2);
    let text = std::fs::read_to_string(t.path().join("cache.toml")).unwrap();
    assert!(
        text.contains("version = 2") && text.contains("size = 16384"),
        "{text}"
    );
    drop(c);
    let c = lru(t.path(), 8);
    assert_eq!(c.format_version(), 2);
    assert_eq!(set(&c), [id(1)].into_iter().collect());
    // A version this build does not know is refused with what it means.
    drop(c);
    let p = t.path().join("cache.toml");
    std::fs::write(&p, text.replace("version = 2", "version = 3")).unwrap();
    let e = refused(t.path());
    assert!(e.contains("a newer roamdisk made it"), "{e}");
}

#[test]
fn evict_keeps_what_sessions_pin_and_hoards_keep_and_all_needs_no_session() {
    let t = tempfile::tempdir().unwrap();
    let c = lru(t.path(), 8);
    for n in 1..=6 {
        c.insert_now(id(n), &data(n)).unwrap();
    }
    c.mark_hoard(&mark(1, &[1, 2])).unwrap();
    let pin = c.pin(&[id(2), id(3)]).unwrap();
    let e = c.evict(false).unwrap();
    assert_eq!(
        (e.chunks, e.bytes, e.kept_pinned, e.kept_hoarded, e.released),
        (3, 3 * UNIT as u64, 2, 1, 0)
    );
    assert_eq!(set(&c), [1, 2, 3].map(id).into_iter().collect());
    let msg = c.evict(true).unwrap_err().to_string();
    assert!(
        msg.contains("1 session is running") && msg.contains(&std::process::id().to_string()),
        "{msg}"
    );
    drop(pin);
    let e = c.evict(true).unwrap();
    assert_eq!((e.chunks, e.released), (3, 1));
    assert!(set(&c).is_empty() && c.hoard_marks().unwrap().is_empty());
    let files: usize = std::fs::read_dir(t.path().join("chunks"))
        .unwrap()
        .map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(files, 0);
    // Another process agrees.
    let d = lru(t.path(), 8);
    assert!(set(&d).is_empty());
}

#[test]
fn verify_drops_a_damaged_chunk_even_for_a_process_that_holds_it_open() {
    let t = tempfile::tempdir().unwrap();
    let a = lru(t.path(), 8);
    let hash = roamdisk_chunkstore::hash::HashKind::Blake3;
    let chunks: Vec<(ChunkId, Vec<u8>)> = (1..=4)
        .map(|n| {
            let d = data(n);
            (hash.hash(&d), d)
        })
        .collect();
    for (i, d) in &chunks {
        a.insert_now(*i, d).unwrap();
    }
    // Process A reads chunk 2 (and keeps its file open).
    let (bad, good) = (&chunks[1], &chunks[0]);
    let mut buf = vec![0u8; UNIT as usize];
    assert!(a.read(&bad.0, UNIT as usize, &mut buf, 0).unwrap());
    // Its file is damaged in place (same size).
    let path = a.chunk_path(&bad.0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] ^= 0x20;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&bytes, 0)
        .unwrap();
    // Process B verifies: the damaged chunk is found and dropped.
    let b = lru(t.path(), 8);
    let r = super::admin::verify(&b, &roamdisk_chunkstore::NoProgress).unwrap();
    assert_eq!(r.chunks, 4);
    assert_eq!(r.damaged.len(), 1, "{r:?}");
    assert_eq!(r.damaged[0].id, bad.0.to_hex());
    assert!(!path.exists());
    // A no longer serves it (it fetches it again), and serves the rest.
    assert!(!a.read(&bad.0, UNIT as usize, &mut buf, 0).unwrap());
    assert!(a.read(&good.0, UNIT as usize, &mut buf, 0).unwrap());
    assert_eq!(buf, good.1);
    let s = super::admin::status(&a).unwrap();
    assert_eq!((s.chunks, s.bytes), (3, 3 * UNIT as u64));
    // Nothing else is damaged.
    assert!(super::admin::verify(&b, &roamdisk_chunkstore::NoProgress)
        .unwrap()
        .damaged
        .is_empty());
}

#[test]
fn status_counts_hoards_pins_and_what_may_go() {
    let t = tempfile::tempdir().unwrap();
    let c = lru(t.path(), 8);
    for n in 1..=5 {
        c.insert_now(id(n), &data(n)).unwrap();
    }
    c.mark_hoard(&mark(1, &[1, 2, 9])).unwrap();
    let _pin = c.pin(&[id(2), id(3)]).unwrap();
    let s = super::admin::status(&c).unwrap();
    assert_eq!((s.chunks, s.bytes, s.capacity), (5, 5 * UNIT as u64, 8));
    assert_eq!(
        (s.hoarded_chunks, s.pinned_chunks, s.evictable_chunks),
        (2, 1, 2)
    );
    assert_eq!(s.hoards.len(), 1);
    let h = &s.hoards[0];
    assert_eq!((h.chunks, h.present_chunks, h.complete), (3, 2, false));
    assert!((h.percent - 200.0 / 3.0).abs() < 1e-9);
    assert_eq!(s.sessions.len(), 1);
    assert_eq!(s.sessions[0].pid, Some(std::process::id()));
    assert_eq!((s.sessions[0].chunks, s.sessions[0].present_chunks), (2, 2));
}
