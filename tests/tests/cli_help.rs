//! Every command explains itself: `--help` succeeds, names the command's
//! purpose and carries an example; bad input gets an error that says what
//! to do.

mod common;
use common::roamdisk;

const COMMANDS: &[&str] = &[
    "serve", "info", "layers", "lbs", "trace", "replay", "sperf", "sim", "model", "commit", "log",
    "checkout", "tag", "rm", "gc", "store", "borrow",
];

#[test]
fn top_level_help_lists_every_command() {
    let out = roamdisk(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for c in COMMANDS {
        assert!(
            text.contains(c),
            "top-level help does not mention '{c}':\n{text}"
        );
    }
    assert!(
        text.contains("cow:overlay.img:raw:base.img"),
        "help shows a stack example"
    );
}

#[test]
fn every_command_help_has_an_example() {
    for c in COMMANDS {
        let out = roamdisk(&[c, "--help"]);
        assert!(out.status.success(), "{c} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example"),
            "`roamdisk {c} --help` has no example:\n{text}"
        );
        assert!(
            text.contains(&format!("roamdisk {c}")),
            "`roamdisk {c} --help` example does not run the command:\n{text}"
        );
    }
}

#[test]
fn errors_say_what_to_do() {
    let out = roamdisk(&["info", "raw:/nonexistent/disk.img"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not exist") && err.contains("truncate"),
        "{err}"
    );

    let out = roamdisk(&["info", "bogus:1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown layer 'bogus'") && err.contains("cow"),
        "{err}"
    );

    let out = roamdisk(&["serve", "mem:1M"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--socket"), "{err}");
}

#[test]
fn layers_lists_builtin_kinds() {
    let out = roamdisk(&["layers"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for k in ["raw:PATH", "mem:SIZE", "cow[OPT=VALUE,...]:OVERLAY:NEXT"] {
        assert!(text.contains(k), "missing {k}:\n{text}");
    }
}
