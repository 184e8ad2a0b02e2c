//! The ledger: every key's entry, kept where the process's death does not
//! take it.
//!
//! # Why
//! A swap device must outlive its server: killed or upgraded, the server's
//! successor must find every page. The objects already outlive it (the
//! allocator's arena, `zmem_alloc::arena`); what names them, the index, is
//! heap. The ledger is the arena's table ([`SharedTable`]): for a pool of a
//! device (keys `0..N`, [`crate::PoolConfig::ledger_keys`]), one 16-byte
//! entry per key, written whole (one atomic store) with every change of
//! the key's entry, under the key's shard lock. [`crate::Pool::open`]
//! rebuilds the index from it. zram's table is the same thing: a flat
//! array with one (handle, flags) per slot; here it is kept beside the
//! index rather than instead of it.
//!
//! # Order
//! What makes a death at any instant safe is the order against the
//! allocator, which the engine already keeps: a new object is written
//! whole before its entry is published (and so recorded), and an entry is
//! recorded gone or replaced, under the shard lock, before the object it
//! named is freed, after that lock. So a recorded entry always names a
//! live object; an object allocated and not yet recorded is named by no
//! entry, and the next process frees it.
//!
//! # Format
//! An entry is `VALID | meta << 64 | payload` (`Entry::to_raw`: the flags
//! that only steer a process, the referenced bit and the LRU generation,
//! are not kept); 0 is a key with no page. The format is part of the
//! arena's: a change here bumps `zmem_alloc::ARENA_VERSION`, which every
//! opening checks, so that a process never reads another's entries wrong. A page of the table holds the
//! 256 keys of one cold block, so it belongs to one shard: a range
//! dropped whole gives its pages back ([`Ledger::clear`]).
//!
//! # Cost
//! 16 bytes a key, in pages of 256 keys charged to the pool's budget the
//! first time one of their keys is recorded (so `mem_used_total` shows
//! it), and one 16-byte store per change of an entry.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use zmem_alloc::{Budget, SharedTable, TABLE_PAGE_ENTRIES};

use crate::entry::Entry;

const VALID: u128 = 1 << 127;
/// A key whose page could not be proven right (`Shard::mark_lost`).
const LOST: u128 = 1;
const PAGE: u64 = 4096;

/// See the module notes.
pub(crate) struct Ledger {
    table: SharedTable,
    /// A bit per page of the table: charged to `budget`.
    charged: Box<[AtomicU64]>,
    budget: Arc<Budget>,
}

/// What a ledger entry says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    Entry(Entry),
    /// A page lost when the pool was opened before, not stored since.
    Lost,
    /// Not 0 and not an entry: a damaged word.
    Damaged,
}

impl Ledger {
    /// A ledger over `table`, charging its pages to `budget`: those that
    /// hold data already (a table found again) at once.
    pub fn new(table: SharedTable, budget: Arc<Budget>) -> Ledger {
        let pages = table.len().div_ceil(TABLE_PAGE_ENTRIES);
        let l = Ledger { charged: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(), table, budget };
        for r in l.table.written() {
            for p in r.start / TABLE_PAGE_ENTRIES..r.end.div_ceil(TABLE_PAGE_ENTRIES) {
                l.charge(p);
            }
        }
        l
    }

    /// Keys the ledger has room for.
    pub fn keys(&self) -> u64 {
        self.table.len() as u64
    }

    fn charge(&self, page: usize) {
        let bit = 1u64 << (page % 64);
        if self.charged[page / 64].fetch_or(bit, Relaxed) & bit == 0 {
            // (A page is memory held once written: charged whatever the
            // limit, as the index's own blocks of a publish are.)
            self.budget.force_charge(PAGE);
        }
    }

    /// `key`'s entry is now `e` (None: no page). Keys past the table are
    /// not kept (the pool refuses them: `Pool::store`).
    #[inline]
    pub fn record(&self, key: u64, e: Option<Entry>) {
        if key >= self.keys() {
            return;
        }
        let v = match e {
            None => 0,
            Some(e) => {
                self.charge(key as usize / TABLE_PAGE_ENTRIES);
                let (meta, data) = e.to_raw();
                VALID | (meta as u128) << 64 | data as u128
            }
        };
        self.table.set(key as usize, v);
    }

