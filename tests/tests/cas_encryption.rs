//! Convergent encryption: two users commit the same disk with their own
//! keys; the chunks are stored once (the second commit uploads only its
//! version package), no plaintext reaches the store, each user's index is
//! sealed with their key (the other key and no key are refused, naming the
//! problem), and gc and store verify still work without any key.

mod cas_common;
mod common;

use std::path::Path;

use cas_common::{
    checkout, checkout_fail, commit, commit_session, json_num, open_session, qemu_io_session, rd,
    store_files, Cas,
};
use common::{path_str, qemu_img_compare};

/// `commit` options: encrypt with the key in KEY (made if missing), JSON.
fn encrypt_with(key: &Path) -> [&str; 4] {
    ["--encrypt", "--key-file", path_str(key), "--json"]
}

#[test]
fn identical_chunks_deduplicate_across_users_and_indexes_stay_private() {
    // Local: reads every file of the store for plaintext.
    let cas = Cas::local();
    let (dir, s) = (cas.dir(), cas.s());
    let img = cas.random_file("disk.img", 6 << 20, 31);
    // A recognisable plaintext that must not appear in the store.
    let marker = b"TOP-SECRET-MARKER-0123456789".repeat(2400);
    let marker_file = dir.join("marker");
    std::fs::write(&marker_file, &marker).unwrap();
    cas_common::put_at(&img, &marker_file, 1 << 20);
    let ka = dir.join("alice.key");
    let kb = dir.join("bob.key");
    rd(&["store", "keygen", path_str(&kb)]);
    let a = commit(s, path_str(&img), "alice/vm", &encrypt_with(&ka));
    assert!(ka.exists(), "--encrypt made the key file");
    assert_eq!(json_num(&a, "new_objects"), 96);
    let b = commit(s, path_str(&img), "bob/vm", &encrypt_with(&kb));
    assert_eq!(
        json_num(&b, "new_objects"),
        0,
        "bob's chunks deduplicate against alice's"
    );
    assert_eq!(json_num(&b, "reused_objects"), 96);
    for f in store_files(&cas.store) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(18).any(|w| w == &marker[..18]),
            "plaintext found in {}",
            f.display()
        );
    }
    let out = dir.join("a.raw");
    checkout(s, "alice/vm", &out, &["--key-file", path_str(&ka)]);
    qemu_img_compare(path_str(&img), path_str(&out));
    let e = checkout_fail(
        s,
        "alice/vm",
        &dir.join("x"),
        &["--key-file", path_str(&kb)],
    );
    assert!(
        e.contains("encrypted with key") && e.contains("not the given key"),
        "{e}"
    );
    let e = checkout_fail(s, "alice/vm", &dir.join("y"), &[]);
    assert!(e.contains("--key-file"), "{e}");
    // Passwords are not keys.
    let pw = dir.join("pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let e = checkout_fail(
        s,
        "alice/vm",
        &dir.join("z"),
        &["--key-file", path_str(&pw)],
    );
    assert!(e.contains("passwords are not accepted"), "{e}");
    // No key needed to collect garbage or verify.
    let r = rd(&["gc", "--store", s, "--json"]);
    assert_eq!(json_num(&r, "removed_objects"), 0, "{r}");
    assert_eq!(json_num(&r, "referenced"), 98, "{r}");
    rd(&["store", "verify", "--store", s]);
    // A session of an encrypted image commits encrypted.
    let sess = dir.join("sess");
    open_session(s, "bob/vm", &sess, &["--key-file", path_str(&kb)]);
    qemu_io_session(dir, &sess, &["write -P 5 0 64k".into()]);
    let c = commit_session(&sess, &["--json"]);
    assert!(c.contains("\"encrypted\": true"), "{c}");
}
