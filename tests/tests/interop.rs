//! Interoperability with real NBD clients: `roamdisk serve` on a Unix socket
//! driven by qemu-img, qemu-io, nbdinfo, nbdcopy and fio. Every test checks
//! the bytes (or the allocation map) against the file the export serves.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use json::{Json, Report as _};

const MIB: u64 = 1 << 20;

/// A sparse file of `size` bytes with random data islands `(offset, len)`.
fn sparse_file(path: &Path, size: u64, islands: &[(u64, u64)], seed: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(size).expect("set_len");
    let mut x = seed | 1;
    for &(off, len) in islands {
        let buf: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Never zero, so no tool may report an island as zero.
                (x as u8) | 1
            })
            .collect();
        f.write_all_at(&buf, off).expect("write island");
    }
    f.sync_all().expect("sync");
}

/// One run of an allocation map: offset, length, NBD base:allocation
/// flags (1 = hole, 2 = zero).
type Run = (u64, u64, u32);

/// Merge adjacent runs of the same type (tools may split them anywhere).
fn merge(runs: impl IntoIterator<Item = Run>) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (off, len, ty) in runs {
        if len == 0 {
            continue;
        }
        if let Some(last) = out.last_mut() {
            assert_eq!(last.0 + last.1, off, "map runs are not contiguous");
            if last.2 == ty {
                last.1 += len;
                continue;
            }
        }
        out.push((off, len, ty));
    }
    out
}

/// The map a sparse raw file must have: islands are data (0), the rest
/// hole+zero (3).
fn expected_map(size: u64, islands: &[(u64, u64)]) -> Vec<Run> {
    let mut v = Vec::new();
    let mut pos = 0;
    for &(off, len) in islands {
        v.push((pos, off - pos, 3));
        v.push((off, len, 0));
        pos = off + len;
    }
    v.push((pos, size - pos, 3));
    merge(v)
}

/// `nbdinfo --map URI`, parsed from its text output.
fn nbdinfo_map_text(uri: &str) -> Vec<Run> {
    let text = run_stdout("nbdinfo", &["--map", uri]);
    merge(text.lines().map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(f.len() >= 3, "unexpected nbdinfo --map line: {l:?}");
        (
            f[0].parse().expect("offset"),
            f[1].parse().expect("length"),
            f[2].parse().expect("type"),
        )
    }))
}

/// `nbdinfo --json --map URI`, parsed.
fn nbdinfo_map_json(uri: &str) -> Vec<Run> {
    let j = json::parse(&run_stdout("nbdinfo", &["--json", "--map", uri]));
    merge(j.arr().iter().map(|e| {
        (
            e.key("offset").u64(),
            e.key("length").u64(),
            e.key("type").u64() as u32,
        )
    }))
}

/// `qemu-img map --output=json -f raw IMAGE` as NBD-style runs.
fn qemu_img_map(image: &str) -> Vec<Run> {
    let j = json::parse(&run_stdout(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", image],
    ));
    merge(j.arr().iter().map(|e| {
        let hole = if e.key("data").bool() { 0 } else { 1 };
        let zero = if e.key("zero").bool() { 2 } else { 0 };
        (e.key("start").u64(), e.key("length").u64(), hole | zero)
    }))
}

/// Proof 1: `qemu-img convert` of a served 1 GiB random image yields the
/// same bytes.
#[test]
fn qemu_img_convert_of_1gib_export_equals_source() {
    let dir = tempdir();
    let src = dir.path().join("src.raw");
    random_file(&src, 1 << 30, 1);
    let srv = Server::start(dir.path(), &[&spec_raw(&src)]);
    let out = dir.path().join("out.raw");
    qemu_img_copy(&srv.uri(), path_str(&out));
    qemu_img_compare(path_str(&src), path_str(&out));
    assert_files_equal(&src, &out);
}

