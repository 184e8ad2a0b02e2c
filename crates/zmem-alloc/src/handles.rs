//! A class's handle table, in the arena.
//!
//! The handle table is what a caller's [`crate::Handle`] points into, and
//! the one thing compaction rewrites when it moves an object, so it is the
//! allocator's state that must outlive the process: with it and the
//! directory's chunks, every live object's span and slot are known again.
//!
//! A class's first [`NURSERY`] entries live in the arena's nursery, one
//! region that holds the first entries of every class side by side (so a
//! pool that uses many classes a little pays 128 bytes a class, not a page
//! a class); the rest in segments of the class's own, each twice the one
//! before (512 entries, then 1,024, ...), so a class's table costs what it
//! holds and is a handful of mappings, never one per page. Its pages are
//! charged as entries reach into them (a segment's untouched pages cost
//! nothing). Entries are atomic words (the arena is shared memory) written
//! with release order, so an entry naming a new place is never seen before
//! the bytes copied there.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;

use crate::arena::{Arena, Kind};
use crate::budget::grow_charged;
use crate::mem::Region;
use crate::{AllocError, Budget, NUM_CLASSES, PAGE_SIZE};

/// A class's entries in the nursery.
pub(crate) const NURSERY: usize = 16;
/// Bytes of the nursery: every class's first entries.
pub(crate) const NURSERY_BYTES: usize = (NUM_CLASSES * NURSERY * 8).next_multiple_of(PAGE_SIZE);
/// Entries in a class's first segment of its own (one page); each next one
/// doubles.
const SEG0: usize = 512;

pub(crate) struct HandleTable {
    class: usize,
    /// The nursery, once this class has a handle.
    nursery: Option<Arc<Region>>,
    segs: Vec<Region>,
    /// Entries in use (handed out at least once).
    len: usize,
    /// Entries charged: the nursery's share, then whole pages.
    charged: usize,
}

/// Where entry `i` is: in the nursery (`None`), or segment `k`, and its
/// place there.
#[inline]
fn locate(i: usize) -> (Option<usize>, usize) {
    if i < NURSERY {
        return (None, i);
    }
    let j = i - NURSERY;
    let q = j / SEG0 + 1;
    let k = (usize::BITS - 1 - q.leading_zeros()) as usize;
    (Some(k), j - SEG0 * ((1 << k) - 1))
}

/// Bytes of segment `k`.
pub(crate) fn seg_bytes(k: usize) -> usize {
    (SEG0 << k) * 8
}

/// What `len` entries in use are charged for.
fn charge_of(len: usize) -> usize {
    match len {
        0 => 0,
        l if l <= NURSERY => NURSERY,
        l => NURSERY + (l - NURSERY).next_multiple_of(SEG0),
    }
}

impl HandleTable {
    pub(crate) fn new(class: usize) -> HandleTable {
        HandleTable { class, nursery: None, segs: Vec::new(), len: 0, charged: 0 }
    }

    /// A table over the nursery and segments found in an arena: in use up
    /// to its last entry that is not zero (a new entry is never zero).
    pub(crate) fn opened(class: usize, nursery: Option<Arc<Region>>, segs: Vec<Region>) -> HandleTable {
        let mut t = HandleTable { class, nursery, segs, len: 0, charged: 0 };
        t.len = t.capacity();
        while t.len > 0 && t.raw(t.len - 1) == 0 {
            t.len -= 1;
        }
        t.charged = charge_of(t.len);
        t
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        match self.nursery {
            None => 0,
            Some(_) => NURSERY + SEG0 * ((1 << self.segs.len()) - 1),
        }
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        match locate(i) {
            (None, o) => &self.nursery.as_ref().expect("a table with entries has the nursery").words()[self.class * NURSERY + o],
            (Some(k), o) => &self.segs[k].words()[o],
        }
    }

    #[inline]
    fn raw(&self, i: usize) -> u64 {
        self.word(i).load(Relaxed)
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
        self.word(i).store(v, Release);
    }

    /// Put a new entry at the end (there must be room: [`Self::make_room`]).
    pub(crate) fn push(&mut self, v: u64) {
        debug_assert!(self.len < self.charged && self.charged <= self.capacity());
        self.len += 1;
        self.set(self.len - 1, v);
    }

    /// Make room for one more entry: the nursery or the next segment when
    /// there is no room, and the entries it reaches into, charged to `b`
    /// first. A refusal changes nothing anyone can see.
    pub(crate) fn make_room(&mut self, arena: &Arena, b: &Budget) -> Result<(), AllocError> {
        let oom = |e: std::io::Error| AllocError::OutOfMemory(e.to_string());
        if self.len == self.capacity() {
            if self.nursery.is_none() {
                self.nursery = Some(arena.nursery().map_err(oom)?);
            } else {
                let k = self.segs.len();
                grow_charged(&mut self.segs, 1, b)?;
                self.segs.push(arena.add(Kind::Handles, self.class, k as u32, seg_bytes(k)).map_err(oom)?);
            }
        }
        if self.len == self.charged {
            let more = charge_of(self.len + 1) - self.charged;
            b.try_charge(more as u64 * 8)?;
            self.charged += more;
        }
        Ok(())
    }

    /// Bytes this table holds: its charged entries, and its segments' list.
    pub(crate) fn bytes(&self) -> usize {
        self.charged * 8 + self.segs.capacity() * std::mem::size_of::<Region>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fill_the_nursery_then_segments_in_order() {
        assert_eq!(locate(0), (None, 0));
        assert_eq!(locate(15), (None, 15));
        assert_eq!(locate(16), (Some(0), 0));
        assert_eq!(locate(16 + 511), (Some(0), 511));
        assert_eq!(locate(16 + 512), (Some(1), 0));
        let mut i = NURSERY;
        for k in 0..12 {
            for o in [0, (SEG0 << k) - 1] {
                assert_eq!(locate(i + o), (Some(k), o));
            }
            i += SEG0 << k;
        }
        assert_eq!(locate((1 << 31) - 1).0, Some(22));
        assert_eq!((charge_of(1), charge_of(16), charge_of(17), charge_of(16 + 512), charge_of(16 + 513)), (16, 16, 528, 528, 1040));
    }
}
