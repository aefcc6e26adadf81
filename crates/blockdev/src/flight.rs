//! Single flight: one fetch per key at a time. The first caller to
//! [`SingleFlight::join`] a key leads (it does the work and lands the
//! result); callers that join while it works wait for it and get a copy.
//! A lead dropped without landing (an error, a panic) lands as failed, so
//! no waiter waits forever; each then fetches for itself and reports its
//! own error. The one mechanism for "many readers of one missing block"
//! (a version view's chunks, a cache layer's blocks).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Fetches under way, by key.
pub struct SingleFlight<K, V> {
    flights: Mutex<HashMap<K, Arc<Flight<V>>>>,
}

/// One fetch under way: `None` until landed, then its result (`None`: it
/// failed).
struct Flight<V> {
    done: Mutex<Option<Option<V>>>,
    cv: Condvar,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

/// What [`SingleFlight::join`] made of a caller.
pub enum Joined<'a, K: Hash + Eq + Clone, V: Clone> {
    /// Nobody fetches the key: this caller does, and lands the result.
    Lead(Lead<'a, K, V>),
    /// Someone does: wait for it.
    Wait(Waiter<V>),
}

/// What [`SingleFlight::join_many`] made of a caller: the leads of the
/// keys nobody fetched, and waiters for the others.
pub type JoinedMany<'a, K, V> = (Vec<Lead<'a, K, V>>, Vec<(K, Waiter<V>)>);

/// The right and duty to fetch one key.
pub struct Lead<'a, K: Hash + Eq + Clone, V: Clone> {
    owner: &'a SingleFlight<K, V>,
    key: K,
    flight: Option<Arc<Flight<V>>>,
}

/// A fetch someone else leads.
pub struct Waiter<V> {
    flight: Arc<Flight<V>>,
}

impl<K: Hash + Eq + Clone, V: Clone> SingleFlight<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Lead the fetch of `key`, or wait for the one under way.
    pub fn join(&self, key: K) -> Joined<'_, K, V> {
        let mut m = self.flights.lock();
        match m.get(&key) {
            Some(f) => Joined::Wait(Waiter { flight: f.clone() }),
            None => {
                let f = Arc::new(Flight {
                    done: Mutex::new(None),
                    cv: Condvar::new(),
                });
                m.insert(key.clone(), f.clone());
                Joined::Lead(Lead {
                    owner: self,
                    key,
                    flight: Some(f),
                })
            }
        }
    }

    /// [`SingleFlight::join`] of several keys under one lock: the leads of
    /// those nobody fetches, and waiters for the others.
    pub fn join_many(&self, keys: impl IntoIterator<Item = K>) -> JoinedMany<'_, K, V> {
        let mut m = self.flights.lock();
        let (mut leads, mut waits) = (Vec::new(), Vec::new());
        for key in keys {
            match m.get(&key) {
                Some(f) => waits.push((key, Waiter { flight: f.clone() })),
                None => {
                    let f = Arc::new(Flight {
                        done: Mutex::new(None),
                        cv: Condvar::new(),
                    });
                    m.insert(key.clone(), f.clone());
                    leads.push(Lead {
                        owner: self,
                        key,
                        flight: Some(f),
                    });
                }
            }
        }
        (leads, waits)
    }

    /// Fetch `key` once however many ask at the same time: the leader runs
    /// `fetch`; a waiter gets the leader's value, or runs `fetch` itself
    /// if the leader failed (so it gets its own error).
    pub fn run<E>(&self, key: K, fetch: impl Fn() -> Result<V, E>) -> Result<V, E> {
        match self.join(key) {
            Joined::Lead(lead) => {
                let r = fetch();
                lead.land(r.as_ref().ok().cloned());
                r
            }
            Joined::Wait(w) => match w.wait() {
                Some(v) => Ok(v),
                None => fetch(),
            },
        }
    }

    /// Fetches under way.
    pub fn len(&self) -> usize {
        self.flights.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Lead<'_, K, V> {
    /// The key this lead fetches.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The fetch is over: hand its waiters `value` (`None`: it failed).
    pub fn land(mut self, value: Option<V>) {
        self.finish(value);
    }

    fn finish(&mut self, value: Option<V>) {
        if let Some(f) = self.flight.take() {
            *f.done.lock() = Some(value);
            f.cv.notify_all();
            self.owner.flights.lock().remove(&self.key);
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Lead<'_, K, V> {
    fn drop(&mut self) {
        self.finish(None);
    }
}

impl<V: Clone> Waiter<V> {
    /// Wait for the leader: its value, or `None` if it failed.
    pub fn wait(self) -> Option<V> {
        let mut d = self.flight.done.lock();
        while d.is_none() {
            self.flight.cv.wait(&mut d);
        }
        d.as_ref().expect("landed").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn concurrent_callers_of_one_key_share_one_fetch() {
        let sf: SingleFlight<u32, Arc<Vec<u8>>> = SingleFlight::new();
        let fetches = AtomicUsize::new(0);
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    barrier.wait();
                    let v = sf
                        .run(7, || {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Ok::<_, ()>(Arc::new(vec![7u8; 4]))
                        })
                        .unwrap();
                    assert_eq!(*v, vec![7u8; 4]);
                });
            }
        });
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert!(sf.is_empty());
    }

    #[test]
    fn a_failed_or_dropped_lead_releases_its_waiters() {
        let sf: SingleFlight<u32, u32> = SingleFlight::new();
        let Joined::Lead(lead) = sf.join(1) else {
            panic!("first caller leads")
        };
        let (leads, waits) = sf.join_many([1, 2]);
        assert_eq!(leads.len(), 1, "key 2 is free");
        assert_eq!(waits.len(), 1, "key 1 is taken");
        drop(lead);
        let (_, w) = waits.into_iter().next().expect("one waiter");
        assert_eq!(w.wait(), None, "dropped without landing: failed");
        drop(leads);
        assert!(sf.is_empty());
        // A waiter of a failed fetch fetches for itself.
        let r: Result<u32, &str> = sf.run(3, || Err("own error"));
        assert_eq!(r, Err("own error"));
    }
}
