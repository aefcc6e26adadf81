//! The initial commit reads any disk: an NBD export (through the `nbd` layer),
//! an LBS image (a stack spec) and a raw file give the same version, stored
//! once; each checks out byte-identical (`qemu-img compare`). A version
//! keeps the VM configuration file and a memory image too.

mod cas_common;
mod common;

use cas_common::{checkout, commit, json_num, json_str, rd, Cas};
use common::{path_str, qemu_img_compare, qemu_io, random_file, Server};

#[test]
fn nbd_export_lbs_image_and_raw_file_commit_to_the_same_version() {
    let cas = Cas::new();
    let (dir, s) = (cas.dir(), cas.s());
    let raw = cas.random_file("disk.raw", 10 << 20, 41);
    let r = path_str(&raw);
    qemu_io(r, &["write -z 2M 3M".into()]);
    let a = commit(s, r, "f/raw", &["--json"]);
    let lbs = dir.join("vm.lbsd");
    rd(&["lbs", "import", r, path_str(&lbs)]);
    let b = commit(s, &format!("lbs:{}", lbs.display()), "f/lbs", &["--json"]);
    let c = {
        let srv = Server::start(dir, &[&format!("raw:{r}"), "--read-only"]);
        commit(s, &srv.uri(), "f/nbd", &["--json"])
    };
    // Same content, same chunks: only the first commit uploaded data.
    assert_eq!(json_num(&b, "new_objects"), 0, "{b}");
    assert_eq!(json_num(&c, "new_objects"), 0, "{c}");
    assert!(json_num(&a, "new_objects") > 100);
    for (image, out) in [(&a, "f/raw"), (&b, "f/lbs"), (&c, "f/nbd")] {
        let v = json_str(image, "version");
        let got = dir.join(format!("{}.raw", out.replace('/', "-")));
        checkout(s, &format!("{out}@{}", &v[..8]), &got, &[]);
        qemu_img_compare(r, path_str(&got));
    }
    // The VM configuration file and a memory image travel with a version.
    let mem = dir.join("mem.bin");
    random_file(&mem, 300_001, 42);
    let conf = dir.join("vm.conf");
    std::fs::write(&conf, "memory = 2G\ncpus = 2\n").unwrap();
    let vm = ["--memory", path_str(&mem), "--config", path_str(&conf)];
    commit(s, r, "f/vm", &vm);
    let (m2, c2) = (dir.join("m2.bin"), dir.join("c2.conf"));
    let outs = ["--memory-out", path_str(&m2), "--config-out", path_str(&c2)];
    checkout(s, "f/vm", &dir.join("vm.raw"), &outs);
    assert!(
        std::fs::read(&m2).unwrap() == std::fs::read(&mem).unwrap(),
        "memory image"
    );
    assert_eq!(std::fs::read(&c2).unwrap(), std::fs::read(&conf).unwrap());
}
