//! The key index of one shard: 16-entry blocks in a hash map.
//!
//! zram indexes its pages with a flat array sized for the whole disk (16
//! bytes per page, never counted in `mem_used_total`); zswap uses a tree (an
//! xarray today) per swap device. Our keys are page numbers from every
//! frontend (block-device offsets, swap slots, process page offsets, file
//! page indices), so they come in runs. A block of 16 consecutive keys per
//! hash-map slot stores a dense run at 12 bytes per entry plus ~2 bytes of
//! map overhead, against ~40 bytes per entry for a plain `HashMap<u64,
//! Entry>`; a key with no neighbours costs a whole block (~230 bytes), the
//! price of that density. Empty blocks are freed at once.
//!
//! A new block and any resize of the map are charged to the pool's budget
//! before the key goes in ([`BlockIndex::insert`] is refused otherwise);
//! the bytes held are kept in a counter, so the index's share of
//! `mem_used_total` costs nothing to read.

use std::ops::Range;

use zmem_alloc::{AllocError, Budget};

use crate::charged::{map_bytes, map_insert_new, Map};
use crate::entry::Entry;

pub(crate) const BLOCK_SHIFT: u32 = 4;
const BLOCK: usize = 1 << BLOCK_SHIFT;
const MASK: u64 = BLOCK as u64 - 1;

/// Sixteen entries, and their last-access times (zram's `ac_time`, seconds
/// since the pool was created), which every pool keeps: they name idle
/// pages for writeback and recompression. 80 bytes a block (5 a key) with
/// malloc's header, 0.2 % of `mem_used_total` on the `/usr/lib` tar, in a
/// second allocation so that a load touches it only after the entry.
struct Block {
    e: [Entry; BLOCK],
    ac: Option<Box<[u32; BLOCK]>>,
}

/// Heap bytes of a block, and of its access times (with malloc's header).
const BLOCK_BYTES: u64 = (std::mem::size_of::<Block>() + 16) as u64;
const AC_BYTES: u64 = (std::mem::size_of::<[u32; BLOCK]>() + 16) as u64;

impl Block {
    fn new(with_ac: bool) -> Box<Block> {
        Box::new(Block { e: [Entry::EMPTY; BLOCK], ac: with_ac.then(|| Box::new([0; BLOCK])) })
    }
    fn is_empty(&self) -> bool {
        self.e.iter().all(|e| e.is_empty())
    }
}

#[derive(Default)]
pub(crate) struct BlockIndex {
    blocks: Map<Box<Block>>,
    len: usize,
    /// Blocks keep access times (a writeback tier asks for them): each
    /// block gets its array when it is created, so a load never allocates.
    with_ac: bool,
    /// Heap bytes of the blocks (the map's table is read from the map).
    block_bytes: u64,
}

impl BlockIndex {
    pub fn new(with_ac: bool) -> BlockIndex {
        BlockIndex { with_ac, ..BlockIndex::default() }
    }

