//! A class's handle table, in the arena.
//!
//! The handle table is what a caller's [`crate::Handle`] points into, and
//! the one thing compaction rewrites when it moves an object, so it is the
//! allocator's state that must outlive the process: with it and the
//! directory's chunks, every live object's span and slot are known again.
//! It lives in segments of the arena, each twice the one before (512
//! entries, then 1,024, ...), so a class's table costs what it holds and
//! is a handful of mappings, never one per page; its pages are charged as
//! entries reach into them (a segment's untouched pages cost nothing).
//! Entries are atomic words
//! (the arena is shared memory) written with release order, so an entry
//! naming a new place is never seen before the bytes copied there.

use std::sync::atomic::Ordering::{Relaxed, Release};

use crate::arena::{Arena, Kind};
use crate::budget::grow_charged;
use crate::mem::Region;
use crate::{AllocError, Budget, PAGE_SIZE};

/// Entries in a class's first segment (one page); each next one doubles.
const SEG0: usize = 512;
/// Entries in a page.
const PAGE_ENTRIES: usize = PAGE_SIZE / 8;

pub(crate) struct HandleTable {
    segs: Vec<Region>,
    /// Entries in use (handed out at least once).
    len: usize,
    /// Entries whose pages are charged (whole pages: a multiple of 512).
    charged: usize,
}

/// The segment holding entry `i`, and its place there.
#[inline]
fn locate(i: usize) -> (usize, usize) {
    let q = i / SEG0 + 1;
    let k = (usize::BITS - 1 - q.leading_zeros()) as usize;
    (k, i - SEG0 * ((1 << k) - 1))
}

/// Bytes of segment `k`.
pub(crate) fn seg_bytes(k: usize) -> usize {
    (SEG0 << k) * 8
}

impl HandleTable {
    pub(crate) fn new() -> HandleTable {
        HandleTable { segs: Vec::new(), len: 0, charged: 0 }
    }

    /// A table over segments found in an arena: in use up to its last
    /// entry that is not zero (a new entry is never zero).
    pub(crate) fn opened(segs: Vec<Region>) -> HandleTable {
        let mut t = HandleTable { segs, len: 0, charged: 0 };
        t.len = t.capacity();
        while t.len > 0 && t.raw(t.len - 1) == 0 {
            t.len -= 1;
        }
        t.charged = t.len.next_multiple_of(PAGE_ENTRIES);
        t
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn capacity(&self) -> usize {
        SEG0 * ((1 << self.segs.len()) - 1)
    }

    #[inline]
    fn raw(&self, i: usize) -> u64 {
        let (k, o) = locate(i);
        self.segs[k].words()[o].load(Relaxed)
    }

    /// Entry `i`, if it is in use.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        (i < self.len).then(|| self.raw(i))
    }

    /// Write entry `i` (in use).
    #[inline]
    pub(crate) fn set(&self, i: usize, v: u64) {
        debug_assert!(i < self.len);
        let (k, o) = locate(i);
        self.segs[k].words()[o].store(v, Release);
    }

    /// Put a new entry at the end (there must be room: [`Self::make_room`]).
    pub(crate) fn push(&mut self, v: u64) {
        debug_assert!(self.len < self.charged && self.charged <= self.capacity());
        self.len += 1;
        self.set(self.len - 1, v);
    }

    /// Make room for one more entry: the next segment when the last is
    /// full, and the page the entry reaches into, charged to `b` first. A
    /// refusal changes nothing anyone can see.
    pub(crate) fn make_room(&mut self, arena: &Arena, class: usize, b: &Budget) -> Result<(), AllocError> {
        if self.len == self.capacity() {
            let k = self.segs.len();
            grow_charged(&mut self.segs, 1, b)?;
            let r = arena.add(Kind::Handles, class, k as u32, seg_bytes(k)).map_err(|e| AllocError::OutOfMemory(e.to_string()))?;
            self.segs.push(r);
        }
        if self.len == self.charged {
            b.try_charge(PAGE_SIZE as u64)?;
            self.charged += PAGE_ENTRIES;
        }
        Ok(())
    }

    /// Bytes this table holds: its charged pages, and its segments' list.
    pub(crate) fn bytes(&self) -> usize {
        self.charged * 8 + self.segs.capacity() * std::mem::size_of::<Region>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fill_segments_in_order() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(511), (0, 511));
        assert_eq!(locate(512), (1, 0));
        assert_eq!(locate(1535), (1, 1023));
        assert_eq!(locate(1536), (2, 0));
        let mut i = 0;
        for k in 0..12 {
            for o in [0, (SEG0 << k) - 1] {
                assert_eq!(locate(i + o), (k, o));
            }
            i += SEG0 << k;
        }
        assert_eq!(locate((1 << 31) - 1).0, 22);
    }
}
