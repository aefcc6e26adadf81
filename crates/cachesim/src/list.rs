//! The node arena and intrusive doubly-linked lists every policy is built
//! from.
//!
//! Nodes live in one `Vec` sized once for the policy's whole budget
//! (resident entries plus ghost entries) and are recycled through a free
//! list, so steady-state accesses never allocate. A node is on at most one
//! [`List`] at a time; it records which one in `tag` so a policy can find
//! the list to unlink it from. Lists are ordered front (oldest / least
//! recently used, the eviction end) to back (newest / most recently used).

use crate::index::{KeyIndex, NIL};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<K, X> {
    pub key: K,
    pub prev: u32,
    pub next: u32,
    /// Which of the policy's lists holds the node.
    pub tag: u8,
    /// Per-policy data (frequency, expiry time, section...).
    pub x: X,
}

/// A list head: front (oldest) and back (newest) node, and its length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    pub front: u32,
    pub back: u32,
    pub len: usize,
}

impl Default for List {
    fn default() -> Self {
        List {
            front: NIL,
            back: NIL,
            len: 0,
        }
    }
}

pub(crate) struct Arena<K, X> {
    pub nodes: Vec<Node<K, X>>,
    free: u32,
    budget: usize,
}

impl<K: Copy, X: Copy> Arena<K, X> {
    /// An arena for up to `budget` live nodes; the memory is reserved now.
    pub fn with_budget(budget: usize) -> Self {
        Arena {
            nodes: Vec::with_capacity(budget),
            free: NIL,
            budget,
        }
    }

    /// A node for `key` (not on any list yet).
    #[inline]
    pub fn alloc(&mut self, key: K, tag: u8, x: X) -> u32 {
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
            tag,
            x,
        };
        if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize] = node;
            i
        } else {
            debug_assert!(self.nodes.len() < self.budget, "arena over budget");
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Return an unlinked node to the free list.
    #[inline]
    pub fn free(&mut self, i: u32) {
        self.nodes[i as usize].next = self.free;
        self.nodes[i as usize].prev = NIL;
        self.free = i;
    }

    /// A node for `key` at the back of `l`, tagged `tag`, entered in
    /// `index`; returns it.
    #[inline]
    pub fn insert_back<I: KeyIndex<K>>(
        &mut self,
        l: &mut List,
        index: &mut I,
        key: K,
        tag: u8,
        x: X,
    ) -> u32 {
        let i = self.alloc(key, tag, x);
        self.push_back(l, i, tag);
        index.insert(key, i);
        i
    }

    /// Drop the unlinked node `i`: out of `index`, back to the free list;
    /// returns its key.
    #[inline]
    pub fn forget<I: KeyIndex<K>>(&mut self, index: &mut I, i: u32) -> K {
        let key = self.get(i).key;
        index.remove(&key);
        self.free(i);
        key
    }

    /// Drop the front (oldest) node of `l` (which must not be empty);
    /// returns its key.
    #[inline]
    pub fn pop_front<I: KeyIndex<K>>(&mut self, l: &mut List, index: &mut I) -> K {
        let i = l.front;
        self.unlink(l, i);
        self.forget(index, i)
    }

    /// Remember the evicted, unlinked node `i` as a ghost at the back of
    /// `ghosts` (tagged `tag`), dropping the oldest ghost beyond `cap`;
    /// with `cap` 0 nothing is remembered and `i` is forgotten.
    #[inline]
    pub fn retire<I: KeyIndex<K>>(
        &mut self,
        i: u32,
        ghosts: &mut List,
        tag: u8,
        cap: usize,
        index: &mut I,
    ) {
        if cap == 0 {
            self.forget(index, i);
        } else {
            self.push_back(ghosts, i, tag);
            if ghosts.len > cap {
                self.pop_front(ghosts, index);
            }
        }
    }

    /// Take `key`'s node off the list its tag names, out of `index`, and
    /// free it; returns the tag it had (None when `key` is not there).
    pub fn remove_keyed<I: KeyIndex<K>>(
        &mut self,
        lists: &mut [List],
        index: &mut I,
        key: &K,
    ) -> Option<u8> {
        let i = index.get(key)?;
        let tag = self.get(i).tag;
        self.unlink(&mut lists[tag as usize], i);
        self.forget(index, i);
        Some(tag)
    }

    #[inline]
    pub fn get(&self, i: u32) -> &Node<K, X> {
        &self.nodes[i as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Node<K, X> {
        &mut self.nodes[i as usize]
    }

    /// Append `i` at the back (newest end) of `l`, tagging it `tag`.
    #[inline]
    pub fn push_back(&mut self, l: &mut List, i: u32, tag: u8) {
        let old_back = l.back;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = old_back;
            n.next = NIL;
            n.tag = tag;
        }
        if old_back != NIL {
            self.nodes[old_back as usize].next = i;
        } else {
            l.front = i;
        }
        l.back = i;
        l.len += 1;
    }

    /// Take `i` off `l`.
    #[inline]
    pub fn unlink(&mut self, l: &mut List, i: u32) {
        let (p, n) = {
            let node = &self.nodes[i as usize];
            (node.prev, node.next)
        };
        if p != NIL {
            self.nodes[p as usize].next = n;
        } else {
            l.front = n;
        }
        if n != NIL {
            self.nodes[n as usize].prev = p;
        } else {
            l.back = p;
        }
        l.len -= 1;
    }

    /// Move `i` (on `from`) to the back of `to`.
    #[inline]
    pub fn move_back(&mut self, from: &mut List, to: &mut List, i: u32, tag: u8) {
        self.unlink(from, i);
        self.push_back(to, i, tag);
    }

    /// Move `i` to the back (newest end) of the list it is already on.
    #[inline]
    pub fn refresh(&mut self, l: &mut List, i: u32) {
        if l.back != i {
            let tag = self.nodes[i as usize].tag;
            self.unlink(l, i);
            self.push_back(l, i, tag);
        }
    }

    /// Keys of `l` from front to back (tests and inspection).
    pub fn keys(&self, l: &List) -> Vec<K> {
        let mut out = Vec::with_capacity(l.len);
        let mut i = l.front;
        while i != NIL {
            out.push(self.nodes[i as usize].key);
            i = self.nodes[i as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_keep_order_and_recycle_nodes() {
        let mut a: Arena<u32, ()> = Arena::with_budget(4);
        let mut l = List::default();
        let mut m = List::default();
        let ids: Vec<u32> = (0..4).map(|k| a.alloc(k, 0, ())).collect();
        for &i in &ids {
            a.push_back(&mut l, i, 0);
        }
        assert_eq!(a.keys(&l), vec![0, 1, 2, 3]);
        a.refresh(&mut l, ids[1]);
        assert_eq!(a.keys(&l), vec![0, 2, 3, 1]);
        a.move_back(&mut l, &mut m, ids[0], 1);
        assert_eq!((a.keys(&l), a.keys(&m)), (vec![2, 3, 1], vec![0]));
        a.unlink(&mut l, ids[3]);
        a.free(ids[3]);
        let again = a.alloc(9, 0, ());
        assert_eq!(again, ids[3], "freed node is reused");
        a.push_back(&mut l, again, 0);
        assert_eq!(a.keys(&l), vec![2, 1, 9]);
        assert_eq!((l.len, m.len), (3, 1));
        assert_eq!(a.nodes.capacity(), 4, "no growth past the budget");
    }
}
