//! Whether the pool is worth the memory it takes: how long ago a page the
//! pool serves from RAM was last used, counted in pages stored since (the
//! kernel's refault distance, `mm/workingset.c`, applied to hits).
//!
//! A swap device's pool shares the machine's RAM with the workload: a pool
//! holding M pages of memory takes M pages from it. A page served from RAM
//! that was last used fewer than M stores ago would still have been in the
//! workload's memory had the pool not taken that memory: a **near** hit,
//! a fault the pool caused and then served. One last used further back
//! would have been read from the disk without the pool: a **far** hit, a
//! disk read saved. A build's short processes reuse their pages soon or
//! never, so its hits should be near and the pool only cost it; a
//! long-lived heap read at random is served far. The counts are reported
//! (`Stats::reuse_near`, `reuse_far`) for a policy that sizes the pool to
//! weigh; measured so far, they do not yet tell the two apart (the build
//! counts about half its hits far: a page the kernel evicted clean from
//! its swap cache and read again counts from its last load, not from its
//! eviction, which the pool does not see). docs/MEASUREMENTS.md, "Pool
//! size".
//!
//! The first hit since a page's store is also counted apart, by the loads
//! since the store rather than the stores (`Stats::reuse_first_near`,
//! `reuse_first_far`): the store is the kernel's eviction of the page, and
//! each load since brought a page into the workload's memory, which (its
//! memory being full) the kernel made room for: the kernel's refault
//! distance, counted from the eviction. It undercounts where the workload
//! also reads files (page-ins the pool does not see), so it errs near. A
//! page whose referenced bit the LRU's second chance cleared counts again,
//! from its last load.
//!
//! Stores are counted per second in a ring of [`RING`] seconds (and loads
//! in another); a hit's
//! distance is the stores since the start of the first second, from its
//! last use on, in which there were stores (so distances are known to
//! within one second's stores), and a last use older than the ring is far.
//! Stores are counted once, by the pool (`Counters::stores`): the ring
//! notes that count at each second's first store. Lock-free: a store costs
//! a load (and two stores once a second), a hit a few loads and an add; a
//! race at a second's turn skews one sample.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Seconds of stores remembered.
const RING: usize = 256;

/// The store clock and the hit counts (see the module notes).
pub(crate) struct Reuse {
    /// Per second (modulo [`RING`]): the second plus one (0: none yet), and
    /// the stores counted before its first store.
    ring: Box<[(AtomicU32, AtomicU64)]>,
    /// The same for loads (swap-ins): the clock of a page's first hit
    /// since its store, counted from the store.
    loads: Box<[(AtomicU32, AtomicU64)]>,
    /// Hits by the stores since their last use, and first hits since a
    /// store by the loads since it.
    hits: Split,
    first: Split,
}

/// Hits counted near or far.
#[derive(Default)]
struct Split {
    near: AtomicU64,
    far: AtomicU64,
}

impl Split {
    /// A hit `d` (None: beyond the ring) of the clock's counts ago, with a
    /// pool of `pool_pages` pages of memory.
    fn count(&self, d: Option<u64>, pool_pages: u64) {
        match d {
            Some(d) if d < pool_pages => self.near.fetch_add(1, Relaxed),
            _ => self.far.fetch_add(1, Relaxed),
        };
    }

    fn get(&self) -> (u64, u64) {
        (self.near.load(Relaxed), self.far.load(Relaxed))
    }
}

impl Reuse {
    pub fn new() -> Reuse {
        let ring = || (0..RING).map(|_| (AtomicU32::new(0), AtomicU64::new(0))).collect();
        Reuse { ring: ring(), loads: ring(), hits: Split::default(), first: Split::default() }
    }

    /// A page was stored at `now` (seconds), the pool's store number `n`
    /// (its stores before this one).
    pub fn note_store(&self, now: u32, n: u64) {
        note(&self.ring, now, n);
    }

    /// A page was loaded at `now`, the pool's load number `n`.
    pub fn note_load(&self, now: u32, n: u64) {
        note(&self.loads, now, n);
    }

    /// Stores since the start of the first second in `last..=now` that had
    /// any, of the pool's `stores` so far; `None` if `last` is older than
    /// the ring remembers.
    fn stores_since(&self, last: u32, now: u32, stores: u64) -> Option<u64> {
        since(&self.ring, last, now, stores)
    }

    /// A load served from RAM at `now` a page last used at `last`, after
    /// the pool's `stores` so far, while it holds `pool_pages` pages of
    /// memory.
    pub fn note_hit(&self, last: u32, now: u32, stores: u64, pool_pages: u64) {
        self.hits.count(self.stores_since(last, now, stores), pool_pages);
    }

    /// The first load served from RAM since its store (at `stored`) of a
    /// page, at `now`, after the pool's `loads` so far, while it holds
    /// `pool_pages` pages of memory: near if fewer pages were loaded since
    /// (each of which took a page of the workload's memory) than the pool
    /// holds.
    pub fn note_first_hit(&self, stored: u32, now: u32, loads: u64, pool_pages: u64) {
        self.first.count(since(&self.loads, stored, now, loads), pool_pages);
    }

