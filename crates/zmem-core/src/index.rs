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
//! A block whose keys are all written back (records written without a
//! dictionary), same-filled zero pages aside, is kept as a [`ColdBlock`]
//! in a second map instead: three masks and each key's record id, in 4
//! bytes where the ids share their high halves (a backing file's segment
//! and generation: pages written back together) and 8 where they do not
//! ([`Recs`]), about 8 bytes a key for a full block with its slot in the
//! map against the block's 18 (its 288 bytes with access times); a block
//! whose keys all went in one extent (`extent.rs`) keeps that one record,
//! 32 bytes in all, about two bytes a page. A written-back page needs nothing else of its entry: its
//! encoding is in its record, and its flags and access time only matter
//! in RAM. The entries are made up when asked for (written back, naming
//! the record; or zero-filled); a store to one of its keys turns it back
//! into a block first. A block id is in at most one of the two maps.
//!
//! Every entry naming a record that leaves the index is marked
//! ([`Entry::with_last`]) when no other entry of its block names that
//! record: an extent never spans blocks, so its last member is found in
//! the block alone, under the lock that removes it.
//!
//! A new block and any resize of the map are charged to the pool's budget
//! before the key goes in ([`BlockIndex::insert`] is refused otherwise);
//! the bytes held are kept in a counter, so the index's share of
//! `mem_used_total` costs nothing to read.

use std::ops::Range;

use zmem_alloc::{AllocError, Budget};

use crate::charged::{map_bytes, map_insert_new, Map};
use crate::entry::{Entry, ObjInfo, Slot};

pub(crate) const BLOCK_SHIFT: u32 = 4;
const BLOCK: usize = 1 << BLOCK_SHIFT;
const MASK: u64 = BLOCK as u64 - 1;
/// A key's place in its block: `key & BLOCK_MASK`.
pub(crate) const BLOCK_MASK: u64 = MASK;

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
    fn names(&self, rec: u64) -> bool {
        self.e.iter().any(|e| e.record() == Some(rec))
    }
    /// The same keys as a cold block, if every entry is written back
    /// without a dictionary, or a zero-filled page, and one is written back.
    fn as_cold(&self) -> Option<ColdBlock> {
        let (mut named, mut zeros) = (0u16, 0u16);
        let mut recs: Vec<u64> = Vec::new();
        for (i, e) in self.e.iter().enumerate() {
            match e.slot() {
                _ if e.is_empty() => {}
                Slot::Same(0) => zeros |= 1 << i,
                Slot::Backed(rec, info) if info.dict().is_none() => {
                    named |= 1 << i;
                    recs.push(rec);
                }
                _ => return None,
            }
        }
        if recs.is_empty() {
            return None;
        }
        Some(ColdBlock { recs: Recs::build(&recs), named, members: named, zeros })
    }
}

/// The records a cold block's keys name (each key's of
/// [`ColdBlock::named`], by its rank there): one extent's, or each key's
/// own.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Recs {
    One(u64),
    /// `[h, ...]`. With `h` of 1 to [`SPLIT_HIGHS`], ids of that many
    /// distinct high halves: a cold store issues ids in runs that share
    /// them (the backing file's are a segment and its generation over an
    /// offset and a length, and the pages of a block tend to go out
    /// together), kept as `[h, the h high halves, a 2-bit index into them
    /// per rank, the low half per rank]`: 4 bytes a key and a few a block.
    /// With `h` of 0, every id whole: `[0, (low, high) per rank]`.
    Ids(Box<[u32]>),
}

/// The most distinct high halves a split [`Recs::Ids`] keeps.
const SPLIT_HIGHS: usize = 4;

impl Recs {
    /// The smallest form of `ids` (one per rank; not empty).
    fn build(ids: &[u64]) -> Recs {
        if ids.iter().all(|&r| r == ids[0]) {
            return Recs::One(ids[0]);
        }
        let mut highs: Vec<u32> = Vec::with_capacity(SPLIT_HIGHS);
        let mut index = 0u32;
        for (rank, &id) in ids.iter().enumerate() {
            let high = (id >> 32) as u32;
            let k = match highs.iter().position(|&h| h == high) {
                Some(k) => k,
                None if highs.len() < SPLIT_HIGHS => {
                    highs.push(high);
                    highs.len() - 1
                }
                None => {
                    let mut v = Vec::with_capacity(1 + 2 * ids.len());
                    v.push(0);
                    v.extend(ids.iter().flat_map(|&id| [id as u32, (id >> 32) as u32]));
                    return Recs::Ids(v.into_boxed_slice());
                }
            };
            index |= (k as u32) << (2 * rank);
        }
        let mut v = Vec::with_capacity(2 + highs.len() + ids.len());
        v.push(highs.len() as u32);
        v.extend_from_slice(&highs);
        v.push(index);
        v.extend(ids.iter().map(|&id| id as u32));
        Recs::Ids(v.into_boxed_slice())
    }

