//! Power cuts during a whole-file write. `durable::write_atomically_in`
//! (the code every atomic file write of the project runs) replaces a file
//! on the simulated file system `testkit::simfs::SimFs`; the power fails at
//! every one of its I/Os in turn, and every reboot must find exactly the
//! old file or exactly the new one (exactly the new one once the write
//! returned), never an empty, short or mixed file, and the next write must
//! leave the new file and no stray temporary.
//!
//! Regression: the borrow plan was saved by hand with a temporary file and
//! a rename but no `fsync` (its comment said "atomically"), so a power cut
//! could leave an empty plan. The same check run on that write finds the
//! empty and torn files (`the_write_without_fsync_leaves_empty_or_torn_files`),
//! and on writes that skip one of the two syncs.

use std::io::Write;
use std::path::Path;

use roamdisk_blockdev::durable::{self, FileSystem};
use roamdisk_blockdev::testkit::simfs::{check_power_cuts, SimFs, Violation};
use roamdisk_blockdev::testkit::{Countdown, Rng};

const REBOOTS: u64 = 48;

/// Contents of every shape: none, empty, under a sector, several sectors
/// with a partial last one.
fn contents() -> Vec<Option<Vec<u8>>> {
    let mut r = Rng::new(7);
    vec![
        None,
        Some(Vec::new()),
        Some(r.bytes(100)),
        Some(r.bytes(1500)),
        Some(r.bytes(2048)),
    ]
}

/// The regression: temporary file, write, rename, no sync.
fn unsynced_write(fs: &SimFs, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp-plan");
    fs.create(&tmp)?.write_all(bytes)?;
    fs.rename(&tmp, path)
}

/// `durable`'s steps without the `fsync` of the file.
fn write_without_file_sync(fs: &SimFs, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = durable::with_suffix(path, ".tmp");
    fs.create(&tmp)?.write_all(bytes)?;
    fs.rename(&tmp, path)?;
    fs.sync_dir(durable::parent_of(path))
}

/// `durable`'s steps without the `fsync` of the directory.
fn write_without_dir_sync(fs: &SimFs, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = durable::with_suffix(path, ".tmp");
    let mut f = fs.create(&tmp)?;
    f.write_all(bytes)?;
    fs.sync_file(&mut f)?;
    fs.rename(&tmp, path)
}

/// Whether a violation shows a file that is neither old nor new.
fn damaged(v: &Violation, old: &[u8], new: &[u8]) -> bool {
    v.found.as_deref().is_some_and(|f| {
        f != old && f != new && (f.is_empty() || f.len() < new.len() || f.contains(&0))
    })
}

#[test]
fn durable_write_leaves_the_old_file_or_the_new_one() {
    // In a directory, and a bare name (the current directory).
    for name in ["/d/state", "state"] {
        let path = Path::new(name);
        for old in contents() {
            for new in contents().into_iter().flatten() {
                let bad = check_power_cuts(path, old.as_deref(), &new, REBOOTS, |fs| {
                    let _ = durable::write_atomically_in(fs, path, &new);
                });
                assert!(
                    bad.is_empty(),
                    "{path:?} {:?} -> {}: {bad:?}",
                    old.as_ref().map(Vec::len),
                    new.len()
                );
            }
        }
    }
}

/// A whole-file write on the simulated file system.
type WriteFn = fn(&SimFs, &Path, &[u8]) -> std::io::Result<()>;

/// The file `/d/f` of `old_len` bytes replaced by `write` with `new_len`
/// bytes (contents from `seed`): the two contents and what
/// [`check_power_cuts`] finds.
fn cuts(
    seed: u64,
    old_len: usize,
    new_len: usize,
    write: WriteFn,
) -> (Vec<u8>, Vec<u8>, Vec<Violation>) {
    let path = Path::new("/d/f");
    let mut r = Rng::new(seed);
    let (old, new) = (r.bytes(old_len), r.bytes(new_len));
    let bad = check_power_cuts(path, Some(&old), &new, REBOOTS, |fs| {
        let _ = write(fs, path, &new);
    });
    (old, new, bad)
}

#[test]
fn the_write_without_fsync_leaves_empty_or_torn_files() {
    let (old, new, bad) = cuts(1, 1500, 1500, unsynced_write);
    assert!(
        bad.iter().any(|v| v.found.as_deref() == Some(&[][..])),
        "{bad:?}"
    );
    assert!(bad.iter().any(|v| damaged(v, &old, &new)), "{bad:?}");
    assert!(
        bad.iter().any(|v| v.completed),
        "nothing made it durable: {bad:?}"
    );
}

#[test]
fn a_write_without_the_file_sync_is_caught() {
    let (old, new, bad) = cuts(2, 700, 1100, write_without_file_sync);
    assert!(bad.iter().any(|v| damaged(v, &old, &new)), "{bad:?}");
    // Even after it returned: the name was durable, the data not.
    assert!(
        bad.iter().any(|v| v.completed && damaged(v, &old, &new)),
        "{bad:?}"
    );
}

#[test]
fn a_write_without_the_directory_sync_loses_only_completed_writes() {
    let (old, _, bad) = cuts(3, 700, 1100, write_without_dir_sync);
    assert!(!bad.is_empty());
    // Atomic but not durable: the reboot finds the old file.
    for v in &bad {
        assert!(v.completed && v.found.as_deref() == Some(&old[..]), "{v:?}");
    }
}

