//! Helpers of the content-addressed image tests (`cas_*.rs`): run
//! `roamdisk` and insist on success, read numbers from its JSON output,
//! measure a store, and play "guest": write into a served disk only the
//! 4 KiB blocks that differ between two states of a disk image, as a guest
//! file system would have written them.

#![allow(dead_code)]

use std::path::Path;
use std::process::Output;

use crate::common::{roamdisk, run_python_nbd};

/// Run `roamdisk ARGS`; panic with its output unless it succeeds. Returns
/// stdout.
pub fn rd(args: &[&str]) -> String {
    let out = roamdisk(args);
    assert!(
        out.status.success(),
        "roamdisk {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new chunk store in `dir/store` (`roamdisk store init`).
pub fn init_store(dir: &Path) -> std::path::PathBuf {
    let store = dir.join("store");
    rd(&["store", "init", store.to_str().unwrap()]);
    store
}

/// Run `roamdisk ARGS`, which must fail; returns stderr.
pub fn rd_fail(args: &[&str]) -> String {
    let out: Output = roamdisk(args);
    assert!(
        !out.status.success(),
        "roamdisk {args:?} should have failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The first number after `"key":` in a JSON text.
pub fn json_num(text: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("no \"{key}\" in:\n{text}"))
        + pat.len();
    let rest = text[at..].trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("\"{key}\" is not a number in:\n{text}"))
}

/// The first string after `"key":` in a JSON text.
pub fn json_str(text: &str, key: &str) -> String {
    let pat = format!("\"{key}\":");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("no \"{key}\" in:\n{text}"))
        + pat.len();
    let rest = text[at..].trim_start();
    let rest = rest.strip_prefix('"').expect("a string value");
    rest[..rest.find('"').expect("closing quote")].to_string()
}

/// Bytes of every object file in a local store.
pub fn store_bytes(store: &Path) -> u64 {
    let mut total = 0;
    for fan in std::fs::read_dir(store.join("objects")).expect("objects dir") {
        let fan = fan.expect("entry");
        for f in std::fs::read_dir(fan.path()).expect("fan-out dir") {
            total += f.expect("entry").metadata().expect("meta").len();
        }
    }
    total
}

/// Every object file of a local store.
pub fn object_files(store: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for fan in std::fs::read_dir(store.join("objects")).expect("objects dir") {
        for f in std::fs::read_dir(fan.expect("entry").path()).expect("fan-out dir") {
            v.push(f.expect("entry").path());
        }
    }
    v.sort();
    v
}

/// The object file of a hex id.
pub fn object_file(store: &Path, hex: &str) -> std::path::PathBuf {
    store.join("objects").join(&hex[..2]).join(hex)
}

/// Write into the NBD export `uri` every 4 KiB block where `new` differs
/// from `old` (both raw images of the same size). Returns the bytes
/// written.
pub fn write_diff(uri: &str, old: &Path, new: &Path) -> u64 {
    let script = r#"
import sys, nbd
uri, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
h = nbd.NBD()
h.connect_uri(uri)
B = 4096
n = 0
with open(old, 'rb') as a, open(new, 'rb') as b:
    off = 0
    while True:
        x = a.read(1 << 20)
        y = b.read(1 << 20)
        if not y:
            break
        for i in range(0, len(y), B):
            if x[i:i+B] != y[i:i+B]:
                h.pwrite(y[i:i+B], off + i)
                n += len(y[i:i+B])
        off += len(y)
h.flush()
h.shutdown()
print(n)
"#;
    let out = run_python_nbd(script, &[uri, old.to_str().unwrap(), new.to_str().unwrap()]);
    out.trim().parse().expect("bytes written")
}

/// Copy `part` into `disk` at byte `offset` (in place).
pub fn put_at(disk: &Path, part: &Path, offset: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let data = std::fs::read(part).expect("read part");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .expect("open disk");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&data).expect("write");
}