    /// The id of rank `rank`.
    fn get(&self, rank: usize) -> u64 {
        match self {
            Recs::One(r) => *r,
            Recs::Ids(v) if v[0] == 0 => u64::from(v[2 + 2 * rank]) << 32 | u64::from(v[1 + 2 * rank]),
            Recs::Ids(v) => {
                let h = v[0] as usize;
                let k = (v[1 + h] >> (2 * rank) & 3) as usize;
                u64::from(v[1 + k]) << 32 | u64::from(v[2 + h + rank])
            }
        }
    }

    /// Whether the ids are kept split (4 bytes a key).
    #[cfg(test)]
    fn split(&self) -> bool {
        matches!(self, Recs::Ids(v) if v[0] != 0)
    }

    /// Heap bytes beyond the enum (with malloc's header).
    fn heap_bytes(&self) -> u64 {
        match self {
            Recs::One(_) => 0,
            Recs::Ids(v) => (v.len() * 4 + 16) as u64,
        }
    }
}

/// A block whose keys are all written back or zero-filled pages (see the
/// module notes): what its entries would be.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ColdBlock {
    recs: Recs,
    /// Keys written back when the block went cold: key `i`'s record is
    /// `recs`'s entry at the count of keys named before it.
    named: u16,
    /// Of those, the keys still written back.
    members: u16,
    /// Keys holding a zero-filled page.
    zeros: u16,
}

impl ColdBlock {
    fn rec(&self, i: usize) -> u64 {
        self.recs.get((self.named & ((1u16 << i) - 1)).count_ones() as usize)
    }
    fn entry(&self, i: usize) -> Entry {
        if self.members >> i & 1 == 1 {
            Entry::backed(self.rec(i), ObjInfo::in_extent())
        } else if self.zeros >> i & 1 == 1 {
            Entry::same(0)
        } else {
            Entry::EMPTY
        }
    }
    fn is_empty(&self) -> bool {
        self.members == 0 && self.zeros == 0
    }
    /// Heap bytes beyond its slot in the map (with malloc's header).
    fn heap_bytes(&self) -> u64 {
        self.recs.heap_bytes()
    }
    /// Take key `i` out; returns its entry (empty if it held none; marked
    /// if no key left in the block names its record).
    fn take(&mut self, i: usize) -> Entry {
        let e = self.entry(i);
        let bit = !(1u16 << i);
        self.members &= bit;
        self.zeros &= bit;
        match e.record() {
            Some(rec) if !(0..BLOCK).any(|j| self.members >> j & 1 == 1 && self.rec(j) == rec) => e.with_last(),
            _ => e,
        }
    }
    fn to_block(&self, with_ac: bool) -> Box<Block> {
        let mut b = Block::new(with_ac);
        for (i, e) in b.e.iter_mut().enumerate() {
            *e = self.entry(i);
        }
        b
    }
}

/// `old`, taken from block `b`, marked if no entry left in `b` names its record.
fn mark_last(b: &Block, old: Entry) -> Entry {
    match old.record() {
        Some(rec) if !b.names(rec) => old.with_last(),
        _ => old,
    }
}

#[derive(Default)]
pub(crate) struct BlockIndex {
    blocks: Map<Box<Block>>,
    /// Blocks kept cold (never also in `blocks`).
    cold: Map<ColdBlock>,
    len: usize,
    /// Blocks keep access times (a writeback tier asks for them): each
    /// block gets its array when it is created, so a load never allocates.
    with_ac: bool,
    /// Heap bytes of the blocks (the map's table is read from the map),
    /// and of the cold blocks' record lists.
    block_bytes: u64,
    cold_bytes: u64,
    /// Keys of the cold blocks: written back, and zero-filled.
    cold_members: u64,
    cold_zeros: u64,
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
        let id = key >> BLOCK_SHIFT;
        let i = (key & MASK) as usize;
        let e = match self.blocks.get(&id) {
            Some(b) => b.e[i],
            None => self.cold.get(&id)?.entry(i),
        };
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