/// Proof 4: `nbdinfo --map` (text and JSON) reports exactly the file's
/// holes and data, also when the map needs more than one block-status
/// round trip (thousands of extents).
#[test]
fn nbdinfo_map_matches_file_sparseness() {
    let dir = tempdir();
    // A few islands of various sizes, one at offset 0 and one at the end.
    let size = 32 * MIB;
    let few = [
        (0, 4096),
        (64 * 1024, 3 * 4096),
        (MIB + 8192, 256 * 1024),
        (5 * MIB, 4096),
        (9 * MIB, 2 * MIB),
        (size - 8192, 8192),
    ];
    // Many small islands: more extents than one block-status reply carries.
    let many: Vec<(u64, u64)> = (0..3000u64).map(|i| (i * 8192 + 4096, 4096)).collect();
    for (name, size, islands) in [("few", size, &few[..]), ("many", 3000 * 8192, &many[..])] {
        let img = dir.path().join(format!("{name}.raw"));
        sparse_file(&img, size, islands, 7);
        let want = expected_map(size, islands);
        assert_eq!(
            qemu_img_map(path_str(&img)),
            want,
            "{name}: the file system did not keep the islands exactly (test setup)"
        );
        let srv = Server::start_named(dir.path(), &format!("{name}.sock"), &[&spec_raw(&img)]);
        let uri = srv.uri();
        assert_eq!(nbdinfo_map_text(&uri), want, "{name}: nbdinfo --map");
        assert_eq!(nbdinfo_map_json(&uri), want, "{name}: nbdinfo --json --map");
        if name == "few" {
            // qemu asks one extent per request (REQ_ONE); on thousands of
            // extents that takes seconds, so only on the small map.
            assert_eq!(qemu_img_map(&uri), want, "{name}: qemu-img map over NBD");
        }
    }
}

/// Proof 5: a `--config` file with several named exports: `nbdinfo --list`
/// shows names and descriptions, each export opens by name, the read-only
/// one says so and refuses writes, trims and zeroing (even from a client
/// that does not check first).
#[test]
fn config_file_serves_named_exports() {
    let dir = tempdir();
    let golden = dir.path().join("golden.raw");
    random_file(&golden, 8 * MIB, 5);
    let pristine = std::fs::read(&golden).expect("read golden");
    let overlay = dir.path().join("vm1.ovl");
    let cfg = dir.path().join("exports.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[[export]]
name = "golden"
description = "the golden image"
stack = "raw:{golden}"
read-only = true

[[export]]
name = "scratch"
description = "scratch space in memory"
stack = "mem:16M"

[[export]]
name = "vm1"
description = "user 1's disk"
stack = "cow:{overlay}:raw:{golden}"
"#,
            golden = golden.display(),
            overlay = overlay.display()
        ),
    )
    .expect("write config");
    let srv = Server::start(dir.path(), &["--config", path_str(&cfg)]);

    let list = run_stdout("nbdinfo", &["--list", &srv.uri()]);
    for s in [
        "golden",
        "the golden image",
        "scratch",
        "scratch space in memory",
        "vm1",
        "user 1's disk",
    ] {
        assert!(list.contains(s), "nbdinfo --list lacks {s:?}:\n{list}");
    }
    let j = json::parse(&run_stdout("nbdinfo", &["--list", "--json", &srv.uri()]));
    let exports = j.key("exports").arr();
    let find = |name: &str| {
        exports
            .iter()
            .find(|e| e.key("export-name").str() == name)
            .unwrap_or_else(|| panic!("no export {name} in nbdinfo --list --json"))
    };
    assert_eq!(exports.len(), 3, "{j:?}");
    for (name, desc, size, ro) in [
        ("golden", "the golden image", 8 * MIB, true),
        ("scratch", "scratch space in memory", 16 * MIB, false),
        ("vm1", "user 1's disk", 8 * MIB, false),
    ] {
        let e = find(name);
        assert_eq!(e.key("description").str(), desc, "{name}");
        assert_eq!(e.key("export-size").u64(), size, "{name}");
        assert_eq!(e.key("is_read_only").bool(), ro, "{name}");
        // Each export also opens on its own, by name.
        let one = json::parse(&run_stdout("nbdinfo", &["--json", &srv.uri_of(name)]));
        let one = &one.key("exports").arr()[0];
        assert_eq!(one.key("export-name").str(), name);
        assert_eq!(one.key("export-size").u64(), size, "{name}");
        assert_eq!(one.key("is_read_only").bool(), ro, "{name}");
    }
    // The empty name is the first export.
    assert_eq!(
        run_stdout("nbdinfo", &["--size", &srv.uri()]).trim(),
        (8 * MIB).to_string()
    );
    // An unknown name is refused.
    let st = std::process::Command::new("nbdinfo")
        .arg(srv.uri_of("nosuch"))
        .output()
        .expect("nbdinfo");
    assert!(!st.status.success(), "nbdinfo opened an unknown export");

    // qemu-io cannot write to the read-only export.
    let out = qemu_io_command(&srv.uri_of("golden"), &["write -P 0x55 0 4096".into()])
        .output()
        .expect("qemu-io");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && !text.contains("wrote 4096/4096"),
        "write to the read-only export succeeded:\n{text}"
    );
    // The server itself refuses (libnbd's client-side checks switched off).
    let refused = run_python_nbd(
        r#"
import sys, nbd
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
assert h.is_read_only()
for name, f in (("pwrite", lambda: h.pwrite(b"x" * 4096, 0)),
                ("trim", lambda: h.trim(65536, 0)),
                ("zero", lambda: h.zero(65536, 0))):
    try:
        f()
        print(name, "accepted")
    except nbd.Error as e:
        print(name, e.errno)
"#,
        &[&srv.uri_of("golden")],
    );
    assert_eq!(
        refused.lines().collect::<Vec<_>>(),
        ["pwrite EPERM", "trim EPERM", "zero EPERM"],
        "read-only export did not refuse with EPERM"
    );
    // The writable cow export over the same file takes writes; golden keeps its bytes.
    qemu_io(
        &srv.uri_of("vm1"),
        &[
            "write -P 0x55 1000 70000".into(),
            "read -P 0x55 1000 70000".into(),
        ],
    );
    qemu_io(
        &srv.uri_of("scratch"),
        &[
            "write -P 0x66 0 65536".into(),
            "read -P 0x66 0 65536".into(),
            "read -P 0 65536 65536".into(),
        ],
    );
    drop(srv);
    assert!(
        std::fs::read(&golden).expect("read golden") == pristine,
        "the read-only export's file changed"
    );
}

