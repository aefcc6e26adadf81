//! `roamdisk store verify`: read every object and check it against its
//! name; then check that every version of every catalog has its package
//! and every object the package references.

use std::collections::HashSet;

use rayon::prelude::*;
use roamdisk_blockdev::progress::Unit;
use roamdisk_blockdev::{Progress, Result};
use serde::Serialize;

use crate::hash::ChunkId;
use crate::repo::read_full;
use crate::store::{fetch, ChunkPrune, RefStore};
use crate::version::Version;

/// What [`verify`] found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Objects read.
    pub objects: usize,
    /// Objects that do not match their name, or cannot be read: `ID: why`.
    pub bad: Vec<String>,
    /// Versions checked.
    pub versions: u64,
    /// Versions whose package or objects are missing, one line each.
    pub missing: Vec<String>,
}

impl VerifyReport {
    /// Nothing damaged, nothing missing.
    pub fn ok(&self) -> bool {
        self.bad.is_empty() && self.missing.is_empty()
    }
}

/// Objects read and checked together.
const BATCH: usize = 256;

/// Verify every object of `store`, then every version's completeness.
pub fn verify<S: ChunkPrune + RefStore + ?Sized>(
    store: &S,
    progress: &dyn Progress,
) -> Result<VerifyReport> {
    let mut ids = Vec::new();
    store.list_objects(&mut |e| ids.push(e.id))?;
    progress.start("verifying", ids.len() as u64, Unit::Items);
    let codec = store.config().codec();
    let bad: Vec<String> = ids
        .par_chunks(BATCH)
        .flat_map_iter(|part| {
            let got = store.get_many(part);
            let out: Vec<String> = part
                .iter()
                .zip(got)
                .filter_map(
                    |(id, r)| match r.and_then(|b| codec.verify(id, &b).map(|_| ())) {
                        Ok(()) => None,
                        Err(e) => Some(format!("{id}: {e}")),
                    },
                )
                .collect();
            progress.advance(part.len() as u64);
            out
        })
        .collect();
    // Every version's package, and every object it references, must be
    // in the store.
    let present: HashSet<ChunkId> = ids.iter().copied().collect();
    let mut r = VerifyReport {
        objects: ids.len(),
        bad,
        ..Default::default()
    };
    for name in store.ref_list()? {
        let (cat, _) = read_full(store, &name)?;
        for e in &cat.entries {
            r.versions += 1;
            let at = format!("version {} of {name}", e.version.short());
            if !present.contains(&e.version) {
                r.missing
                    .push(format!("{at}: its package {} is missing", e.version));
                continue;
            }
            let refs = fetch(store, &e.version, None).and_then(|pkg| Version::references_of(&pkg));
            // A damaged package is already among the bad objects.
            if let Ok(refs) = refs {
                let gone: Vec<&ChunkId> = refs.iter().filter(|r| !present.contains(r)).collect();
                if let Some(first) = gone.first() {
                    r.missing.push(format!(
                        "{at}: {} of its {} objects are missing (first: {first})",
                        gone.len(),
                        refs.len()
                    ));
                }
            }
        }
    }
    progress.end();
    Ok(r)
}
