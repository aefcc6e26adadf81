//! Single objects put at the same time from several threads (the uploads
//! a chunk server receives) go up together as one pack, one request
//! instead of one each: the first waits [`GATHER`] for others, stores
//! them, and wakes them; every put returns only once its batch is stored.
//! How a batch is stored is the caller's (`objects.rs`).

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::time::Duration;

use roamdisk_blockdev::{ErrorKind, Op, Result};

use crate::error::err;
use crate::hash::ChunkId;

/// How long the first of several single puts waits for others to join
/// its pack.
const GATHER: Duration = Duration::from_millis(5);

/// The most bytes of objects one batch gathers.
pub(super) const BATCH_BYTES: usize = 32 << 20;

/// The single puts being gathered ([`Batcher::put`]).
#[derive(Default)]
pub(super) struct Batcher {
    state: Mutex<Gathering>,
    cv: Condvar,
}

/// Objects gathered, as (id, bytes).
pub(super) type Gathered = Vec<(ChunkId, Vec<u8>)>;

#[derive(Default)]
struct Gathering {
    /// The batch open to newcomers: its number and objects.
    open: Option<(u64, Gathered)>,
    next: u64,
    /// Uploaded batches whose waiters have not all seen the outcome:
    /// number → (the error, if it failed; waiters left).
    done: HashMap<u64, (Option<(ErrorKind, String)>, usize)>,
}

impl Batcher {
    /// Store one object, gathered with others put at the same moment: the
    /// first of a batch waits [`GATHER`], then hands the batch to `store`
    /// and wakes the others, who return the batch's outcome.
    pub(super) fn put(
        &self,
        id: ChunkId,
        bytes: &[u8],
        store: impl FnOnce(&Gathered) -> Result<()>,
    ) -> Result<()> {
        let b = self;
        let mut st = b.state.lock();
        let (n, leader) = match &mut st.open {
            // A full batch takes no more: this one goes up on its own (a
            // pack stays well under what one PUT carries in its timeout).
            Some((_, items))
                if items.iter().map(|(_, b)| b.len()).sum::<usize>() + bytes.len()
                    > BATCH_BYTES =>
            {
                drop(st);
                return store(&vec![(id, bytes.to_vec())]);
            }
            Some((n, items)) => {
                items.push((id, bytes.to_vec()));
                (*n, false)
            }
            None => {
                let n = st.next;
                st.next += 1;
                st.open = Some((n, vec![(id, bytes.to_vec())]));
                (n, true)
            }
        };
        if !leader {
            loop {
                if let Some(d) = st.done.get_mut(&n) {
                    d.1 -= 1;
                    let failed = d.0.clone();
                    if d.1 == 0 {
                        st.done.remove(&n);
                    }
                    return match failed {
                        None => Ok(()),
                        Some((kind, msg)) => Err(err(kind, Op::Write, msg)),
                    };
                }
                b.cv.wait(&mut st);
            }
        }
        drop(st);
        std::thread::sleep(GATHER);
        let items = {
            let mut st = b.state.lock();
            st.open.take().expect("the leader's batch").1
        };
        let r = store(&items);
        let mut st = b.state.lock();
        if items.len() > 1 {
            let failed = r.as_ref().err().map(|e| (e.kind(), e.to_string()));
            st.done.insert(n, (failed, items.len() - 1));
            b.cv.notify_all();
        }
        r
    }
}
