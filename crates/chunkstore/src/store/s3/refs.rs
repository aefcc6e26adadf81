//! Catalogs in an S3 store: no object is ever overwritten. Each update of
//! `USER/IMAGE` is a new object `refs/USER/IMAGE/GEN-RANDOM` (GEN: 16 hex
//! digits, one more than the generation it was made from; RANDOM: 16 hex
//! digits) holding the whole catalog, or nothing for a deletion. The
//! catalog is the newest generation; two updates made from the same
//! generation (two commits at once, or a reader whose listing lagged) are
//! both kept and read as their union, so a commit's version is never lost.
//! Removed versions are recorded by tombstones (`removed/HEX`) so that a
//! merge cannot bring them back, and every update is also copied to
//! `at/GEN`, which a reader finds by key when a listing lags. Layout and
//! argument: `docs/formats/cas-s3.md`. The naming, grouping and merging
//! are pure functions (fuzzed: `fuzz/fuzz_targets/cas_s3_names.rs`); the
//! store's [`RefStore`] is built on them.

use std::collections::HashSet;
use std::time::SystemTime;

use object_store::ObjectStoreExt;
use roamdisk_blockdev::{Op, Result};

use super::bridge::{is_not_found, random_u64};
use super::store::S3Store;
use crate::catalog::{load_segments_with, Catalog, Entry};
use crate::error::context;
use crate::hash::ChunkId;
use crate::store::api::{check_ref_name, fetch, ref_tag, RefStore};

/// One stored update of a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefObject {
    pub generation: u64,
    /// `GEN-RANDOM`.
    pub name: String,
    pub size: u64,
    pub modified: SystemTime,
}

/// `GEN-RANDOM` → its generation, if the name has that shape.
pub fn parse_name(n: &str) -> Option<u64> {
    let (g, r) = n.split_once('-')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(g, 16) || !hex(r, 16) {
        return None;
    }
    u64::from_str_radix(g, 16).ok()
}

/// The name of a new update at `generation`.
pub fn new_name(generation: u64, random: u64) -> String {
    format!("{generation:016x}-{random:016x}")
}

/// The updates of every catalog, by `USER/IMAGE`, and the `at/GEN`
/// copies (key, generation), from a listing of `refs/` (relative keys,
/// sizes, times). Other keys (`removed/` tombstones) are left out.
#[allow(clippy::type_complexity)]
pub fn group(
    listing: Vec<(String, u64, SystemTime)>,
) -> (
    std::collections::HashMap<String, Vec<RefObject>>,
    std::collections::HashMap<String, Vec<(String, u64)>>,
) {
    let mut updates: std::collections::HashMap<String, Vec<RefObject>> = Default::default();
    let mut copies: std::collections::HashMap<String, Vec<(String, u64)>> = Default::default();
    for (rel, size, modified) in listing {
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.first() != Some(&"refs") {
            continue;
        }
        let name = || format!("{}/{}", parts[1], parts[2]);
        if parts.len() == 5 && parts[3] == "at" {
            if let Ok(g) = u64::from_str_radix(parts[4], 16) {
                copies.entry(name()).or_default().push((rel.clone(), g));
            }
        } else if parts.len() == 4 {
            if let Some(generation) = parse_name(parts[3]) {
                updates.entry(name()).or_default().push(RefObject {
                    generation,
                    name: parts[3].to_string(),
                    size,
                    modified,
                });
            }
        }
    }
    (updates, copies)
}

/// The updates of the newest generation (several after concurrent
/// updates), sorted by name; empty if there are none.
pub fn heads(objects: &[RefObject]) -> Vec<&RefObject> {
    let Some(top) = objects.iter().map(|o| o.generation).max() else {
        return Vec::new();
    };
    let mut h: Vec<&RefObject> = objects.iter().filter(|o| o.generation == top).collect();
    h.sort_by(|a, b| a.name.cmp(&b.name));
    h
}

