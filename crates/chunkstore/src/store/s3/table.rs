//! Where each object an S3 store has seen is: the packs loaded (their
//! entries and times) and the loose objects listed. Filled by the listing
//! of `packs.rs`; a pack found gone is forgotten. No I/O.

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime};

use crate::hash::ChunkId;
use crate::store::pack::Entry;

/// Where a known object is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Where {
    Packed { pack: u32, offset: u64, len: u32 },
    Loose { len: u64 },
}

/// The packs and loose objects this process has seen.
#[derive(Default)]
pub(super) struct Table {
    pub(super) scanned: Option<Instant>,
    /// Pack names by number, with their entries and modification times.
    pub(super) names: Vec<String>,
    pub(super) entries: Vec<Vec<Entry>>,
    pub(super) modified: Vec<SystemTime>,
    pub(super) by_name: HashMap<String, u32>,
    /// Packs removed by a gc (their numbers stay, unused).
    pub(super) gone: HashSet<u32>,
    pub(super) objects: HashMap<ChunkId, Where>,
    pub(super) loose_modified: HashMap<ChunkId, SystemTime>,
    pub(super) damaged: HashSet<String>,
}

impl Table {
    /// Add pack `name`, its entries and time (an object another loaded
    /// pack has keeps that place).
    pub(super) fn add_pack(&mut self, name: String, entries: Vec<Entry>, modified: SystemTime) {
        if self.by_name.contains_key(&name) {
            return;
        }
        let n = self.names.len() as u32;
        for e in &entries {
            self.objects.entry(e.id).or_insert(Where::Packed {
                pack: n,
                offset: e.offset,
                len: e.len,
            });
        }
        self.by_name.insert(name.clone(), n);
        self.names.push(name);
        self.entries.push(entries);
        self.modified.push(modified);
    }

    /// Forget a pack (gone from the bucket): its objects may be in another.
    pub(super) fn forget_pack(&mut self, n: u32) {
        if !self.gone.insert(n) {
            return;
        }
        self.by_name.remove(&self.names[n as usize]);
        for e in std::mem::take(&mut self.entries[n as usize]) {
            if matches!(self.objects.get(&e.id), Some(Where::Packed { pack, .. }) if *pack == n) {
                self.objects.remove(&e.id);
                // Another loaded pack may hold it too.
                if let Some((m, x)) = self.entries.iter().enumerate().find_map(|(m, es)| {
                    es.binary_search_by_key(&e.id, |x| x.id)
                        .ok()
                        .map(|i| (m as u32, es[i]))
                }) {
                    self.objects.insert(
                        e.id,
                        Where::Packed {
                            pack: m,
                            offset: x.offset,
                            len: x.len,
                        },
                    );
                }
            }
        }
    }
}
