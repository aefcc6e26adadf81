//! Issue 6 proof: a `qemu-img convert` recorded through the `trace` layer
//! of `roamdisk serve` and replayed against a fresh target gives a
//! byte-identical image; replay with the synthetic data pattern is
//! deterministic.

mod common;
use common::*;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const SIZE: u64 = 24 << 20;

fn blank(path: &Path) {
    blank_file(path, SIZE);
}

/// `src.img` in DIR: random data with zero stretches, so that a convert
/// also sends zero writes.
fn source_image(dir: &Path) -> PathBuf {
    let src = dir.join("src.img");
    random_file(&src, SIZE, 11);
    let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    f.write_all_at(&vec![0u8; 4 << 20], 4 << 20).unwrap();
    f.write_all_at(&vec![0u8; 1 << 20], 17 << 20).unwrap();
    src
}

#[test]
fn recorded_convert_replays_to_a_byte_identical_image() {
    require_tool("qemu-img");
    let dir = tempdir();
    let d = dir.path();
    let src = source_image(d);
    let target = d.join("target.img");
    blank(&target);
    let trace = d.join("convert.rdtrace");
    let srv = Server::start(
        d,
        &[&format!(
            "trace[data=on]:{}:raw:{}",
            trace.display(),
            target.display()
        )],
    );
    qemu_img_copy_into(src.to_str().unwrap(), &srv.uri());
    assert!(srv.stop().success());
    let source = std::fs::read(&src).unwrap();
    assert!(
        std::fs::read(&target).unwrap() == source,
        "the recorded export differs from the source"
    );

    // The trace holds the convert's writes and its final flush.
    let text = rd(&["trace", "stats", path_str(&trace)]);
    let flushes: u64 = text
        .lines()
        .find(|l| l.starts_with("flush "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("a flush line");
    assert!(flushes >= 1, "{text}");

    // Replay onto a fresh stack and onto a fresh plain file (O_DIRECT).
    for fresh_target in ["raw", "direct"] {
        let fresh = d.join(format!("fresh-{fresh_target}.img"));
        blank(&fresh);
        let t = if fresh_target == "raw" {
            format!("raw:{}", fresh.display())
        } else {
            fresh.display().to_string()
        };
        rd(&["replay", path_str(&trace), &t, "--data", "recorded"]);
        assert!(
            std::fs::read(&fresh).unwrap() == source,
            "replay onto {fresh_target} is not byte-identical"
        );
    }

    // Without recorded data, the pattern depends only on the offsets: two
    // replays give the same image (and not the source).
    let (a, b) = (d.join("a.img"), d.join("b.img"));
    for p in [&a, &b] {
        blank(p);
        rd(&["replay", path_str(&trace), &spec_raw(p)]);
    }
    let ia = std::fs::read(&a).unwrap();
    assert!(ia == std::fs::read(&b).unwrap());
    assert!(ia != source);
}

#[test]
fn replay_refuses_a_missing_payload_and_a_small_target() {
    let (_dir, trace) = synth_in_tempdir("android-contacts", "c.rdtrace", "");
    let t = path_str(&trace);
    let err = rd_fail(&["replay", t, "mem:2G", "--data", "recorded"]);
    assert!(err.contains("trace[data=on]"), "{err}");
    let err = rd_fail(&["replay", t, "mem:1M"]);
    assert!(err.contains("use a larger target"), "{err}");
}
