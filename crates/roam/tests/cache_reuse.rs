//! Slot reuse is safe for readers in other processes (issue 38): one
//! writer process keeps rewriting the 16 slots of a slot file with other
//! chunks (claiming their granules' generations first, as the cache's
//! lock holder does) and publishes where each chunk is in an index file;
//! two reader processes read 4 KiB pieces of the chunks the index names,
//! often after it has moved on (a stale index, as a process that has not
//! caught up with the journal has), and check every byte against the
//! chunk's contents. With the generation check no byte is ever wrong;
//! the control runs the same readers without it and must see wrong bytes,
//! or the test proves nothing and fails.
//!
//! The processes are this test binary run again (`worker`, ignored in a
//! normal run) with its role in `ROAMDISK_REUSE_ROLE`. They stop after a
//! count of writes, not a time.

#![allow(
    clippy::disallowed_methods,
    reason = "a child process reads its role from its environment"
)]
#![allow(
    clippy::disallowed_macros,
    reason = "the test prints the counts it saw"
)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use roamdisk_roam::cache::gens::GenTable;

const SLOT: usize = 65536;
const SLOTS: usize = 16;
const GRANULES: usize = SLOT / 4096;
const WRITES: u64 = 6000;
/// An index entry: chunk number, generation, and a done flag (u32 each).
const ENTRY: usize = 12;

/// Byte `i` of chunk `n`: every chunk differs from every other at every
/// 4 KiB piece.
fn byte(n: u32, i: usize) -> u8 {
    (n.wrapping_mul(2_654_435_761).wrapping_add((i / 64) as u32) % 251) as u8
}

fn chunk(n: u32) -> Vec<u8> {
    (0..SLOT).map(|i| byte(n, i)).collect()
}

fn rng(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn write_loop(dir: &Path) {
    let slots = File::options().write(true).open(dir.join("slots")).unwrap();
    let index = File::options().write(true).open(dir.join("index")).unwrap();
    let gens = GenTable::open(&dir.join("slots.gens"), SLOTS * GRANULES).unwrap();
    let mut seed = 0x1234_5678_9abc_def1u64;
    for w in 0..WRITES {
        let slot = (rng(&mut seed) % SLOTS as u64) as usize;
        let n = 1000 + w as u32;
        let gen = gens.claim(slot * GRANULES, GRANULES);
        slots.write_all_at(&chunk(n), (slot * SLOT) as u64).unwrap();
        let mut e = [0u8; ENTRY];
        e[..4].copy_from_slice(&n.to_le_bytes());
        e[4..8].copy_from_slice(&gen.to_le_bytes());
        index.write_all_at(&e, (slot * ENTRY) as u64).unwrap();
    }
    index
        .write_all_at(&1u32.to_le_bytes(), (SLOTS * ENTRY) as u64)
        .unwrap();
}

/// Read until the writer is done; prints "wrong stale checked".
fn read_loop(dir: &Path, check: bool) {
    let slots = File::open(dir.join("slots")).unwrap();
    let index = File::open(dir.join("index")).unwrap();
    let gens = GenTable::open(&dir.join("slots.gens"), SLOTS * GRANULES).unwrap();
    let mut seed = std::process::id() as u64 * 0x9e37_79b9 + 1;
    let (mut wrong, mut stale, mut checked) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; 4096];
    loop {
        let mut done = [0u8; 4];
        index
            .read_exact_at(&mut done, (SLOTS * ENTRY) as u64)
            .unwrap();
        if done != [0; 4] {
            break;
        }
        for _ in 0..64 {
            let r = rng(&mut seed);
            let slot = (r % SLOTS as u64) as usize;
            let mut e = [0u8; ENTRY];
            index.read_exact_at(&mut e, (slot * ENTRY) as u64).unwrap();
            let n = u32::from_le_bytes(e[..4].try_into().unwrap());
            let gen = u32::from_le_bytes(e[4..8].try_into().unwrap());
            if n == 0 {
                continue;
            }
            // A little while between the lookup and the read: what a
            // reader that has not caught up yet does.
            for _ in 0..(r >> 40) % 2000 {
                std::hint::spin_loop();
            }
            let piece = ((r >> 8) % GRANULES as u64) as usize * 4096;
            let at = (slot * SLOT + piece) as u64;
            let ok = if check {
                gens.read_checked(&slots, at, &mut buf, gen).unwrap()
            } else {
                slots.read_exact_at(&mut buf, at).unwrap();
                true
            };
            if !ok {
                stale += 1;
                continue;
            }
            checked += 1;
            if buf
                .iter()
                .enumerate()
                .any(|(i, &b)| b != byte(n, piece + i))
            {
                wrong += 1;
            }
        }
    }
    println!("counts {wrong} {stale} {checked}");
}

#[test]
#[ignore = "a child process of the reuse tests"]
fn worker() {
    let dir = std::env::var_os("ROAMDISK_REUSE_DIR").expect("ROAMDISK_REUSE_DIR");
    let dir = Path::new(&dir);
    match std::env::var("ROAMDISK_REUSE_ROLE").as_deref() {
        Ok("writer") => write_loop(dir),
        Ok("reader") => read_loop(dir, true),
        Ok("unchecked") => read_loop(dir, false),
        r => panic!("unknown role {r:?}"),
    }
}

/// Run one writer and two readers of ROLE; the readers' summed (wrong,
/// stale, checked).
fn run(role: &str) -> (u64, u64, u64) {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("slots"), vec![0u8; SLOT * SLOTS]).unwrap();
    std::fs::write(t.path().join("index"), vec![0u8; SLOTS * ENTRY + 4]).unwrap();
    drop(GenTable::open(&t.path().join("slots.gens"), SLOTS * GRANULES).unwrap());
    let exe = std::env::current_exe().unwrap();
    let spawn = |role: &str| {
        Command::new(&exe)
            .args([
                "--exact",
                "worker",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ROAMDISK_REUSE_DIR", t.path())
            .env("ROAMDISK_REUSE_ROLE", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let readers = [spawn(role), spawn(role)];
    let writer = spawn("writer").wait_with_output().unwrap();
    assert!(writer.status.success(), "writer: {writer:?}");
    let mut sum = (0, 0, 0);
    for r in readers {
        let out = r.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "reader: {text} {out:?}");
        let line = text
            .lines()
            .find_map(|l| l.split_once("counts ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no counts in {text}"));
        let v: Vec<u64> = line
            .split_whitespace()
            .take(3)
            .map(|x| x.parse().unwrap_or_else(|_| panic!("{x:?} in {text}")))
            .collect();
        sum = (sum.0 + v[0], sum.1 + v[1], sum.2 + v[2]);
    }
    sum
}

#[test]
fn readers_never_get_a_reused_slots_bytes_and_without_the_check_they_do() {
    let (wrong, stale, checked) = run("reader");
    eprintln!("checked: {wrong} wrong, {stale} stale, {checked} read");
    assert_eq!(wrong, 0, "{stale} stale, {checked} checked");
    assert!(
        stale > 0,
        "the readers met no reuse at all: {checked} checked"
    );
    assert!(checked > 1000, "{checked} checked");
    // The control: the same race without the check returns wrong bytes.
    let (wrong, _, checked) = run("unchecked");
    eprintln!("unchecked: {wrong} wrong of {checked} read");
    assert!(wrong > 0, "the unchecked readers read {checked} pieces, none wrong: the race did not happen, so the check above proves nothing");
}
