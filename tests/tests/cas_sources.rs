//! The initial commit reads any disk: an NBD export (through the `nbd` layer),
//! an LBS image (a stack spec) and a raw file give the same version, stored
//! once; each checks out byte-identical (`qemu-img compare`). A version
//! keeps the VM configuration file and a memory image too.

mod cas_common;
mod common;

use cas_common::{init_store, json_num, json_str, rd};
use common::{qemu_img_compare, qemu_io, random_file, tempdir, Server};

#[test]
fn nbd_export_lbs_image_and_raw_file_commit_to_the_same_version() {
    let d = tempdir();
    let dir = d.path();
    let store = init_store(dir);
    let s = store.to_str().unwrap();
    let raw = dir.join("disk.raw");
    random_file(&raw, 10 << 20, 41);
    qemu_io(raw.to_str().unwrap(), &["write -z 2M 3M".into()]);
    let a = rd(&[
        "commit",
        raw.to_str().unwrap(),
        "--to",
        "f/raw",
        "--store",
        s,
        "--json",
    ]);
    let lbs = dir.join("vm.lbsd");
    rd(&[
        "lbs",
        "import",
        raw.to_str().unwrap(),
        lbs.to_str().unwrap(),
    ]);
    let b = rd(&[
        "commit",
        &format!("lbs:{}", lbs.display()),
        "--to",
        "f/lbs",
        "--store",
        s,
        "--json",
    ]);
    let c = {
        let srv = Server::start(dir, &[&format!("raw:{}", raw.display()), "--read-only"]);
        rd(&[
            "commit",
            &srv.uri(),
            "--to",
            "f/nbd",
            "--store",
            s,
            "--json",
        ])
    };
    // Same content, same chunks: only the first commit uploaded data.
    assert_eq!(json_num(&b, "new_objects"), 0, "{b}");
    assert_eq!(json_num(&c, "new_objects"), 0, "{c}");
    assert!(json_num(&a, "new_objects") > 100);
    for (image, out) in [(&a, "f/raw"), (&b, "f/lbs"), (&c, "f/nbd")] {
        let v = json_str(image, "version");
        let got = dir.join(format!("{}.raw", out.replace('/', "-")));
        rd(&[
            "checkout",
            &format!("{out}@{}", &v[..8]),
            "--store",
            s,
            "--output",
            got.to_str().unwrap(),
        ]);
        qemu_img_compare(raw.to_str().unwrap(), got.to_str().unwrap());
    }
    // The VM configuration file and a memory image travel with a version.
    let mem = dir.join("mem.bin");
    random_file(&mem, 300_001, 42);
    let conf = dir.join("vm.conf");
    std::fs::write(&conf, "memory = 2G\ncpus = 2\n").unwrap();
    rd(&[
        "commit",
        raw.to_str().unwrap(),
        "--to",
        "f/vm",
        "--store",
        s,
        "--memory",
        mem.to_str().unwrap(),
        "--config",
        conf.to_str().unwrap(),
    ]);
    let (m2, c2) = (dir.join("m2.bin"), dir.join("c2.conf"));
    rd(&[
        "checkout",
        "f/vm",
        "--store",
        s,
        "--memory-out",
        m2.to_str().unwrap(),
        "--config-out",
        c2.to_str().unwrap(),
        "--output",
        dir.join("vm.raw").to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&m2).unwrap() == std::fs::read(&mem).unwrap(),
        "memory image"
    );
    assert_eq!(std::fs::read(&c2).unwrap(), std::fs::read(&conf).unwrap());
}
