//! The eviction core of Tessera's block caches: an S3-FIFO of entries
//! (Yang et al., SOSP 2023), shared by the host read cache of the object
//! layer and the content cache of the store.
//!
//! Owns: which entries stay and which go, in O(1) amortised per operation:
//! a small FIFO that new entries enter, a main FIFO (a CLOCK: an entry read
//! again while in it goes round once more) for entries read again, and a
//! ghost FIFO of keys recently dropped from the small one, whose return
//! goes straight to the main one. Blocks read once by a scan pass through
//! the small FIFO without pushing out the blocks that are read again.
//! Must not touch: what the values are, locking, budgets in bytes (callers
//! turn their budget into an entry count) and counters.
//!
//! Invariants: at most `capacity` entries and `capacity` ghost keys; every
//! entry is in exactly one FIFO and in the map under its key; a value the
//! structure lets go (evicted, removed, replaced) is handed to the caller
//! through [`S3Fifo::take_dropped`], never kept.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Highest access count an entry keeps (S3-FIFO's 2-bit counter).
const FREQ_MAX: u8 = 3;

/// One entry in this many goes to the small FIFO (S3-FIFO's 10%).
const SMALL_SHARE: usize = 10;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Queue {
    Small,
    Main,
}

struct Node<K, V> {
    key: K,
    value: V,
    freq: u8,
    queue: Queue,
    /// Toward the newer end of its FIFO.
    prev: u32,
    /// Toward the older end.
    next: u32,
}

/// A FIFO threaded through the slots: `head` is the newest entry.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// Entries of `V` under keys `K`, at most a given count, evicted by the
/// S3-FIFO rule. `S` hashes the keys.
pub struct S3Fifo<K, V, S> {
    nodes: Vec<Node<K, V>>,
    free_slots: Vec<u32>,
    map: HashMap<K, u32, S>,
    small: List,
    main: List,
    /// Keys dropped from the small FIFO, oldest first, each with the
    /// sequence `ghost_map` holds for it while it counts.
    ghost: VecDeque<(K, u64)>,
    ghost_map: HashMap<K, u64, S>,
    ghost_seq: u64,
    capacity: usize,
    small_capacity: usize,
    /// Values let go since the caller last took them.
    dropped: Vec<V>,
}

impl<K, V, S> Default for S3Fifo<K, V, S>
where
    K: Copy + Eq + Hash,
    V: Default,
    S: BuildHasher + Default,
{
    fn default() -> Self {
        S3Fifo::new()
    }
}

