//! Issue 6 proof: converters round-trip. A binary blktrace made here is
//! turned into text by the real `blkparse`, converted to a trace and then
//! to CSV, and every field survives; likewise an MSR-Cambridge CSV sample
//! (the SNIA IOTTA layout); binary and CSV traces convert into each other
//! without loss.

mod common;
use common::*;

use std::path::Path;

const MAGIC: u32 = 0x6561_7400 | 0x07;
const TC_READ: u32 = 1;
const TC_WRITE: u32 = 2;
const TC_FLUSH: u32 = 4;
const TC_SYNC: u32 = 8;
const TC_QUEUE: u32 = 16;
const TC_ISSUE: u32 = 64;
const TC_COMPLETE: u32 = 128;
const TC_AHEAD: u32 = 1 << 11;
const TC_META: u32 = 1 << 12;
const TC_DISCARD: u32 = 1 << 13;
const TC_FUA: u32 = 1 << 15;
const A_QUEUE: u32 = 1;
const A_ISSUE: u32 = 7;
const A_COMPLETE: u32 = 8;

/// One `struct blk_io_trace` (linux/blktrace_api.h), native endian.
#[allow(clippy::too_many_arguments)]
fn event(
    out: &mut Vec<u8>,
    seq: u32,
    time: u64,
    sector: u64,
    bytes: u32,
    action: u32,
    cats: u32,
    pid: u32,
    dev: u32,
    cpu: u32,
) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(&sector.to_le_bytes());
    out.extend_from_slice(&bytes.to_le_bytes());
    out.extend_from_slice(&(action | (cats << 16)).to_le_bytes());
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&dev.to_le_bytes());
    out.extend_from_slice(&cpu.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
}

/// Expected CSV line of a record.
fn line(t: u64, client: u32, dev: u32, op: &str, off: u64, len: u64) -> String {
    format!("{t},{client},{dev},{op},{off},{len},0")
}

fn csv_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// `roamdisk trace convert INPUT -o OUTPUT EXTRA...`.
fn convert_args<'a>(input: &'a Path, output: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let io = [path_str(input), "-o", path_str(output)];
    [&["trace", "convert"][..], &io, extra].concat()
}

fn convert(input: &Path, output: &Path, extra: &[&str]) {
    rd(&convert_args(input, output, extra));
}

#[test]
fn blkparse_text_converts_and_keeps_every_field() {
    require_tool("blkparse");
    let dir = tempdir();
    let d = dir.path();
    // A mixed workload on two devices from several processes and CPUs.
    let devs = [(8u32, 0u32), (8, 16), (259, 1)];
    let mut per_cpu: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut expected = Vec::new();
    let base = 1_000_000_007u64;
    let mut x = 12345u64;
    let mut seq = [0u32; 2];
    for i in 0..300u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (maj, min) = devs[(x % 3) as usize];
        let dev = (maj << 20) | min;
        let pid = 100 + (x >> 8) as u32 % 5;
        let cpu = (i % 2) as usize;
        let t = base + i * 10_000 + (x >> 20) % 5000;
        let sector = (x >> 24) % (1 << 30);
        let nsect = 1 + (x >> 40) % 256;
        let kind = (x >> 50) % 7;
        let (cats, ops): (u32, Vec<(&str, u64, u64)>) = match kind {
            0 => (TC_READ, vec![("read", sector, nsect)]),
            1 => (TC_READ | TC_AHEAD | TC_META, vec![("read", sector, nsect)]),
            2 => (TC_WRITE | TC_SYNC, vec![("write", sector, nsect)]),
            3 => (TC_WRITE | TC_DISCARD, vec![("trim", sector, nsect)]),
            4 => (
                TC_WRITE | TC_FUA,
                vec![("write", sector, nsect), ("flush", 0, 0)],
            ),
            5 => (
                TC_WRITE | TC_FLUSH | TC_SYNC,
                vec![("flush", 0, 0), ("write", sector, nsect)],
            ),
            _ => (TC_FLUSH, vec![("flush", 0, 0)]),
        };
        let bytes = if kind == 6 { 0 } else { (nsect * 512) as u32 };
        let mut e = |t: u64, action, cat| {
            seq[cpu] += 1;
            event(
                &mut per_cpu[cpu],
                seq[cpu],
                t,
                sector,
                bytes,
                action,
                cats | cat,
                pid,
                dev,
                cpu as u32,
            );
        };
        e(t, A_QUEUE, TC_QUEUE);
        e(t + 1, A_ISSUE, TC_ISSUE);
        e(t + 2, A_COMPLETE, TC_COMPLETE);
        for (op, s, n) in ops {
            expected.push((t, pid, dev, op, s * 512, n * 512));
        }
    }
    for (cpu, ev) in per_cpu.iter().enumerate() {
        std::fs::write(d.join(format!("bt.blktrace.{cpu}")), ev).unwrap();
    }
    let text = run_stdout("blkparse", &["-i", "bt", "-D", d.to_str().unwrap()]);
    assert!(
        text.contains(" D "),
        "blkparse printed no dispatch events:\n{text}"
    );
    let txt = d.join("bt.txt");
    std::fs::write(&txt, &text).unwrap();
    let bin = d.join("bt.rdtrace");
    convert(&txt, &bin, &[]);
    let csv = d.join("bt.csv");
    convert(&bin, &csv, &[]);
    // blkparse prints times relative to the first event (a queue event).
    let genesis = expected[0].0;
    let want: Vec<String> = expected
        .iter()
        .map(|&(t, pid, dev, op, off, len)| line(t + 1 - genesis, pid, dev, op, off, len))
        .collect();
    let got = csv_lines(&csv);
    assert_eq!(got.len(), want.len());
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, e, "record {i}");
    }
    // --action Q picks the queue events instead (one time unit earlier).
    let q = d.join("q.csv");
    convert(&txt, &q, &["--action", "Q", "--single-client"]);
    let (_, _, dev, op, off, len) = expected[0];
    assert_eq!(csv_lines(&q)[0], line(0, 0, dev, op, off, len));
}

