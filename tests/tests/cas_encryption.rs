//! Convergent encryption: two users commit the same disk with their own
//! keys; the chunks are stored once (the second commit uploads only its
//! version package), no plaintext reaches the store, each user's index is
//! sealed with their key (the other key and no key are refused, naming the
//! problem), and gc and store verify still work without any key.

mod cas_common;
mod common;

use cas_common::{init_store, json_num, object_files, rd, rd_fail};
use common::{qemu_img_compare, random_file, tempdir};

#[test]
fn identical_chunks_deduplicate_across_users_and_indexes_stay_private() {
    let d = tempdir();
    let dir = d.path();
    let store = init_store(dir);
    let s = store.to_str().unwrap();
    let img = dir.join("disk.img");
    random_file(&img, 6 << 20, 31);
    // A recognisable plaintext that must not appear in the store.
    let marker = b"TOP-SECRET-MARKER-0123456789".repeat(2400);
    cas_common::put_at(
        &img,
        &{
            let p = dir.join("marker");
            std::fs::write(&p, &marker).unwrap();
            p
        },
        1 << 20,
    );
    let ka = dir.join("alice.key");
    let kb = dir.join("bob.key");
    rd(&["store", "keygen", kb.to_str().unwrap()]);
    let a = rd(&[
        "commit",
        img.to_str().unwrap(),
        "--to",
        "alice/vm",
        "--store",
        s,
        "--encrypt",
        "--key-file",
        ka.to_str().unwrap(),
        "--json",
    ]);
    assert!(ka.exists(), "--encrypt made the key file");
    assert_eq!(json_num(&a, "new_objects"), 96);
    let b = rd(&[
        "commit",
        img.to_str().unwrap(),
        "--to",
        "bob/vm",
        "--store",
        s,
        "--encrypt",
        "--key-file",
        kb.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        json_num(&b, "new_objects"),
        0,
        "bob's chunks deduplicate against alice's"
    );
    assert_eq!(json_num(&b, "reused_objects"), 96);
    for f in object_files(&store) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(18).any(|w| w == &marker[..18]),
            "plaintext found in {}",
            f.display()
        );
    }
    let out = dir.join("a.raw");
    rd(&[
        "checkout",
        "alice/vm",
        "--store",
        s,
        "--key-file",
        ka.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    qemu_img_compare(img.to_str().unwrap(), out.to_str().unwrap());
    let e = rd_fail(&[
        "checkout",
        "alice/vm",
        "--store",
        s,
        "--key-file",
        kb.to_str().unwrap(),
        "--output",
        dir.join("x").to_str().unwrap(),
    ]);
    assert!(
        e.contains("encrypted with key") && e.contains("not the given key"),
        "{e}"
    );
    let e = rd_fail(&[
        "checkout",
        "alice/vm",
        "--store",
        s,
        "--output",
        dir.join("y").to_str().unwrap(),
    ]);
    assert!(e.contains("--key-file"), "{e}");
    // Passwords are not keys.
    let pw = dir.join("pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let e = rd_fail(&[
        "checkout",
        "alice/vm",
        "--store",
        s,
        "--key-file",
        pw.to_str().unwrap(),
        "--output",
        dir.join("z").to_str().unwrap(),
    ]);
    assert!(e.contains("passwords are not accepted"), "{e}");
    // No key needed to collect garbage or verify.
    let r = rd(&["gc", "--store", s, "--json"]);
    assert_eq!(json_num(&r, "removed_objects"), 0, "{r}");
    assert_eq!(json_num(&r, "referenced"), 98, "{r}");
    rd(&["store", "verify", "--store", s]);
    // A session of an encrypted image commits encrypted.
    let sess = dir.join("sess");
    rd(&[
        "checkout",
        "bob/vm",
        "--store",
        s,
        "--key-file",
        kb.to_str().unwrap(),
        "--session",
        sess.to_str().unwrap(),
    ]);
    {
        let srv = common::Server::start(dir, &[&format!("cas:{}", sess.display())]);
        common::qemu_io(&srv.uri(), &["write -P 5 0 64k".into()]);
        srv.stop();
    }
    let c = rd(&["commit", &format!("cas:{}", sess.display()), "--json"]);
    assert!(c.contains("\"encrypted\": true"), "{c}");
}