/// The catalog that the bodies of the newest generation's updates make
/// (`None`: the catalog was deleted). One body is returned as it is;
/// several are merged: every version any of them has (by id, in order of
/// creation), a tag kept on the newest version that carries it, the
/// generation the highest. An empty body (a deletion) merged with a
/// catalog adds nothing: the catalog stays.
pub fn merge(name: &str, bodies: &[Vec<u8>]) -> Result<Option<Vec<u8>>> {
    let live: Vec<&Vec<u8>> = bodies.iter().filter(|b| !b.is_empty()).collect();
    match live.len() {
        0 => return Ok(None),
        1 => return Ok(Some(live[0].clone())),
        _ => {}
    }
    let mut merged = Catalog::default();
    let mut all: Vec<Entry> = Vec::new();
    for b in &live {
        let c = Catalog::parse(b).map_err(|e| context(e, format!("catalog {name}")))?;
        merged.generation = merged.generation.max(c.generation);
        // Catalogs are stored here without segments (`ref_update` unseals
        // them); should a body list some, none is dropped.
        for g in c.segments {
            if !merged.segments.iter().any(|x| x.id == g.id) {
                merged.segments.push(g);
            }
        }
        for e in c.entries {
            match all.iter_mut().find(|x| x.version == e.version) {
                Some(x) => {
                    for t in e.tags {
                        if !x.tags.contains(&t) {
                            x.tags.push(t);
                        }
                    }
                }
                None => all.push(e),
            }
        }
    }
    all.sort_by_key(|e| (e.created, e.version));
    merged.segments.sort_by_key(|g| (g.first, g.last, g.id));
    // A tag names one version: the newest that carries it.
    for i in (0..all.len()).rev() {
        let tags = all[i].tags.clone();
        for t in tags {
            for x in all[..i].iter_mut() {
                x.tags.retain(|y| *y != t);
            }
        }
    }
    merged.entries = all;
    tracing::warn!(
        catalog = name,
        updates = live.len(),
        "concurrent updates of a catalog were merged (every version of each is kept)"
    );
    Ok(Some(merged.encode()))
}

impl S3Store {
    /// Every update of catalog `name` (`refs/USER/IMAGE/GEN-RANDOM`) and
    /// its removed versions (`refs/USER/IMAGE/removed/HEX`).
    async fn ref_objects(&self, name: &str) -> Result<(Vec<RefObject>, HashSet<ChunkId>)> {
        let mut objs = Vec::new();
        let mut removed = HashSet::new();
        for (rel, size, modified) in self.list(&format!("refs/{name}")).await? {
            let Some(tail) = rel.strip_prefix(&format!("refs/{name}/")) else {
                continue;
            };
            if let Some(hex) = tail.strip_prefix("removed/") {
                if let Some(id) = ChunkId::from_hex(hex) {
                    removed.insert(id);
                }
            } else if let Some(generation) = parse_name(tail) {
                objs.push(RefObject {
                    generation,
                    name: tail.to_string(),
                    size,
                    modified,
                });
            }
        }
        Ok((objs, removed))
    }

    /// The current catalog of `name` (merged from concurrent updates,
    /// without removed versions) and its generation.
    async fn ref_head(&self, name: &str) -> Result<(Option<Vec<u8>>, u64)> {
        let (objs, removed) = self.ref_objects(name).await?;
        let heads = heads(&objs);
        let mut generation = heads.first().map_or(0, |h| h.generation);
        let mut bodies = Vec::new();
        for h in heads {
            if h.size == 0 {
                bodies.push(Vec::new());
                continue;
            }
            bodies.push(
                self.get_bytes(
                    &format!("refs/{name}/{}", h.name),
                    &format!("catalog {name}"),
                )
                .await?,
            );
        }
        // A listing may miss the newest updates (a container replica that
        // missed them): follow the per-generation copies by key, which a
        // GET sees as soon as their PUT returned.
        loop {
            let at = format!("refs/{name}/at/{:016x}", generation + 1);
            match self.os.get(&self.key(&at)).await {
                Ok(r) => {
                    let b = r
                        .bytes()
                        .await
                        .map_err(|e| self.fail(e, Op::Read, &format!("catalog {name}")))?;
                    generation += 1;
                    bodies = vec![b.to_vec()];
                }
                Err(e) if is_not_found(&e) => break,
                Err(e) => return Err(self.fail(e, Op::Read, &format!("catalog {name}"))),
            }
        }
        if bodies.is_empty() {
            return Ok((None, 0));
        }
        let merged = merge(name, &bodies)?;
        let merged = match merged {
            Some(b) if !removed.is_empty() => {
                let mut c = Catalog::parse(&b)?;
                if !c.segments.is_empty() {
                    // Not written here (see `ref_update`): left as it is.
                    return Ok((Some(b), generation));
                }
                let n = c.entries.len();
                c.entries.retain(|e| !removed.contains(&e.version));
                if c.entries.len() == n {
                    Some(b)
                } else if c.entries.is_empty() {
                    None
                } else {
                    Some(c.encode())
                }
            }
            other => other,
        };
        Ok((merged, generation))
    }
}

