//! The index: every key's entry, in shards.
//!
//! # Design
//! Keys (page numbers from every frontend) hash to one of N shards (64 by
//! default, a power of two); whole 256-key cold blocks (sixteen 16-key
//! blocks) go to one shard, so a run of keys shares a lock and a block
//! (`index.rs`), the written-back keys of sixteen neighbouring blocks share
//! one cold block, and neighbouring cold blocks spread over the shards. A [`Shard`] is what one mutex guards: the
//! shard's block map, the generation stamped on its next entry, and the
//! counters of the entries it holds. The writeback tier keeps its own
//! queue for each shard (`tier.rs`), changed only under this lock;
//! it asks the shard one question of an item it queued:
//! [`Shard::queued_object`].
//!
//! Every change of an entry goes through a method here, and each records
//! it in the pool's ledger, if it keeps one (`ledger.rs`), and moves the
//! shard's counters with it (`compr_bytes`, same-filled, huge and
//! written-back pages, objects per dictionary slot): no caller adds or
//! subtracts a count. Flags that do not change what an entry stores (the
//! referenced bit, the no-recompression mark) are set with
//! [`Shard::set_flags`], which checks that.
//!
//! # Lock order
//! A shard's lock comes first: a dedup shard, the tier's queue of this
//! shard, an allocator class and the cold store may be locked under it, never the other way round, and no
//! disk I/O or wait for the shrinker happens under it. [`ShardLock::lock`]
//! checks the first half in debug builds (`lockorder.rs`); a dedup guard
//! taken under a shard's is had through it
//! (`DedupTable::lock_under`), so it cannot outlive it.
//!
//! # Trade-offs
//! * Sharding by cold block rather than by key: a sequential run of stores
//!   takes one lock and fills one block; a random key costs a whole block.
//!   Sharded by the 16-key block instead, the blocks a cold block covers
//!   went to as many shards, each shard's cold block held one block's
//!   keys, and a written-back page paid a cold block's fixed part alone
//!   (cold blocks of 12 keys on the build). A sequential run of a MiB
//!   (256 pages) takes one shard's lock; writers far apart take others.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use zmem_alloc::{AllocError, Budget};

use crate::entry::{count_dict, Entry, Slot, DICT_SLOTS};
use crate::index::{BlockIndex, COLD_SHIFT};
use crate::ledger::Ledger;
use crate::stats::Stats;

/// The index's shards (see the module notes).
pub(crate) struct Index {
    shards: Box<[ShardLock]>,
    bits: u32,
    ledger: Option<Arc<Ledger>>,
}

/// One shard's lock: the first in the engine's lock order, so taking it
/// while this thread holds a dedup shard's guard is a bug, which debug
/// builds (and so the tests) catch at the call (`lockorder.rs`).
pub(crate) struct ShardLock(Mutex<Shard>);

impl ShardLock {
    pub fn lock(&self) -> MutexGuard<'_, Shard> {
        crate::lockorder::taking_index_shard();
        self.0.lock()
    }
}

impl Index {
    /// An index of `n` shards (rounded up to a power of two, at most 2¹⁶),
    /// recording every change in `ledger` if given.
    pub fn new(n: usize, ledger: Option<Arc<Ledger>>) -> Index {
        let n = n.clamp(1, 1 << 16).next_power_of_two();
        let bits = n.trailing_zeros();
        Index { shards: (0..n).map(|me| ShardLock(Mutex::new(Shard::new(me, bits, ledger.clone())))).collect(), bits, ledger }
    }

    /// The ledger every change is recorded in, if the pool keeps one.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_deref()
    }

    /// The shard that holds `key`.
    pub fn shard(&self, key: u64) -> &ShardLock {
        &self.shards[self.shard_index(key)]
    }

    /// Where the shard that holds `key` is in [`Index::shards`].
    pub fn shard_index(&self, key: u64) -> usize {
        shard_of(key, self.bits)
    }

    /// Every shard, in order (passes over the whole index).
    pub fn shards(&self) -> &[ShardLock] {
        &self.shards
    }

    /// Entries over every shard.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Bytes of the shard array, held from creation to drop.
    pub fn fixed_bytes(&self) -> u64 {
        (self.shards.len() * std::mem::size_of::<ShardLock>()) as u64
    }
}

/// The shard of `key` among 2^`bits`.
fn shard_of(key: u64, bits: u32) -> usize {
    if bits == 0 {
        0
    } else {
        // Whole cold blocks go to one shard; neighbouring ones spread.
        ((key >> COLD_SHIFT).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }
}

/// What a load's [`Shard::access`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    /// The entry, as it is after the access.
    pub entry: Entry,
    /// This access set the referenced bit.
    pub newly_referenced: bool,
}

