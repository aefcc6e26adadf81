//! Leases in a local store: a commit in progress is a file `leases/ID`
//! whose body says when it started; refreshing it sets its modification
//! time (its last sign of life), ending it removes it.

use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use roamdisk_blockdev::durable::{sync_dir, write_then_rename};
use roamdisk_blockdev::{Op, Result};

use super::files::{if_found, touch};
use super::store::LocalStore;
use crate::error::io;
use crate::store::api::{Lease, LeaseStore};

/// Lease body's first line.
const LEASE_MAGIC: &str = "roamdisk-lease 1";

fn system_time_from_nanos(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n)
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl LeaseStore for LocalStore {
    fn lease_begin(&self) -> Result<Lease> {
        let mut r = [0u8; 12];
        crate::secret::fill_random(&mut r, "a lease id")?;
        let id: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let started = SystemTime::now();
        let p = self.root.join("leases").join(&id);
        let tmp = self.tmp_path("lease");
        let text = format!(
            "{LEASE_MAGIC}\nstarted {}\npid {}\n",
            nanos(started),
            std::process::id()
        );
        write_then_rename(&p, &tmp, text.as_bytes()).map_err(|e| io(Op::Write, e, &p))?;
        let d = self.root.join("leases");
        sync_dir(&d).map_err(|e| io(Op::Flush, e, &d))?;
        Ok(Lease::new(id, started))
    }
    fn lease_refresh(&self, id: &str) -> Result<()> {
        let p = self.root.join("leases").join(id);
        touch(&p).map_err(|e| io(Op::Write, e, &p).msg(format!("lease {id} vanished (a gc took it for dead: its commit was idle longer than the lease timeout)")))
    }
    fn lease_end(&self, id: &str) -> Result<()> {
        let p = self.root.join("leases").join(id);
        if_found(fs::remove_file(&p))
            .map(drop)
            .map_err(|e| io(Op::Write, e, &p))
    }
    fn leases(&self) -> Result<Vec<Lease>> {
        let d = self.root.join("leases");
        let mut out = Vec::new();
        for ent in fs::read_dir(&d).map_err(|e| io(Op::Read, e, &d))? {
            let ent = ent.map_err(|e| io(Op::Read, e, &d))?;
            let id = ent.file_name().to_string_lossy().to_string();
            let Ok(text) = fs::read_to_string(ent.path()) else {
                continue;
            };
            let Ok(m) = ent.metadata() else { continue };
            let refreshed = m.modified().unwrap_or(UNIX_EPOCH);
            let mut lines = text.lines();
            let started = if lines.next() == Some(LEASE_MAGIC) {
                lines
                    .find_map(|l| l.strip_prefix("started "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .map(system_time_from_nanos)
            } else {
                None
            };
            // An unreadable lease is treated as taken at its file time.
            out.push(Lease {
                ended: false,
                id,
                started: started.unwrap_or(refreshed).min(refreshed),
                refreshed,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::testing::store;
    use super::*;

    #[test]
    fn leases_list_and_end() {
        let (_d, s) = store();
        let l = s.lease_begin().unwrap();
        let all = s.leases().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].id, l.id);
        assert!(all[0].started <= all[0].refreshed);
        s.lease_refresh(&l.id).unwrap();
        s.lease_end(&l.id).unwrap();
        assert!(s.leases().unwrap().is_empty());
    }
}
