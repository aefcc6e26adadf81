//! Catalog operations on a store: read a catalog, update it by
//! compare-and-swap (retrying when another commit got there first), and
//! resolve `USER/IMAGE[@REV]` to a version, and load a version package.

use crate::catalog::{Catalog, Entry};
use crate::chunk::Key;
use crate::error::{bad_arg, context, corrupt, not_found};
use crate::hash::ChunkId;
use crate::store::{check_ref_name, fetch, ref_tag, ChunkRead, RefStore};
use crate::version::Version;
use roamdisk_blockdev::Result;

/// Split `USER/IMAGE[@REV]` into the catalog name and the revision
/// (empty: latest).
pub fn split_target(s: &str) -> Result<(String, String)> {
    let (name, rev) = match s.split_once('@') {
        Some((n, r)) => (n, r),
        None => (s, ""),
    };
    check_ref_name(name)?;
    Ok((name.to_string(), rev.to_string()))
}

/// A catalog and the tag of the bytes it was read from (for CAS).
pub fn read_catalog<S: RefStore + ?Sized>(
    store: &S,
    name: &str,
) -> Result<(Catalog, Option<ChunkId>)> {
    match store.ref_get(name)? {
        None => Ok((Catalog::default(), None)),
        Some(b) => {
            let c = Catalog::parse(&b)
                .map_err(|e| context(e, format!("catalog {name} in store {}", store.describe())))?;
            Ok((c, Some(ref_tag(&b))))
        }
    }
}

/// Read an existing catalog; `not-found` naming it when there is none.
pub fn existing_catalog<S: RefStore + ?Sized>(store: &S, name: &str) -> Result<Catalog> {
    let (c, tag) = read_catalog(store, name)?;
    if tag.is_none() {
        return Err(not_found(format!(
            "there is no image {name} in store {} (see `roamdisk store info`)",
            store.describe()
        )));
    }
    Ok(c)
}

/// Apply `f` to a catalog and write it back atomically; retried from a
/// fresh read if another writer changed the catalog meanwhile. An empty
/// result deletes the catalog.
pub fn update_catalog<S, F>(store: &S, name: &str, mut f: F) -> Result<Catalog>
where
    S: RefStore + ?Sized,
    F: FnMut(&mut Catalog) -> Result<()>,
{
    for _ in 0..1000 {
        let (mut c, tag) = read_catalog(store, name)?;
        f(&mut c)?;
        c.generation += 1;
        let ok = if c.entries.is_empty() {
            store.ref_update(name, tag, None)?
        } else {
            store.ref_update(name, tag, Some(&c.encode()))?
        };
        if ok {
            return Ok(c);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(corrupt(format!(
        "catalog {name} keeps changing under us; try again"
    )))
}

/// Resolve `USER/IMAGE[@REV]` to its catalog entry.
pub fn resolve<S: RefStore + ?Sized>(store: &S, target: &str) -> Result<(String, Entry)> {
    let (name, rev) = split_target(target)?;
    let c = existing_catalog(store, &name)?;
    let e = c.resolve(&rev, &name)?.clone();
    Ok((name, e))
}

/// Reject a bare `USER/IMAGE@` with nothing after the `@`.
pub fn check_rev(target: &str) -> Result<()> {
    if target.ends_with('@') {
        return Err(bad_arg(format!(
            "'{target}': give a version, tag or date after '@', or leave '@' out for the latest"
        )));
    }
    Ok(())
}

/// Fetch, verify and decode a version package.
pub fn load_version<S: ChunkRead + ?Sized>(
    store: &S,
    id: &ChunkId,
    user_key: Option<&Key>,
) -> Result<Version> {
    let bytes = fetch(store, id, None).map_err(|e| context(e, format!("version {id}")))?;
    Version::decode(&bytes, user_key).map_err(|e| context(e, format!("version {id}")))
}
