//! The key index of one shard: blocks of keys in RAM, and cold blocks.
//!
//! zram indexes its pages with a flat array sized for the whole disk (16
//! bytes per page, never counted in `mem_used_total`); zswap uses a tree (an
//! xarray today) per swap device. Our keys are page numbers from every
//! frontend (block-device offsets, swap slots, process page offsets, file
//! page indices), so they come in runs: a block id (`key >> 4`) names 16
//! consecutive keys, a cold block id (`key >> 8`) 256.
//!
//! A key is in at most one of two maps:
//!
//! * **In RAM** ([`Block`], by block id): the keys whose pages the pool
//!   holds (objects, same-filled pages, shared objects), and written-back
//!   keys that are not worth a cold block. A block keeps a mask of its keys
//!   and, by rank in it, each key's 12-byte entry with its last-access time
//!   (zram's `ac_time`): 16 bytes a key in one allocation of just their
//!   size, plus the block's 24-byte slot in the map. A full block costs
//!   about 20 bytes a key, a block of one key about 80 in all (a dense
//!   array of 16 would take 300 whatever it held). Empty blocks are freed
//!   at once.
//! * **Written back** ([`ColdBlock`], by cold block id): the keys of sixteen
//!   blocks (one shard's: `shard.rs` shards by cold block id) whose
//!   records were written without a dictionary, and their zero-filled
//!   pages, moved there once written back ([`BlockIndex::make_cold_all`]:
//!   the blocks of a writeback batch, one rebuild a cold block), in one
//!   allocation of just their size: a 256-bit mask of the written-back
//!   keys (and one of the zero-filled pages, if any) and each key's record
//!   id: an index of 1 to 8 bits into the high halves the ids share (a
//!   backing file's segment and generation: pages written back together)
//!   and its low half, each half packed in just the bits in which the
//!   block's halves differ (a backing file's offsets and the low bits of
//!   its spans; the low bits of its segments and generations), or 8 bytes
//!   where that is no smaller ([`encode_ids`]); a block whose keys all
//!   name one extent (`extent.rs`) keeps that one record. With its 24-byte
//!   slot in the map, about 4 bytes a key when full of keys written out
//!   together, 5 when they went out in a hundred segments. A written-back
//!   page needs nothing else of its entry: its encoding is in its record,
//!   and its flags and access time only matter in RAM. The entries are
//!   made up when asked for (written back, naming the record; or
//!   zero-filled). A key loaded back leaves a bit in a mask of gone keys
//!   (its id stays until one in eight of the block's ids are gone, and the
//!   block is rebuilt): a load does not decode and encode the block.
//!
//! So a written-back page costs the cold rate whatever its neighbours in
//! RAM, which keep only their own bytes; a store to a written-back key
//! moves that key alone back to RAM. A cold block is made only when it
//! costs no more than the bytes its keys free in RAM (a lone written-back
//! key among pages in RAM stays there at 16 bytes); once made, every
//! written-back key of its sixteen blocks joins it.
//!
//! A new key in RAM (16 bytes, or a new block) and any resize of a map are
//! charged to the pool's budget before the key goes in
//! ([`BlockIndex::insert`] is refused otherwise); the bytes held are kept
//! in a counter, so the index's share of `mem_used_total` costs nothing to
//! read.

use std::ops::Range;

use zmem_alloc::{AllocError, Budget};

use crate::charged::{map_bytes, map_insert_new, map_shrink, Map};
use crate::entry::{Entry, ObjInfo, Slot};

mod cold;
pub(crate) use cold::COLD_SHIFT;
use cold::*;

pub(crate) const BLOCK_SHIFT: u32 = 4;
const BLOCK: usize = 1 << BLOCK_SHIFT;
const MASK: u64 = BLOCK as u64 - 1;
/// A key's place in its block: `key & BLOCK_MASK`.
pub(crate) const BLOCK_MASK: u64 = MASK;

/// A key in RAM: its entry and its last-access time (zram's `ac_time`,
/// seconds since the pool was created), which every pool keeps: they name
/// idle pages for writeback and recompression. Side by side, as a load
/// reads the one and writes the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    e: Entry,
    ac: u32,
}

/// Heap bytes of a block's `n` keys (with malloc's header: a request of
/// 16 n bytes takes a chunk of 16 n + 16).
fn kept_bytes(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        (n * std::mem::size_of::<Kept>() + 16) as u64
    }
}

