//! Admission: zswap's `max_pool` and its marks.
//!
//! # Design
//! `max_pool` bounds what the pool takes from the machine: the allocator's
//! pages plus the metadata that grows with the data (allocator tables,
//! index, LRUs, the dedup table, the cold store's tables), of which at
//! most 3/4 of `max_pool` counts, so that pages always keep a quarter (the
//! tables of written-back pages cannot be written back). zswap counts
//! pages only. What the pool holds whatever its data (the shard arrays,
//! the cold store's I/O buffers) does not count, nor does the bound
//! charged ahead of a write to the cold store in flight.
//!
//! Below `max_pool` sit two marks: the **accept threshold**
//! (`accept_threshold_percent` of it) and the **high mark**, halfway from
//! the shrinker's target to `max_pool`. With a writeback tier a store that
//! leaves the pool at the high mark wakes the shrinker, which works down
//! to the target (the accept threshold, and always below `max_pool`); only
//! a store at `max_pool` waits for it (`tier.rs`). Without one, a store
//! that needs memory is refused at `max_pool`, and refused until the pool
//! is back under the accept threshold (zswap's `zswap_pool_reached_full`:
//! hysteresis, so it does not flap at the limit).
//!
//! # Trade-offs
//! * O(1) to ask: the budget's total and the allocator's page count, two
//!   atomics; no shard is visited.
//! * The limit and the flag are atomics read without a lock: a store racing
//!   a change of `max_pool` may be judged by either value.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::entry::PAGE_SIZE;
use crate::stats::Stats;

/// `max_pool`, its marks and zswap's pool-full flag (see the module notes).
pub(crate) struct Admission {
    /// `max_pool` in pages (`u64::MAX`: none).
    max_pages: AtomicU64,
    accept_percent: u8,
    /// What the budget holds from the start that does not grow with the
    /// data: the shard arrays.
    fixed_bytes: u64,
    /// zswap's `zswap_pool_reached_full`: set at max_pool, cleared below the
    /// accept threshold (pools without a writeback tier).
    full: AtomicBool,
}

/// What [`Admission::judge`] decides for a store without a writeback tier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    /// Refused; `hit` when this store is the one that reached `max_pool`
    /// (zswap's `pool_limit_hit`).
    Refuse {
        max_pages: u64,
        hit: bool,
    },
}

fn pages_of(bytes: Option<u64>) -> u64 {
    bytes.map_or(u64::MAX, |b| b.div_ceil(PAGE_SIZE as u64).max(1))
}

impl Admission {
    pub fn new(max_pool: Option<u64>, accept_percent: u8, fixed_bytes: u64) -> Admission {
        Admission { max_pages: AtomicU64::new(pages_of(max_pool)), accept_percent, fixed_bytes, full: AtomicBool::new(false) }
    }

    /// `max_pool` in pages (`u64::MAX`: none).
    pub fn max_pages(&self) -> u64 {
        self.max_pages.load(Relaxed)
    }

    /// Change `max_pool` (None: no limit); a pool marked full is judged
    /// afresh.
    pub fn set_max_pool(&self, bytes: Option<u64>) {
        self.max_pages.store(pages_of(bytes), Relaxed);
        self.full.store(false, Relaxed);
    }

    /// What `max_pool` bounds now, in pages, from the allocator's `pages`,
    /// the budget's `used` bytes and the bytes held that do not count
    /// (`uncounted`: the cold store's buffers and a write's bound ahead).
    pub fn held_pages(&self, pages: u64, used: u64, uncounted: u64) -> u64 {
        let max = self.max_pages();
        if max == u64::MAX {
            return pages;
        }
        let meta = used.saturating_sub(pages * PAGE_SIZE as u64 + self.fixed_bytes + uncounted);
        pages + (meta / PAGE_SIZE as u64).min(max - max / 4)
    }