/// Proof 6: qemu-img info, map and compare against the export, and
/// `qemu-img convert -n` into it.
#[test]
fn qemu_img_info_map_compare_and_convert_into_export() {
    let dir = tempdir();
    let img = dir.path().join("disk.raw");
    let size = 64 * MIB;
    let islands = [(0, MIB), (10 * MIB + 4096, 3 * MIB), (size - 65536, 65536)];
    sparse_file(&img, size, &islands, 11);
    let srv = Server::start(dir.path(), &[&spec_raw(&img)]);
    let uri = srv.uri();

    let info = json::parse(&run_stdout(
        "qemu-img",
        &["info", "--output=json", "-f", "raw", &uri],
    ));
    assert_eq!(info.key("virtual-size").u64(), size);
    assert_eq!(info.key("format").str(), "raw");

    assert_eq!(qemu_img_map(&uri), qemu_img_map(path_str(&img)));
    assert_eq!(qemu_img_map(&uri), expected_map(size, &islands));

    qemu_img_compare(path_str(&img), &uri);
    // compare sees a one-byte difference through the export.
    let other = dir.path().join("other.raw");
    std::fs::copy(&img, &other).expect("copy");
    std::fs::File::options()
        .write(true)
        .open(&other)
        .expect("open")
        .write_all_at(&[0x5a], 12 * MIB + 3)
        .expect("poke");
    let st = std::process::Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", path_str(&other), &uri])
        .output()
        .expect("qemu-img compare");
    assert_eq!(
        st.status.code(),
        Some(1),
        "qemu-img compare did not see the difference:\n{}",
        String::from_utf8_lossy(&st.stdout)
    );

    // convert -n into the export: data where the export has holes and
    // holes where it has data (which qemu-img must zero through us).
    let src = dir.path().join("src.raw");
    let src_islands = [(2 * MIB, 6 * MIB), (12 * MIB, 4096), (40 * MIB, 20 * MIB)];
    sparse_file(&src, size, &src_islands, 13);
    qemu_img_copy_into_parallel(path_str(&src), &uri);
    qemu_img_compare(path_str(&src), &uri);
    drop(srv);
    assert_files_equal(&src, &img);
}

