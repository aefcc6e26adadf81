//! The bridge from the store's blocking calls to `object_store`'s async
//! requests: the store's own tokio runtime ([`S3Store::block`], safe to
//! call from another runtime's task), the requests every other file makes
//! (get, put — always one PUT —, head, delete, list), keys
//! relative to the store's prefix, and errors that say what to check.

use std::future::Future;
use std::time::SystemTime;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};
use roamdisk_blockdev::{ErrorKind, Op, Result};

use super::store::S3Store;
use crate::error::{corrupt, err, not_found};

fn system_time(t: impl Into<SystemTime>) -> SystemTime {
    t.into()
}

/// `bytes` random bytes in hex: a name no other writer picks.
pub(super) fn random_hex(bytes: usize) -> Result<String> {
    let mut r = vec![0u8; bytes];
    crate::secret::fill_random(&mut r, "an object name")?;
    Ok(r.iter().map(|b| format!("{b:02x}")).collect())
}

/// A random number for an object name.
pub(super) fn random_u64() -> Result<u64> {
    let mut r = [0u8; 8];
    crate::secret::fill_random(&mut r, "an object name")?;
    Ok(u64::from_le_bytes(r))
}

/// Whether a PUT's answer lacked its ETag header (not retried by
/// `object_store`).
fn missing_etag(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. })
        && e.to_string().contains("ETag Header missing")
}

/// Whether a request failed because its object does not exist.
pub(super) fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

impl S3Store {
    /// Run `f` on the store's runtime and wait for its output.
    pub(super) fn block<F: Future + Send>(&self, f: F) -> F::Output
    where
        F::Output: Send,
    {
        let rt = self.rt.as_ref().expect("runtime");
        if tokio::runtime::Handle::try_current().is_err() {
            return rt.block_on(f);
        }
        // Called from another runtime (the NBD server reads a session's
        // chunks in its tasks; `store serve` handles requests on its
        // blocking threads), where block_on panics ("Cannot start a runtime
        // from within a runtime"). The store's runtime drives the requests'
        // I/O and timers on its own worker threads, so `f` is polled here,
        // in that runtime's context, with no thread started per call (one
        // was, before: ~20-50 µs a call).
        let _context = rt.enter();
        futures::executor::block_on(f)
    }

    /// The key of `rel` (a name relative to the store's prefix).
    pub(super) fn key(&self, rel: &str) -> Key {
        Key::from(self.loc.key(rel))
    }

