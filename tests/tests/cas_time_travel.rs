//! Time travel: a 5-version history built by a session (writes of
//! patterns, zeroes and unaligned bytes through the `cas` layer over NBD,
//! committed after each step) checks out byte-identical to a reference
//! image kept alongside — every version, by id, by tag and by date —
//! verified with `qemu-img compare`.

mod cas_common;
mod common;

use cas_common::{init_store, json_num, json_str, rd};
use common::{qemu_io, random_file, run, run_stdout, tempdir, Server};

#[test]
fn five_versions_check_out_byte_identical() {
    let d = tempdir();
    let dir = d.path();
    let store = init_store(dir);
    let s = store.to_str().unwrap();
    let reference = dir.join("ref.img");
    random_file(&reference, 24 << 20, 11);
    // Some all-zero chunks in the golden image.
    qemu_io(reference.to_str().unwrap(), &["write -z 8M 2M".into()]);
    let out = rd(&[
        "commit",
        reference.to_str().unwrap(),
        "--to",
        "carol/vm",
        "-m",
        "v1",
        "--store",
        s,
        "--json",
    ]);
    let mut ids = vec![json_str(&out, "version")];
    let mut refs = vec![dir.join("ref1.img")];
    std::fs::copy(&reference, &refs[0]).unwrap();
    let sess = dir.join("sess");
    rd(&[
        "checkout",
        "carol/vm",
        "--store",
        s,
        "--session",
        sess.to_str().unwrap(),
    ]);
    let mut created = vec![json_num(
        &rd(&["log", "carol/vm", "--store", s, "--json"]),
        "created_ns",
    )];
    for k in 2..=5u32 {
        let cmds: Vec<String> = vec![
            format!("write -P {k} {}M 300k", k * 2),
            format!("write -z {}M 128k", k + 10),
            format!("write -P {} {} 1000", k + 100, k * 1_000_003),
            format!("write -P 0 {}M 64k", 20 + k / 2),
        ];
        {
            let srv = Server::start(dir, &[&format!("cas:{}", sess.display())]);
            qemu_io(&srv.uri(), &cmds);
            srv.stop();
        }
        qemu_io(reference.to_str().unwrap(), &cmds);
        let out = rd(&[
            "commit",
            &format!("cas:{}", sess.display()),
            "-m",
            &format!("v{k}"),
            "--json",
        ]);
        ids.push(json_str(&out, "version"));
        let r = dir.join(format!("ref{k}.img"));
        std::fs::copy(&reference, &r).unwrap();
        refs.push(r);
        let log = rd(&["log", "carol/vm", "--store", s, "--json"]);
        created.push(json_num(&log, "created_ns"));
        // Dates are resolved to the second: keep commits apart.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let log = rd(&["log", "carol/vm", "--store", s]);
    assert_eq!(log.lines().count(), 6, "{log}");
    rd(&[
        "tag",
        &format!("carol/vm@{}", &ids[2][..10]),
        "--store",
        s,
        "three",
    ]);
    for (k, id) in ids.iter().enumerate() {
        let out = dir.join(format!("out{k}.raw"));
        rd(&[
            "checkout",
            &format!("carol/vm@{}", &id[..8]),
            "--store",
            s,
            "--output",
            out.to_str().unwrap(),
        ]);
        run(
            "qemu-img",
            &[
                "compare",
                "-f",
                "raw",
                "-F",
                "raw",
                refs[k].to_str().unwrap(),
                out.to_str().unwrap(),
            ],
        );
    }
    // By tag, as qcow2.
    let q = dir.join("three.qcow2");
    rd(&[
        "checkout",
        "carol/vm@three",
        "--store",
        s,
        "--output",
        q.to_str().unwrap(),
        "--format",
        "qcow2",
    ]);
    run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "qcow2",
            refs[2].to_str().unwrap(),
            q.to_str().unwrap(),
        ],
    );
    // By date: the second after version 4 was committed.
    let secs = created[3] / 1_000_000_000 + 1;
    let date = run_stdout(
        "date",
        &["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"],
    );
    let out = dir.join("bydate.raw");
    rd(&[
        "checkout",
        &format!("carol/vm@{}", date.trim()),
        "--store",
        s,
        "--output",
        out.to_str().unwrap(),
    ]);
    run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            refs[3].to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    // Read-only serving of an old version.
    let srv = Server::start(
        dir,
        &[
            &format!("cas-version[store={s}]:carol/vm@{}", &ids[1][..8]),
            "--read-only",
        ],
    );
    run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            refs[1].to_str().unwrap(),
            &srv.uri(),
        ],
    );
}