/// Bytes a block id's slot takes in a map of `V` (buckets at most 7/8
/// full; a freed slot is not given back until the map is rebuilt).
fn slot_bytes<V>() -> u64 {
    std::mem::size_of::<(u64, V)>() as u64 + 1
}

/// The keys of a block that are in RAM (see the module notes): which are
/// here, and their entries by rank among them, in an allocation of just
/// their size (a key that comes or goes moves the rest: 16 bytes each).
#[derive(Debug)]
struct Block {
    present: u16,
    kept: Box<[Kept]>,
}

impl Block {
    fn one(i: usize, k: Kept) -> Block {
        Block { present: 1 << i, kept: Box::new([k]) }
    }
    fn len(&self) -> usize {
        self.kept.len()
    }
    fn bytes(&self) -> u64 {
        kept_bytes(self.kept.len())
    }
    fn has(&self, i: usize) -> bool {
        self.present >> i & 1 == 1
    }
    fn rank(&self, i: usize) -> usize {
        (self.present & ((1u16 << i) - 1)).count_ones() as usize
    }
    fn get(&self, i: usize) -> Option<&Kept> {
        self.has(i).then(|| &self.kept[self.rank(i)])
    }
    fn get_mut(&mut self, i: usize) -> Option<&mut Kept> {
        let r = self.rank(i);
        self.has(i).then(|| &mut self.kept[r])
    }
    /// Every key here, by place, with what it keeps.
    fn iter(&self) -> impl Iterator<Item = (usize, &Kept)> + '_ {
        (0..BLOCK).filter(|&i| self.has(i)).zip(self.kept.iter())
    }
    /// Add key `i` (absent): [`Kept`]'s size more.
    fn add(&mut self, i: usize, k: Kept) {
        debug_assert!(!self.has(i));
        let r = self.rank(i);
        let mut v = Vec::with_capacity(self.kept.len() + 1);
        v.extend_from_slice(&self.kept[..r]);
        v.push(k);
        v.extend_from_slice(&self.kept[r..]);
        self.kept = v.into_boxed_slice();
        self.present |= 1 << i;
    }
    /// Take the keys of `mask` out, handing each to `out` with its place.
    /// Returns the bytes freed.
    fn take(&mut self, mask: u16, mut out: impl FnMut(usize, Entry)) -> u64 {
        let mask = mask & self.present;
        if mask == 0 {
            return 0;
        }
        let before = self.bytes();
        let mut v = Vec::with_capacity(self.kept.len() - mask.count_ones() as usize);
        for (i, k) in (0..BLOCK).filter(|&i| self.present >> i & 1 == 1).zip(self.kept.iter()) {
            if mask >> i & 1 == 1 {
                out(i, k.e);
            } else {
                v.push(*k);
            }
        }
        self.present &= !mask;
        self.kept = v.into_boxed_slice();
        before - self.bytes()
    }
    /// The keys that go to the cold block when the block is made cold:
    /// written back without a dictionary (which a cold block cannot name),
    /// and zero-filled pages. None unless one is written back.
    fn cold_keys(&self) -> (u16, u16) {
        let (mut backed, mut zeros) = (0u16, 0u16);
        for (i, k) in self.iter() {
            match k.e.slot() {
                Slot::Same(0) => zeros |= 1 << i,
                Slot::Backed(_, info) if info.dict().is_none() => backed |= 1 << i,
                _ => {}
            }
        }
        if backed == 0 {
            (0, 0)
        } else {
            (backed, zeros)
        }
    }
}
/// What [`take_keys`] took out of a block's two parts.
#[derive(Default)]
struct Taken {
    /// Bytes the block in RAM gave back, and the cold block.
    freed: u64,
    cold_freed: u64,
    /// Written-back keys and zero-filled pages taken from the cold block.
    members: u64,
    zeros: u64,
}

/// Take the keys of `mask` out of block `id`'s part in RAM and its part of
/// a cold block, pushing their entries to `out`.
fn take_keys(id: u64, hot: Option<&mut Block>, cold: Option<&mut ColdBlock>, mask: u16, out: &mut Vec<Entry>) -> Taken {
    let mut t = Taken::default();
    if let Some(b) = hot {
        t.freed = b.take(mask, |_, e| out.push(e));
    }
    if let Some(c) = cold {
        let before = c.heap_bytes();
        (t.members, t.zeros) = c.take(&span_mask(id, mask), false, |_, e| out.push(e));
        t.cold_freed = before - c.heap_bytes();
    }
    t
}

