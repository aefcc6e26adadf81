//! Catalog operations on a store: read a catalog, update it by
//! compare-and-swap (retrying when another commit got there first), and
//! resolve `USER/IMAGE[@REV]` to a version, and load a version package.
//! A long catalog's oldest entries are sealed into segment objects
//! (`catalog.rs`): [`update_catalog`] seals them as the catalog grows,
//! [`read_full`] loads them, [`update_full`] rewrites the whole list.

use crate::catalog::{
    encode_segment, load_segment_with, load_segments_with, segment_len, Catalog, Entry,
};
use crate::chunk::Key;
use crate::error::{bad_arg, context, corrupt, not_found};
use crate::hash::ChunkId;
use crate::store::{check_ref_name, fetch, ref_tag, ChunkRead, ChunkWrite, LeaseStore, RefStore};
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

/// Apply `f` to a catalog as its ref holds it (the newest entries, not
/// the sealed segments') and write it back atomically; retried from a
/// fresh read if another writer changed the catalog meanwhile. When the
/// ref reaches twice `catalog::segment_len()` entries, its oldest are sealed into a
/// segment object first (under a lease, so a gc keeps the new object), so
/// a commit's cost does not grow with the history. An empty result
/// deletes the catalog.
pub fn update_catalog<S, F>(store: &S, name: &str, mut f: F) -> Result<Catalog>
where
    S: RefStore + ChunkWrite + LeaseStore + ?Sized,
    F: FnMut(&mut Catalog) -> Result<()>,
{
    let mut lease = None;
    let out = until_swapped(name, || {
        let (mut c, tag) = read_catalog(store, name)?;
        f(&mut c)?;
        // The ref keeps the newest entries: if `f` took all of them,
        // the last segment's come back.
        while c.entries.is_empty() {
            let Some(g) = c.segments.pop() else { break };
            c.entries = load_segment_with(&g, name, |id| fetch(store, id, None))?;
        }
        let mut sealed_any = false;
        while c.seal_due() && store.ref_segments() {
            if lease.is_none() {
                lease = Some(store.lease_begin()?);
            }
            let (bytes, sealed) = c.seal_oldest();
            let id = put_segment(store, &bytes)?;
            c.add_segment(id, &sealed);
            sealed_any = true;
        }
        if let Some(l) = lease.as_ref().filter(|_| sealed_any) {
            named_safely(store, l)?;
        }
        write_back(store, name, c, tag)
    });
    if let Some(l) = lease {
        let _ = store.lease_end(&l.id);
    }
    out
}

/// Apply `f` to every entry of a catalog, oldest first (the segments'
/// loaded), and write the whole catalog back: the list is cut again into
/// segments of `catalog::segment_len()` entries (one that did not change
/// is the same object, stored once) and the newest, between one and two
/// segments' worth (less without segments), in the ref. Retried like [`update_catalog`];
/// an empty list deletes the catalog. For the rare changes of old entries
/// (`rm`, `tag`): its cost grows with the history.
pub fn update_full<S, F>(store: &S, name: &str, mut f: F) -> Result<Catalog>
where
    S: RefStore + ChunkWrite + LeaseStore + ?Sized,
    F: FnMut(&mut Vec<Entry>) -> Result<()>,
{
    let lease = store.lease_begin()?;
    let out = until_swapped(name, || {
        let (mut c, tag) = read_full(store, name)?;
        f(&mut c.entries)?;
        let all = std::mem::take(&mut c.entries);
        let seg = segment_len();
        let sealed = if all.len() >= 2 * seg && store.ref_segments() {
            (all.len() - seg) / seg
        } else {
            0
        };
        let mut rest = &all[..];
        for _ in 0..sealed {
            let (part, after) = rest.split_at(seg);
            let id = put_segment(store, &encode_segment(part))?;
            c.add_segment(id, part);
            rest = after;
        }
        c.entries = rest.to_vec();
        if sealed > 0 {
            named_safely(store, &lease)?;
        }
        write_back(store, name, c, tag)
    });
    let _ = store.lease_end(&lease.id);
    out
}

