//! The writeback tier's LRU: one queue of [`LruItem`]s per index shard and
//! per dedup shard, in store order, owned by the tier (zswap keeps one
//! `list_lru`; here the queues are merged by sequence number when the
//! shrinker looks for the coldest objects, `tier.rs`).
//!
//! # What an item is
//! A key (for a dedup shard's queue, the content hash), when it was queued
//! (a pool-wide sequence number, so queues can be compared), and the
//! generation of the entry it was queued for. An item is a hint: the shard
//! that owns the key says whether it still names an object in RAM at that
//! generation, and a stale item (the key overwritten, freed or written
//! back) is skipped when it reaches the cold end, or swept once there are
//! more than the shard's objects in RAM can account for.
//!
//! # Locks
//! Queue `q` has a mutex of its own, a leaf of the engine's lock order:
//! nothing is locked under it. Whoever looks at what an item names (the
//! shrinker picking, settling or putting victims back, a sweep of stale
//! items) holds the lock of the shard it belongs to (index shard `q`, or
//! dedup shard `q - index shards`) and then the queue's, so what an item
//! names cannot change meanwhile. A store makes its item's place under its
//! shard's lock, in the critical section that publishes the page, and
//! pushes the item with the queue's lock alone once the shard's is
//! dropped (an item is a hint: one pushed a moment late, or stale by the
//! time it is pushed, is skipped at the cold end like any other). Reading
//! a queue's size for the stats takes its mutex alone.
//!
//! # Capacity
//! A queue's capacity is charged to the pool's [`Budget`] before it grows
//! (room is made before the change that needs an item, so a refusal undoes
//! nothing), and it keeps room for the places made and for the items the shrinker has taken out
//! for a write (`out`): whatever happens to the write, putting them back
//! never grows the queue, so the shrinker (which makes room) never needs
//! room itself.

use std::collections::VecDeque;

use parking_lot::{Mutex, MutexGuard};
use zmem_alloc::{AllocError, Budget};

/// A place in a queue (see the module notes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LruItem {
    pub key: u64,
    pub seq: u32,
    pub gen: u8,
}

const ITEM: u64 = std::mem::size_of::<LruItem>() as u64;

/// One FIFO of [`LruItem`]s whose capacity is charged, and which keeps a
/// place for every item taken out for a write still in flight.
#[derive(Default)]
pub(crate) struct Lru {
    q: VecDeque<LruItem>,
    /// Items popped as writeback victims and not yet settled: each may be
    /// put back, so the capacity keeps room for them.
    out: usize,
    /// Places made ([`reserve_one`](Lru::reserve_one)) for items not yet
    /// pushed: a store makes its place under its shard's lock and queues
    /// its item once the lock is dropped.
    pending: usize,
}

impl Lru {
    pub fn front(&self) -> Option<&LruItem> {
        self.q.front()
    }

    pub fn pop_front(&mut self) -> Option<LruItem> {
        self.q.pop_front()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Heap bytes held (what is charged).
    pub fn bytes(&self) -> u64 {
        self.q.capacity() as u64 * ITEM
    }

    /// Make a place for one more item (beyond those out and the places
    /// already made), charging any growth: an eighth more, at least 16
    /// items. Call before the change that needs the item, so a refusal
    /// undoes nothing; then [`push_reserved`](Self::push_reserved) or
    /// [`unreserve`](Self::unreserve).
    pub fn reserve_one(&mut self, b: &Budget) -> Result<(), AllocError> {
        let need = self.q.len() + self.out + self.pending + 1;
        if need > self.q.capacity() {
            let target = need + (self.q.len() / 8).max(16);
            let before = self.bytes();
            let reserved = target as u64 * ITEM - before;
            b.try_charge(reserved)?;
            self.q.reserve_exact(target - self.q.len());
            b.settle(reserved, self.bytes() - before);
        }
        self.pending += 1;
        Ok(())
    }

    /// Queue `item` in the place made for it: at the hot end, or (`front`)
    /// at the cold end.
    pub fn push_reserved(&mut self, item: LruItem, front: bool) {
        debug_assert!(self.pending > 0, "an LRU push without a place made for it");
        self.pending = self.pending.saturating_sub(1);
        debug_assert!(self.q.len() < self.q.capacity());
        if front {
            self.q.push_front(item);
        } else {
            self.q.push_back(item);
        }
    }

    /// The change a place was made for did not happen: give it back.
    pub fn unreserve(&mut self) {
        debug_assert!(self.pending > 0);
        self.pending = self.pending.saturating_sub(1);
    }

    /// Queue at the hot end, in the room an item just popped left, or
    /// kept for an item out.
    pub fn push_back(&mut self, item: LruItem, b: &Budget) {
        self.grow_for_one(b);
        self.q.push_back(item);
    }

    /// Queue at the cold end (an item put back), in room kept for it.
    pub fn push_front(&mut self, item: LruItem, b: &Budget) {
        self.grow_for_one(b);
        self.q.push_front(item);
    }

    /// The room for one more is always there on a correct path; if a bug
    /// ever breaks that, the queue still grows (an item lost would pin its
    /// page in RAM for good) and the growth is charged, not hidden.
    fn grow_for_one(&mut self, b: &Budget) {
        if self.q.len() < self.q.capacity() {
            return;
        }
        debug_assert!(false, "an LRU push found no room ({} items, {} out)", self.q.len(), self.out);
        let before = self.bytes();
        self.q.reserve(1);
        b.force_charge(self.bytes() - before);
    }

    /// An item just popped is a writeback victim: keep its place.
    pub fn take_out(&mut self) {
        self.out += 1;
    }

    /// `n` victims are settled (put back, or written back for good).
    pub fn return_out(&mut self, n: usize) {
        debug_assert!(self.out >= n);
        self.out -= n;
    }

    /// Sweep stale items once there are more than `live` objects can
    /// account for (each has at most three live items: in store order,
    /// queued cold once loaded, and re-queued by a second chance, plus
    /// some slack), and give back the room of a queue that writeback
    /// emptied. `is_live` says whether an item still names its object.
    /// Amortised O(1) per push: a sweep leaves at most the live items and
    /// room for twice that, so the next needs `live` more pushes or the
    /// objects halved.
    pub fn trim(&mut self, live: usize, is_live: impl FnMut(&LruItem) -> bool, b: &Budget) {
        if self.due(live) {
            self.retain(is_live, b);
        }
    }

    /// Whether [`trim`](Self::trim) would sweep, with `live` objects.
    pub fn due(&self, live: usize) -> bool {
        let bound = 3 * live + 64;
        self.q.len() > bound || self.q.capacity() > 4 * bound + self.out + self.pending
    }

    /// Drop the items `keep` rejects; when that leaves the queue mostly
    /// empty, give the room back (keeping some slack and the places of
    /// items out).
    fn retain(&mut self, keep: impl FnMut(&LruItem) -> bool, b: &Budget) {
        self.q.retain(keep);
        let before = self.bytes();
        self.q.shrink_to(self.q.len() * 2 + self.out + self.pending + 64);
        b.uncharge(before - self.bytes());
    }
}

/// The tier's queues: index shard `i`'s is queue `i`, dedup shard `j`'s
/// is queue `index shards + j` (the numbering of the shrinker's sources).
pub(crate) struct Queues {
    q: Box<[Mutex<Lru>]>,
    index_shards: usize,
}

impl Queues {
    pub fn new(index_shards: usize, dedup_shards: usize) -> Queues {
        Queues { q: (0..index_shards + dedup_shards).map(|_| Mutex::new(Lru::default())).collect(), index_shards }
    }