/// A key's block id and its place in the block.
fn place(key: u64) -> (u64, usize) {
    (key >> BLOCK_SHIFT, (key & MASK) as usize)
}

/// A key's cold block id and its place there.
fn cold_place(key: u64) -> (u64, usize) {
    (key >> COLD_SHIFT, (key & (COLD as u64 - 1)) as usize)
}

#[derive(Default)]
pub(crate) struct BlockIndex {
    /// Blocks of keys in RAM, by block id (`key >> 4`).
    blocks: Map<Block>,
    /// Cold blocks, by `key >> 6` (a key is in at most one of the two maps).
    cold: Map<ColdBlock>,
    len: usize,
    /// Heap bytes of the blocks' keys (the maps' tables are read from the
    /// maps), and of the cold blocks' record lists.
    block_bytes: u64,
    cold_bytes: u64,
    /// Keys of the cold blocks: written back, and zero-filled.
    cold_members: u64,
    cold_zeros: u64,
}

impl BlockIndex {
    pub fn new() -> BlockIndex {
        BlockIndex::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get(&id).and_then(|b| b.get(i)) {
            return Some(k.e);
        }
        let (cid, ci) = cold_place(key);
        let e = self.cold.get(&cid)?.entry(ci);
        (!e.is_empty()).then_some(e)
    }

    #[cfg(test)]
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Last access time of `key` (0 if never recorded, or cold).
    #[cfg(test)]
    pub fn ac_time(&self, key: u64) -> u32 {
        let (id, i) = place(key);
        self.blocks.get(&id).and_then(|b| b.get(i)).map_or(0, |k| k.ac)
    }

