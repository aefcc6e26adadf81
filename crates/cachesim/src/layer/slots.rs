//! The cache layer's data structure: the state of every resident block
//! (its bytes, generation and filling ticket), the writes in flight, and
//! the counters per device, one [`Slots`] per shard of the engine, under
//! that shard's lock. Its methods are the per-block rules that keep the
//! cache equal to NEXT when reads and writes race (see the ordering in
//! the layer's module comment); the layer itself (`mod.rs`) does the I/O.

use std::sync::Arc;

use crate::index::FastMap;
use crate::policy::Outcome;

/// Bits of a key that hold the block number; the device number sits
/// above them. A key is thus [`shard_hint`](crate::sharded::shard_hint)`(device, block)` for every
/// device below 2^20 and block below 2^44 (64 PiB in 4 KiB blocks), which
/// is what the simulator hashes to pick a shard: a cache shared by several
/// devices picks the shards `roamdisk sim` picks for a trace of several.
pub(super) const BLOCK_BITS: u32 = 44;
/// Devices one cache can hold.
pub const MAX_DEVICES: u32 = 1 << (64 - BLOCK_BITS);

#[inline]
fn device_of(key: u64) -> usize {
    (key >> BLOCK_BITS) as usize
}

/// A [`BlockCache`]'s counters: over every device ([`CacheStats::totals`]),
/// or one device's share: its accesses, the evictions and trims of its
/// blocks, and its blocks resident now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, derive_more::AddAssign)]
pub struct DeviceStats {
    /// Block accesses (reads and writes) the policy found resident.
    pub hits: u64,
    /// Block accesses it did not (and admitted).
    pub misses: u64,
    /// Blocks evicted to admit others (a device's: its blocks evicted to
    /// admit a block of any device).
    pub evictions: u64,
    /// Resident blocks forgotten by a trim.
    pub trimmed: u64,
    /// Bytes of reads served from memory.
    pub bytes_from_cache: u64,
    /// Bytes the read path fetched from NEXT (whole blocks).
    pub bytes_from_next: u64,
    /// Blocks resident now.
    pub resident: u64,
}

/// A cached block's state.
pub(super) struct Slot {
    /// The block's bytes, equal to NEXT's; `None` while not yet fetched
    /// (or dropped by a write that could not patch it).
    pub(super) data: Option<Arc<[u8]>>,
    /// Changes whenever a write or a new admission makes earlier fetches
    /// of this block unfit to install.
    pub(super) gen: u64,
    /// The ticket of the read fetching this block now, if one is: later
    /// readers wait for it instead of reading NEXT too.
    pub(super) filling: Option<u64>,
}

/// What a read does about one block ([`Slots::read_step`]).
pub(super) enum ReadStep {
    /// Copy these bytes.
    Cached(Arc<[u8]>),
    /// Wait for the read fetching the block with this ticket.
    Wait(u64),
    /// Fetch the block from NEXT and install it with this ticket.
    Fetch(u64),
}

/// Writes of a block in flight.
struct InFlight {
    writers: u32,
    /// Another write of the block overlapped one of them.
    contended: bool,
}

/// The layer's part of a shard: the data of its resident blocks, by key.
#[derive(Default)]
pub struct Slots {
    pub(super) slots: FastMap<u64, Slot>,
    writing: FastMap<u64, InFlight>,
    next_gen: u64,
    /// Counters per device, indexed by device number.
    pub(super) devices: Vec<DeviceStats>,
}

impl Slots {
    /// A new generation.
    pub(super) fn gen(&mut self) -> u64 {
        self.next_gen += 1;
        self.next_gen
    }

    /// The counters of `key`'s device.
    #[inline]
    pub(super) fn dev(&mut self, key: u64) -> &mut DeviceStats {
        let d = device_of(key);
        if d >= self.devices.len() {
            self.devices.resize(d + 1, DeviceStats::default());
        }
        &mut self.devices[d]
    }