    /// The queue of index shard `i`.
    pub fn of_index(&self, i: usize) -> usize {
        i
    }

    /// The queue of dedup shard `j`.
    pub fn of_shared(&self, j: usize) -> usize {
        self.index_shards + j
    }

    /// The dedup shard whose queue is `q` (None: an index shard's).
    pub fn shared_of(&self, q: usize) -> Option<usize> {
        q.checked_sub(self.index_shards)
    }

    /// Queue `q`, locked.
    pub fn lock(&self, q: usize) -> MutexGuard<'_, Lru> {
        self.q[q].lock()
    }

    /// Heap bytes of every queue (what is charged).
    pub fn bytes(&self) -> u64 {
        self.q.iter().map(|q| q.lock().bytes()).sum()
    }

    /// Bytes of the queue array, held from creation to drop.
    pub fn fixed_bytes(&self) -> u64 {
        (self.q.len() * std::mem::size_of::<Mutex<Lru>>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_out_always_have_a_place_to_come_back_to() {
        let b = Budget::new(None);
        let mut lru = Lru::default();
        let item = |key| LruItem { key, seq: key as u32, gen: 0 };
        for k in 0..100 {
            lru.reserve_one(&b).unwrap();
            lru.push_reserved(item(k), false);
        }
        let taken: Vec<_> = (0..30).map(|_| lru.pop_front().unwrap()).collect();
        for _ in &taken {
            lru.take_out();
        }
        // Stores fill the queue meanwhile, each making room for itself.
        for k in 100..400 {
            lru.reserve_one(&b).unwrap();
            // A place made and not yet used is kept too.
            assert!(lru.q.capacity() > lru.q.len() + 30);
            lru.push_reserved(item(k), false);
        }
        let cap = lru.q.capacity();
        for it in taken.into_iter().rev() {
            lru.push_front(it, &b);
        }
        lru.return_out(30);
        assert_eq!(lru.q.capacity(), cap, "putting victims back never grows the queue");
        assert_eq!(lru.len(), 400);
        assert_eq!(b.used(), lru.bytes());
        // 400 items for 40 live objects: past the bound, so swept.
        lru.trim(40, |it| it.key % 10 == 0, &b);
        assert_eq!(lru.len(), 40);
        assert_eq!(b.used(), lru.bytes());
        assert!(lru.bytes() < cap as u64 * ITEM);
        // Within the bound: left alone, stale or not.
        lru.trim(40, |_| false, &b);
        assert_eq!(lru.len(), 40);
    }

    #[test]
    fn each_shard_has_its_own_queue() {
        let qs = Queues::new(4, 2);
        let b = Budget::new(None);
        assert_eq!((qs.of_index(3), qs.of_shared(0), qs.of_shared(1)), (3, 4, 5));
        assert_eq!((qs.shared_of(3), qs.shared_of(5)), (None, Some(1)));
        for q in [0, 5] {
            let mut l = qs.lock(q);
            l.reserve_one(&b).unwrap();
            l.push_reserved(LruItem { key: q as u64, seq: 0, gen: 0 }, false);
        }
        assert_eq!(qs.lock(5).front().map(|i| i.key), Some(5));
        assert!(qs.lock(4).front().is_none());
        assert_eq!(qs.bytes(), b.used());
    }
}