/// Run `attempt` (read, change, [`write_back`]) until its compare-and-swap
/// succeeds: the catalog written. Another writer got there first each
/// time it returns `None`.
fn until_swapped(
    name: &str,
    mut attempt: impl FnMut() -> Result<Option<Catalog>>,
) -> Result<Catalog> {
    for _ in 0..1000 {
        if let Some(c) = attempt()? {
            return Ok(c);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(corrupt(format!(
        "catalog {name} keeps changing under us; try again"
    )))
}

/// Write `c` over the catalog read with `tag` by compare-and-swap, its
/// generation one more (an empty catalog is deleted): `None` if another
/// writer changed it first.
fn write_back<S: RefStore + ?Sized>(
    store: &S,
    name: &str,
    mut c: Catalog,
    tag: Option<ChunkId>,
) -> Result<Option<Catalog>> {
    c.generation += 1;
    c.check_limits(name)?;
    let ok = if c.entries.is_empty() {
        store.ref_update(name, tag, None)?
    } else {
        store.ref_update(name, tag, Some(&c.encode()))?
    };
    Ok(ok.then_some(c))
}

/// Before a catalog naming new segment objects replaces the old one: make
/// them durable (a local store syncs their folder entries), and prove the
/// lease they were put under is still alive — a gc that took it for dead
/// may have removed them (the same rule as a commit's, `cas-store.md`).
fn named_safely<S: ChunkWrite + LeaseStore + ?Sized>(
    store: &S,
    lease: &crate::store::Lease,
) -> Result<()> {
    store.sync()?;
    store.lease_refresh(&lease.id).map_err(|e| {
        context(
            e,
            "the catalog's new segments were stored under a lease that is gone (a gc took it for dead); try again",
        )
    })
}

/// Store a segment object (plain, like a version package) and name it; one
/// already stored is touched instead, so a gc running now keeps it.
fn put_segment<S: ChunkWrite + ?Sized>(store: &S, bytes: &[u8]) -> Result<ChunkId> {
    crate::upload::put_plain_object(store, bytes, true)
}

/// Put the entries of `c`'s segments in front of its own (an entry listed
/// twice kept once, a tag on its newest holder: `catalog::flatten`) and
/// empty `c.segments`: the whole catalog, oldest first.
pub fn load_segments<S: ChunkRead + ?Sized>(store: &S, name: &str, c: &mut Catalog) -> Result<()> {
    load_segments_with(c, name, |id| fetch(store, id, None))
}

/// [`read_catalog`] with every entry: the segments' loaded.
pub fn read_full<S: RefStore + ChunkRead + ?Sized>(
    store: &S,
    name: &str,
) -> Result<(Catalog, Option<ChunkId>)> {
    let (mut c, tag) = read_catalog(store, name)?;
    load_segments(store, name, &mut c)?;
    Ok((c, tag))
}

/// [`existing_catalog`] with every entry: the segments' loaded.
pub fn existing_full<S: RefStore + ChunkRead + ?Sized>(store: &S, name: &str) -> Result<Catalog> {
    let mut c = existing_catalog(store, name)?;
    load_segments(store, name, &mut c)?;
    Ok(c)
}

/// Resolve `USER/IMAGE[@REV]` to its catalog entry. The latest version is
/// in the ref; anything else may be in a segment (loaded then).
pub fn resolve<S: RefStore + ChunkRead + ?Sized>(
    store: &S,
    target: &str,
) -> Result<(String, Entry)> {
    let (name, rev) = split_target(target)?;
    let mut c = existing_catalog(store, &name)?;
    if !(rev.is_empty() || rev == "latest") {
        load_segments(store, &name, &mut c)?;
    }
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