impl RefStore for S3Store {
    fn ref_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_ref_name(name)?;
        Ok(self.block(self.ref_head(name))?.0)
    }
    fn ref_list(&self) -> Result<Vec<String>> {
        let (by_name, _) = group(self.block(self.list("refs"))?);
        let mut names: Vec<String> = by_name
            .into_iter()
            .filter(|(_, objs)| heads(objs).iter().any(|h| h.size > 0))
            .map(|(n, _)| n)
            .collect();
        names.sort();
        Ok(names)
    }
    /// Catalogs stay whole: concurrent updates are merged entry by entry.
    fn ref_segments(&self) -> bool {
        false
    }
    fn ref_update(&self, name: &str, old: Option<ChunkId>, new: Option<&[u8]>) -> Result<bool> {
        check_ref_name(name)?;
        // A catalog with segments is kept whole here: its segments' entries
        // are put back in front of its own (the segment objects become
        // garbage for gc). Concurrent updates are merged entry by entry,
        // which segments would defeat (`cas-s3.md`).
        let unsealed;
        let new = match new.map(Catalog::parse).transpose()? {
            Some(mut c) if !c.segments.is_empty() => {
                load_segments_with(&mut c, name, |id| fetch(self, id, None))?;
                c.check_limits(name)?;
                unsealed = c.encode();
                Some(&unsealed[..])
            }
            _ => new,
        };
        self.block(async {
            let (cur, generation) = self.ref_head(name).await?;
            if cur.as_deref().map(ref_tag) != old {
                return Ok(false);
            }
            // Versions this update removes are recorded first, so that a
            // concurrent update made from an older catalog cannot bring
            // them back (gc may free their chunks).
            if let Some(cur) = &cur {
                let keep: HashSet<ChunkId> = match new {
                    Some(b) => Catalog::parse(b)?
                        .entries
                        .iter()
                        .map(|e| e.version)
                        .collect(),
                    None => HashSet::new(),
                };
                for e in Catalog::parse(cur)?.entries {
                    if !keep.contains(&e.version) {
                        self.put(
                            &format!("refs/{name}/removed/{}", e.version.to_hex()),
                            Vec::new(),
                        )
                        .await?;
                    }
                }
            }
            let rel = format!("refs/{name}/{}", new_name(generation + 1, random_u64()?));
            let body = new.map(<[u8]>::to_vec).unwrap_or_default();
            self.put(&rel, body.clone()).await?;
            // The same catalog under a key readers can find without a
            // listing (overwritten if two updates race; the unique object
            // above keeps both for the merge).
            self.put(&format!("refs/{name}/at/{:016x}", generation + 1), body)
                .await?;
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ChunkId;

    fn entry(v: u8, created: i64, tags: &[&str]) -> Entry {
        Entry {
            version: ChunkId([v; 32]),
            parent: None,
            created,
            disk_size: 1 << 20,
            encrypted: false,
            new_objects: 1,
            reused_objects: 0,
            uploaded_bytes: 1,
            data_bytes: 1,
            description: format!("v{v}"),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn obj(g: u64, r: u64) -> RefObject {
        RefObject {
            generation: g,
            name: new_name(g, r),
            size: 1,
            modified: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn names_parse_and_the_newest_generation_is_the_head() {
        assert_eq!(parse_name(&new_name(42, 7)), Some(42));
        for bad in [
            "",
            "x",
            "0000000000000001",
            "000000000000001-0000000000000007",
            "000000000000000g-0000000000000007",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        let objs = vec![obj(1, 5), obj(3, 9), obj(2, 1), obj(3, 2)];
        let h: Vec<&str> = heads(&objs).iter().map(|o| o.name.as_str()).collect();
        assert_eq!(h, [new_name(3, 2), new_name(3, 9)]);
        assert!(heads(&[]).is_empty());
    }

    #[test]
    fn a_listing_is_grouped_by_catalog() {
        let t = SystemTime::UNIX_EPOCH;
        let l = |k: &str| (k.to_string(), 5u64, t);
        let (u, c) = group(vec![
            l(&format!("refs/a/vm/{}", new_name(1, 2))),
            l(&format!("refs/a/vm/{}", new_name(2, 3))),
            l("refs/a/vm/at/0000000000000002"),
            l("refs/a/vm/removed/00"),
            l(&format!("refs/b/x/{}", new_name(7, 1))),
            l("refs/a/vm/junk"),
            l("packs/x"),
        ]);
        assert_eq!(u["a/vm"].len(), 2);
        assert_eq!(u["b/x"][0].generation, 7);
        assert_eq!(u.len(), 2);
        assert_eq!(
            c["a/vm"],
            [("refs/a/vm/at/0000000000000002".to_string(), 2)]
        );
    }

    /// Bodies that list segments (not written by this store, which
    /// unseals them): the merge drops no segment and no entry, lists a
    /// segment both name once, and readers keep each version once.
    #[test]
    fn a_merge_lists_every_segment_once() {
        let mut base = Catalog {
            generation: 4,
            segments: Vec::new(),
            entries: (1..=4).map(|v| entry(v, v as i64 * 10, &[])).collect(),
        };
        let old = crate::catalog::SegmentRef {
            id: ChunkId([0x77; 32]),
            count: 2,
            first: 1,
            last: 2,
        };
        base.segments.push(old);
        let mut sealer = base.clone();
        let sealed: Vec<Entry> = sealer.entries.drain(..2).collect();
        sealer.add_segment(ChunkId([0x88; 32]), &sealed);
        sealer.entries.push(entry(5, 50, &[]));
        let mut other = base.clone();
        other.entries.push(entry(6, 60, &[]));
        let m = merge("u/i", &[sealer.encode(), other.encode()])
            .unwrap()
            .unwrap();
        let m = Catalog::parse(&m).unwrap();
        let ids: Vec<ChunkId> = m.segments.iter().map(|g| g.id).collect();
        assert_eq!(ids, [ChunkId([0x77; 32]), ChunkId([0x88; 32])]);
        let v: Vec<u8> = m.entries.iter().map(|e| e.version.0[0]).collect();
        assert_eq!(v, [1, 2, 3, 4, 5, 6]);
        let whole = crate::catalog::flatten(vec![sealed, m.entries.clone()]);
        let v: Vec<u8> = whole.iter().map(|e| e.version.0[0]).collect();
        assert_eq!(v, [1, 2, 3, 4, 5, 6], "each version once");
    }

    #[test]
    fn concurrent_updates_merge_into_a_union_and_a_deletion_does_not_hide_a_commit() {
        let base = vec![entry(1, 10, &["stable"])];
        let mut a = Catalog {
            generation: 2,
            segments: Vec::new(),
            entries: base.clone(),
        };
        a.entries.push(entry(2, 20, &[]));
        let mut b = Catalog {
            generation: 2,
            segments: Vec::new(),
            entries: base,
        };
        b.entries.push(entry(3, 30, &["stable"]));
        let m = merge("u/i", &[a.encode(), b.encode(), Vec::new()])
            .unwrap()
            .unwrap();
        let m = Catalog::parse(&m).unwrap();
        let ids: Vec<u8> = m.entries.iter().map(|e| e.version.0[0]).collect();
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(m.generation, 2);
        // The tag stays on the newest version that has it.
        assert!(m.entries[0].tags.is_empty());
        assert_eq!(m.entries[2].tags, ["stable"]);
        // One body is passed through; only deletions: gone.
        assert_eq!(merge("u/i", &[a.encode()]).unwrap().unwrap(), a.encode());
        assert_eq!(merge("u/i", &[Vec::new(), Vec::new()]).unwrap(), None);
        // A damaged body stops the merge with its catalog's name.
        let e = merge("u/i", &[a.encode(), b"junk".to_vec()]).unwrap_err();
        assert!(e.to_string().contains("u/i"), "{e}");
    }
}
