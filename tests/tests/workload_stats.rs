//! `roamdisk trace stats` prints LBS Table 3 for the generated Android
//! traces (the columns' 5% agreement is proven by the unit tests in
//! crates/workload), the TransCom desktop numbers for the desktop mix,
//! and writes its plots.

mod common;
use common::*;

#[test]
fn generated_android_traces_print_their_table3_rows() {
    let dir = tempdir();
    let d = dir.path();
    // (trace, partition, published columns from read count to barrier %,
    // as `trace stats` prints them).
    for (kind, part, row) in [
        (
            "android-contacts",
            "/data",
            "83 32 21 30 4 | 55281 21048 15414 3348 2286 17 | 100 4",
        ),
        (
            "android-email",
            "/data",
            "191 53 51 87 3 | 52100 16668 10520 2595 3553 12 | 99 33",
        ),
        (
            "android-boot",
            "/system",
            "1275 21 39 1215 0 | 0 0 0 0 0 NA | 0 0",
        ),
        (
            "android-slideshow",
            "/sdcard",
            "18 14 2 2 22 | 13701 1883 1407 197 279 6 | 99 0",
        ),
        (
            "android-browsing",
            "/data",
            "1662 313 228 1121 1 | 12609 3512 2149 542 821 10 | 68 18",
        ),
    ] {
        let t = d.join(format!("{kind}.rdtrace"));
        trace_synth(kind, &t, "");
        let s = rd(&["trace", "stats", path_str(&t), "--names", "android"]);
        let line = s
            .lines()
            .find(|l| l.starts_with(part))
            .unwrap_or_else(|| panic!("{kind}: no {part} row:\n{s}"));
        let norm = line.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            norm.ends_with(row),
            "{kind} {part}:\n  got  {norm}\n  want ...{row}"
        );
    }
}

#[test]
fn desktop_mix_stats_and_plots() {
    let (dir, t) = synth_in_tempdir("desktop", "desk.csv", "--requests 50000 --clients 3");
    let d = dir.path();
    let plot = d.join("desk");
    let s = rd(&["trace", "stats", path_str(&t), "--plot", path_str(&plot)]);
    assert!(s.contains("most frequent 4.0 KiB"), "{s}");
    assert!(s.contains("min 0.5 KiB, max 64.0 KiB"), "{s}");
    assert!(s.contains("150000 requests, 3 clients"), "{s}");
    for f in ["desk-sizes.png", "desk-reuse.svg", "desk-mix.png"] {
        assert!(d.join(f).exists(), "{f} missing");
    }
    let out = roamdisk(&["trace", "synth", "nothing", "-o", "x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("known: android-boot"));
}
