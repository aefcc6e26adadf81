//! Every cipher, MAC, key derivation and random byte of roamdisk, in one
//! place (clippy.toml refuses OpenSSL's ciphers and random generator
//! elsewhere):
//!
//! * block encryption for every layer that encrypts blocks (the LBS image,
//!   the borrowed disk): XTS-AES-256 per block, through OpenSSL
//!   (AES-NI/VAES), with one cipher context per thread reused across
//!   blocks; key files and Argon2id passphrases;
//! * the content-addressed store's ciphers: AES-256-CTR for convergent
//!   chunk encryption ([`aes256_ctr`]) and AES-256-GCM for sealed version
//!   packages ([`aes256_gcm_seal`], [`aes256_gcm_open`]);
//! * random bytes ([`fill_random`]).
//!
//! The 128-bit tweak of a block is two 64-bit numbers the caller chooses
//! (little-endian, low then high). LBS uses the block's PBN and the write
//! epoch of its cluster: a ciphertext copied to another place, or replayed
//! from an earlier use of the same place, decrypts to noise and fails its
//! checksum.

#![allow(
    clippy::disallowed_methods,
    reason = "this crate is the home of ciphers and random bytes"
)]

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use openssl::cipher::Cipher as OsslCipher;
use openssl::cipher_ctx::CipherCtx;
use openssl::symm::{decrypt_aead, encrypt_aead, Cipher, Crypter, Mode};
use sha2::Digest;

/// What went wrong in a cryptographic operation; the message says what to
/// do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// A key that cannot be used (the two XTS halves equal, a key file of
    /// the wrong length).
    #[error("{0}")]
    BadKey(String),
    /// A key file that cannot be read.
    #[error("{0}")]
    KeyFile(String),
    /// Argon2id refused its parameters or failed.
    #[error("{0}")]
    Derive(String),
    /// Sealed data failed authentication: tampered, damaged, or the wrong
    /// key.
    #[error("authentication failed (tampered, damaged, or the wrong key)")]
    Authentication,
    /// The operating system's random generator failed.
    #[error("no randomness from the operating system: {0}")]
    Random(String),
    /// The cipher library failed.
    #[error("{0}")]
    Cipher(String),
}

/// XTS-AES-256 key length (two AES-256 keys).
pub const KEY_LEN: usize = 64;

/// Argon2id parameters used for new passphrase-protected images:
/// 64 MiB, 3 passes, 1 lane.
pub const ARGON_DEFAULT: (u32, u32, u32) = (64 * 1024, 3, 1);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An XTS key and the identity used to cache per-thread contexts.
pub struct Xts {
    key: [u8; KEY_LEN],
    id: u64,
}

thread_local! {
    static CTX: RefCell<Option<(u64, CipherCtx, CipherCtx)>> = const { RefCell::new(None) };
}

fn tweak(pbn: u64, epoch: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&pbn.to_le_bytes());
    t[8..].copy_from_slice(&epoch.to_le_bytes());
    t
}

