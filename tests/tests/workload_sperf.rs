//! Issue 6 proof: sperf on the flashsim SD-card model shows the seed's
//! shape (section 2): random writes far slower than sequential ones at
//! small block sizes, converging near 128-256 KiB (Figures 1-2);
//! interleaved sequential writers degrade past the card's open units
//! (Figure 4). Also: plots are written, and sperf refuses to overwrite a
//! real target without --destructive.

mod common;
use common::*;

/// The points of a curve line `  NAME   x:y  x:y ...` of sperf's output.
fn curve(stdout: &str, name: &str) -> Vec<(f64, f64)> {
    let l = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no curve '{name}' in:\n{stdout}"));
    l.split_whitespace()
        .filter_map(|p| p.split_once(':'))
        .filter_map(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?)))
        .collect()
}

fn at(c: &[(f64, f64)], x: f64) -> f64 {
    c.iter()
        .find(|p| p.0 == x)
        .unwrap_or_else(|| panic!("no x={x} in {c:?}"))
        .1
}

#[test]
fn sperf_on_the_card_model_has_the_seed_shape() {
    let dir = tempdir();
    let d = dir.path();
    let args = ["sperf", "flashsim:class6:mem:128M", "--plot", path_str(d)];
    let s = rd(&argv(&args, "--figure 1,2,4 --bytes 8M"));
    assert!(s.contains("(simulated card time)"));
    let ratio = curve(&s, "sequential:random write");
    assert!(at(&ratio, 4.0) > 20.0, "4 KiB: {ratio:?}");
    assert!(at(&ratio, 256.0) < 2.5, "256 KiB: {ratio:?}");
    assert!(at(&ratio, 1.0) > at(&ratio, 16.0) && at(&ratio, 16.0) > at(&ratio, 128.0));
    // Reads: random as fast as sequential.
    let sr = curve(&s, "sequential read");
    let rr = curve(&s, "random read");
    assert!((at(&sr, 4.0) - at(&rr, 4.0)).abs() < 0.05 * at(&sr, 4.0));
    // Four open units: four writers at full speed, five far slower.
    let w = curve(&s, "256 KiB writes");
    assert!(at(&w, 4.0) > 0.9 * at(&w, 1.0), "{w:?}");
    assert!(at(&w, 5.0) < 0.6 * at(&w, 4.0), "{w:?}");
    for f in "sperf-fig1.png sperf-fig1.svg sperf-fig2.png sperf-fig4.svg".split(' ') {
        assert!(d.join(f).exists(), "{f} missing");
    }
}

#[test]
fn a_one_open_unit_card_degrades_with_two_writers() {
    let s = rd(&argv(
        &["sperf", "flashsim:class4:mem:128M"],
        "--figure 4 --bytes 8M",
    ));
    let w = curve(&s, "256 KiB writes");
    assert!(at(&w, 2.0) < 0.6 * at(&w, 1.0), "{w:?}");
}

#[test]
fn sperf_measures_plain_patterns_and_guards_real_targets() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("disk.img");
    blank_file(&img, 16 << 20);
    let sperf_img = ["sperf", path_str(&img)];
    let err = rd_fail(&argv(&sperf_img, "--area 8M --write-pct 100"));
    assert!(err.contains("--destructive"), "{err}");
    // Reads need no permission; O_DIRECT file; strided and partitioned.
    let opts = "--area 8M --bytes 1M --write-pct 0 \
                --pattern sequential,stride:4,writers:2:1M --bs 4K,64K";
    let s = rd(&argv(&sperf_img, opts));
    for name in [
        "sequential 0% writes",
        "stride 4 0% writes",
        "2 writers 1024 KiB apart 0% writes",
    ] {
        let c = curve(&s, name);
        assert_eq!(c.len(), 2, "{name}: {c:?}");
        assert!(c.iter().all(|p| p.1 > 0.0));
    }
    assert!(rd_fail(&["sperf", "mem:1M", "--area", "8M"]).contains("smaller --area"));
}