    /// The name of `key` relative to the store's prefix.
    fn rel<'k>(&self, key: &'k str) -> &'k str {
        if self.loc.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.loc.prefix)
                .and_then(|k| k.strip_prefix('/'))
                .unwrap_or(key)
        }
    }

    /// A roamdisk error for a failed request about `what`.
    pub(super) fn fail(
        &self,
        e: object_store::Error,
        op: Op,
        what: &str,
    ) -> roamdisk_blockdev::Error {
        use object_store::Error as E;
        let store = self.loc.describe();
        match &e {
            E::NotFound { .. } => not_found(format!("{what} is missing from store {store}")),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => err(
                ErrorKind::PermissionDenied,
                op,
                format!(
                    "{store} refused access to {what}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({e})"
                ),
            ),
            _ => {
                // The first line, without the XML body some servers add.
                let full = e.to_string();
                let mut text: String = full.lines().next().unwrap_or_default().to_string();
                if let Some(i) = text.find("<?xml") {
                    text.truncate(i);
                }
                if text.len() > 400 {
                    let mut cut = 400;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                    text.push('…');
                }
                let text = text.trim_end().to_string();
                // The error and its causes (a timeout is said only there).
                let mut chain = full.clone();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    chain.push_str(": ");
                    chain.push_str(&c.to_string());
                    cause = c.source();
                }
                let hint = if has_status(&text, "403") || text.contains("SignatureDoesNotMatch") || text.contains("InvalidAccessKeyId") || text.contains("AccessDenied") {
                    return err(
                        ErrorKind::PermissionDenied,
                        op,
                        format!("{store} refused access to {what}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({text})"),
                    );
                } else if chain.contains("timed out") || chain.contains("deadline has elapsed") {
                    " (the endpoint did not answer in time; retried with backoff, then gave up)"
                } else if chain.contains("onnection refused") {
                    " (nothing listens at the endpoint: check AWS_ENDPOINT_URL)"
                } else {
                    ""
                };
                err(ErrorKind::Io, op, format!("{what} in store {store}: {text}{hint}"))
            }
        }
    }

    /// The bytes of `rel` (`what` names it in errors).
    pub(super) async fn get_bytes(&self, rel: &str, what: &str) -> Result<Vec<u8>> {
        let r = self
            .os
            .get(&self.key(rel))
            .await
            .map_err(|e| self.fail(e, Op::Read, what))?;
        Ok(r.bytes()
            .await
            .map_err(|e| self.fail(e, Op::Read, what))?
            .to_vec())
    }

    /// The text of `rel`, `None` if it does not exist.
    pub(super) async fn get_text(&self, rel: &str) -> Result<Option<String>> {
        match self.os.get(&self.key(rel)).await {
            Ok(r) => {
                let b = r.bytes().await.map_err(|e| self.fail(e, Op::Read, rel))?;
                String::from_utf8(b.to_vec())
                    .map(Some)
                    .map_err(|_| corrupt(format!("{rel} of {} is not text", self.loc.describe())))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.fail(e, Op::Read, rel)),
        }
    }

    /// Store `bytes` as `rel` with one PUT. Packs too: never a multipart
    /// upload, which a killed commit would leave hidden in the bucket, and
    /// which Swift stores much worse than a PUT (`cas-s3.md`, BENCHMARKS).
    pub(super) async fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<()> {
        let payload = PutPayload::from(bytes);
        let mut attempt = 0;
        loop {
            match self.os.put(&self.key(rel), payload.clone()).await {
                Ok(_) => return Ok(()),
                // An answer without the ETag every S3 PUT answer carries
                // (Swift under load, seen once in CI: "Unable to extract
                // metadata from headers: ETag Header missing") says nothing
                // of whether the object was stored; object_store does not
                // retry it. Every PUT here is of a fresh random name, a
                // content-addressed object or an empty marker, so it is
                // sent again.
                Err(e) if attempt < 3 && missing_etag(&e) => {
                    attempt += 1;
                    tracing::debug!(object = rel, attempt, "PUT answered without an ETag: again");
                    tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => return Err(self.fail(e, Op::Write, rel)),
            }
        }
    }

    /// Modification time of `rel`, `None` if it does not exist.
    pub(super) async fn time_of(&self, rel: &str) -> Result<Option<(SystemTime, u64)>> {
        match self.os.head(&self.key(rel)).await {
            Ok(m) => Ok(Some((system_time(m.last_modified), m.size))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.fail(e, Op::Read, rel)),
        }
    }

    /// Delete `rel` (done if it is already gone).
    pub(super) async fn delete(&self, rel: &str) -> Result<()> {
        match self.os.delete(&self.key(rel)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.fail(e, Op::Write, rel)),
        }
    }

    /// Every object under `dir/` (relative names, sizes, times).
    pub(super) async fn list(&self, dir: &str) -> Result<Vec<(String, u64, SystemTime)>> {
        let prefix = self.key(dir);
        let metas: Vec<object_store::ObjectMeta> = self
            .os
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.fail(e, Op::Read, &format!("the listing of {dir}/")))?;
        Ok(metas
            .into_iter()
            .map(|m| {
                (
                    self.rel(m.location.as_ref()).to_string(),
                    m.size,
                    system_time(m.last_modified),
                )
            })
            .collect())
    }
}

/// Whether `text` holds the HTTP status `code` as a number of its own
/// (not inside a duration such as `4.109403219s`).
fn has_status(text: &str, code: &str) -> bool {
    let b = text.as_bytes();
    text.match_indices(code).any(|(i, _)| {
        let before = i.checked_sub(1).map(|j| b[j]);
        let after = b.get(i + code.len()).copied();
        let apart = |c: Option<u8>| c.is_none_or(|c| !c.is_ascii_digit() && c != b'.');
        apart(before) && apart(after)
    })
}

#[cfg(test)]
mod status_tests {
    use super::has_status;

    #[test]
    fn a_status_is_a_number_of_its_own() {
        assert!(has_status("Client error with status 403 Forbidden", "403"));
        assert!(has_status("HTTP 403", "403"));
        assert!(!has_status(
            "GET http://h/x in 4.109403219s, after 1 retries",
            "403"
        ));
        assert!(!has_status("port 14030", "403"));
    }
}

#[cfg(test)]
mod put_retry_tests {
    use super::missing_etag;

    #[test]
    fn only_a_put_answer_without_its_etag_is_sent_again() {
        let generic = |m: &str| object_store::Error::Generic {
            store: "S3",
            source: m.to_string().into(),
        };
        assert!(missing_etag(&generic(
            "Unable to extract metadata from headers: ETag Header missing from response"
        )));
        assert!(!missing_etag(&generic("connection reset")));
        assert!(!missing_etag(&object_store::Error::NotFound {
            path: "x".into(),
            source: "ETag Header missing".into(),
        }));
    }
}
