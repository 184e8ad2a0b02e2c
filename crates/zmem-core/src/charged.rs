//! Containers whose growth is charged to the pool's [`Budget`] before it
//! happens: the hash maps of the index and the dedup table, and the LRU
//! queues of the writeback tier.
//!
//! `mem_used_total` counts these from their capacities, so a limit that
//! only watched allocator pages was overshot by whatever a map resize or a
//! queue doubling took (932,320 bytes past a 64 MiB `--mem-limit`, seen in
//! a fill test). Here every growth is charged first, as a bound when the
//! exact size is not known in advance (a hash table's resize), and settled
//! to the exact size after: the charged total equals what `stats()` counts
//! whenever no operation is in flight, and never passes the limit.
//!
//! The LRU keeps room for the items the shrinker has taken out for a write
//! (`out`): whatever happens to the write, putting them back never grows
//! the queue, so the shrinker (which makes room) never needs room itself.

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};

use zmem_alloc::{AllocError, Budget};

/// A fast, well-mixed hasher for the u64 keys of the index (a folded
/// 128-bit multiply: every key bit reaches the low bits hashbrown uses).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let m = ((self.0 ^ n) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_u128);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The maps of the engine: u64 keys, a fast multiplicative hash.
pub(crate) type Map<V> = hashbrown::HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Heap bytes a map holds (its one allocation: buckets and control bytes).
pub(crate) fn map_bytes<V>(m: &Map<V>) -> u64 {
    m.allocation_size() as u64
}

/// Insert `key`, which the caller knows is absent, charging a resize
/// first if the map has no room left. A refusal changes nothing. A hash
/// table resize holds the old and the new table at once, for a moment: the
/// bound charged covers both. (Only for absent keys: hashbrown's insert
/// makes room before it looks for the key, so replacing a value in a full
/// map would grow it too; replace through `get_mut`.)
pub(crate) fn map_insert_new<V>(m: &mut Map<V>, key: u64, v: V, b: &Budget) -> Result<(), AllocError> {
    debug_assert!(!m.contains_key(&key));
    let before = map_bytes(m);
    let reserved = if m.len() == m.capacity() {
        let slot = std::mem::size_of::<(u64, V)>() as u64;
        // Doubling the buckets at most doubles the allocation; an empty map
        // gets four buckets and a group of control bytes.
        2 * before + 8 * slot + 64
    } else {
        0
    };
    b.try_charge(reserved)?;
    m.insert(key, v);
    b.settle(reserved, map_bytes(m) - before);
    Ok(())
}

/// A place in an LRU: the key (for a dedup shard's LRU, the content hash),
/// when it was queued (a pool-wide sequence number, so queues can be
/// compared), and the generation of the entry it was queued for (an
/// overwritten key leaves a stale item behind).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LruItem {
    pub key: u64,
    pub seq: u32,
    pub gen: u8,
}

const ITEM: u64 = std::mem::size_of::<LruItem>() as u64;

/// A FIFO of [`LruItem`]s whose capacity is charged, and which keeps a
/// place for every item taken out for a write still in flight.
#[derive(Default)]
pub(crate) struct Lru {
    q: VecDeque<LruItem>,
    /// Items popped as writeback victims and not yet settled: each may be
    /// put back, so the capacity keeps room for them.
    out: usize,
}

impl Lru {
    pub fn front(&self) -> Option<&LruItem> {
        self.q.front()
    }

    pub fn pop_front(&mut self) -> Option<LruItem> {
        self.q.pop_front()
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Items the queue has room for.
    pub fn capacity(&self) -> usize {
        self.q.capacity()
    }

    /// Victims taken out and not yet settled.
    pub fn out(&self) -> usize {
        self.out
    }

    /// Heap bytes held (what is charged).
    pub fn bytes(&self) -> u64 {
        self.q.capacity() as u64 * ITEM
    }

    /// Make room for one more item (beyond those out), charging any growth:
    /// an eighth more, at least 16 items. Call before the change that
    /// needs the item, so a refusal undoes nothing.
    pub fn reserve_one(&mut self, b: &Budget) -> Result<(), AllocError> {
        let need = self.q.len() + self.out + 1;
        if need <= self.q.capacity() {
            return Ok(());
        }
        let target = need + (self.q.len() / 8).max(16);
        let before = self.bytes();
        let reserved = target as u64 * ITEM - before;
        b.try_charge(reserved)?;
        self.q.reserve_exact(target - self.q.len());
        b.settle(reserved, self.bytes() - before);
        Ok(())
    }

    /// Queue at the hot end, in room made by [`reserve_one`](Self::reserve_one)
    /// or kept for an item out.
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

    /// Drop the items `keep` rejects; when that leaves the queue mostly
    /// empty, give the room back (keeping some slack and the places of
    /// items out).
    pub fn retain(&mut self, keep: impl FnMut(&LruItem) -> bool, b: &Budget) {
        self.q.retain(keep);
        let before = self.bytes();
        self.q.shrink_to(self.q.len() * 2 + self.out + 64);
        b.uncharge(before - self.bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_growth_is_charged_exactly_and_refused_whole() {
        let b = Budget::new(None);
        let mut m: Map<u64> = Map::default();
        for k in 0..10_000 {
            map_insert_new(&mut m, k, k, &b).unwrap();
            assert_eq!(b.used(), map_bytes(&m));
        }
        // Deleting leaves tombstones; inserting again may rehash in place.
        for k in 0..5_000 {
            m.remove(&k);
        }
        for k in 20_000..26_000 {
            map_insert_new(&mut m, k, k, &b).unwrap();
            assert_eq!(b.used(), map_bytes(&m));
        }
        let full = Budget::new(Some(b.used()));
        full.force_charge(b.used());
        let mut k = 100_000;
        while m.len() < m.capacity() {
            map_insert_new(&mut m, k, k, &full).unwrap();
            k += 1;
        }
        let (len, bytes) = (m.len(), map_bytes(&m));
        assert!(matches!(map_insert_new(&mut m, k, k, &full), Err(AllocError::LimitReached { .. })));
        assert_eq!((m.len(), map_bytes(&m), full.used()), (len, bytes, bytes));
    }

    #[test]
    fn items_out_always_have_a_place_to_come_back_to() {
        let b = Budget::new(None);
        let mut lru = Lru::default();
        let item = |key| LruItem { key, seq: key as u32, gen: 0 };
        for k in 0..100 {
            lru.reserve_one(&b).unwrap();
            lru.push_back(item(k), &b);
        }
        let taken: Vec<_> = (0..30).map(|_| lru.pop_front().unwrap()).collect();
        for _ in &taken {
            lru.take_out();
        }
        // Stores fill the queue meanwhile, each making room for itself.
        for k in 100..400 {
            lru.reserve_one(&b).unwrap();
            lru.push_back(item(k), &b);
            assert!(lru.q.capacity() >= lru.q.len() + 30);
        }
        let cap = lru.q.capacity();
        for it in taken.into_iter().rev() {
            lru.push_front(it, &b);
        }
        lru.return_out(30);
        assert_eq!(lru.q.capacity(), cap, "putting victims back never grows the queue");
        assert_eq!(lru.len(), 400);
        assert_eq!(b.used(), lru.bytes());
        lru.retain(|it| it.key % 10 == 0, &b);
        assert_eq!(lru.len(), 40);
        assert_eq!(b.used(), lru.bytes());
        assert!(lru.bytes() < cap as u64 * ITEM);
    }
}