    /// Pages under which a written-back page may come back to RAM, and
    /// under which a pool marked full accepts again.
    pub fn accept_pages(&self) -> u64 {
        let max = self.max_pages();
        if max == u64::MAX {
            return u64::MAX;
        }
        max * self.accept_percent as u64 / 100
    }

    /// Where a shrinker round stops: the accept threshold, and always below
    /// `max_pool`, so a round always leaves room for a waiting store.
    pub fn shrink_target(&self) -> u64 {
        self.accept_pages().min(self.max_pages().saturating_sub(1))
    }

    /// Where a store wakes the shrinker: halfway from the target to max_pool.
    pub fn high_pages(&self) -> u64 {
        let max = self.max_pages();
        if max == u64::MAX {
            return u64::MAX;
        }
        let target = self.shrink_target();
        target + (max - target) / 2
    }

    /// A store that needs memory, in a pool without a writeback tier that
    /// holds `used` pages: accept it, or refuse it until the pool is back
    /// under the accept threshold.
    pub fn judge(&self, used: u64) -> Verdict {
        let max = self.max_pages();
        if max == u64::MAX {
            return Verdict::Accept;
        }
        if self.full.load(Relaxed) {
            if used * 100 < max * self.accept_percent as u64 {
                self.full.store(false, Relaxed);
            } else {
                return Verdict::Refuse { max_pages: max, hit: false };
            }
        }
        if used >= max {
            self.full.store(true, Relaxed);
            return Verdict::Refuse { max_pages: max, hit: true };
        }
        Verdict::Accept
    }

    /// `max_pool_bytes`, `max_pool_used_bytes` and
    /// `accept_threshold_percent` of the stats, for `held` pages.
    pub fn fill_stats(&self, st: &mut Stats, held: u64) {
        let max = self.max_pages();
        st.max_pool_bytes = if max == u64::MAX { 0 } else { max * PAGE_SIZE as u64 };
        st.max_pool_used_bytes = held * PAGE_SIZE as u64;
        st.accept_threshold_percent = self.accept_percent as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_sit_below_max_pool() {
        let a = Admission::new(Some(1000 * PAGE_SIZE as u64), 90, 0);
        assert_eq!((a.accept_pages(), a.shrink_target(), a.high_pages()), (900, 900, 950));
        let tight = Admission::new(Some(PAGE_SIZE as u64), 100, 0);
        assert_eq!(tight.shrink_target(), 0, "always below max_pool");
        let none = Admission::new(None, 90, 0);
        assert_eq!((none.accept_pages(), none.high_pages()), (u64::MAX, u64::MAX));
    }

    #[test]
    fn refusal_holds_until_the_accept_threshold() {
        let a = Admission::new(Some(100 * PAGE_SIZE as u64), 90, 0);
        assert_eq!(a.judge(99), Verdict::Accept);
        assert_eq!(a.judge(100), Verdict::Refuse { max_pages: 100, hit: true });
        assert_eq!(a.judge(95), Verdict::Refuse { max_pages: 100, hit: false }, "hysteresis");
        assert_eq!(a.judge(89), Verdict::Accept);
        a.judge(100);
        a.set_max_pool(Some(200 * PAGE_SIZE as u64));
        assert_eq!(a.judge(150), Verdict::Accept, "a new limit is judged afresh");
    }

    #[test]
    fn metadata_counts_for_at_most_three_quarters() {
        let a = Admission::new(Some(100 * PAGE_SIZE as u64), 90, 4096);
        let page = PAGE_SIZE as u64;
        // 10 pages, 5 pages of tables, the fixed page not counted.
        assert_eq!(a.held_pages(10, 16 * page, 0), 15);
        assert_eq!(a.held_pages(10, 16 * page, 2 * page), 13, "buffers and a write's bound do not count");
        assert_eq!(a.held_pages(10, 1000 * page, 0), 10 + 75);
        assert_eq!(Admission::new(None, 90, 0).held_pages(10, 1000 * page, 0), 10, "no max_pool: pages only");
    }
}