    fn one_block_bytes(&self) -> u64 {
        BLOCK_BYTES + if self.with_ac { AC_BYTES } else { 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        let e = self.blocks.get(&(key >> BLOCK_SHIFT))?.e[(key & MASK) as usize];
        (!e.is_empty()).then_some(e)
    }

    #[cfg(test)]
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Last access time of `key` (0 if never recorded).
    #[cfg(test)]
    pub fn ac_time(&self, key: u64) -> u32 {
        self.blocks.get(&(key >> BLOCK_SHIFT)).and_then(|b| b.ac.as_ref()).map_or(0, |ac| ac[(key & MASK) as usize])
    }

    /// Record an access to an existing key (no-op without access times).
    pub fn touch(&mut self, key: u64, now: u32) {
        if let Some(ac) = self.blocks.get_mut(&(key >> BLOCK_SHIFT)).and_then(|b| b.ac.as_mut()) {
            ac[(key & MASK) as usize] = now;
        }
    }

    /// A load's access to `key`: record the access time and hand out the
    /// entry for flag updates, in one lookup. `None` if the key is absent.
    pub fn access(&mut self, key: u64, now: u32) -> Option<&mut Entry> {
        let b = self.blocks.get_mut(&(key >> BLOCK_SHIFT))?;
        let i = (key & MASK) as usize;
        if b.e[i].is_empty() {
            return None;
        }
        if let Some(ac) = b.ac.as_mut() {
            ac[i] = now;
        }
        Some(&mut b.e[i])
    }

    /// Replace an existing entry without touching counts (flag updates).
    pub fn set(&mut self, key: u64, e: Entry) {
        if let Some(b) = self.blocks.get_mut(&(key >> BLOCK_SHIFT)) {
            let slot = &mut b.e[(key & MASK) as usize];
            if !slot.is_empty() {
                *slot = e;
            }
        }
    }

    /// Every entry with its key and last access time.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        self.blocks.iter().flat_map(|(&id, b)| {
            b.e.iter().enumerate().filter(|(_, e)| !e.is_empty()).map(move |(i, &e)| (id << BLOCK_SHIFT | i as u64, e, b.ac.as_ref().map_or(0, |ac| ac[i])))
        })
    }

    /// Insert or replace; returns the previous entry. A key that needs a
    /// new block is refused, changing nothing, if `budget` cannot pay for
    /// the block and the map's growth.
    pub fn insert(&mut self, key: u64, e: Entry, budget: &Budget) -> Result<Option<Entry>, AllocError> {
        let id = key >> BLOCK_SHIFT;
        let i = (key & MASK) as usize;
        if let Some(b) = self.blocks.get_mut(&id) {
            let old = std::mem::replace(&mut b.e[i], e);
            if !old.is_empty() {
                return Ok(Some(old));
            }
            self.len += 1;
            return Ok(None);
        }
        let bytes = self.one_block_bytes();
        budget.try_charge(bytes)?;
        let mut block = Block::new(self.with_ac);
        block.e[i] = e;
        if let Err(err) = map_insert_new(&mut self.blocks, id, block, budget) {
            budget.uncharge(bytes);
            return Err(err);
        }
        self.block_bytes += bytes;
        self.len += 1;
        Ok(None)
    }

    /// Remove `key`; a block left empty is freed and its bytes uncharged.
    pub fn remove(&mut self, key: u64, budget: &Budget) -> Option<Entry> {
        let id = key >> BLOCK_SHIFT;
        let b = self.blocks.get_mut(&id)?;
        let old = std::mem::replace(&mut b.e[(key & MASK) as usize], Entry::EMPTY);
        if old.is_empty() {
            return None;
        }
        self.len -= 1;
        if b.is_empty() {
            self.blocks.remove(&id);
            let bytes = self.one_block_bytes();
            self.block_bytes -= bytes;
            budget.uncharge(bytes);
        }
        Some(old)
    }

    /// Remove every key in `range`, pushing the removed entries to `out`.
    pub fn remove_range(&mut self, range: &Range<u64>, out: &mut Vec<Entry>, budget: &Budget) {
        let before = out.len();
        let blocks_before = self.blocks.len();
        self.blocks.retain(|&id, b| {
            let base = id << BLOCK_SHIFT;
            if base > range.end.saturating_sub(1) || base.saturating_add(MASK) < range.start {
                return true;
            }
            for (i, e) in b.e.iter_mut().enumerate() {
                if !e.is_empty() && range.contains(&(base + i as u64)) {
                    out.push(std::mem::replace(e, Entry::EMPTY));
                }
            }
            !b.is_empty()
        });
        self.len -= out.len() - before;
        let bytes = (blocks_before - self.blocks.len()) as u64 * self.one_block_bytes();
        self.block_bytes -= bytes;
        budget.uncharge(bytes);
    }

    /// Heap bytes held: the map's table and every block (with malloc's header).
    pub fn heap_bytes(&self) -> u64 {
        map_bytes(&self.blocks) + self.block_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_free_blocks() {
        for with_ac in [false, true] {
            let b = Budget::new(None);
            let mut ix = BlockIndex::new(with_ac);
            assert_eq!(ix.insert(5, Entry::same(1), &b).unwrap(), None);
            assert_eq!(ix.insert(5, Entry::same(2), &b).unwrap(), Some(Entry::same(1)));
            assert_eq!(ix.insert(u64::MAX, Entry::same(3), &b).unwrap(), None);
            assert_eq!(ix.len(), 2);
            assert_eq!(ix.get(5), Some(Entry::same(2)));
            assert_eq!(ix.get(6), None);
            assert!(ix.heap_bytes() > 2 * 192);
            assert_eq!(b.used(), ix.heap_bytes());
            ix.touch(5, 77);
            assert_eq!(ix.ac_time(5), if with_ac { 77 } else { 0 });
            assert_eq!(ix.ac_time(6), 0);
            assert_eq!(ix.iter().map(|(k, _, ac)| (k, ac)).collect::<Vec<_>>().len(), 2);
            assert_eq!(ix.remove(5, &b), Some(Entry::same(2)));
            assert_eq!(ix.remove(5, &b), None);
            assert_eq!(ix.blocks.len(), 1, "the emptied block is freed");
            assert_eq!(b.used(), ix.heap_bytes());
            let mut out = Vec::new();
            for k in 0..100 {
                ix.insert(k, Entry::same(k), &b).unwrap();
            }
            ix.remove_range(&(10..90), &mut out, &b);
            assert_eq!(out.len(), 80);
            assert_eq!(ix.len(), 21);
            assert!(ix.contains(9) && !ix.contains(10) && !ix.contains(89) && ix.contains(90));
            assert_eq!(b.used(), ix.heap_bytes());
            ix.remove_range(&(0..u64::MAX), &mut out, &b);
            assert!(ix.contains(u64::MAX));
            assert_eq!(ix.len(), 1);
            assert_eq!(b.used(), ix.heap_bytes());
        }
    }

    #[test]
    fn a_key_that_needs_a_block_the_budget_cannot_pay_for_is_refused() {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new(true);
        ix.insert(0, Entry::same(0), &b).unwrap();
        let limited = Budget::new(Some(b.used()));
        limited.force_charge(b.used());
        assert!(matches!(ix.insert(16, Entry::same(1), &limited), Err(AllocError::LimitReached { .. })));
        assert_eq!((ix.len(), ix.heap_bytes(), limited.used()), (1, b.used(), b.used()));
        // Keys of a block that exists need nothing.
        ix.insert(15, Entry::same(2), &limited).unwrap();
        assert_eq!(ix.len(), 2);
    }
}