    /// Count an access's outcome and bring the slots in line with it;
    /// returns the evicted block's bytes, for the caller to reuse as a
    /// buffer.
    pub(super) fn admit(&mut self, key: u64, o: Outcome<u64>) -> Option<Arc<[u8]>> {
        let Outcome::Miss { evicted } = o else {
            self.dev(key).hits += 1;
            return None;
        };
        let me = self.dev(key);
        me.misses += 1;
        me.resident += 1;
        let old = evicted.and_then(|e| {
            let victim = self.dev(e);
            victim.evictions += 1;
            victim.resident -= 1;
            self.slots.remove(&e)?.data
        });
        let gen = self.gen();
        self.slots.insert(
            key,
            Slot {
                data: None,
                gen,
                filling: None,
            },
        );
        old
    }

    /// What a read does about `key`, just accessed: copy the cached
    /// bytes, or, not here yet, wait for the read fetching them, or fetch
    /// them itself (and mark the block as being filled with its ticket,
    /// unless a write of it is in flight: that fetch could not install
    /// then, so nobody should wait for it).
    #[inline]
    pub(super) fn read_step(&mut self, key: u64) -> ReadStep {
        let slot = self
            .slots
            .get_mut(&key)
            .expect("an accessed block has a slot");
        if let Some(data) = &slot.data {
            return ReadStep::Cached(data.clone());
        }
        let writing = self.writing.contains_key(&key);
        match slot.filling {
            Some(filler) if !writing => ReadStep::Wait(filler),
            _ => {
                if !writing {
                    slot.filling = Some(slot.gen);
                }
                ReadStep::Fetch(slot.gen)
            }
        }
    }

    /// Keep `data`, fetched from NEXT with `ticket`, as the bytes of `key`
    /// unless something made that fetch stale (a write began or a new
    /// admission happened since, or a write is in flight). Returns whether
    /// the fetch was marked as filling the block: its waiters must be woken.
    #[inline]
    pub(super) fn install(&mut self, key: u64, ticket: u64, data: Option<Arc<[u8]>>) -> bool {
        let writing = self.writing.contains_key(&key);
        let Some(slot) = self.slots.get_mut(&key) else {
            return false;
        };
        let filled = slot.filling == Some(ticket);
        if filled {
            slot.filling = None;
        }
        if !writing && slot.gen == ticket && slot.data.is_none() {
            slot.data = data;
        }
        filled
    }

    /// Register a write of `key` before it goes to NEXT, and make every
    /// fetch of the block that started earlier stale (it may have read the
    /// old bytes). Returns the write's generation, for [`Slots::end_write`].
    #[inline]
    pub(super) fn begin_write(&mut self, key: u64) -> u64 {
        let gen = self.gen();
        if let Some(s) = self.slots.get_mut(&key) {
            s.gen = gen;
        }
        self.writing
            .entry(key)
            .and_modify(|w| {
                w.writers += 1;
                w.contended = true;
            })
            .or_insert(InFlight {
                writers: 1,
                contended: false,
            });
        gen
    }

    /// The write of `key` that [`Slots::begin_write`] gave generation
    /// `my_gen` is over (`ok`: NEXT has its bytes): deregister it, make
    /// every fetch that overlapped it stale, and drop the cached bytes.
    /// Returns the slot and those old bytes when the write may install the
    /// block's new bytes: it succeeded, no other write of the block
    /// overlapped it, and nothing else changed the block meanwhile (with two
    /// overlapping writes NEXT holds whichever landed last, which the cache
    /// cannot know).
    #[inline]
    pub(super) fn end_write(
        &mut self,
        key: u64,
        my_gen: u64,
        ok: bool,
    ) -> Option<(&mut Slot, Option<Arc<[u8]>>)> {
        let sole = match self.writing.get_mut(&key) {
            Some(w) => {
                w.writers -= 1;
                let sole = !w.contended;
                if w.writers == 0 {
                    self.writing.remove(&key);
                }
                sole
            }
            None => false,
        };
        let gen = self.gen();
        let slot = self.slots.get_mut(&key)?;
        let fresh = ok && sole && slot.gen == my_gen;
        slot.gen = gen;
        let old = slot.data.take();
        fresh.then_some((slot, old))
    }
}
