//! Where each packed object of a local store is: the packs loaded (by
//! number) and, per object, its pack, offset and length. Filled from the
//! packs' indexes by `packs.rs`; reset when a pack went away. No I/O.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{HashMap, HashSet};

use crate::hash::ChunkId;
use crate::store::pack::Entry;

/// Where a packed object is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    pub(super) pack: u32,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// The packs a store has loaded, and where each packed object is.
#[derive(Default)]
pub(super) struct PackTable(RwLock<Table>);

/// The packs loaded and where their objects are (behind [`PackTable`]'s
/// lock).
#[derive(Default)]
pub(super) struct Table {
    /// The packs folder has been read at least once.
    pub(super) scanned: bool,
    /// Pack names by number.
    pub(super) names: Vec<String>,
    pub(super) by_name: HashMap<String, u32>,
    /// One location per object (the first pack loaded that has it).
    pub(super) objects: HashMap<ChunkId, Loc>,
    /// Packs whose index could not be read (warned about once).
    pub(super) damaged: HashSet<String>,
}

impl Table {
    /// Add pack `name` with its entries (an object another loaded pack
    /// has keeps that place).
    pub(super) fn add(&mut self, name: String, entries: &[Entry]) {
        if self.by_name.contains_key(&name) {
            return;
        }
        let n = self.names.len() as u32;
        self.names.push(name.clone());
        self.by_name.insert(name, n);
        for e in entries {
            self.objects.entry(e.id).or_insert(Loc {
                pack: n,
                offset: e.offset,
                len: e.len,
            });
        }
    }

    /// Forget everything: the next lookup loads every pack again (a pack
    /// went away; objects it held may be in another one).
    pub(super) fn reset(&mut self) {
        let damaged = std::mem::take(&mut self.damaged);
        *self = Table {
            damaged,
            ..Table::default()
        };
    }
}

impl PackTable {
    /// The table, shared with other readers.
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Table> {
        self.0.read()
    }
    /// The table, to change.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.0.write()
    }
}