/// One shard of the index, with the counters for the entries it holds.
pub(crate) struct Shard {
    index: BlockIndex,
    /// Generation for the next entry stored (tells an entry from an
    /// earlier one under the same key).
    next_gen: u8,
    /// Bytes of non-deduplicated objects referenced from this shard.
    compr_bytes: u64,
    same_pages: u64,
    huge_pages: u64,
    /// Entries written back to the cold store (zram's bd_count).
    backed_pages: u64,
    /// Entries whose object is in RAM.
    ram_objs: u64,
    /// Objects (in RAM or written back) per dictionary slot.
    dict_objs: [u64; DICT_SLOTS],
    /// Where every change is recorded too, if the pool keeps a ledger;
    /// with this shard's place among 2^`bits` (which keys are its own).
    ledger: Option<Arc<Ledger>>,
    me: usize,
    bits: u32,
    /// Keys whose page could not be proven right when the pool was opened
    /// again (`pool/reopen.rs`): their loads fail until a store or a drop
    /// of the key. Empty (and not allocated) but after such an opening.
    lost: HashSet<u64>,
}

impl Shard {
    fn new(me: usize, bits: u32, ledger: Option<Arc<Ledger>>) -> Shard {
        Shard {
            ledger,
            me,
            bits,
            lost: HashSet::new(),
            // Every pool keeps access times (zram's ac_time): idle pages can
            // be named for writeback and recompression alike.
            index: BlockIndex::new(),
            next_gen: 0,
            compr_bytes: 0,
            same_pages: 0,
            huge_pages: 0,
            backed_pages: 0,
            ram_objs: 0,
            dict_objs: [0; DICT_SLOTS],
        }
    }

    fn account(&mut self, e: Entry, add: bool) {
        let (compr, same, huge, backed, ram) = match e.slot() {
            Slot::Obj(_, info) => (info.len as u64, 0, info.is_huge() as u64, 0, 1),
            Slot::Same(_) => (0, 1, 0, 0, 0),
            Slot::Dedup(..) => (0, 0, 0, 0, 0),
            Slot::Backed(..) => (0, 0, 0, 1, 0),
        };
        if let Slot::Obj(_, info) | Slot::Backed(_, info) = e.slot() {
            count_dict(&mut self.dict_objs, info, add);
        }
        if add {
            self.compr_bytes += compr;
            self.same_pages += same;
            self.huge_pages += huge;
            self.backed_pages += backed;
            self.ram_objs += ram;
        } else {
            self.compr_bytes -= compr;
            self.same_pages -= same;
            self.huge_pages -= huge;
            self.backed_pages -= backed;
            self.ram_objs -= ram;
        }
    }

    /// The entry under `key`.
    pub fn get(&self, key: u64) -> Option<Entry> {
        self.index.get(key)
    }

    /// Entries in this shard.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// The entries of the keys in RAM (every object and shared object),
    /// with their last access times; the written-back keys of cold blocks
    /// are not decoded.
    pub fn iter_in_ram(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        self.index.iter_in_ram()
    }

    /// The entry under `key`, its access time now `now` (zram's ac_time).
    /// An object in RAM gets zswap's referenced bit in the same lookup
    /// (what it means is the writeback tier's: `tier.rs`).
    pub fn access(&mut self, key: u64, now: u32) -> Option<Access> {
        let mut newly = false;
        let entry = self.index.access(key, now, |e| {
            newly = matches!(e.slot(), Slot::Obj(..)) && !e.referenced();
            if newly {
                *e = e.with_referenced(true);
            }
        })?;
        Some(Access { entry, newly_referenced: newly })
    }

    /// Change only the flags of `key`'s entry (what it stores stays).
    pub fn set_flags(&mut self, key: u64, e: Entry) {
        debug_assert_eq!(self.index.get(key).map(|o| o.slot()), Some(e.slot()), "set_flags changes only flags");
        self.index.set(key, e);
    }

    /// Replace `key`'s entry, which the caller has just read as `old`,
    /// with `new`.
    pub fn replace(&mut self, key: u64, old: Entry, new: Entry) {
        debug_assert_eq!(self.index.get(key), Some(old));
        self.account(old, false);
        self.account(new, true);
        self.index.set(key, new);
        self.record(key, Some(new));
    }

    #[inline]
    fn record(&self, key: u64, e: Option<Entry>) {
        if let Some(l) = &self.ledger {
            l.record(key, e);
        }
    }

