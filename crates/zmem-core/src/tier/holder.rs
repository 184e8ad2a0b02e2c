//! What the tier asks of a shard whose objects it queues: an index shard
//! (a page's own object, under its key) or a dedup shard (a shared
//! object, under its content hash). The tier's paths (picking from a
//! queue's cold end, writing back what a mode names, putting victims back
//! after a failed write, settling them after a good one, sweeping stale
//! items) are written once, against [`Holder`]; the two kinds differ only
//! in the answers below.
//!
//! Every method is called with the shard's lock held (the tier takes it:
//! a [`Source`](super::Source) names the shard and its queue).

use zmem_alloc::{Budget, Handle};

use super::lru::LruItem;
use crate::cold::RecordId;
use crate::dedup::{DedupShard, ToCold};
use crate::entry::{Entry, ObjInfo, Slot};
use crate::shard::Shard;

/// An object in RAM that the tier may write back, as its shard names it.
#[derive(Clone, Copy)]
pub(super) struct Found {
    /// The page's key, or a shared object's hash.
    pub key: u64,
    /// The index entry (keys only; [`Entry::EMPTY`] for a shared object).
    pub entry: Entry,
    pub handle: Handle,
    pub info: ObjInfo,
    /// The generation it was found at (shared objects only).
    pub gen: u8,
    /// Its referenced bit when found (shared objects only): set later
    /// means a load or a new sharer came while the write ran.
    pub referenced: bool,
}

/// What a popped item's object does next.
pub(super) enum Candidate {
    /// Goes to the batch.
    Go(Found),
    /// Was referenced: its bit is cleared, and it gets a second round.
    Again,
    /// The item is stale (the object was overwritten, freed or written back).
    Stale,
}

/// What became of a victim once its batch was written.
pub(super) enum Settled {
    /// It left RAM: its object is to be freed; `dropped` if the store
    /// dropped it rather than kept it.
    Moved { dropped: bool },
    /// A load referenced it while the write ran: it stays, at the hot end.
    Hot,
    /// It changed meanwhile (its new entry has its own item).
    Stale,
}

/// A shard as the tier sees it (see the module notes).
pub(super) trait Holder {
    /// Its objects in RAM (what bounds its queue's stale items).
    fn live(&self) -> usize;
    /// Whether `item` still names an object in RAM.
    fn is_live(&self, item: &LruItem) -> bool;
    /// The object `item` names, popped from the cold end. A referenced
    /// one has its bit cleared and gets a second chance (not for a page's
    /// object with `exclusive` loads: its bit means "queued cold").
    fn candidate(&mut self, item: &LruItem, exclusive: bool) -> Candidate;
    /// Its objects in RAM that `picks(info, ac)` names, at most `cap`.
    fn picked(&self, picks: &dyn Fn(ObjInfo, u32) -> bool, cap: usize) -> Vec<Found>;
    /// `f` as it is now, if it is still the same object in RAM.
    fn again(&self, f: &Found) -> Option<Found>;
    /// After a failed write: whether `f` is still in RAM as picked, and if
    /// so whether it was referenced since (`true`: back at the hot end).
    fn unchanged(&self, f: &Found, exclusive: bool) -> Option<bool>;
    /// After a good write: `f` now lives in record `id` (None: the store
    /// dropped it), unless it changed meanwhile.
    fn settle(&mut self, f: &Found, id: Option<RecordId>, exclusive: bool, b: &Budget) -> Settled;
    /// After a batch is settled: `moved` are the keys that left RAM.
    fn settled(&mut self, moved: &[u64], b: &Budget);
}

impl Holder for Shard {
    fn live(&self) -> usize {
        self.ram_objects()
    }

    fn is_live(&self, item: &LruItem) -> bool {
        self.queued_object(item.key, item.gen).is_some()
    }

    fn candidate(&mut self, item: &LruItem, exclusive: bool) -> Candidate {
        let Some(e) = self.queued_object(item.key, item.gen) else { return Candidate::Stale };
        let Slot::Obj(handle, info) = e.slot() else { return Candidate::Stale };
        if e.referenced() && !exclusive {
            self.set_flags(item.key, e.with_referenced(false));
            return Candidate::Again;
        }
        Candidate::Go(Found::own(item.key, e, handle, info))
    }