    /// `key`'s page is lost ([`Recorded::Lost`]).
    pub fn record_lost(&self, key: u64) {
        if key < self.keys() {
            self.charge(key as usize / TABLE_PAGE_ENTRIES);
            self.table.set(key as usize, LOST);
        }
    }

    /// No page for any key of `range` whose 256-key page `owned` says is
    /// the caller's (the shard whose lock it holds): whole pages are given
    /// back.
    pub fn clear(&self, range: &Range<u64>, owned: impl Fn(u64) -> bool) {
        let (start, end) = (range.start.min(self.keys()), range.end.min(self.keys()));
        let per = TABLE_PAGE_ENTRIES as u64;
        let mut page = start / per;
        while page * per < end {
            let (a, b) = ((page * per).max(start), ((page + 1) * per).min(end));
            if owned(page * per) {
                self.table.clear(a as usize..b as usize);
                if b - a == per {
                    let bit = 1u64 << (page % 64);
                    if self.charged[page as usize / 64].fetch_and(!bit, Relaxed) & bit != 0 {
                        self.budget.uncharge(PAGE);
                    }
                }
            }
            page += 1;
        }
    }

    /// Every key with something recorded, and what.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Recorded)> + '_ {
        self.table.written().into_iter().flat_map(move |r| {
            r.filter_map(move |k| {
                let v = self.table.get(k);
                (v != 0).then(|| {
                    let e = (v & VALID != 0).then(|| Entry::from_raw((v >> 64) as u32, v as u64)).flatten();
                    let r = match e {
                        Some(e) => Recorded::Entry(e),
                        None if v == LOST => Recorded::Lost,
                        None => Recorded::Damaged,
                    };
                    (k as u64, r)
                })
            })
        })
    }

    /// Bytes charged for the table's pages.
    pub fn bytes(&self) -> u64 {
        self.charged.iter().map(|w| w.load(Relaxed).count_ones() as u64).sum::<u64>() * PAGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::ObjInfo;

    fn ledger(keys: usize) -> (zmem_alloc::ZsPool, Ledger) {
        let pool = zmem_alloc::ZsPool::default();
        let table = pool.shared_table(keys).unwrap();
        let l = Ledger::new(table, Arc::clone(pool.budget()));
        (pool, l)
    }

    #[test]
    fn entries_are_recorded_cleared_and_charged_by_page() {
        let (pool, l) = ledger(4096);
        let base = pool.budget().used();
        let obj = Entry::obj(zmem_alloc::Handle::from_raw(77), ObjInfo::raw()).with_referenced(true).with_gen(9);
        l.record(3, Some(obj));
        l.record(300, Some(Entry::same(0xabab)));
        l.record(301, Some(Entry::same(1)));
        l.record(301, None);
        l.record(1 << 40, Some(Entry::same(2)));
        let got: Vec<_> = l.entries().collect();
        // The flags that steer only this process are not kept.
        assert_eq!(got, vec![(3, Recorded::Entry(obj.with_referenced(false).with_gen(0))), (300, Recorded::Entry(Entry::same(0xabab)))]);
        assert_eq!((pool.budget().used() - base, l.bytes()), (2 * PAGE, 2 * PAGE));
        // A range: the whole page of keys 256..512 goes back; the edge of
        // the first page is written, and only keys the caller owns.
        l.record(255, Some(Entry::same(5)));
        l.clear(&(255..1024), |first| first != 512);
        let got: Vec<_> = l.entries().map(|(k, _)| k).collect();
        assert_eq!(got, vec![3]);
        assert_eq!(l.bytes(), PAGE);
        l.record(600, Some(Entry::same(6)));
        l.clear(&(0..4096), |first| first != 512);
        assert_eq!(l.entries().map(|(k, _)| k).collect::<Vec<_>>(), vec![600], "a page the caller does not own stays");
        // A damaged word is told apart from an entry, and from a lost page.
        l.table.set(7, 5);
        l.record_lost(8);
        let got: Vec<_> = l.entries().filter(|&(k, _)| k == 7 || k == 8).collect();
        assert_eq!(got, vec![(7, Recorded::Damaged), (8, Recorded::Lost)]);
    }
}