impl<K, V, S> S3Fifo<K, V, S>
where
    K: Copy + Eq + Hash,
    V: Default,
    S: BuildHasher + Default,
{
    /// An empty structure that holds nothing until given a capacity.
    pub fn new() -> Self {
        S3Fifo {
            nodes: Vec::new(),
            free_slots: Vec::new(),
            map: HashMap::default(),
            small: List::EMPTY,
            main: List::EMPTY,
            ghost: VecDeque::new(),
            ghost_map: HashMap::default(),
            ghost_seq: 0,
            capacity: 0,
            small_capacity: 1,
            dropped: Vec::new(),
        }
    }

    /// Holds at most `entries` from now on, evicting down to it; returns
    /// how many were evicted. At 0 every table is given back.
    pub fn set_capacity(&mut self, entries: usize) -> u64 {
        self.capacity = entries;
        self.small_capacity = (entries / SMALL_SHARE).max(1);
        let mut evicted = 0;
        while self.map.len() > entries {
            evicted += self.evict_one();
        }
        while self.ghost.len() > entries {
            self.ghost_pop();
        }
        if entries == 0 {
            let dropped = std::mem::take(&mut self.dropped);
            *self = S3Fifo {
                dropped,
                ..S3Fifo::new()
            };
        }
        evicted
    }

    /// The most entries held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Slots allocated (held entries and free slots): how far the tables
    /// stand above what is held, for [`S3Fifo::compact`].
    pub fn slots(&self) -> usize {
        self.nodes.len()
    }

    /// Reserves room for `entries` entries and ghost keys up front, so the
    /// tables do not grow (and copy themselves) while a cache fills.
    pub fn reserve(&mut self, entries: usize) {
        let more = |len: usize| entries.saturating_sub(len);
        self.map.reserve(more(self.map.len()));
        self.nodes.reserve(more(self.nodes.len()));
        self.ghost_map.reserve(more(self.ghost_map.len()));
        self.ghost.reserve(more(self.ghost.len()));
    }

    /// Whether `key` has an entry (not counted as an access).
    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    /// The value of `key`, counted as an access.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let i = *self.map.get(key)?;
        let n = &mut self.nodes[i as usize];
        n.freq = (n.freq + 1).min(FREQ_MAX);
        Some(&n.value)
    }

    /// The keys held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }

    /// Inserts `value` under `key` (replacing an entry it had); returns how
    /// many entries were evicted for it. With a capacity of 0 the value is
    /// let go at once.
    pub fn insert(&mut self, key: K, value: V) -> u64 {
        if self.capacity == 0 {
            self.dropped.push(value);
            return 0;
        }
        self.remove(&key);
        let q = if self.ghost_map.remove(&key).is_some() {
            Queue::Main
        } else {
            Queue::Small
        };
        let node = Node {
            key,
            value,
            freq: 0,
            queue: q,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free_slots.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.push_head(q, i);
        self.map.insert(key, i);
        let mut evicted = 0;
        while self.map.len() > self.capacity {
            evicted += self.evict_one();
        }
        evicted
    }

    /// Removes the entry of `key`; returns whether there was one.
    pub fn remove(&mut self, key: &K) -> bool {
        let Some(&i) = self.map.get(key) else {
            return false;
        };
        self.unlink(i);
        self.free_slot(i);
        true
    }

    /// Removes every entry whose key `drop` selects; returns how many.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&K) -> bool) -> u64 {
        let keys: Vec<K> = self.map.keys().filter(|k| drop(k)).copied().collect();
        for key in &keys {
            self.remove(key);
        }
        keys.len() as u64
    }

    /// The values let go since the last call (evicted, removed, replaced).
    pub fn take_dropped(&mut self) -> std::vec::Drain<'_, V> {
        self.dropped.drain(..)
    }

    /// Rebuilds the slots, map and ghost at the size of what is held,
    /// keeping the order of both FIFOs and every entry's count.
    pub fn compact(&mut self) {
        let mut kept: Vec<(Queue, K, V, u8)> = Vec::with_capacity(self.map.len());
        for q in [Queue::Small, Queue::Main] {
            // Oldest first, so pushing each at the head rebuilds the order.
            let mut i = self.list_mut(q).tail;
            while i != NIL {
                let n = &mut self.nodes[i as usize];
                kept.push((q, n.key, std::mem::take(&mut n.value), n.freq));
                i = n.prev;
            }
        }
        let ghost: VecDeque<(K, u64)> = self
            .ghost
            .iter()
            .filter(|(k, s)| self.ghost_map.get(k) == Some(s))
            .copied()
            .collect();
        let mut fresh = S3Fifo {
            nodes: Vec::with_capacity(kept.len()),
            map: HashMap::with_capacity_and_hasher(kept.len(), S::default()),
            ghost_map: ghost.iter().copied().collect(),
            ghost,
            ghost_seq: self.ghost_seq,
            capacity: self.capacity,
            small_capacity: self.small_capacity,
            dropped: std::mem::take(&mut self.dropped),
            ..S3Fifo::new()
        };
        for (q, key, value, freq) in kept {
            fresh.nodes.push(Node {
                key,
                value,
                freq,
                queue: q,
                prev: NIL,
                next: NIL,
            });
            let i = (fresh.nodes.len() - 1) as u32;
            fresh.push_head(q, i);
            fresh.map.insert(key, i);
        }
        *self = fresh;
    }

    /// Checks the structure's invariants (tests).
    pub fn check(&self) -> Result<(), String> {
        if self.map.len() > self.capacity {
            return Err(format!("{} entries over {}", self.map.len(), self.capacity));
        }
        if self.ghost.len() > self.capacity.max(1) {
            return Err(format!(
                "{} ghost keys over {}",
                self.ghost.len(),
                self.capacity
            ));
        }
        if self.map.len() != self.small.len + self.main.len {
            return Err("the FIFOs do not hold every entry".into());
        }
        for (q, list) in [(Queue::Small, &self.small), (Queue::Main, &self.main)] {
            let (mut i, mut seen) = (list.head, 0);
            while i != NIL {
                let n = &self.nodes[i as usize];
                if n.queue != q || self.map.get(&n.key) != Some(&i) {
                    return Err(format!("slot {i} is not where its key says"));
                }
                seen += 1;
                i = n.next;
            }
            if seen != list.len {
                return Err(format!("{q:?} FIFO holds {seen}, counts {}", list.len));
            }
        }
        Ok(())
    }

    fn list_mut(&mut self, q: Queue) -> &mut List {
        match q {
            Queue::Small => &mut self.small,
            Queue::Main => &mut self.main,
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next, q) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next, n.queue)
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.list_mut(q).head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.list_mut(q).tail = prev;
        }
        self.list_mut(q).len -= 1;
    }

    fn push_head(&mut self, q: Queue, i: u32) {
        let old = self.list_mut(q).head;
        {
            let n = &mut self.nodes[i as usize];
            n.queue = q;
            n.prev = NIL;
            n.next = old;
        }
        if old != NIL {
            self.nodes[old as usize].prev = i;
        } else {
            self.list_mut(q).tail = i;
        }
        let list = self.list_mut(q);
        list.head = i;
        list.len += 1;
    }

    /// Frees slot `i` (already unlinked) and its map entry; its value goes
    /// to the dropped ones.
    fn free_slot(&mut self, i: u32) -> K {
        let n = &mut self.nodes[i as usize];
        let key = n.key;
        self.dropped.push(std::mem::take(&mut n.value));
        self.map.remove(&key);
        self.free_slots.push(i);
        key
    }

    /// Drops one entry by the S3-FIFO rule; returns 1, or 0 when empty.
    fn evict_one(&mut self) -> u64 {
        loop {
            if self.small.len > self.small_capacity || self.main.len == 0 {
                let i = self.small.tail;
                if i == NIL {
                    return 0;
                }
                self.unlink(i);
                let n = &mut self.nodes[i as usize];
                if n.freq > 0 {
                    // Read again while in the small FIFO: it stays.
                    n.freq = 0;
                    self.push_head(Queue::Main, i);
                    continue;
                }
                let key = self.free_slot(i);
                self.ghost_push(key);
                return 1;
            }
            let i = self.main.tail;
            self.unlink(i);
            let n = &mut self.nodes[i as usize];
            if n.freq > 0 {
                n.freq -= 1;
                self.push_head(Queue::Main, i);
                continue;
            }
            self.free_slot(i);
            return 1;
        }
    }

    fn ghost_push(&mut self, key: K) {
        if self.capacity == 0 {
            return;
        }
        self.ghost_seq += 1;
        self.ghost.push_back((key, self.ghost_seq));
        self.ghost_map.insert(key, self.ghost_seq);
        while self.ghost.len() > self.capacity {
            self.ghost_pop();
        }
    }

    fn ghost_pop(&mut self) {
        if let Some((key, seq)) = self.ghost.pop_front() {
            if self.ghost_map.get(&key) == Some(&seq) {
                self.ghost_map.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::hash_map::RandomState;

    type Fifo = S3Fifo<u64, u64, RandomState>;

    fn filled(capacity: usize, keys: impl IntoIterator<Item = u64>) -> Fifo {
        let mut f = Fifo::new();
        f.set_capacity(capacity);
        for k in keys {
            f.insert(k, k * 10);
        }
        f
    }

    #[test]
    fn nothing_is_held_at_capacity_zero_and_values_are_handed_back() {
        let mut f = filled(0, [1, 2]);
        assert!(f.is_empty());
        assert_eq!(f.take_dropped().collect::<Vec<_>>(), vec![10, 20]);
        f.set_capacity(2);
        f.insert(3, 30);
        assert_eq!(f.get(&3), Some(&30));
    }

    #[test]
    fn blocks_read_again_survive_a_scan() {
        let mut f = filled(20, 0..20);
        for k in 0..20 {
            f.get(&k);
        }
        // A scan of 200 blocks read once.
        for k in 1000..1200 {
            f.insert(k, 0);
        }
        let kept = (0..20).filter(|k| f.contains(k)).count();
        assert!(
            kept >= 15,
            "only {kept} of the hot blocks survived the scan"
        );
        f.check().unwrap();
    }

    #[test]
    fn a_key_back_from_the_ghost_goes_to_the_main_fifo() {
        let mut f = filled(10, 0..10);
        // Key 0 leaves the small FIFO unread, as a ghost.
        for k in 100..110 {
            f.insert(k, 0);
        }
        assert!(!f.contains(&0));
        f.insert(0, 1);
        for k in 200..209 {
            f.insert(k, 0);
        }
        assert!(f.contains(&0), "a returning key outlives new ones");
        f.check().unwrap();
    }

    #[test]
    fn compacting_keeps_entries_order_and_counts() {
        let mut f = filled(1000, 0..1000);
        f.set_capacity(10);
        assert!(f.slots() >= 1000);
        let before: Vec<u64> = {
            let mut k: Vec<u64> = f.keys().copied().collect();
            k.sort();
            k
        };
        f.compact();
        assert_eq!(f.slots(), 10);
        let mut after: Vec<u64> = f.keys().copied().collect();
        after.sort();
        assert_eq!(before, after);
        f.check().unwrap();
    }

    proptest! {
        #[test]
        fn the_structure_holds_under_any_operations(
            capacity in 0usize..12,
            ops in proptest::collection::vec((0u8..5, 0u64..24), 0..300),
        ) {
            let mut f = Fifo::new();
            f.set_capacity(capacity);
            let mut model: HashMap<u64, u64> = HashMap::new();
            for (op, key) in ops {
                match op {
                    0 | 1 => {
                        f.insert(key, key + 1);
                        if capacity > 0 { model.insert(key, key + 1); }
                    }
                    2 => {
                        if let Some(v) = f.get(&key) {
                            prop_assert_eq!(Some(v), model.get(&key));
                        }
                    }
                    3 => {
                        f.remove(&key);
                        model.remove(&key);
                    }
                    _ => f.compact(),
                }
                // Whatever it holds is what was last put there.
                for k in f.keys().copied().collect::<Vec<_>>() {
                    prop_assert_eq!(f.get(&k), model.get(&k));
                }
                prop_assert!(f.check().is_ok(), "{:?}", f.check());
                f.take_dropped().for_each(drop);
            }
        }
    }
}