#[test]
fn durable_write_completes_without_a_power_cut() {
    let fs = SimFs::new(Countdown::unarmed());
    let path = Path::new("/d/f");
    durable::write_atomically_in(&fs, path, b"one").unwrap();
    durable::write_atomically_in(&fs, path, b"two").unwrap();
    assert_eq!(fs.read(path).unwrap(), b"two");
    assert_eq!(fs.files(), [path]);
}

/// `write_unsynced` (a layer's report at a flush) is atomic for readers: at
/// every step a reader sees the old file or the new one. As documented, a
/// power cut may leave an empty or torn file.
#[test]
fn an_unsynced_write_is_atomic_for_readers_only() {
    let (old, new, bad) = cuts(4, 700, 1100, durable::write_unsynced_in::<SimFs>);
    assert!(bad.iter().any(|v| damaged(v, &old, &new)), "{bad:?}");
    let path = Path::new("/d/f");
    for cut in 1.. {
        let fs = SimFs::new(Countdown::crash_at(cut));
        fs.put(path, &old);
        let _ = durable::write_unsynced_in(&fs, path, &new);
        let seen = fs.read(path).expect("a file");
        assert!(seen == old || seen == new, "cut at {cut}");
        if !fs.crashed() {
            assert_eq!(seen, new);
            assert_eq!(fs.files(), [path]);
            break;
        }
    }
}

/// A reboot after each I/O of `write` in turn (and after it returned) on a
/// file system holding `old` at `/d/f`: the cuts (I/O number, seed) whose
/// reboot found neither `old` nor `new` at `/d/f`, or not `new` although
/// `write` had returned, or after which `write` run again with another
/// temporary did not leave `new`.
fn cuts_with_temporaries(
    old: &[u8],
    new: &[u8],
    write: impl Fn(&SimFs, &Path) -> std::io::Result<()>,
) -> Vec<(u64, u64, &'static str)> {
    let path = Path::new("/d/f");
    let start = |countdown| {
        let fs = SimFs::new(countdown);
        fs.put(path, old);
        fs
    };
    let counter = Countdown::unarmed();
    write(&start(counter.clone()), Path::new("/t/f.1")).unwrap();
    let mut bad = Vec::new();
    for cut_at in 1..=counter.spent() + 1 {
        let fs = start(Countdown::crash_at(cut_at));
        let completed = write(&fs, Path::new("/t/f.1")).is_ok();
        for seed in 0..REBOOTS {
            let after = fs.after_crash(&mut Rng::new((cut_at << 32) | seed), Countdown::unarmed());
            let found = after.read(path);
            if completed && found.as_deref() != Some(new) {
                bad.push((cut_at, seed, "a completed write was lost"));
            } else if found.as_deref() != Some(old) && found.as_deref() != Some(new) {
                bad.push((cut_at, seed, "neither the old file nor the new one"));
            } else if write(&after, Path::new("/t/f.2")).is_err()
                || after.read(path).as_deref() != Some(new)
            {
                bad.push((cut_at, seed, "the next write did not leave the new file"));
            }
        }
    }
    bad
}

/// `write_then_rename` and then the caller's `fsync` of the directory (a
/// chunk store's catalog update, lease or settings; its temporaries are in
/// `tmp/`, named by process and sequence number, and a stale one is
/// removed by the store's recovery): a reboot finds the old file or the new
/// one, the new one once the sync returned.
#[test]
fn write_then_rename_and_a_directory_sync_leave_the_old_file_or_the_new_one() {
    let mut r = Rng::new(5);
    for (old_len, new_len) in [(0, 100), (700, 1100), (2048, 512)] {
        let (old, new) = (r.bytes(old_len), r.bytes(new_len));
        let bad = cuts_with_temporaries(&old, &new, |fs, tmp| {
            durable::write_then_rename_in(fs, Path::new("/d/f"), tmp, &new)?;
            fs.sync_dir(Path::new("/d"))
        });
        assert!(bad.is_empty(), "{old_len} -> {new_len}: {bad:?}");
    }
}

/// Without the caller's directory sync the write is atomic, not durable:
/// a reboot may find the old file after it returned (never a torn one).
#[test]
fn write_then_rename_without_the_directory_sync_is_atomic_only() {
    let mut r = Rng::new(6);
    let (old, new) = (r.bytes(700), r.bytes(1100));
    let bad = cuts_with_temporaries(&old, &new, |fs, tmp| {
        durable::write_then_rename_in(fs, Path::new("/d/f"), tmp, &new)
    });
    assert!(!bad.is_empty());
    assert!(
        bad.iter().all(|b| b.2 == "a completed write was lost"),
        "{bad:?}"
    );
}

/// A temporary that exists is never written through.
#[test]
fn write_then_rename_refuses_a_taken_temporary() {
    let fs = SimFs::new(Countdown::unarmed());
    let (path, tmp) = (Path::new("/d/f"), Path::new("/t/f.1"));
    fs.put(tmp, b"stale");
    let e = durable::write_then_rename_in(&fs, path, tmp, b"new").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(fs.read(tmp).unwrap(), b"stale");
    assert_eq!(fs.read(path), None);
}