    /// Put `new` under `key` and stamp its access time `now`, charging what
    /// the key needs first (an index block, the map's growth); a refusal
    /// changes nothing. Returns the entry replaced.
    pub fn insert(&mut self, key: u64, new: Entry, now: u32, b: &Budget) -> Result<Option<Entry>, AllocError> {
        let old = self.index.insert(key, new, b)?;
        self.account(new, true);
        if let Some(o) = old {
            self.account(o, false);
        }
        self.index.touch(key, now);
        self.record(key, Some(new));
        if !self.lost.is_empty() {
            self.lost.remove(&key);
        }
        Ok(old)
    }

    /// Take `key`'s entry out; returns it.
    pub fn remove(&mut self, key: u64, b: &Budget) -> Option<Entry> {
        let old = self.index.remove(key, b);
        if let Some(o) = old {
            self.account(o, false);
            self.record(key, None);
        } else if !self.lost.is_empty() && self.lost.remove(&key) {
            self.record(key, None);
        }
        old
    }

    /// Take out every entry whose key lies in `range`, into `out`.
    pub fn remove_range(&mut self, range: &Range<u64>, out: &mut Vec<Entry>, b: &Budget) {
        let start = out.len();
        self.index.remove_range(range, out, b);
        for &o in &out[start..] {
            self.account(o, false);
        }
        if let Some(l) = &self.ledger {
            l.clear(range, |key| shard_of(key, self.bits) == self.me);
        }
        if !self.lost.is_empty() {
            self.lost.retain(|k| !range.contains(k));
        }
    }

    /// `key` holds a page that could not be proven right (it holds no
    /// entry): its loads fail until it is stored or dropped, and the
    /// ledger keeps the mark for the next opening.
    pub fn mark_lost(&mut self, key: u64) {
        debug_assert!(self.index.get(key).is_none());
        self.lost.insert(key);
        if let Some(l) = &self.ledger {
            l.record_lost(key);
        }
    }

    /// Whether `key` is marked lost ([`Shard::mark_lost`]).
    pub fn is_lost(&self, key: u64) -> bool {
        !self.lost.is_empty() && self.lost.contains(&key)
    }

    /// Move the written-back keys of the index blocks of `keys` (and their
    /// zero-filled pages) to their cold blocks when that takes less RAM
    /// (`index.rs`: one rebuild a cold block); the counts do not change
    /// (the same pages, held in less RAM).
    pub fn make_cold(&mut self, keys: &[u64], b: &Budget) -> usize {
        self.index.make_cold_all(keys, b)
    }

    /// Make the keys of `key`'s block that name record `from` name `to`
    /// (the cold store copied it); returns whether one did. The counts do
    /// not change: the pages are written back either way.
    /// The ledger records each key renamed.
    pub fn rename_record(&mut self, key: u64, from: u64, to: u64, b: &Budget) -> bool {
        let renamed = self.index.rename_record(key, from, to, b);
        if renamed && self.ledger.is_some() {
            let block = key & !crate::index::BLOCK_MASK;
            for k in block..=block | crate::index::BLOCK_MASK {
                if let Some(e) = self.index.get(k).filter(|e| e.record() == Some(to)) {
                    self.record(k, Some(e));
                }
            }
        }
        renamed
    }

    /// `e` with the shard's next generation (the writeback tier tells the
    /// entry it queued from a later one under the same key by it).
    pub fn stamp(&mut self, e: Entry) -> Entry {
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        e.with_gen(gen)
    }

    /// The entry under `key`, if it still holds the object in RAM that
    /// the writeback tier queued at generation `gen` (else the tier's item
    /// is stale).
    pub fn queued_object(&self, key: u64, gen: u8) -> Option<Entry> {
        self.index.get(key).filter(|e| e.gen() == gen && matches!(e.slot(), Slot::Obj(..)))
    }

    /// Entries whose object is in RAM.
    pub fn ram_objects(&self) -> usize {
        self.ram_objs as usize
    }

    /// Objects in RAM or written back with the dictionary in `slot`.
    pub fn dict_objects(&self, slot: usize) -> u64 {
        self.dict_objs[slot]
    }

    /// Add this shard's counts to `st` (entries, compressed bytes,
    /// same-filled, huge and written-back pages); returns the heap bytes of
    /// its index, and of those the bytes held for its written-back pages.
    pub fn add_stats(&self, st: &mut Stats) -> (u64, u64) {
        st.stored_pages += self.index.len() as u64;
        st.compr_data_size += self.compr_bytes;
        st.same_pages += self.same_pages;
        st.huge_pages += self.huge_pages;
        st.bd_count += self.backed_pages;
        st.lost_pages += self.lost.len() as u64;
        let (cold_pages, cold_blocks) = self.index.cold_counts();
        st.cold_index_pages += cold_pages;
        st.cold_index_blocks += cold_blocks;
        (self.index.heap_bytes(), self.index.backed_bytes(self.backed_pages))
    }
}
