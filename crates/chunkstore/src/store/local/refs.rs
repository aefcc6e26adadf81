//! Catalogs in a local store: `refs/USER/IMAGE`, one file each, replaced
//! whole by compare-and-swap under the lock `refs/.lock` (a new file
//! written and made durable under a temporary name, renamed into place,
//! then the folders synced).

use std::fs::{self, File};
use std::path::PathBuf;

use roamdisk_blockdev::durable::{sync_dir, write_then_rename};
use roamdisk_blockdev::{Op, Result};

use super::files::if_found;
use super::store::LocalStore;
use crate::error::{io, lock_exclusive};
use crate::hash::ChunkId;
use crate::store::api::{check_ref_name, ref_tag, RefStore};

impl LocalStore {
    /// The file of catalog `name` (checked).
    fn ref_path(&self, name: &str) -> Result<PathBuf> {
        check_ref_name(name)?;
        Ok(self.root.join("refs").join(name))
    }

    /// Hold the lock of every catalog update (until the file is dropped).
    fn refs_lock(&self) -> Result<File> {
        lock_exclusive(&self.root.join("refs").join(".lock"))
    }
}

impl RefStore for LocalStore {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let p = self.ref_path(name)?;
        if_found(fs::read(&p)).map_err(|e| io(Op::Read, e, &p))
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        let refs = self.root.join("refs");
        let mut out = Vec::new();
        for user in fs::read_dir(&refs).map_err(|e| io(Op::Read, e, &refs))? {
            let user = user.map_err(|e| io(Op::Read, e, &refs))?;
            if !user.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let un = user.file_name().to_string_lossy().to_string();
            for img in fs::read_dir(user.path()).map_err(|e| io(Op::Read, e, &user.path()))? {
                let img = img.map_err(|e| io(Op::Read, e, &refs))?;
                let name = format!("{un}/{}", img.file_name().to_string_lossy());
                if check_ref_name(&name).is_ok() {
                    out.push(name);
                }
            }
        }
        out.sort();
        Ok(out)
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        let p = self.ref_path(name)?;
        let _lock = self.refs_lock()?;
        let current = self.ref_get(name)?;
        if current.as_deref().map(ref_tag) != old {
            return Ok(false);
        }
        let dir = p.parent().expect("user folder");
        match new {
            Some(bytes) => {
                fs::create_dir_all(dir).map_err(|e| io(Op::Write, e, dir))?;
                let tmp = self.tmp_path("ref");
                write_then_rename(&p, &tmp, bytes).map_err(|e| {
                    let _ = fs::remove_file(&tmp);
                    io(Op::Write, e, &p).msg(format!("cannot write catalog {name}"))
                })?;
            }
            None => {
                if_found(fs::remove_file(&p)).map_err(|e| io(Op::Write, e, &p))?;
            }
        }
        sync_dir(dir).map_err(|e| io(Op::Flush, e, dir))?;
        let refs = self.root.join("refs");
        sync_dir(&refs).map_err(|e| io(Op::Flush, e, &refs))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::testing::store;
    use super::*;

    #[test]
    fn refs_compare_and_swap() {
        let (_d, s) = store();
        assert!(s.ref_update("a/b", None, Some(b"one")).unwrap());
        assert!(!s.ref_update("a/b", None, Some(b"two")).unwrap());
        assert!(s
            .ref_update("a/b", Some(ref_tag(b"one")), Some(b"two"))
            .unwrap());
        assert_eq!(s.ref_get("a/b").unwrap().unwrap(), b"two");
        assert_eq!(s.ref_list().unwrap(), vec!["a/b".to_string()]);
        assert!(s.ref_update("a/b", Some(ref_tag(b"two")), None).unwrap());
        assert_eq!(s.ref_get("a/b").unwrap(), None);
    }
}