    /// Record an access to a key in RAM.
    pub fn touch(&mut self, key: u64, now: u32) {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.ac = now;
        }
    }

    /// A load's access to `key`: record the access time and let `mark`
    /// update the entry's flags, in
    /// one lookup; returns the entry as it is then. `None` if the key is
    /// absent. (A cold block's keys keep no access times and no flags:
    /// they are not in RAM.)
    pub fn access(&mut self, key: u64, now: u32, mark: impl FnOnce(&mut Entry)) -> Option<Entry> {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.ac = now;
            mark(&mut k.e);
            return Some(k.e);
        }
        let (cid, ci) = cold_place(key);
        let e = self.cold.get(&cid)?.entry(ci);
        (!e.is_empty()).then_some(e)
    }

    /// Replace a key's entry in RAM without touching counts (flag updates,
    /// an object written back).
    pub fn set(&mut self, key: u64, e: Entry) {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.e = e;
        }
    }

    /// Every entry with its key and last access time (0 in a cold block).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        let cold = self.cold.iter().flat_map(|(&id, c)| c.entries().map(move |(i, e)| (id << COLD_SHIFT | i as u64, e, 0)));
        self.iter_in_ram().chain(cold)
    }

    /// The entries of the keys in RAM, with their keys and last access
    /// times: every object and shared object. No cold block is decoded:
    /// none of their keys is in RAM (written back, or zero-filled).
    pub fn iter_in_ram(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        self.blocks.iter().flat_map(|(&id, b)| b.iter().map(move |(i, k)| (id << BLOCK_SHIFT | i as u64, k.e, k.ac)))
    }

    /// Move the keys of the blocks of `keys` (any order) that are written
    /// back without a dictionary, with their zero-filled pages, to the
    /// cold blocks that cover them (see the module notes); a block left
    /// empty is freed. The blocks of one cold block go together (one
    /// rebuild for all). A cold block is made only if that takes no more
    /// bytes than the keys free in RAM (a few written-back keys among many
    /// in RAM cost less where they are); once made, it takes every such key
    /// of its sixteen blocks that comes. Returns the blocks whose keys
    /// moved: none if none is written back, if a new cold block would cost
    /// more, or if the budget cannot pay for the cold block's growth (the
    /// keys then stay).
    pub fn make_cold_all(&mut self, keys: &[u64], budget: &Budget) -> usize {
        let mut ids: Vec<u64> = keys.iter().map(|k| k >> BLOCK_SHIFT).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.chunk_by(|a, b| a >> (COLD_SHIFT - BLOCK_SHIFT) == b >> (COLD_SHIFT - BLOCK_SHIFT)).map(|g| self.make_cold_group(g, budget)).sum()
    }

    /// [`make_cold_all`](Self::make_cold_all) for `key`'s block alone.
    #[cfg(test)]
    pub fn make_cold(&mut self, key: u64, budget: &Budget) -> bool {
        self.make_cold_all(&[key], budget) > 0
    }

    /// [`make_cold_all`](Self::make_cold_all) for blocks `ids` of one cold block.
    fn make_cold_group(&mut self, ids: &[u64], budget: &Budget) -> usize {
        let (mut adds, mut zero_mask, mut freed_in_ram, mut moved) = (Vec::new(), [0u32; MASK_WORDS], 0, Vec::new());
        for &id in ids {
            let Some(b) = self.blocks.get(&id) else { continue };
            let (backed, zeros) = b.cold_keys();
            if backed == 0 {
                continue;
            }
            let span = cold_span(id);
            adds.extend(b.iter().filter(|&(i, _)| backed >> i & 1 == 1).filter_map(|(i, k)| Some((span.start + i, k.e.record()?))));
            zero_mask.iter_mut().zip(span_mask(id, zeros)).for_each(|(a, b)| *a |= b);
            freed_in_ram += b.bytes() - kept_bytes(b.len() - (backed | zeros).count_ones() as usize);
            moved.push((id, backed | zeros));
        }
        let Some(&(first, _)) = moved.first() else { return 0 };
        let cid = first >> (COLD_SHIFT - BLOCK_SHIFT);
        let old = self.cold.get(&cid);
        let c = ColdBlock::with(old, &adds, &zero_mask);
        let (before, after) = (old.map_or(0, ColdBlock::heap_bytes), c.heap_bytes());
        if old.is_none() && slot_bytes::<ColdBlock>() + after > freed_in_ram {
            return 0;
        }
        if after > before && budget.try_charge(after - before).is_err() {
            return 0;
        }
        match self.cold.get_mut(&cid) {
            Some(slot) => *slot = c,
            None => {
                if map_insert_new(&mut self.cold, cid, c, budget).is_err() {
                    budget.uncharge(after.saturating_sub(before));
                    return 0;
                }
            }
        }
        budget.uncharge(before.saturating_sub(after));
        self.cold_bytes = self.cold_bytes + after - before;
        self.cold_members += adds.len() as u64;
        self.cold_zeros += ones(&zero_mask) as u64;
        for &(id, m) in &moved {
            self.take_from_block(id, m, budget, |_, _| {});
        }
        moved.len()
    }

    /// Take the keys of `mask` out of block `id` in RAM (handing each to
    /// `out`), freeing the block if that empties it, and uncharge the bytes.
    /// Returns whether the block held any of them.
    fn take_from_block(&mut self, id: u64, mask: u16, budget: &Budget, out: impl FnMut(usize, Entry)) -> bool {
        let Some(b) = self.blocks.get_mut(&id).filter(|b| b.present & mask != 0) else { return false };
        let freed = b.take(mask, out);
        if b.len() == 0 {
            self.blocks.remove(&id);
            map_shrink(&mut self.blocks, budget);
        }
        self.block_bytes -= freed;
        budget.uncharge(freed);
        true
    }

    /// Take `key` out of its cold block, freeing the cold block if that
    /// empties it; returns its entry.
    fn take_cold(&mut self, key: u64, budget: &Budget) -> Option<Entry> {
        let (cid, ci) = cold_place(key);
        let c = self.cold.get_mut(&cid)?;
        let before = c.heap_bytes();
        let mut one = [0; MASK_WORDS];
        one[ci / 32] = 1 << (ci % 32);
        // A written-back key leaves its block a gone mark, which costs a
        // block without a gone mask one (else it is rebuilt).
        let had_gone = c.gone().is_some();
        let grow = had_gone || (c.is_member(ci) && budget.try_charge(MASK_BYTES).is_ok());
        let charged = if grow && !had_gone { MASK_BYTES } else { 0 };
        let mut old = None;
        let (members, zeros) = c.take(&one, grow, |_, e| old = Some(e));
        self.cold_members -= members;
        self.cold_zeros -= zeros;
        let mut after = c.heap_bytes();
        if c.is_empty() {
            self.cold.remove(&cid);
            after = 0;
        }
        // (A take grows a block by its gone mask at most: the charge.)
        self.cold_bytes = self.cold_bytes + after - before;
        budget.uncharge(before + charged - after);
        if after < before {
            map_shrink(&mut self.cold, budget);
        }
        old
    }

    /// Every extent the index names, with the first key of its block and
    /// the keys of the block that name it (pushed to `out`): what the
    /// tests below see of the records a block's keys share.
    #[cfg(test)]
    pub fn extents(&self, out: &mut Vec<(u64, u64, u16)>) {
        fn name(out: &mut Vec<(u64, u64, u16)>, first: usize, id: u64, i: usize, rec: u64) {
            match out[first..].iter_mut().find(|x| x.0 == rec) {
                Some(x) => x.2 |= 1 << i,
                None => out.push((rec, id << BLOCK_SHIFT, 1 << i)),
            }
        }
        let cold_of = |c: &ColdBlock, id: u64, first: usize, out: &mut Vec<(u64, u64, u16)>| {
            let span = cold_span(id);
            c.members_in(span.clone()).for_each(|i| name(out, first, id, i - span.start, c.rec(i)));
        };
        for (&id, b) in &self.blocks {
            let first = out.len();
            for (i, k) in b.iter() {
                if let Some(rec) = k.e.record() {
                    name(out, first, id, i, rec);
                }
            }
            if let Some(c) = self.cold.get(&(id >> (COLD_SHIFT - BLOCK_SHIFT))) {
                cold_of(c, id, first, out);
            }
        }
        for (&cid, c) in &self.cold {
            for id in (0..(COLD / BLOCK) as u64).map(|s| cid << (COLD_SHIFT - BLOCK_SHIFT) | s).filter(|id| !self.blocks.contains_key(id)) {
                let first = out.len();
                cold_of(c, id, first, out);
            }
        }
    }

    /// Make every key of `key`'s block that names record `from` name `to`
    /// (the cold store copied the record); returns whether one did. A cold
    /// block whose new form is larger is charged the difference first: if
    /// `budget` refuses it, nothing changes and this returns false (the
    /// keys keep naming `from`).
    pub fn rename_record(&mut self, key: u64, from: u64, to: u64, budget: &Budget) -> bool {
        let id = key >> BLOCK_SHIFT;
        let mut any = false;
        if let Some(c) = self.cold.get_mut(&(key >> COLD_SHIFT)) {
            let span = cold_span(id);
            let mut keys = c.keys();
            for k in keys.iter_mut().filter(|k| span.contains(&k.0) && k.1 == from) {
                k.1 = to;
                any = true;
            }
            if any {
                let renamed = ColdBlock::new(&keys, &c.zero_mask());
                let (old, new) = (c.heap_bytes(), renamed.heap_bytes());
                if new > old && budget.try_charge(new - old).is_err() {
                    return false;
                }
                budget.uncharge(old.saturating_sub(new));
                *c = renamed;
                self.cold_bytes = self.cold_bytes + new - old;
            }
        }
        if let Some(b) = self.blocks.get_mut(&id) {
            for k in b.kept.iter_mut().filter(|k| k.e.record() == Some(from)) {
                k.e = k.e.with_record(to);
                any = true;
            }
        }
        any
    }

    /// Insert or replace; returns the previous entry. A key new to RAM (a
    /// new block, or 16 bytes more in its block) is refused, changing
    /// nothing, if `budget` cannot pay for it and the map's growth.
    pub fn insert(&mut self, key: u64, e: Entry, budget: &Budget) -> Result<Option<Entry>, AllocError> {
        let (id, i) = place(key);
        let new = Kept { e, ac: 0 };
        match self.blocks.get_mut(&id) {
            Some(b) => {
                if let Some(k) = b.get_mut(i) {
                    return Ok(Some(std::mem::replace(&mut k.e, e)));
                }
                let more = kept_bytes(b.len() + 1) - b.bytes();
                budget.try_charge(more)?;
                b.add(i, new);
                self.block_bytes += more;
            }
            None => {
                let bytes = kept_bytes(1);
                budget.try_charge(bytes)?;
                if let Err(err) = map_insert_new(&mut self.blocks, id, Block::one(i, new), budget) {
                    budget.uncharge(bytes);
                    return Err(err);
                }
                self.block_bytes += bytes;
            }
        }
        // A key is in at most one map: a written-back one comes back here.
        let old = self.take_cold(key, budget);
        if old.is_none() {
            self.len += 1;
        }
        Ok(old)
    }

    /// Remove `key`; a block left empty is freed and its bytes uncharged.
    pub fn remove(&mut self, key: u64, budget: &Budget) -> Option<Entry> {
        let (id, i) = place(key);
        let mut old = Entry::EMPTY;
        if !self.take_from_block(id, 1 << i, budget, |_, e| old = e) {
            old = self.take_cold(key, budget)?;
        }
        self.len -= 1;
        Some(old)
    }

    /// Remove every key in `range`, pushing the removed entries to `out`.
    pub fn remove_range(&mut self, range: &Range<u64>, out: &mut Vec<Entry>, budget: &Budget) {
        let before = out.len();
        let outside = |first: u64, shift: u32| {
            let base = first << shift;
            base > range.end.saturating_sub(1) || base.saturating_add((1 << shift) - 1) < range.start
        };
        let in_range = |id: u64| (0..BLOCK).filter(|&i| range.contains(&((id << BLOCK_SHIFT) + i as u64))).fold(0u16, |m, i| m | 1 << i);
        let mut t = Taken::default();
        let cold = &mut self.cold;
        self.blocks.retain(|&id, b| {
            if outside(id, BLOCK_SHIFT) {
                return true;
            }
            let x = take_keys(id, Some(b), cold.get_mut(&(id >> (COLD_SHIFT - BLOCK_SHIFT))), in_range(id), out);
            t.freed += x.freed;
            t.cold_freed += x.cold_freed;
            t.members += x.members;
            t.zeros += x.zeros;
            b.len() > 0
        });
        // The keys of cold blocks whose blocks have none in RAM (the
        // others' are out already); cold blocks left empty go.
        let mut cold_freed = 0;
        let blocks = &self.blocks;
        self.cold.retain(|&cid, c| {
            if !outside(cid, COLD_SHIFT) {
                for id in (0..(COLD / BLOCK) as u64).map(|s| cid << (COLD_SHIFT - BLOCK_SHIFT) | s) {
                    if !outside(id, BLOCK_SHIFT) && !blocks.contains_key(&id) {
                        let x = take_keys(id, None, Some(c), in_range(id), out);
                        t.cold_freed += x.cold_freed;
                        t.members += x.members;
                        t.zeros += x.zeros;
                    }
                }
            }
            if c.is_empty() {
                cold_freed += c.heap_bytes();
            }
            !c.is_empty()
        });
        self.cold_members -= t.members;
        self.cold_zeros -= t.zeros;
        self.cold_bytes -= t.cold_freed + cold_freed;
        self.len -= out.len() - before;
        self.block_bytes -= t.freed;
        budget.uncharge(t.freed + t.cold_freed + cold_freed);
        map_shrink(&mut self.blocks, budget);
        map_shrink(&mut self.cold, budget);
    }

    /// Written-back keys in cold blocks, and the cold blocks.
    pub fn cold_counts(&self) -> (u64, u64) {
        (self.cold_members, self.cold.len() as u64)
    }

    /// Heap bytes held: the maps' tables and every block (with malloc's header).
    pub fn heap_bytes(&self) -> u64 {
        map_bytes(&self.blocks) + map_bytes(&self.cold) + self.block_bytes + self.cold_bytes
    }

    /// The heap bytes held for the `backed` written-back keys (of
    /// [`len`](Self::len)): the cold blocks whole, and the blocks' share
    /// for the written-back keys they hold (those written with a
    /// dictionary, or too few to make a cold block of; every key of a
    /// block costs it alike).
    pub fn backed_bytes(&self, backed: u64) -> u64 {
        let cold = map_bytes(&self.cold) + self.cold_bytes;
        let hot_keys = self.len as u64 - self.cold_members - self.cold_zeros;
        let hot_backed = backed.saturating_sub(self.cold_members).min(hot_keys);
        let hot = map_bytes(&self.blocks) + self.block_bytes;
        cold + if hot_keys == 0 { 0 } else { (u128::from(hot) * u128::from(hot_backed) / u128::from(hot_keys)) as u64 }
    }
}

#[cfg(test)]
mod tests;
