//! Containers whose growth is charged to the pool's [`Budget`] before it
//! happens: the hash maps of the index and the dedup table (the writeback
//! tier's queues follow the same rule, in `tier/lru.rs`).
//!
//! `mem_used_total` counts these from their capacities, so a limit that
//! only watched allocator pages was overshot by whatever a map resize or a
//! queue doubling took (932,320 bytes past a 64 MiB `--mem-limit`, seen in
//! a fill test). Here every growth is charged first, as a bound when the
//! exact size is not known in advance (a hash table's resize), and settled
//! to the exact size after: the charged total equals what `stats()` counts
//! whenever no operation is in flight, and never passes the limit.

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

/// Give back most of a map's table once it is less than a quarter full
/// (a map does not shrink by itself: one that held many blocks once would
/// keep their buckets), down to room for twice its entries. The new table
/// is charged while both exist; a budget that cannot pay leaves the map as
/// it is.
pub(crate) fn map_shrink<V>(m: &mut Map<V>, b: &Budget) {
    if m.len() >= m.capacity() / 4 || m.capacity() < 64 {
        return;
    }
    let before = map_bytes(m);
    let reserved = before / 2;
    if b.try_charge(reserved).is_err() {
        return;
    }
    m.shrink_to(2 * m.len());
    b.uncharge(reserved + before.saturating_sub(map_bytes(m)));
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
    fn a_map_mostly_emptied_gives_its_table_back() {
        let b = Budget::new(None);
        let mut m: Map<u64> = Map::default();
        for k in 0..10_000 {
            map_insert_new(&mut m, k, k, &b).unwrap();
        }
        let full = map_bytes(&m);
        for k in 0..9_000 {
            m.remove(&k);
            map_shrink(&mut m, &b);
            assert_eq!(b.used(), map_bytes(&m));
        }
        assert!(map_bytes(&m) < full / 3, "{} of {full}", map_bytes(&m));
        assert!((9_000..10_000).all(|k| m[&k] == k));
    }
}