    /// A load's access to `key`: record the access time and let `mark`
    /// update the entry's flags (given the access time it replaces: 0
    /// without access times), in one lookup; returns the entry as it is
    /// then. `None` if the key is absent. (A cold block's keys keep no
    /// access times and no flags: they are not in RAM.)
    pub fn access(&mut self, key: u64, now: u32, mark: impl FnOnce(&mut Entry, u32)) -> Option<Entry> {
        let id = key >> BLOCK_SHIFT;
        let i = (key & MASK) as usize;
        let Some(b) = self.blocks.get_mut(&id) else {
            let e = self.cold.get(&id)?.entry(i);
            return (!e.is_empty()).then_some(e);
        };
        if b.e[i].is_empty() {
            return None;
        }
        let mut before = 0;
        if let Some(ac) = b.ac.as_mut() {
            before = std::mem::replace(&mut ac[i], now);
        }
        mark(&mut b.e[i], before);
        Some(b.e[i])
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

    /// Every entry with its key and last access time (0 in a cold block).
    pub fn iter(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        let hot = self.blocks.iter().flat_map(|(&id, b)| {
            b.e.iter().enumerate().filter(|(_, e)| !e.is_empty()).map(move |(i, &e)| (id << BLOCK_SHIFT | i as u64, e, b.ac.as_ref().map_or(0, |ac| ac[i])))
        });
        let cold =
            self.cold.iter().flat_map(|(&id, c)| (0..BLOCK).map(move |i| (id << BLOCK_SHIFT | i as u64, c.entry(i), 0)).filter(|(_, e, _)| !e.is_empty()));
        hot.chain(cold)
    }

    /// Keep `key`'s block as a cold block if it now can be (every key a
    /// member of one extent, or zero-filled; see the module notes). Its
    /// access times go with it. Returns whether it did; a budget that
    /// cannot pay for the cold map's growth leaves the block as it is.
    pub fn make_cold(&mut self, key: u64, budget: &Budget) -> bool {
        let id = key >> BLOCK_SHIFT;
        let Some(c) = self.blocks.get(&id).and_then(|b| b.as_cold()) else { return false };
        let extra = c.heap_bytes();
        if budget.try_charge(extra).is_err() {
            return false;
        }
        let (members, zeros) = (u64::from(c.members.count_ones()), u64::from(c.zeros.count_ones()));
        if map_insert_new(&mut self.cold, id, c, budget).is_err() {
            budget.uncharge(extra);
            return false;
        }
        self.blocks.remove(&id);
        let bytes = self.one_block_bytes();
        self.block_bytes -= bytes;
        budget.uncharge(bytes);
        self.cold_bytes += extra;
        self.cold_members += members;
        self.cold_zeros += zeros;
        true
    }

    /// Forget cold block `c`'s keys and heap bytes (it left the cold map);
    /// returns its heap bytes, for the caller to uncharge.
    fn drop_cold(&mut self, c: &ColdBlock) -> u64 {
        self.cold_members -= u64::from(c.members.count_ones());
        self.cold_zeros -= u64::from(c.zeros.count_ones());
        let bytes = c.heap_bytes();
        self.cold_bytes -= bytes;
        bytes
    }

    /// Every extent the index names, with the first key of its block and
    /// the keys of the block that name it (pushed to `out`).
    pub fn extents(&self, out: &mut Vec<(u64, u64, u16)>) {
        for (&id, b) in &self.blocks {
            let first = out.len();
            for (i, e) in b.e.iter().enumerate() {
                let Some(rec) = e.record() else { continue };
                match out[first..].iter_mut().find(|x| x.0 == rec) {
                    Some(x) => x.2 |= 1 << i,
                    None => out.push((rec, id << BLOCK_SHIFT, 1 << i)),
                }
            }
        }
        for (&id, c) in &self.cold {
            let first = out.len();
            for i in (0..BLOCK).filter(|&i| c.members >> i & 1 == 1) {
                let rec = c.rec(i);
                match out[first..].iter_mut().find(|x| x.0 == rec) {
                    Some(x) => x.2 |= 1 << i,
                    None => out.push((rec, id << BLOCK_SHIFT, 1 << i)),
                }
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
        if let Some(b) = self.blocks.get_mut(&id) {
            let mut any = false;
            for e in b.e.iter_mut().filter(|e| e.record() == Some(from)) {
                *e = e.with_record(to);
                any = true;
            }
            return any;
        }
        let Some(c) = self.cold.get_mut(&id) else { return false };
        // Every rank's id as it will be: a key no longer a member takes
        // `to` too (its rank is never read), so the form stays small.
        let mut any = false;
        let mut ids = Vec::with_capacity(BLOCK);
        for i in (0..BLOCK).filter(|&i| c.named >> i & 1 == 1) {
            let member = c.members >> i & 1 == 1;
            let r = c.rec(i);
            any |= member && r == from;
            ids.push(if !member || r == from { to } else { r });
        }
        if !any {
            return false;
        }
        let recs = Recs::build(&ids);
        let (old, new) = (c.recs.heap_bytes(), recs.heap_bytes());
        if new > old && budget.try_charge(new - old).is_err() {
            return false;
        }
        budget.uncharge(old.saturating_sub(new));
        c.recs = recs;
        self.cold_bytes = self.cold_bytes + new - old;
        true
    }

    /// Turn `id`'s cold block, if it has one, back into a block (a store
    /// to one of its keys), charging the block first; a refusal changes
    /// nothing.
    fn thaw(&mut self, id: u64, budget: &Budget) -> Result<(), AllocError> {
        let Some(block) = self.cold.get(&id).map(|c| c.to_block(self.with_ac)) else { return Ok(()) };
        let bytes = self.one_block_bytes();
        budget.try_charge(bytes)?;
        if let Err(err) = map_insert_new(&mut self.blocks, id, block, budget) {
            budget.uncharge(bytes);
            return Err(err);
        }
        if let Some(c) = self.cold.remove(&id) {
            let freed = self.drop_cold(&c);
            budget.uncharge(freed);
        }
        self.block_bytes += bytes;
        Ok(())
    }

    /// Insert or replace; returns the previous entry. A key that needs a
    /// new block is refused, changing nothing, if `budget` cannot pay for
    /// the block and the map's growth.
    pub fn insert(&mut self, key: u64, e: Entry, budget: &Budget) -> Result<Option<Entry>, AllocError> {
        let id = key >> BLOCK_SHIFT;
        let i = (key & MASK) as usize;
        // (A key of a block in RAM, the store path's case, looks up one map.)
        if !self.blocks.contains_key(&id) {
            self.thaw(id, budget)?;
        }
        if let Some(b) = self.blocks.get_mut(&id) {
            let old = std::mem::replace(&mut b.e[i], e);
            if !old.is_empty() {
                return Ok(Some(mark_last(b, old)));
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
        let i = (key & MASK) as usize;
        let Some(b) = self.blocks.get_mut(&id) else {
            let c = self.cold.get_mut(&id)?;
            let old = c.take(i);
            if old.is_empty() {
                return None;
            }
            if old.record().is_some() {
                self.cold_members -= 1;
            } else {
                self.cold_zeros -= 1;
            }
            if c.is_empty() {
                if let Some(c) = self.cold.remove(&id) {
                    let freed = self.drop_cold(&c);
                    budget.uncharge(freed);
                }
            }
            self.len -= 1;
            return Some(old);
        };
        let old = std::mem::replace(&mut b.e[i], Entry::EMPTY);
        if old.is_empty() {
            return None;
        }
        let old = mark_last(b, old);
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
        let outside = |id: u64| {
            let base = id << BLOCK_SHIFT;
            base > range.end.saturating_sub(1) || base.saturating_add(MASK) < range.start
        };
        let keys = |id: u64| (0..BLOCK).filter(move |&i| range.contains(&((id << BLOCK_SHIFT) + i as u64)));
        self.blocks.retain(|&id, b| {
            if outside(id) {
                return true;
            }
            let first = out.len();
            for i in keys(id) {
                if !b.e[i].is_empty() {
                    out.push(std::mem::replace(&mut b.e[i], Entry::EMPTY));
                }
            }
            // One mark per record the block no longer names.
            for j in first..out.len() {
                let e = out[j];
                if e.record().is_some_and(|r| !b.names(r) && !out[first..j].iter().any(|o| o.record() == Some(r))) {
                    out[j] = e.with_last();
                }
            }
            !b.is_empty()
        });
        let (mut members, mut zeros, mut cold_freed) = (0, 0, 0);
        self.cold.retain(|&id, c| {
            if outside(id) {
                return true;
            }
            for e in keys(id).map(|i| c.take(i)).filter(|e| !e.is_empty()) {
                if e.record().is_some() {
                    members += 1;
                } else {
                    zeros += 1;
                }
                out.push(e);
            }
            if c.is_empty() {
                cold_freed += c.heap_bytes();
            }
            !c.is_empty()
        });
        self.cold_members -= members;
        self.cold_zeros -= zeros;
        self.cold_bytes -= cold_freed;
        self.len -= out.len() - before;
        let bytes = (blocks_before - self.blocks.len()) as u64 * self.one_block_bytes();
        self.block_bytes -= bytes;
        budget.uncharge(bytes + cold_freed);
    }

    /// Heap bytes held: the maps' tables and every block (with malloc's header).
    pub fn heap_bytes(&self) -> u64 {
        map_bytes(&self.blocks) + map_bytes(&self.cold) + self.block_bytes + self.cold_bytes
    }

    /// The heap bytes held for the `backed` written-back keys (of
    /// [`len`](Self::len)): the cold blocks whole, and the blocks' share
    /// for the written-back keys they hold (every key of a block costs it
    /// alike).
    pub fn backed_bytes(&self, backed: u64) -> u64 {
        let cold = map_bytes(&self.cold) + self.cold_bytes;
        let hot_keys = self.len as u64 - self.cold_members - self.cold_zeros;
        let hot_backed = backed.saturating_sub(self.cold_members).min(hot_keys);
        let hot = map_bytes(&self.blocks) + self.block_bytes;
        cold + if hot_keys == 0 { 0 } else { (u128::from(hot) * u128::from(hot_backed) / u128::from(hot_keys)) as u64 }
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

    fn backed(rec: u64) -> Entry {
        Entry::backed(rec, ObjInfo::raw())
    }

    /// A block of one extent's pages (and zero pages) is kept cold in 16
    /// bytes, reads back the same, comes back to a block when a key is
    /// stored, and the last of an extent's keys to leave is marked, however
    /// it leaves (removed, replaced, in a range), in either form.
    #[test]
    fn cold_blocks_and_the_last_member_of_an_extent() {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new(true);
        for k in 16..32 {
            ix.insert(k, if k % 4 == 0 { Entry::same(0) } else { backed(7) }, &b).unwrap();
        }
        let hot = ix.heap_bytes();
        assert!(ix.make_cold(20, &b), "one extent and zero pages");
        assert!(ix.heap_bytes() < hot && ix.block_bytes == 0, "{} of {hot}", ix.heap_bytes());
        assert_eq!(std::mem::size_of::<(u64, ColdBlock)>(), 32, "a cold block's slot in its map");
        assert_eq!(b.used(), ix.heap_bytes());
        assert_eq!((ix.len(), ix.blocks.len(), ix.cold.len()), (16, 0, 1));
        assert_eq!(ix.get(16), Some(Entry::same(0)));
        assert_eq!(ix.get(17).and_then(Entry::record), Some(7));
        assert_eq!(ix.access(17, 5, |_, _| panic!("no flags on a cold key")).and_then(Entry::record), Some(7));
        assert_eq!(ix.iter().count(), 16);
        let mut ext = Vec::new();
        ix.extents(&mut ext);
        assert_eq!(ext, vec![(7, 16, 0b1110_1110_1110_1110)]);
        // Removed one by one: the last member is marked, zero pages never.
        let mut marked = 0;
        for k in [16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30] {
            marked += ix.remove(k, &b).unwrap().last() as u32;
        }
        assert_eq!(marked, 0);
        assert!(ix.remove(31, &b).unwrap().last(), "the extent's last key");
        assert!(!ix.remove(20, &b).unwrap().last());
        assert_eq!((ix.len(), ix.cold.len()), (0, 0));
        // A store into a cold block brings the block back; the entry it
        // replaces is marked only if it was the extent's last.
        for k in 32..36 {
            ix.insert(k, backed(9), &b).unwrap();
        }
        assert!(ix.make_cold(32, &b));
        let old = ix.insert(33, Entry::same(5), &b).unwrap().unwrap();
        assert!(old.record() == Some(9) && !old.last());
        assert_eq!((ix.blocks.len(), ix.cold.len()), (1, 0));
        assert!(!ix.make_cold(32, &b), "a non-zero same-filled page keeps the block");
        assert!(!ix.insert(32, Entry::same(6), &b).unwrap().unwrap().last());
        assert!(!ix.insert(34, Entry::same(7), &b).unwrap().unwrap().last());
        assert!(ix.insert(35, Entry::same(8), &b).unwrap().unwrap().last());
        // In a range: one mark per extent no key names any more.
        for k in 48..64 {
            ix.insert(k, backed(if k < 56 { 1 } else { 2 }), &b).unwrap();
        }
        let mut out = Vec::new();
        ix.remove_range(&(50..60), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 0, "both extents keep keys");
        ix.remove_range(&(0..58), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 1, "extent 1 is gone");
        assert!(ix.make_cold(60, &b));
        ix.remove_range(&(58..100), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 2, "and extent 2, from its cold block");
        assert_eq!(b.used(), ix.heap_bytes());
        // A page in RAM, or one written with a dictionary, keeps a block.
        ix.insert(64, backed(3), &b).unwrap();
        ix.insert(65, Entry::obj(zmem_alloc::Handle::from_raw(1), ObjInfo::raw()), &b).unwrap();
        assert!(!ix.make_cold(64, &b));
        let dict = Entry::backed(5, ObjInfo::with_dict(0, zmem_compress::Algorithm::Zstd, 100));
        ix.insert(80, dict, &b).unwrap();
        assert!(!ix.make_cold(80, &b));
    }

    /// A block of pages written back each in its own record (extents off,
    /// the default) goes cold too: each key's record id kept in 4 bytes
    /// where their high halves are few (the backing file's segment and
    /// generation), a full block in under 10.5 bytes a key with its slot in
    /// the map, where a block in RAM takes 18–20. It reads back the same, comes back to a
    /// block when a key is stored, reports each record as an extent of one,
    /// and every key leaving it is the last to name its record.
    #[test]
    fn blocks_of_single_page_records_go_cold_too() {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new(true);
        for k in 0..16 * 512u64 {
            ix.insert(k, if k % 16 == 5 { Entry::same(0) } else { backed(1000 + k) }, &b).unwrap();
        }
        let hot = ix.heap_bytes();
        for id in 0..512u64 {
            assert!(ix.make_cold(id << BLOCK_SHIFT, &b));
        }
        assert_eq!(b.used(), ix.heap_bytes());
        // (The map of blocks in RAM keeps its buckets, as a map does.)
        let per_key = (map_bytes(&ix.cold) + ix.cold_bytes) as f64 / ix.len() as f64;
        // (5.75 bytes a key of records, the rest the map's slots, at most
        // half its buckets empty.)
        assert!(per_key < 10.5 && per_key < hot as f64 / ix.len() as f64 * 0.55, "{per_key:.1} bytes a key, {hot} in RAM");
        assert!(ix.cold.values().all(|c| c.recs.split()));
        assert_eq!(ix.backed_bytes(15 * 512), ix.heap_bytes() - map_bytes(&ix.blocks), "a cold block is all the written-back pages'");
        for k in 0..16 * 512u64 {
            let want = if k % 16 == 5 { Entry::same(0) } else { Entry::backed(1000 + k, ObjInfo::in_extent()) };
            assert_eq!(ix.get(k), Some(want), "key {k}");
        }
        let mut ext = Vec::new();
        ix.extents(&mut ext);
        assert_eq!(ext.len(), 15 * 512);
        assert!(ext.iter().all(|&(rec, base, live)| live.count_ones() == 1 && base + u64::from(live.trailing_zeros()) + 1000 == rec));
        // Every key that leaves is the last to name its record, however it leaves.
        assert!(ix.remove(3, &b).unwrap().last());
        assert!(!ix.remove(5, &b).unwrap().last(), "a zero page names no record");
        let old = ix.insert(4, Entry::same(9), &b).unwrap().unwrap();
        assert!(old.last() && old.record() == Some(1004));
        assert_eq!(ix.get(6).and_then(Entry::record), Some(1006), "the thawed block keeps its records");
        let mut out = Vec::new();
        ix.remove_range(&(16..40), &mut out, &b);
        assert_eq!(out.len(), 24);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 22, "one mark a record, none for the zero pages");
        assert_eq!(ix.get(40).and_then(Entry::record), Some(1040));
        assert_eq!(b.used(), ix.heap_bytes());
        ix.remove_range(&(0..u64::MAX), &mut out, &b);
        assert_eq!((ix.len(), ix.heap_bytes() - map_bytes(&ix.blocks) - map_bytes(&ix.cold)), (0, 0));
        assert_eq!((ix.cold_members, ix.cold_zeros, ix.cold_bytes), (0, 0, 0));
        assert_eq!(b.used(), ix.heap_bytes());
    }

    /// Record ids in a cold block take their smallest form: one id for an
    /// extent, 4 bytes a key while at most four high halves are shared,
    /// else 8; each reads back as it went in, and a renamed record (the
    /// cold store copied it) changes the form as needed, charged first:
    /// a budget that refuses the growth leaves the block as it was.
    #[test]
    fn cold_record_ids_take_their_smallest_form_and_renames_keep_it_right() {
        let id = |seg: u64, off: u64| 1 << 56 | seg << 32 | off << 16 | 100;
        let form = |r: &Recs| match r {
            Recs::One(_) => "one",
            r if r.split() => "split",
            _ => "whole",
        };
        let cases: [(Vec<u64>, &str); 4] = [
            (vec![id(3, 0); 16], "one"),
            ((0..16).map(|k| id(3, k)).collect(), "split"),
            ((0..16).map(|k| id(k % 4, k)).collect(), "split"),
            ((0..16).map(|k| id(k % 5, k)).collect(), "whole"),
        ];
        for (ids, want) in &cases {
            let b = Budget::new(None);
            let mut ix = BlockIndex::new(true);
            for (k, &r) in ids.iter().enumerate() {
                ix.insert(k as u64, backed(r), &b).unwrap();
            }
            assert!(ix.make_cold(0, &b));
            assert_eq!(form(&ix.cold[&0].recs), *want, "{ids:x?}");
            for (k, &r) in ids.iter().enumerate() {
                assert_eq!(ix.get(k as u64).and_then(Entry::record), Some(r), "{want} key {k}");
            }
            assert_eq!(b.used(), ix.heap_bytes());
        }
        // Renames: within the high halves there are, to a fifth, and refused.
        let b = Budget::new(None);
        let mut ix = BlockIndex::new(true);
        for k in 0..16u64 {
            ix.insert(k, backed(id(k % 4, k)), &b).unwrap();
        }
        assert!(ix.make_cold(0, &b));
        assert!(ix.rename_record(0, id(1, 5), id(2, 99), &b), "a known high half");
        assert_eq!(form(&ix.cold[&0].recs), "split");
        assert_eq!(ix.get(5).and_then(Entry::record), Some(id(2, 99)));
        assert!(!ix.rename_record(0, id(1, 5), id(2, 100), &b), "no key names it now");
        let tight = Budget::new(Some(b.used()));
        tight.force_charge(b.used());
        assert!(!ix.rename_record(0, id(2, 6), id(9, 6), &tight), "a fifth high half needs 8 bytes a key");
        assert_eq!(ix.get(6).and_then(Entry::record), Some(id(2, 6)));
        assert_eq!(form(&ix.cold[&0].recs), "split");
        assert!(ix.rename_record(0, id(2, 6), id(9, 6), &b));
        assert_eq!(form(&ix.cold[&0].recs), "whole");
        assert_eq!(ix.get(6).and_then(Entry::record), Some(id(9, 6)));
        assert_eq!(b.used(), ix.heap_bytes());
        for k in (0..16u64).filter(|&k| k != 5 && k != 6) {
            assert_eq!(ix.get(k).and_then(Entry::record), Some(id(k % 4, k)), "key {k}");
        }
        // Every key of an extent renamed at once keeps it one id.
        let mut ix = BlockIndex::new(true);
        for k in 16..32u64 {
            ix.insert(k, backed(id(7, 0)), &b).unwrap();
        }
        assert!(ix.make_cold(16, &b));
        ix.remove(17, &b);
        assert!(ix.rename_record(16, id(7, 0), id(8, 0), &b));
        assert_eq!(ix.cold[&1].recs, Recs::One(id(8, 0)));
        assert_eq!(ix.get(31).and_then(Entry::record), Some(id(8, 0)));
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