/// Proof 7: discard and `write -z` read back as zeroes; the allocation map
/// shows the punched ranges as holes, and matches the file's own map.
#[test]
fn discard_and_write_zeroes_read_zero_and_map_as_holes() {
    let size = 16 * MIB;
    let (_dir, img, srv) = serve_random(size, 17, &[]);
    let mut want = std::fs::read(&img).expect("read");
    let uri = srv.uri();
    // (command, offset, length): every range must read zero afterwards.
    let ops: [(&str, u64, u64); 5] = [
        ("write -z", MIB, MIB),
        ("write -z -u", 4 * MIB, 2 * MIB),
        ("discard", 8 * MIB, MIB),
        ("write -z", 10 * MIB + 1000, 50_000),
        ("write -z -u", 12 * MIB + 511, 300_001),
    ];
    let mut cmds: Vec<String> = ops
        .iter()
        .map(|(c, off, len)| format!("{c} {off} {len}"))
        .collect();
    cmds.extend(
        ops.iter()
            .map(|(_, off, len)| format!("read -P 0 {off} {len}")),
    );
    let out = qemu_io(&uri, &cmds);
    assert_eq!(out.matches("read ").count(), ops.len(), "{out}");
    for (_, off, len) in ops {
        want[off as usize..(off + len) as usize].fill(0);
    }
    // Fresh connection: the zeroes are still there.
    qemu_io(
        &uri,
        &ops.iter()
            .map(|(_, off, len)| format!("read -P 0 {off} {len}"))
            .collect::<Vec<_>>(),
    );
    let map = nbdinfo_map_text(&uri);
    assert_eq!(map, qemu_img_map(path_str(&img)), "export map vs file map");
    // Aligned punched ranges (write -z -u, discard) are holes that read zero.
    for (off, len) in [(4 * MIB, 2 * MIB), (8 * MIB, MIB)] {
        let covered = map
            .iter()
            .any(|&(o, l, t)| o <= off && off + len <= o + l && t == 3);
        assert!(covered, "{off}+{len} is not one hole,zero run in {map:?}");
    }
    // Outside the zeroed ranges nothing changed.
    drop(srv);
    assert_bytes_equal(&std::fs::read(&img).expect("read"), &want, "served file");
}

/// Proof 8: nbdcopy with four connections and 64 requests each, from the
/// export to a file and from a (sparse) file into the export.
#[test]
fn nbdcopy_multi_connection_both_directions() {
    let size = 64 * MIB;
    let (dir, img, srv) = serve_random(size, 19, &[]);
    let uri = srv.uri();
    let nbdcopy = |from: &str, to: &str| {
        let out = run(
            "nbdcopy",
            &[
                "--verbose",
                "--threads=4",
                "--connections=4",
                "--requests=64",
                "--flush",
                from,
                to,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.starts_with("nbdcopy: connections="))
            .unwrap_or_else(|| panic!("nbdcopy --verbose printed no settings"));
        assert!(
            line.starts_with("nbdcopy: connections=4 requests=64"),
            "nbdcopy did not use 4 connections (multi-conn not honoured?): {line}"
        );
    };
    let out = dir.path().join("out.raw");
    nbdcopy(&uri, path_str(&out));
    assert_files_equal(&img, &out);

    // Into the export: a sparse source, so nbdcopy also zeroes through us.
    let src = dir.path().join("src.raw");
    let islands = [(0, 3 * MIB), (7 * MIB + 4096, 8192), (20 * MIB, 30 * MIB)];
    sparse_file(&src, size, &islands, 23);
    nbdcopy(path_str(&src), &uri);
    qemu_img_compare(path_str(&src), &uri);
    drop(srv);
    assert_files_equal(&src, &img);
}

/// fio's JSON report (fio prints a status line before it on stdout).
fn fio_json(out: &std::process::Output) -> Json {
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| text.starts_with('{').then_some(0));
    let start = start.unwrap_or_else(|| panic!("no JSON in fio output:\n{text}"));
    json::parse(&text[start..])
}

fn fio(uri: &str, job: &[&str]) -> Json {
    require_tool("fio");
    let out = std::process::Command::new("fio")
        .args(["--name=job", "--ioengine=nbd", "--output-format=json"])
        .arg(format!("--uri={uri}"))
        .args(job)
        .output()
        .expect("run fio");
    let all =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !all.contains("verify:") && !all.contains("bad magic"),
        "fio {job:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let j = fio_json(&out);
    let jobs = j.key("jobs").arr();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].key("error").u64(), 0, "fio job error");
    jobs[0].clone()
}

