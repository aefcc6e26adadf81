//! `roamdisk store info`: what a store holds — objects, bytes, versions,
//! deduplication — and what each user's versions use.

use std::collections::{HashMap, HashSet};

use roamdisk_blockdev::Result;
use serde::Serialize;

use crate::hash::ChunkId;
use crate::repo::read_full;
use crate::store::{fetch, ChunkPrune, RefStore};
use crate::version::{Header, Version};

/// One user's share of a store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UserUsage {
    pub user: String,
    pub images: u64,
    pub versions: u64,
    /// The data bytes of their versions' disks.
    pub logical_bytes: u64,
    /// Stored bytes their versions reference.
    pub referenced_bytes: u64,
    /// Of those, referenced by no other user's versions.
    pub unshared_bytes: u64,
}

/// What a store holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreUsage {
    pub store: String,
    pub hash: String,
    pub compression: String,
    pub quota: Option<u64>,
    pub objects: usize,
    pub stored_bytes: u64,
    pub versions: u64,
    pub version_packages: u64,
    pub referenced_bytes: u64,
    pub unreferenced_bytes: u64,
    pub logical_bytes: u64,
    pub dedup_ratio: f64,
    pub users: Vec<UserUsage>,
    /// Versions whose package cannot be read: `USER/IMAGE@ID: why`.
    pub unreadable_versions: Vec<String>,
}

/// Count what `store` holds and what each user's versions reference.
pub fn usage<S: ChunkPrune + RefStore + ?Sized>(store: &S) -> Result<StoreUsage> {
    let mut sizes: HashMap<ChunkId, u64> = HashMap::new();
    store.list_objects(&mut |e| {
        sizes.insert(e.id, e.size);
    })?;
    let mut users: HashMap<String, (UserUsage, HashSet<ChunkId>)> = HashMap::new();
    let mut all_refs: HashMap<ChunkId, HashSet<String>> = HashMap::new();
    let mut u = StoreUsage::default();
    for name in store.ref_list()? {
        let (cat, _) = read_full(store, &name)?;
        let user = name.split('/').next().unwrap_or("").to_string();
        let (uu, refs) = users.entry(user.clone()).or_insert_with(|| {
            (
                UserUsage {
                    user: user.clone(),
                    ..Default::default()
                },
                HashSet::new(),
            )
        });
        uu.images += 1;
        for e in &cat.entries {
            u.versions += 1;
            uu.versions += 1;
            uu.logical_bytes += e.data_bytes;
            u.logical_bytes += e.data_bytes;
            let pkg = match fetch(store, &e.version, None) {
                Ok(p) => p,
                Err(err) => {
                    u.unreadable_versions
                        .push(format!("{name}@{}: {err}", e.version.short()));
                    continue;
                }
            };
            u.version_packages += 1;
            refs.insert(e.version);
            all_refs.entry(e.version).or_default().insert(user.clone());
            let _ = Header::parse(&pkg)?;
            for r in Version::references_of(&pkg)? {
                refs.insert(r);
                all_refs.entry(r).or_default().insert(user.clone());
            }
        }
    }
    let size_of = |ids: &mut dyn Iterator<Item = &ChunkId>| -> u64 {
        ids.filter_map(|id| sizes.get(id)).sum()
    };
    u.referenced_bytes = size_of(&mut all_refs.keys());
    let mut names: Vec<String> = users.keys().cloned().collect();
    names.sort();
    for n in names {
        let (mut uu, refs) = users.remove(&n).expect("listed");
        uu.referenced_bytes = size_of(&mut refs.iter());
        uu.unshared_bytes = size_of(
            &mut refs
                .iter()
                .filter(|id| all_refs.get(id).is_some_and(|s| s.len() == 1)),
        );
        u.users.push(uu);
    }
    let cfg = store.config();
    u.store = store.describe();
    u.hash = cfg.hash.name().to_string();
    u.compression = cfg.compression_name();
    u.quota = cfg.quota;
    u.objects = sizes.len();
    u.stored_bytes = sizes.values().sum();
    u.unreferenced_bytes = u.stored_bytes.saturating_sub(u.referenced_bytes);
    u.dedup_ratio = u.logical_bytes as f64 / u.referenced_bytes.max(1) as f64;
    Ok(u)
}
