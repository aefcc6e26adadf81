//! Leases in an S3 store: a commit in progress is an object
//! `leases/ID` whose body says when it started (and, once over, when it
//! ended) by the store's clock; refreshing it rewrites it, so its
//! modification time is its last sign of life. A finished commit's lease
//! is not deleted but marked ended, and reported over only once the
//! catalog entry it protected is surely in every listing (`gc-margin=`).

use std::time::{Duration, Instant, SystemTime};

use roamdisk_blockdev::Result;

use super::bridge::random_hex;
use super::store::S3Store;
use crate::error::{corrupt, not_found};
use crate::store::api::{ChunkPrune, Lease, LeaseStore};

/// Lease body's first line.
const LEASE_MAGIC: &str = "roamdisk-lease 1";

impl LeaseStore for S3Store {
    fn lease_begin(&self) -> Result<Lease> {
        let id = random_hex(12)?;
        *self.epoch.lock() = Instant::now();
        let rel = format!("leases/{id}");
        let started = self.block(async {
            self.put(
                &rel,
                format!(
                    "{LEASE_MAGIC}\nstarted 0\nended 0\npid {}\n",
                    std::process::id()
                )
                .into_bytes(),
            )
            .await?;
            self.time_of(&rel).await
        })?;
        let started = started.map(|(t, _)| t).ok_or_else(|| {
            not_found(format!(
                "lease {id} vanished from {} as it was written",
                self.loc.describe()
            ))
        })?;
        self.mine.lock().insert(id.clone());
        self.write_lease(&id, started, None)?;
        Ok(Lease::new(id, started))
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let rel = format!("leases/{id}");
        let text = self.block(self.get_text(&rel))?.ok_or_else(|| {
            not_found(format!("lease {id} vanished (a gc took it for dead: its commit was idle longer than the lease timeout)"))
        })?;
        let (started, _) =
            parse_lease(&text).ok_or_else(|| corrupt(format!("lease {id} is damaged")))?;
        self.write_lease(id, started, None)
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let mine = self.mine.lock().remove(id);
        if !mine {
            // gc ending a dead (or long finished) commit's lease.
            return self.block(self.delete(&format!("leases/{id}")));
        }
        // Our commit is over: the lease stays, marked ended, until the
        // catalog entry it protected is surely in every listing.
        let rel = format!("leases/{id}");
        let text = self.block(self.get_text(&rel))?;
        let started = text
            .as_deref()
            .and_then(parse_lease)
            .map(|(s, _)| s)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let now = self.now()?;
        self.write_lease(id, started, Some(now))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        let now = self.now()?;
        self.block(async {
            let list = self.list("leases").await?;
            let mut out = Vec::new();
            for (rel, _, modified) in list {
                let Some(id) = rel.strip_prefix("leases/") else {
                    continue;
                };
                let Some(text) = self.get_text(&rel).await? else {
                    continue;
                };
                let (started, ended) = parse_lease(&text).unwrap_or((modified, None));
                let started = if started == SystemTime::UNIX_EPOCH {
                    modified
                } else {
                    started
                };
                let refreshed = match ended {
                    // Ended long enough ago for its catalog entry to be
                    // in every listing: report it over, gc removes it.
                    Some(e) if now.duration_since(e).unwrap_or_default() > self.margin => {
                        SystemTime::UNIX_EPOCH
                    }
                    _ => modified,
                };
                out.push(Lease {
                    ended: ended.is_some(),
                    id: id.to_string(),
                    started,
                    refreshed,
                });
            }
            Ok(out)
        })
    }
}

/// `(started, ended)` from a lease body.
pub fn parse_lease(text: &str) -> Option<(SystemTime, Option<SystemTime>)> {
    let mut lines = text.lines();
    if lines.next()? != LEASE_MAGIC {
        return None;
    }
    let mut started = None;
    let mut ended = None;
    for l in lines {
        let (k, v) = l.split_once(' ')?;
        let t = || {
            v.parse::<u64>()
                .ok()
                .map(|n| SystemTime::UNIX_EPOCH + Duration::from_nanos(n))
        };
        match k {
            "started" => started = t(),
            "ended" => ended = t().filter(|x| *x != SystemTime::UNIX_EPOCH),
            _ => {}
        }
    }
    Some((started?, ended))
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl S3Store {
    fn write_lease(&self, id: &str, started: SystemTime, ended: Option<SystemTime>) -> Result<()> {
        let text = format!(
            "{LEASE_MAGIC}\nstarted {}\nended {}\npid {}\n",
            nanos(started),
            ended.map_or(0, nanos),
            std::process::id()
        );
        self.block(self.put(&format!("leases/{id}"), text.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_bodies_parse() {
        let (s, e) = parse_lease("roamdisk-lease 1\nstarted 2000000000\nended 0\npid 7\n").unwrap();
        assert_eq!(s, SystemTime::UNIX_EPOCH + Duration::from_secs(2));
        assert_eq!(e, None);
        let (_, e) = parse_lease("roamdisk-lease 1\nstarted 1\nended 3000000000\n").unwrap();
        assert_eq!(e, Some(SystemTime::UNIX_EPOCH + Duration::from_secs(3)));
        assert!(parse_lease("junk").is_none());
        assert!(parse_lease("roamdisk-lease 1\nended 1\n").is_none());
    }
}
