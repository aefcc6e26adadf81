//! X.509 test credentials made with the openssl CLI: a CA, and leaf
//! certificates it signs (a server certificate for 127.0.0.1 and
//! localhost, client certificates). Used by the NBD TLS tests (`tls.rs`)
//! and the chunk server's (`cas_auth.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{assert_success, require_tool};

/// Run `openssl` in `dir` with a whitespace-separated argument line.
fn openssl(dir: &Path, line: &str) {
    require_tool("openssl");
    let args: Vec<&str> = line.split_whitespace().collect();
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(&args)
        .output()
        .expect("run openssl");
    assert_success(&out, &format!("openssl {line}"));
}

const EC_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

/// A CA in `dir` (ca-cert.pem, ca-key.pem).
pub fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &format!(
            "req -x509 {EC_KEY} -keyout ca-key.pem -out ca-cert.pem -days 2 -subj /CN={name} \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
}

/// `who`-cert.pem and `who`-key.pem in `ca`, signed by its CA.
pub fn make_leaf(ca: &Path, who: &str, ext: &str) {
    std::fs::write(ca.join(format!("{who}.ext")), ext).unwrap();
    openssl(
        ca,
        &format!("req {EC_KEY} -keyout {who}-key.pem -out {who}.csr -subj /CN={who}"),
    );
    openssl(
        ca,
        &format!(
            "x509 -req -in {who}.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
             -days 2 -out {who}-cert.pem -extfile {who}.ext"
        ),
    );
}

/// Extensions of a server certificate for 127.0.0.1 and localhost.
pub const SERVER_EXT: &str = "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
    extendedKeyUsage=serverAuth\n\
    keyUsage=critical,digitalSignature,keyEncipherment\n\
    basicConstraints=CA:FALSE\n";
/// Extensions of a client certificate.
pub const CLIENT_EXT: &str = "extendedKeyUsage=clientAuth\n\
    keyUsage=critical,digitalSignature,keyEncipherment\n\
    basicConstraints=CA:FALSE\n";

/// DIR/NAME, a certificates folder as GnuTLS clients (nbdinfo, `roamdisk`'s
/// `tls-certificates=`) want it: `ca`'s ca-cert.pem, and `who`'s
/// certificate and key from `who_ca` as client-cert.pem and
/// client-key.pem.
pub fn client_dir(dir: &Path, name: &str, ca: &Path, who_ca: &Path, who: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
    std::fs::copy(
        who_ca.join(format!("{who}-cert.pem")),
        d.join("client-cert.pem"),
    )
    .unwrap();
    std::fs::copy(
        who_ca.join(format!("{who}-key.pem")),
        d.join("client-key.pem"),
    )
    .unwrap();
    d
}
