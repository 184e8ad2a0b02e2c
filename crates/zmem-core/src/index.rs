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

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::Range;

use crate::entry::Entry;
use crate::pool::{map_bytes, KeyHasher};

pub(crate) const BLOCK_SHIFT: u32 = 4;
const BLOCK: usize = 1 << BLOCK_SHIFT;
const MASK: u64 = BLOCK as u64 - 1;

/// Sixteen entries, and their last-access times (zram's `ac_time`, seconds
/// since the pool was created) once a writeback tier asks for them.
struct Block {
    e: [Entry; BLOCK],
    ac: Option<Box<[u32; BLOCK]>>,
}

impl Block {
    fn new() -> Box<Block> {
        Box::new(Block { e: [Entry::EMPTY; BLOCK], ac: None })
    }
    fn is_empty(&self) -> bool {
        self.e.iter().all(|e| e.is_empty())
    }
}

#[derive(Default)]
pub(crate) struct BlockIndex {
    blocks: HashMap<u64, Box<Block>, BuildHasherDefault<KeyHasher>>,
    len: usize,
}

impl BlockIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        let e = self.blocks.get(&(key >> BLOCK_SHIFT))?.e[(key & MASK) as usize];
        (!e.is_empty()).then_some(e)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Last access time of `key` (0 if never recorded).
    #[cfg(test)]
    pub fn ac_time(&self, key: u64) -> u32 {
        self.blocks
            .get(&(key >> BLOCK_SHIFT))
            .and_then(|b| b.ac.as_ref())
            .map_or(0, |ac| ac[(key & MASK) as usize])
    }

    /// Record an access to an existing key.
    pub fn touch(&mut self, key: u64, now: u32) {
        if let Some(b) = self.blocks.get_mut(&(key >> BLOCK_SHIFT)) {
            b.ac.get_or_insert_with(|| Box::new([0; BLOCK]))[(key & MASK) as usize] = now;
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
        b.ac.get_or_insert_with(|| Box::new([0; BLOCK]))[i] = now;
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
            b.e.iter().enumerate().filter(|(_, e)| !e.is_empty()).map(move |(i, &e)| {
                (id << BLOCK_SHIFT | i as u64, e, b.ac.as_ref().map_or(0, |ac| ac[i]))
            })
        })
    }

    /// Insert or replace; returns the previous entry.
    pub fn insert(&mut self, key: u64, e: Entry) -> Option<Entry> {
        let b = self.blocks.entry(key >> BLOCK_SHIFT).or_insert_with(Block::new);
        let old = std::mem::replace(&mut b.e[(key & MASK) as usize], e);
        if old.is_empty() {
            self.len += 1;
            None
        } else {
            Some(old)
        }
    }

    pub fn remove(&mut self, key: u64) -> Option<Entry> {
        let id = key >> BLOCK_SHIFT;
        let b = self.blocks.get_mut(&id)?;
        let old = std::mem::replace(&mut b.e[(key & MASK) as usize], Entry::EMPTY);
        if old.is_empty() {
            return None;
        }
        self.len -= 1;
        if b.is_empty() {
            self.blocks.remove(&id);
        }
        Some(old)
    }

    /// Remove every key in `range`, pushing the removed entries to `out`.
    pub fn remove_range(&mut self, range: &Range<u64>, out: &mut Vec<Entry>) {
        let before = out.len();
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
    }

    /// Heap bytes held: the map's table and every block (with malloc's header).
    pub fn heap_bytes(&self) -> u64 {
        let table = map_bytes(self.blocks.capacity(), std::mem::size_of::<(u64, Box<Block>)>());
        let ac = self.blocks.values().filter(|b| b.ac.is_some()).count();
        table
            + (self.blocks.len() * (std::mem::size_of::<Block>() + 16)
                + ac * (std::mem::size_of::<[u32; BLOCK]>() + 16)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_free_blocks() {
        let mut ix = BlockIndex::default();
        assert_eq!(ix.insert(5, Entry::same(1)), None);
        assert_eq!(ix.insert(5, Entry::same(2)), Some(Entry::same(1)));
        assert_eq!(ix.insert(u64::MAX, Entry::same(3)), None);
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.get(5), Some(Entry::same(2)));
        assert_eq!(ix.get(6), None);
        assert!(ix.heap_bytes() > 2 * 192);
        let before = ix.heap_bytes();
        ix.touch(5, 77);
        assert_eq!(ix.ac_time(5), 77);
        assert_eq!(ix.ac_time(6), 0);
        assert!(ix.heap_bytes() > before, "access times are counted");
        assert_eq!(ix.iter().map(|(k, _, ac)| (k, ac)).collect::<Vec<_>>().len(), 2);
        assert_eq!(ix.remove(5), Some(Entry::same(2)));
        assert_eq!(ix.remove(5), None);
        assert_eq!(ix.blocks.len(), 1, "the emptied block is freed");
        let mut out = Vec::new();
        for k in 0..100 {
            ix.insert(k, Entry::same(k));
        }
        ix.remove_range(&(10..90), &mut out);
        assert_eq!(out.len(), 80);
        assert_eq!(ix.len(), 21);
        assert!(ix.contains(9) && !ix.contains(10) && !ix.contains(89) && ix.contains(90));
        ix.remove_range(&(0..u64::MAX), &mut out);
        assert!(ix.contains(u64::MAX));
        assert_eq!(ix.len(), 1);
    }
}