#[test]
fn msr_cambridge_csv_converts_and_keeps_every_field() {
    let dir = tempdir();
    let d = dir.path();
    // Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
    let mut msr = String::new();
    let mut expected = Vec::new();
    let base = 128_166_372_003_061_629u64;
    let hosts = ["usr", "proj", "web"];
    for i in 0..200u64 {
        let ts = base + i * 12_345 + (i * i) % 977;
        let host = (i * 7 % 3) as u32;
        let disk = (i % 4) as u32;
        let write = i % 3 == 0;
        let off = (i * 7_919) % 100_000 * 4096;
        let size = 512 * (1 + i % 128);
        msr.push_str(&format!(
            "{ts},{},{disk},{},{off},{size},{}\n",
            hosts[host as usize],
            if write { "Write" } else { "Read" },
            1000 + i
        ));
        // Client ids follow first appearance: usr (i=0), proj (i=1), web (i=2).
        let client = host;
        expected.push(line(
            (ts - base) * 100,
            client,
            disk,
            if write { "write" } else { "read" },
            off,
            size,
        ));
    }
    let input = d.join("usr_0.csv");
    std::fs::write(&input, msr).unwrap();
    let bin = d.join("msr.rdtrace");
    convert(&input, &bin, &[]);
    let csv = d.join("msr-out.csv");
    convert(&bin, &csv, &[]);
    let got = csv_lines(&csv);
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "record {i}");
    }
    // CSV back to binary and to CSV again: nothing changes.
    let bin2 = d.join("again.rdtrace");
    convert(&csv, &bin2, &[]);
    let csv2 = d.join("again.csv");
    convert(&bin2, &csv2, &[]);
    assert_eq!(std::fs::read(&csv).unwrap(), std::fs::read(&csv2).unwrap());
    // Bad input: the line and what is wrong.
    std::fs::write(&input, "1,usr,0,Read,0,512,1\n2,usr,0,Erase,0,512,1\n").unwrap();
    let err = rd_fail(&convert_args(&input, &bin, &["--from", "msr"]));
    assert!(err.contains("line 2") && err.contains("Erase"), "{err}");
}

#[test]
fn damaged_traces_get_clear_errors() {
    let (dir, t) = synth_in_tempdir("android-email", "t.rdtrace", "");
    let d = dir.path();
    let bytes = std::fs::read(&t).unwrap();
    // Cut short, as when a recorder is killed.
    let cut = d.join("cut.rdtrace");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = rd_fail(&["trace", "stats", path_str(&cut)]);
    assert!(
        err.contains("truncated") && err.contains("trace convert"),
        "{err}"
    );
    // The valid prefix can be salvaged.
    let saved = d.join("saved.rdtrace");
    convert(&cut, &saved, &["--from", "trace"]);
    assert!(roamdisk(&["trace", "stats", saved.to_str().unwrap()])
        .status
        .success());
    // A flipped byte is caught by the checksums.
    let mut bad = bytes.clone();
    let mid = bad.len() / 3;
    bad[mid] ^= 0x40;
    let flipped = d.join("flipped.rdtrace");
    std::fs::write(&flipped, bad).unwrap();
    let err = rd_fail(&["trace", "stats", path_str(&flipped)]);
    assert!(err.contains("corrupt"), "{err}");
    // Not a trace at all.
    let junk = d.join("junk");
    std::fs::write(&junk, "hello\n").unwrap();
    let out = roamdisk(&["trace", "stats", junk.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a roamdisk trace"));
}
