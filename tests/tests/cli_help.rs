//! Every command explains itself: `--help` succeeds, names the command's
//! purpose and carries an example; bad input gets an error that says what
//! to do.

mod common;
use common::{rd_fail, roamdisk};

const COMMANDS: &[&str] = &[
    "serve", "info", "layers", "lbs", "trace", "replay", "sperf", "sim", "model", "commit", "log",
    "checkout", "tag", "rm", "gc", "hoard", "cache", "suspend", "resume", "store", "borrow",
    "server",
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
    // Each failing command line and what its error must name.
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["info", "raw:/nonexistent/disk.img"],
            &["does not exist", "truncate"],
        ),
        (&["info", "bogus:1"], &["unknown layer 'bogus'", "cow"]),
        (&["serve", "mem:1M"], &["--socket"]),
    ];
    for (args, names) in cases {
        let err = rd_fail(args);
        for n in names {
            assert!(err.contains(n), "{err}");
        }
    }
}

#[test]
fn layers_lists_builtin_kinds() {
    let out = roamdisk(&["layers"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for k in [
        "raw:PATH",
        "mem:SIZE",
        "cow[OPT=VALUE,...]:OVERLAY:NEXT",
        "cache[OPT=VALUE,...]:[POLICY, default lru]:SIZE:NEXT",
        "hdd[OPT=VALUE,...]:NEXT",
    ] {
        assert!(text.contains(k), "missing {k}:\n{text}");
    }
}