    /// (near hits, far hits) so far.
    pub fn hits(&self) -> (u64, u64) {
        self.hits.get()
    }

    /// (near, far) of the first hits since a store so far.
    pub fn first_hits(&self) -> (u64, u64) {
        self.first.get()
    }

    /// Bytes it holds, from creation to drop.
    pub fn fixed_bytes() -> u64 {
        (2 * RING * std::mem::size_of::<(AtomicU32, AtomicU64)>() + std::mem::size_of::<Reuse>()) as u64
    }
}

/// Note in `ring` that second `now` began at count `n` (if it is its first).
fn note(ring: &[(AtomicU32, AtomicU64)], now: u32, n: u64) {
    let (sec, at) = &ring[now as usize % RING];
    let tag = now.wrapping_add(1);
    if sec.load(Relaxed) != tag {
        at.store(n, Relaxed);
        sec.store(tag, Release);
    }
}

/// Counts since the start of the first second in `last..=now` that `ring`
/// noted, of `count` so far; `None` if `last` is older than it remembers.
fn since(ring: &[(AtomicU32, AtomicU64)], last: u32, now: u32, count: u64) -> Option<u64> {
    let age = now.wrapping_sub(last);
    if age as usize >= RING {
        return None;
    }
    for t in (0..=age).map(|d| last.wrapping_add(d)) {
        let (sec, at) = &ring[t as usize % RING];
        if sec.load(Acquire) == t.wrapping_add(1) {
            return Some(count.saturating_sub(at.load(Relaxed)));
        }
    }
    Some(0) // nothing since: as near as can be
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool's store counter, for the ring.
    struct Pool(u64);

    impl Pool {
        fn store(&mut self, r: &Reuse, now: u32) {
            r.note_store(now, self.0);
            self.0 += 1;
        }
    }

    #[test]
    fn a_hit_is_near_within_the_pools_size_in_stores_and_far_beyond() {
        let (r, mut p) = (Reuse::new(), Pool(0));
        // Second 10: page A stored; then 500 stores in second 11 and 20 in 12.
        p.store(&r, 10);
        (0..500).for_each(|_| p.store(&r, 11));
        (0..20).for_each(|_| p.store(&r, 12));
        // A (last used at 10): 520 stores since the start of second 10, plus its own.
        assert_eq!(r.stores_since(10, 12, p.0), Some(521));
        r.note_hit(10, 12, p.0, 100);
        assert_eq!(r.hits(), (0, 1), "farther than a 100-page pool");
        r.note_hit(10, 12, p.0, 1000);
        assert_eq!(r.hits(), (1, 1), "within a 1000-page pool");
        // A page last used at 12: the 20 stores of that second.
        r.note_hit(12, 12, p.0, 100);
        assert_eq!(r.hits(), (2, 1));
        // A second without stores counts from the next one that had some.
        assert_eq!(r.stores_since(9, 12, p.0), Some(521));
        // Nothing stored since: near.
        assert_eq!(r.stores_since(13, 13, p.0), Some(0));
        // Older than the ring: far, whatever the pool.
        assert_eq!(r.stores_since(10, 10 + RING as u32, p.0), None);
        r.note_hit(10, 10 + RING as u32, p.0, u64::MAX);
        assert_eq!(r.hits(), (2, 2));
    }

    #[test]
    fn a_first_hit_counts_the_loads_since_its_store() {
        let r = Reuse::new();
        let mut loads = 0;
        // Second 10: the page stored; 300 loads in second 11; stores do not count.
        (0..1000).for_each(|n| r.note_store(10, n));
        for _ in 0..300 {
            r.note_load(11, loads);
            loads += 1;
        }
        r.note_first_hit(10, 12, loads, 100);
        assert_eq!(r.first_hits(), (0, 1), "300 pages loaded since: farther than a 100-page pool");
        r.note_first_hit(10, 12, loads, 1000);
        assert_eq!(r.first_hits(), (1, 1), "within a 1000-page pool");
        // No load since the store: as near as can be.
        r.note_first_hit(12, 12, loads, 1);
        assert_eq!(r.first_hits(), (2, 1));
        // Older than the ring: far.
        r.note_first_hit(10, 10 + RING as u32, loads, u64::MAX);
        assert_eq!(r.first_hits(), (2, 2));
        assert_eq!(r.hits(), (0, 0), "the hits by stores are apart");
    }

    #[test]
    fn a_second_seen_again_a_ring_later_starts_afresh() {
        let (r, mut p) = (Reuse::new(), Pool(0));
        (0..50).for_each(|_| p.store(&r, 3));
        (0..7).for_each(|_| p.store(&r, 3 + RING as u32));
        assert_eq!(r.stores_since(3 + RING as u32, 3 + RING as u32, p.0), Some(7));
    }
}