    fn picked(&self, picks: &dyn Fn(ObjInfo, u32) -> bool, cap: usize) -> Vec<Found> {
        self.iter_in_ram()
            .filter_map(|(k, e, ac)| match e.slot() {
                Slot::Obj(handle, info) if picks(info, ac) => Some(Found::own(k, e, handle, info)),
                _ => None,
            })
            .take(cap)
            .collect()
    }

    fn again(&self, f: &Found) -> Option<Found> {
        (self.get(f.key) == Some(f.entry)).then_some(*f)
    }

    fn unchanged(&self, f: &Found, exclusive: bool) -> Option<bool> {
        let now = self.get(f.key).filter(|n| n.gen() == f.entry.gen() && n.slot() == f.entry.slot())?;
        Some(now.referenced() && !exclusive)
    }

    fn settle(&mut self, f: &Found, id: Option<RecordId>, exclusive: bool, b: &Budget) -> Settled {
        let now = self.get(f.key);
        // With exclusive loads, a load during the write changes nothing:
        // the object was going to the cold end anyway.
        let Some(cur) = now.filter(|&n| n == f.entry || (exclusive && n == f.entry.with_referenced(true))) else {
            // A load only set the referenced bit: the object is still here
            // and keeps its place in the LRU, at the hot end.
            return if self.unchanged(f, exclusive).is_some() { Settled::Hot } else { Settled::Stale };
        };
        match id {
            Some(id) => self.replace(f.key, cur, Entry::backed(id.to_raw(), f.info).with_gen(f.entry.gen())),
            None => drop(self.remove(f.key, b)),
        }
        Settled::Moved { dropped: id.is_none() }
    }

    fn settled(&mut self, moved: &[u64], b: &Budget) {
        // The written-back keys of each index block touched go to its cold block.
        let mut blocks: Vec<u64> = moved.iter().map(|k| k & !crate::index::BLOCK_MASK).collect();
        blocks.dedup();
        self.make_cold(&blocks, b);
    }
}

impl Found {
    /// A page's own object, found under `key`.
    pub fn own(key: u64, entry: Entry, handle: Handle, info: ObjInfo) -> Found {
        Found { key, entry, handle, info, gen: 0, referenced: false }
    }
}

impl Holder for DedupShard {
    fn live(&self) -> usize {
        self.records()
    }

    fn is_live(&self, item: &LruItem) -> bool {
        self.in_ram(item.key, item.gen).is_some()
    }

    fn candidate(&mut self, item: &LruItem, _exclusive: bool) -> Candidate {
        match self.cold_candidate(item.key, item.gen) {
            Ok((handle, info, gen)) => Candidate::Go(Found { key: item.key, entry: Entry::EMPTY, handle, info, gen, referenced: false }),
            Err(true) => Candidate::Again,
            Err(false) => Candidate::Stale,
        }
    }

    fn picked(&self, picks: &dyn Fn(ObjInfo, u32) -> bool, cap: usize) -> Vec<Found> {
        self.ram_picked(picks, cap).into_iter().filter_map(|(hash, gen)| self.found(hash, gen)).collect()
    }

    fn again(&self, f: &Found) -> Option<Found> {
        self.found(f.key, f.gen)
    }

    fn unchanged(&self, f: &Found, _exclusive: bool) -> Option<bool> {
        self.still_in_ram(f.key, f.gen, f.handle)
    }

    fn settle(&mut self, f: &Found, id: Option<RecordId>, _exclusive: bool, _b: &Budget) -> Settled {
        // A dropped one stays in the table, as `Loc::Dropped`, until its
        // last key lets go: its keys then miss.
        match self.written_back(f.key, f.gen, f.handle, f.referenced, id.map(RecordId::to_raw)) {
            ToCold::Stale => Settled::Stale,
            // Loaded or shared again while we wrote: stays, at the hot end.
            ToCold::Referenced => Settled::Hot,
            ToCold::Moved { dropped } => Settled::Moved { dropped },
        }
    }

    fn settled(&mut self, _moved: &[u64], _b: &Budget) {}
}

impl DedupShard {
    /// The shared object of `hash` if it is in RAM at `gen`.
    fn found(&self, hash: u64, gen: u8) -> Option<Found> {
        let (handle, info, referenced) = self.in_ram(hash, gen)?;
        Some(Found { key: hash, entry: Entry::EMPTY, handle, info, gen, referenced })
    }
}
