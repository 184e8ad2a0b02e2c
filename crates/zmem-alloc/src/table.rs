//! The owner's table: a flat array of 16-byte entries in the arena, for
//! what the pool's owner must find again with the objects (the engine keeps
//! every key's entry there: its ledger). Each entry is loaded and stored
//! whole (one 16-byte atomic operation), so a process killed at any
//! instant leaves every entry as it was before or after a store, never
//! half of each. Pages of the table never written cost nothing; cleared
//! pages are given back.

use std::ops::Range;
use std::sync::atomic::Ordering::{Acquire, Release};

use crate::mem::Region;
use crate::PAGE_SIZE;

/// Entries in a page of the table.
pub const TABLE_PAGE_ENTRIES: usize = PAGE_SIZE / 16;

/// See the module notes. Made or found again by [`crate::ZsPool::shared_table`].
pub struct SharedTable {
    region: Region,
}

impl SharedTable {
    pub(crate) fn new(region: Region) -> SharedTable {
        SharedTable { region }
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.region.len() / 16
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `i` (0 if never written). Panics if out of bounds. Reading
    /// an entry of a page never written fills that page (the file's, in
    /// RAM): a scan asks [`SharedTable::written`] first.
    #[inline]
    pub fn get(&self, i: usize) -> u128 {
        self.region.pairs()[i].load(Acquire)
    }

    /// Write entry `i` whole. Panics if out of bounds.
    #[inline]
    pub fn set(&self, i: usize, v: u128) {
        self.region.pairs()[i].store(v, Release);
    }

    /// Make every entry of `range` 0: whole pages are given back, the
    /// entries at the edges written (only where not 0 already). The caller
    /// makes sure nobody writes those entries meanwhile.
    pub fn clear(&self, range: Range<usize>) {
        let range = range.start..range.end.min(self.len());
        let first = range.start.next_multiple_of(TABLE_PAGE_ENTRIES);
        let last = range.end / TABLE_PAGE_ENTRIES * TABLE_PAGE_ENTRIES;
        if first < last {
            self.region.clear_atomics(first * 16, (last - first) * 16);
        }
        for i in range.clone().filter(|&i| i < first.min(range.end) || i >= last.max(range.start)) {
            if self.get(i) != 0 {
                self.set(i, 0);
            }
        }
    }

    /// The ranges of entries on pages that hold data: every entry not 0 is
    /// in one of them (reading the others through the mapping would fill
    /// their pages).
    pub fn written(&self) -> Vec<Range<usize>> {
        self.region.data_pages().into_iter().map(|p| p.start * TABLE_PAGE_ENTRIES..(p.end * TABLE_PAGE_ENTRIES).min(self.len())).collect()
    }
}
