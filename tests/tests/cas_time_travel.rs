//! Time travel: a 5-version history built by a session (writes of
//! patterns, zeroes and unaligned bytes through the `cas` layer over NBD,
//! committed after each step) checks out byte-identical to a reference
//! image kept alongside — every version, by id, by tag and by date —
//! verified with `qemu-img compare`.

mod cas_common;
mod common;

use cas_common::{
    checkout, commit, commit_session, json_num, json_str, open_session, qemu_io_session, rd, Cas,
};
use common::{path_str, qemu_io, run, run_stdout, Server};

/// `qemu-img compare -f raw -F FORMAT REFERENCE IMAGE`.
fn compare_with(reference: &std::path::Path, format: &str, image: &str) {
    let r = path_str(reference);
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", format, r, image],
    );
}

#[test]
fn five_versions_check_out_byte_identical() {
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());
    let reference = cas.random_file("ref.img", 24 << 20, 11);
    // Some all-zero chunks in the golden image.
    qemu_io(path_str(&reference), &["write -z 8M 2M".into()]);
    let out = commit(s, path_str(&reference), "carol/vm", &["-m", "v1", "--json"]);
    let mut ids = vec![json_str(&out, "version")];
    let mut refs = vec![dir.join("ref1.img")];
    std::fs::copy(&reference, &refs[0]).unwrap();
    let sess = dir.join("sess");
    open_session(s, "carol/vm", &sess, &[]);
    let log_json = || rd(&["log", "carol/vm", "--store", s, "--json"]);
    let mut created = vec![json_num(&log_json(), "created_ns")];
    for k in 2..=5u32 {
        let cmds: Vec<String> = vec![
            format!("write -P {k} {}M 300k", k * 2),
            format!("write -z {}M 128k", k + 10),
            format!("write -P {} {} 1000", k + 100, k * 1_000_003),
            format!("write -P 0 {}M 64k", 20 + k / 2),
        ];
        qemu_io_session(dir, &sess, &cmds);
        qemu_io(path_str(&reference), &cmds);
        let out = commit_session(&sess, &["-m", &format!("v{k}"), "--json"]);
        ids.push(json_str(&out, "version"));
        let r = dir.join(format!("ref{k}.img"));
        std::fs::copy(&reference, &r).unwrap();
        refs.push(r);
        created.push(json_num(&log_json(), "created_ns"));
        // Dates are resolved to the second: keep commits apart.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let log = rd(&["log", "carol/vm", "--store", s]);
    assert_eq!(log.lines().count(), 6, "{log}");
    let third = format!("carol/vm@{}", &ids[2][..10]);
    rd(&["tag", &third, "--store", s, "three"]);
    for (k, id) in ids.iter().enumerate() {
        let out = dir.join(format!("out{k}.raw"));
        checkout(s, &format!("carol/vm@{}", &id[..8]), &out, &[]);
        compare_with(&refs[k], "raw", path_str(&out));
    }
    // By tag, as qcow2.
    let q = dir.join("three.qcow2");
    checkout(s, "carol/vm@three", &q, &["--format", "qcow2"]);
    compare_with(&refs[2], "qcow2", path_str(&q));
    // By date: the second after version 4 was committed.
    let secs = created[3] / 1_000_000_000 + 1;
    let date = run_stdout(
        "date",
        &["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"],
    );
    let out = dir.join("bydate.raw");
    checkout(s, &format!("carol/vm@{}", date.trim()), &out, &[]);
    compare_with(&refs[3], "raw", path_str(&out));
    // Read-only serving of an old version.
    let srv = Server::start(
        dir,
        &[
            &format!("cas-version[store={s}]:carol/vm@{}", &ids[1][..8]),
            "--read-only",
        ],
    );
    compare_with(&refs[1], "raw", &srv.uri());
}