/// Proof 9: fio's nbd engine: a random-write job with crc32c verification
/// at queue depth 32, a second pass that only verifies (fresh connection),
/// and a sequential read.
#[test]
fn fio_nbd_engine_verify_and_sequential_read() {
    let (_dir, _img, srv) = serve_blank(128 * MIB, &[]);
    let uri = srv.uri();
    let size = 64 * MIB;
    let verify_job = [
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--verify=crc32c",
        "--size=64M",
    ];
    let j = fio(&uri, &verify_job);
    assert_eq!(j.key("write").key("io_bytes").u64(), size, "bytes written");
    assert_eq!(
        j.key("read").key("io_bytes").u64(),
        size,
        "bytes read back and verified"
    );
    let mut again = verify_job.to_vec();
    again.push("--verify_only=1");
    let j = fio(&uri, &again);
    assert_eq!(
        j.key("read").key("io_bytes").u64(),
        size,
        "verify-only pass"
    );
    let j = fio(
        &uri,
        &["--rw=read", "--bs=1M", "--iodepth=8", "--size=128M"],
    );
    assert_eq!(
        j.key("read").key("io_bytes").u64(),
        128 * MIB,
        "sequential read"
    );
}

/// Queue depth 1 with busy-polling off, on by default and polling long
/// (1 ms: every wait for the next request is a poll): fio writes requests
/// of 4-128 KiB one at a time with crc32c verification, then reads them
/// back, so that what polls for a request also frames its payload right.
#[test]
fn fio_queue_depth_one_verifies_with_busy_poll_off_and_on() {
    for busy_poll in [None, Some("0"), Some("1000")] {
        let dir = tempdir();
        let img = dir.path().join("disk.raw");
        std::fs::File::create(&img)
            .expect("create")
            .set_len(32 * MIB)
            .expect("set_len");
        let spec = spec_raw(&img);
        let mut args = vec![spec.as_str()];
        if let Some(us) = busy_poll {
            args.extend(["--busy-poll", us]);
        }
        let srv = Server::start(dir.path(), &args);
        let j = fio(
            &srv.uri(),
            &[
                "--rw=randwrite",
                "--bsrange=4k-128k",
                "--iodepth=1",
                "--verify=crc32c",
                "--size=16M",
            ],
        );
        let written = j.key("write").key("io_bytes").u64();
        assert!(
            written >= 16 * MIB,
            "busy-poll {busy_poll:?}: wrote {written}"
        );
        assert_eq!(
            j.key("read").key("io_bytes").u64(),
            written,
            "busy-poll {busy_poll:?}: bytes read back and verified"
        );
        assert!(srv.stop().success(), "busy-poll {busy_poll:?}: clean stop");
    }
}

/// The same export over TCP (`--listen 127.0.0.1:0`, the port is printed).
#[test]
fn tcp_listener_serves_the_export() {
    let (_dir, img, srv) = serve_random(4 * MIB, 29, &["--listen", "127.0.0.1:0"]);
    let t0 = Instant::now();
    let addr = loop {
        let log = srv.log_text();
        if let Some(a) = log
            .lines()
            .find_map(|l| l.split("on nbd://").nth(1))
            .map(|a| a.trim().to_string())
        {
            break a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no TCP address in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let uri = format!("nbd://{addr}");
    assert_eq!(
        run_stdout("nbdinfo", &["--size", &uri]).trim(),
        (4 * MIB).to_string()
    );
    qemu_img_compare(path_str(&img), &uri);
}

/// The JSON of nbdinfo, qemu-img and fio reports (serde_json), read with
/// accessors that fail the test on a missing key or another type.
mod json {
    pub use serde_json::Value as Json;

    pub fn parse(text: &str) -> Json {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    /// Typed reads of a report's values.
    pub trait Report {
        fn key(&self, key: &str) -> &Json;
        fn u64(&self) -> u64;
        fn bool(&self) -> bool;
        fn str(&self) -> &str;
        fn arr(&self) -> &[Json];
    }

    impl Report for Json {
        fn key(&self, key: &str) -> &Json {
            self.get(key)
                .unwrap_or_else(|| panic!("no key {key:?} in {self}"))
        }
        fn u64(&self) -> u64 {
            self.as_u64()
                .unwrap_or_else(|| panic!("not an unsigned integer: {self}"))
        }
        fn bool(&self) -> bool {
            self.as_bool()
                .unwrap_or_else(|| panic!("not a boolean: {self}"))
        }
        fn str(&self) -> &str {
            self.as_str()
                .unwrap_or_else(|| panic!("not a string: {self}"))
        }
        fn arr(&self) -> &[Json] {
            self.as_array()
                .unwrap_or_else(|| panic!("not an array: {self}"))
        }
    }
}
