//! The engine's lock order, checked where the types cannot: index shard ->
//! dedup shard -> allocator class -> cold store.
//!
//! The nesting the engine uses is visible in its types: a dedup shard
//! locked under an index shard is had through that shard's guard
//! (`DedupTable::lock_under`), so it is dropped first. What types cannot
//! say is the converse: that no index shard is locked while a dedup
//! guard is held, which could deadlock against a load (index, then dedup).
//! In debug builds, and so in every test, each thread counts the dedup
//! guards it holds, and locking an index shard with any held panics at the
//! call, naming the order. Release builds compile all of it away.

#[cfg(debug_assertions)]
thread_local! {
    static DEDUP_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// About to lock an index shard: no dedup guard may be held.
#[inline]
pub(crate) fn taking_index_shard() {
    #[cfg(debug_assertions)]
    DEDUP_HELD.with(|h| {
        assert_eq!(
            h.get(),
            0,
            "lock order: an index shard locked while this thread holds a dedup shard (index shard -> dedup shard -> allocator -> cold store)"
        )
    });
}

/// A dedup shard was locked.
#[inline]
pub(crate) fn took_dedup_shard() {
    #[cfg(debug_assertions)]
    DEDUP_HELD.with(|h| h.set(h.get() + 1));
}

/// A dedup shard's guard was dropped.
#[inline]
pub(crate) fn released_dedup_shard() {
    #[cfg(debug_assertions)]
    DEDUP_HELD.with(|h| h.set(h.get() - 1));
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use crate::dedup::DedupTable;
    use crate::shard::Index;

    #[test]
    fn dedup_under_index_is_fine() {
        let (index, dedup) = (Index::new(4, None), DedupTable::new(true));
        let mut s = index.shard(1).lock();
        let ds = dedup.lock_under(&mut s, 7);
        drop(ds);
        drop(s);
        // And a dedup shard alone, then an index shard once it is dropped.
        drop(dedup.shard(7).lock());
        drop(index.shard(1).lock());
    }

    #[test]
    #[should_panic(expected = "lock order")]
    fn index_under_dedup_is_refused() {
        let (index, dedup) = (Index::new(4, None), DedupTable::new(true));
        let _ds = dedup.shard(7).lock();
        let _s = index.shard(1).lock();
    }
}