impl Xts {
    /// A cipher for `key`. XTS refuses keys whose two halves are equal.
    pub fn new(key: &[u8; KEY_LEN]) -> Result<Xts, CryptoError> {
        if key[..32] == key[32..] {
            return Err(CryptoError::BadKey(
                "invalid XTS key: both halves are equal".into(),
            ));
        }
        Ok(Xts {
            key: *key,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn with_ctx<R>(&self, f: impl FnOnce(&mut CipherCtx, &mut CipherCtx) -> R) -> R {
        CTX.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().is_none_or(|(id, _, _)| *id != self.id) {
                let mut enc = CipherCtx::new().expect("openssl cipher context");
                enc.encrypt_init(Some(OsslCipher::aes_256_xts()), Some(&self.key), None)
                    .expect("xts init");
                let mut dec = CipherCtx::new().expect("openssl cipher context");
                dec.decrypt_init(Some(OsslCipher::aes_256_xts()), Some(&self.key), None)
                    .expect("xts init");
                *c = Some((self.id, enc, dec));
            }
            let (_, enc, dec) = c.as_mut().expect("just set");
            f(enc, dec)
        })
    }

    /// Encrypt one block in place.
    pub fn encrypt(&self, pbn: u64, epoch: u64, block: &mut [u8]) {
        self.crypt(Mode::Encrypt, pbn, epoch, block)
    }

    /// Decrypt one block in place.
    pub fn decrypt(&self, pbn: u64, epoch: u64, block: &mut [u8]) {
        self.crypt(Mode::Decrypt, pbn, epoch, block)
    }

    /// Encrypt or decrypt one block in place, with its tweak.
    #[inline]
    fn crypt(&self, mode: Mode, pbn: u64, epoch: u64, block: &mut [u8]) {
        let t = tweak(pbn, epoch);
        self.with_ctx(|enc, dec| {
            let ctx = match mode {
                Mode::Encrypt => {
                    enc.encrypt_init(None, None, Some(&t)).expect("xts tweak");
                    enc
                }
                Mode::Decrypt => {
                    dec.decrypt_init(None, None, Some(&t)).expect("xts tweak");
                    dec
                }
            };
            let n = ctx.cipher_update_inplace(block, block.len()).expect("xts");
            debug_assert_eq!(n, block.len());
        })
    }
}

/// The header's key check value: SHA-256("roamdisk-lbs-key-check" || key)[..16].
pub fn key_check(key: &[u8; KEY_LEN]) -> [u8; 16] {
    let mut h = sha2::Sha256::new();
    h.update(b"roamdisk-lbs-key-check");
    h.update(key);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

/// Fill `buf` with random bytes from the operating system.
pub fn fill_random(buf: &mut [u8]) -> Result<(), CryptoError> {
    openssl::rand::rand_bytes(buf).map_err(|e| CryptoError::Random(e.to_string()))
}

/// Fill `buf` with random bytes from the OS; a generator that fails (it
/// does not, on Linux, once booted) ends the process.
pub fn random(buf: &mut [u8]) {
    fill_random(buf).expect("OS random generator");
}

/// AES-256-CTR of `data` under `key` with a zero IV: only for keys that
/// encrypt exactly one plaintext (convergent encryption derives the key
/// from the plaintext), so the keystream is never reused for other data.
/// Decryption is the same call.
pub fn aes256_ctr(key: &[u8; 32], data: &[u8]) -> Vec<u8> {
    let cipher = Cipher::aes_256_ctr();
    let mut c = Crypter::new(cipher, Mode::Encrypt, key, Some(&[0u8; 16])).expect("aes-256-ctr");
    let mut out = vec![0u8; data.len() + cipher.block_size()];
    let n = c.update(data, &mut out).expect("ctr update");
    let m = c.finalize(&mut out[n..]).expect("ctr final");
    out.truncate(n + m);
    out
}

/// AES-256-GCM: `plain` sealed under `key` and `nonce` (never used twice
/// with one key), `aad` authenticated with it; the tag goes to `tag`.
pub fn aes256_gcm_seal(
    key: &[u8; 32],
    nonce: &[u8; 12],
    aad: &[u8],
    plain: &[u8],
    tag: &mut [u8; 16],
) -> Result<Vec<u8>, CryptoError> {
    encrypt_aead(Cipher::aes_256_gcm(), key, Some(nonce), aad, plain, tag)
        .map_err(|e| CryptoError::Cipher(format!("AES-GCM failed: {e}")))
}

/// Open what [`aes256_gcm_seal`] sealed; [`CryptoError::Authentication`]
/// if the ciphertext, `aad` or `tag` changed, or the key is not the one.
pub fn aes256_gcm_open(
    key: &[u8; 32],
    nonce: &[u8],
    aad: &[u8],
    sealed: &[u8],
    tag: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    decrypt_aead(Cipher::aes_256_gcm(), key, Some(nonce), aad, sealed, tag)
        .map_err(|_| CryptoError::Authentication)
}

/// A fresh random key.
pub fn new_key() -> [u8; KEY_LEN] {
    loop {
        let mut k = [0u8; KEY_LEN];
        random(&mut k);
        if k[..32] != k[32..] {
            return k;
        }
    }
}

/// Write a key file (mode 0600, created new).
pub fn write_key_file(path: &Path, key: &[u8; KEY_LEN]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(key)?;
    f.sync_all()
}

/// Read a 64-byte key file.
pub fn read_key_file(path: &Path) -> Result<[u8; KEY_LEN], CryptoError> {
    let b = std::fs::read(path).map_err(|e| {
        CryptoError::KeyFile(format!("cannot read key file {}: {e}", path.display()))
    })?;
    b.as_slice().try_into().map_err(|_| {
        CryptoError::BadKey(format!(
            "key file {} holds {} bytes; an LBS key file holds exactly {KEY_LEN}",
            path.display(),
            b.len()
        ))
    })
}

/// Derive a key from a passphrase with Argon2id.
pub fn derive_key(
    passphrase: &[u8],
    salt: &[u8; 32],
    (m, t, p): (u32, u32, u32),
) -> Result<[u8; KEY_LEN], CryptoError> {
    let params = argon2::Params::new(m, t, p, Some(KEY_LEN))
        .map_err(|e| CryptoError::Derive(format!("bad Argon2 parameters: {e}")))?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut key = [0u8; KEY_LEN];
    a.hash_password_into(passphrase, salt, &mut key)
        .map_err(|e| CryptoError::Derive(format!("Argon2id failed: {e}")))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tweak_binding() {
        let x = Xts::new(&new_key()).unwrap();
        let plain: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        let mut b = plain.clone();
        x.encrypt(5, 9, &mut b);
        assert_ne!(b, plain);
        let mut c = b.clone();
        x.decrypt(5, 9, &mut c);
        assert_eq!(c, plain);
        let mut d = b.clone();
        x.decrypt(6, 9, &mut d);
        assert_ne!(d, plain, "another PBN must not decrypt");
        let mut e = b.clone();
        x.decrypt(5, 8, &mut e);
        assert_ne!(e, plain, "another epoch must not decrypt");
    }

    #[test]
    fn two_keys_in_one_thread() {
        let a = Xts::new(&new_key()).unwrap();
        let b = Xts::new(&new_key()).unwrap();
        let mut x = vec![1u8; 1024];
        a.encrypt(1, 1, &mut x);
        let mut y = x.clone();
        b.decrypt(1, 1, &mut y);
        a.decrypt(1, 1, &mut x);
        assert_eq!(x, vec![1u8; 1024]);
        assert_ne!(y, vec![1u8; 1024]);
    }

    #[test]
    fn gcm_seals_and_refuses_what_changed_and_ctr_round_trips() {
        let key = [7u8; 32];
        let nonce = [1u8; 12];
        let mut tag = [0u8; 16];
        let ct = aes256_gcm_seal(&key, &nonce, b"aad", b"plain text", &mut tag).unwrap();
        assert_eq!(
            aes256_gcm_open(&key, &nonce, b"aad", &ct, &tag).unwrap(),
            b"plain text"
        );
        assert_eq!(
            aes256_gcm_open(&key, &nonce, b"aaX", &ct, &tag),
            Err(CryptoError::Authentication)
        );
        assert_eq!(
            aes256_gcm_open(&[8u8; 32], &nonce, b"aad", &ct, &tag),
            Err(CryptoError::Authentication)
        );
        let c = aes256_ctr(&key, b"chunk bytes");
        assert_ne!(c, b"chunk bytes");
        assert_eq!(aes256_ctr(&key, &c), b"chunk bytes");
    }

    #[test]
    fn argon2_derivation_is_deterministic() {
        let salt = [3u8; 32];
        let k1 = derive_key(b"pw", &salt, (256, 1, 1)).unwrap();
        let k2 = derive_key(b"pw", &salt, (256, 1, 1)).unwrap();
        let k3 = derive_key(b"pX", &salt, (256, 1, 1)).unwrap();
        assert_eq!(k1, k2);
        assert_ne!(k1, k3);
    }
}
