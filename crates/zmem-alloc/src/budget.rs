//! A byte budget: zram's `mem_limit`, charged before memory is taken.
//!
//! zram caps only zsmalloc's pages, because its table is allocated up
//! front for the whole disk and never grows. A zmem pool's bookkeeping
//! grows with what it holds (index blocks, hash tables, LRU queues, the
//! allocator's handle tables, the backing store's record table), so the
//! limit has to cover all of it, or `mem_used_total` walks past
//! `mem_limit` one table resize at a time.
//!
//! The rule every owner of memory follows: **charge before you grow, undo
//! on failure, settle to the exact size afterwards.** A growth whose exact
//! size is not known in advance (a hash table's resize) charges an upper
//! bound first, then gives back what it did not use. So the charged total
//! is never below what is really held, and [`Budget::max_used`] is a true
//! high-water mark: with a limit set it never exceeds the limit.
//!
//! One budget is shared (`Arc`) by the allocator and everything the pool
//! builds on top of it; a charge is one atomic add (no limit) or one
//! compare-and-swap loop (with a limit), made only when something grows.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::AllocError;

/// Bytes charged, their high-water mark, and the limit.
#[derive(Debug)]
pub struct Budget {
    used: AtomicU64,
    max_used: AtomicU64,
    /// `u64::MAX`: no limit.
    limit: AtomicU64,
}

impl Budget {
    pub fn new(limit: Option<u64>) -> Budget {
        Budget { used: AtomicU64::new(0), max_used: AtomicU64::new(0), limit: AtomicU64::new(limit.unwrap_or(u64::MAX)) }
    }

    /// Charge `bytes`, unless that takes the total past the limit; then
    /// nothing is charged and the error names the limit.
    #[inline]
    pub fn try_charge(&self, bytes: u64) -> Result<(), AllocError> {
        if bytes == 0 {
            return Ok(());
        }
        let limit = self.limit.load(Relaxed);
        let new = if limit == u64::MAX {
            self.used.fetch_add(bytes, Relaxed) + bytes
        } else {
            let mut cur = self.used.load(Relaxed);
            loop {
                let new = cur.saturating_add(bytes);
                if new > limit {
                    return Err(AllocError::LimitReached { limit_bytes: limit });
                }
                match self.used.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                    Ok(_) => break new,
                    Err(actual) => cur = actual,
                }
            }
        };
        self.max_used.fetch_max(new, Relaxed);
        Ok(())
    }

    /// Charge `bytes` whatever the limit: only for memory that is already
    /// held and was found uncharged (a bound that proved too small), so
    /// the books stay true. Callers avoid it on every normal path.
    pub fn force_charge(&self, bytes: u64) {
        if bytes > 0 {
            let new = self.used.fetch_add(bytes, Relaxed) + bytes;
            self.max_used.fetch_max(new, Relaxed);
        }
    }

    /// Give back `bytes` charged earlier.
    #[inline]
    pub fn uncharge(&self, bytes: u64) {
        if bytes > 0 {
            let prev = self.used.fetch_sub(bytes, Relaxed);
            debug_assert!(prev >= bytes, "uncharged {bytes} bytes of {prev}");
        }
    }

    /// After a growth that charged `reserved` up front: the growth really
    /// took `actual` bytes. Give back the difference (or, if the bound was
    /// too small, charge the rest).
    #[inline]
    pub fn settle(&self, reserved: u64, actual: u64) {
        if actual <= reserved {
            self.uncharge(reserved - actual);
        } else {
            debug_assert!(false, "a growth of {actual} bytes exceeded its bound of {reserved}");
            self.force_charge(actual - reserved);
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// The most ever charged at once.
    pub fn max_used(&self) -> u64 {
        self.max_used.load(Relaxed)
    }

    /// The limit, if there is one.
    pub fn limit(&self) -> Option<u64> {
        let l = self.limit.load(Relaxed);
        (l != u64::MAX).then_some(l)
    }

    /// Change the limit. Lowering it below what is charged frees nothing:
    /// it only makes the next growth fail.
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(u64::MAX), Relaxed);
    }
}

/// Make room in `v` for `more` elements, growing by an eighth (at least
/// `more`, at least 4) rather than doubling, and charge the new capacity
/// to `budget` first. On failure `v` is unchanged.
pub(crate) fn grow_charged<T>(v: &mut Vec<T>, more: usize, budget: &Budget) -> Result<(), AllocError> {
    if v.capacity() - v.len() >= more {
        return Ok(());
    }
    let extra = (v.len() / 8).max(more).max(4);
    let size = std::mem::size_of::<T>() as u64;
    let before = v.capacity() as u64 * size;
    let reserved = (v.len() + extra) as u64 * size - before;
    budget.try_charge(reserved)?;
    v.reserve_exact(extra);
    budget.settle(reserved, v.capacity() as u64 * size - before);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_holds_and_the_high_water_mark_is_true() {
        let b = Budget::new(Some(100));
        b.try_charge(60).unwrap();
        assert!(matches!(b.try_charge(41), Err(AllocError::LimitReached { limit_bytes: 100 })));
        assert_eq!(b.used(), 60, "a refused charge charges nothing");
        b.try_charge(40).unwrap();
        b.uncharge(50);
        b.settle(30, 10);
        assert_eq!((b.used(), b.max_used()), (30, 100));
        b.set_limit(None);
        b.try_charge(1 << 40).unwrap();
        assert_eq!(b.limit(), None);
    }

    #[test]
    fn gentle_growth_is_charged_exactly() {
        let b = Budget::new(Some(4096));
        let mut v: Vec<u64> = Vec::new();
        for i in 0..300 {
            grow_charged(&mut v, 1, &b).unwrap();
            v.push(i);
            assert_eq!(b.used(), v.capacity() as u64 * 8);
        }
        let before = (v.capacity(), b.used());
        assert!(grow_charged(&mut v, 1000, &b).is_err());
        assert_eq!((v.capacity(), b.used()), before, "a refused growth changes nothing");
    }
}
