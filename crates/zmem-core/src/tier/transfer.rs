//! Moving bytes to and from the cold store: the mechanism under the
//! tier's policy (`tier.rs` decides which objects leave RAM and in which
//! order; this file writes a batch of them, settles the index and the
//! dedup table afterwards, reads written-back pages and brings them back).
//!
//! A batch is laid out as records in key order ([`layout_records`]),
//! written with no lock held, then each source's lock is taken again and
//! every entry that is still unchanged is swapped for its record
//! ([`settle_keys`], [`settle_shared`]); a failed write puts every victim
//! back on its LRU ([`requeue_keys`], [`requeue_shared`]) and changes
//! nothing else. The budget is charged a bound for the store's tables
//! before a write and settled after it ([`BackingCharge`]).

use std::sync::atomic::Ordering::Relaxed;

use zmem_alloc::{Budget, Handle};

use super::lru::{Lru, LruItem};
use super::trim_keys;
use super::{Source, Tier, TierHost, Victim, OBJ};
use crate::cold::{ColdError, RecordId};
use crate::dedup::{DedupShard, ToCold};
use crate::entry::{Entry, ObjInfo};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;
use crate::shard::Shard;

/// The budget's charge for the backing store's tables: what they held at
/// the last settlement, and a bound charged ahead of a write in flight.
#[derive(Default)]
pub(super) struct BackingCharge {
    charged: u64,
    reserved: u64,
}

impl Tier {
    /// Charge `bound` ahead of a write that may grow the backing store's
    /// tables by that much (one write at a time: under `writing`).
    pub(super) fn reserve_backing(&self, b: &Budget, bound: u64) -> std::result::Result<(), zmem_alloc::AllocError> {
        let mut c = self.backing_charged.lock();
        b.try_charge(bound)?;
        c.reserved += bound;
        self.reserved_now.store(c.reserved, Relaxed);
        Ok(())
    }

    /// What `max_pool` does not count of the budget's charge for the cold
    /// store: its buffers once made, and the bound charged ahead of the
    /// write in flight (0: none).
    pub(crate) fn uncounted_bytes(&self) -> u64 {
        self.store.buffer_bytes() + self.reserved_now.load(Relaxed)
    }

    /// Free the record `id` (its last key or shared object let go of it)
    /// and give back what the store's tables no longer hold. An error is
    /// a bug's (a stale id), for the caller to count.
    pub(crate) fn free_record(&self, id: u64, b: &Budget) -> std::result::Result<(), String> {
        let r = self.store.free(RecordId::from_raw(id)).map_err(|e| e.to_string());
        self.settle_backing(b, 0);
        r
    }

    /// Bring the budget's charge for the backing store's tables to what
    /// they hold now. The writer passes the `reserved` bound it charged
    /// ahead (its growth has happened); anyone else passes 0: frees shrink
    /// the tables from any thread, and this catches up (until then the
    /// charge is only ever too high). While a write is in flight its growth
    /// is covered by its reservation, so others only give back shrinkage.
    pub fn settle_backing(&self, b: &Budget, reserved: u64) {
        let mut c = self.backing_charged.lock();
        let actual = self.store.metadata_bytes();
        c.reserved -= reserved;
        self.reserved_now.store(c.reserved, Relaxed);
        if reserved == 0 && c.reserved > 0 {
            if actual < c.charged {
                b.uncharge(c.charged - actual);
                c.charged = actual;
            }
            return;
        }
        b.settle(c.charged + reserved, actual);
        c.charged = actual;
    }

    /// Write the victims' bytes to the backing store in one batch, then swap
    /// each that is still unchanged for its record and free its object. On
    /// a write error nothing changes: every victim stays in RAM and on its
    /// LRU (where a load during the write put it: the hot end).
    ///
    /// A store that keeps what it is given gets each page's object as an
    /// extent of one (`extent.rs`); shared objects, and everything given
    /// to a store that drops it, go as they are.
    pub(super) fn commit(&self, h: &impl TierHost, sources: &[Source<'_>], victims: Vec<Victim>, buf: &[u8]) -> Result<u64> {
        let (records, rec_of) = layout_records(&victims, sources, buf, self.store.keeps());
        let recs: Vec<(u64, &[u8])> = records.iter().map(|r| (r.key, &r.bytes[..])).collect();
        let mut by_src: Vec<usize> = victims.iter().map(|v| v.src).collect();
        by_src.sort_unstable();
        by_src.dedup();
        let b = h.objects().budget();
        // Items the shrinker took out of each queue (explicit writeback takes none).
        let out = |i: usize| victims.iter().filter(|v| v.src == i && v.item.is_some()).count();
        // The store's tables grow with the records: charge a bound first.
        let reserved = self.store.growth_bound(recs.len(), recs.iter().map(|r| r.1.len()).sum());
        let put = || match self.reserve_backing(b, reserved) {
            Ok(()) => {
                let r = self.store.put_batch(&recs);
                self.settle_backing(b, reserved);
                r.map_err(ZmemError::Cold)
            }
            Err(e) => Err(h.counters().alloc_failed(e)),
        };
        let mut written = put();
        // A full store may have copied records to make room, which comes
        // back once the copies are named and the old records freed: then
        // once more.
        if written.is_err() && self.apply_moves(h) > 0 {
            written = put();
        }
        let ids = match written {
            Ok(ids) => {
                self.pages_written.fetch_add(victims.len() as u64, Relaxed);
                ids
            }
            Err(e) => {
                self.writeback_fail.fetch_add(1, Relaxed);
                for &i in &by_src {
                    let mine = victims.iter().filter(|v| v.src == i);
                    match sources[i] {
                        Source::Index(sh, q) => {
                            let s = sh.lock();
                            requeue_keys(self, b, &s, &mut self.queues.lock(q), mine, out(i));
                        }
                        Source::Shared(ds, q) => {
                            let g = ds.lock();
                            requeue_shared(self, b, &g, &mut self.queues.lock(q), mine, out(i));
                        }
                    }
                }
                return Err(e);
            }
        };
        let mut settled = Settled { freed: Vec::with_capacity(victims.len()), taken: vec![false; ids.len()], ..Settled::default() };
        for &i in &by_src {
            let mine = victims.iter().zip(&rec_of).filter(|(v, _)| v.src == i).map(|(v, &r)| (v, r, ids[r]));
            match sources[i] {
                Source::Index(sh, q) => {
                    let mut s = sh.lock();
                    settle_keys(self, b, &mut s, &mut self.queues.lock(q), mine, &mut settled, out(i));
                }
                Source::Shared(ds, q) => {
                    let mut g = ds.lock();
                    settle_shared(self, b, &mut g, &mut self.queues.lock(q), mine, &mut settled, out(i));
                }
            }
        }
        let Settled { freed, taken, dropped } = settled;
        let n = freed.len() as u64;
        for handle in freed {
            if let Err(e) = h.objects().free(handle) {
                h.counters().free_failed(&e.to_string());
            }
        }
        // Records nobody took (every page in them was overwritten,
        // invalidated or loaded while we wrote).
        for id in ids.iter().zip(&taken).filter(|(_, &t)| !t).filter_map(|(id, _)| *id) {
            if let Err(e) = self.store.free(id) {
                h.counters().free_failed(&e.to_string());
            }
        }
        self.apply_moves(h);
        self.settle_backing(b, 0);
        self.written_back.fetch_add(n - dropped, Relaxed);
        self.evicted.fetch_add(dropped, Relaxed);
        Ok(n)
    }

    /// Take the records the cold store copied while it compacted
    /// ([`ColdStore::take_moves`]): the keys (or the shared object) that
    /// name a record's old id name its copy, and the old record is freed;
    /// a record nothing names any more (freed since) has its copy freed.
    /// An id is named in one place at most, so exactly one of the two is
    /// freed. A load that read the old id before its segment was freed
    /// finds it no longer live and looks its key up again. Returns the
    /// moves taken.
    pub(crate) fn apply_moves(&self, h: &impl TierHost) -> usize {
        let moves = self.store.take_moves();
        for m in &moves {
            let (from, to) = (m.from.to_raw(), m.to.to_raw());
            let named = h.index().shard(m.key).lock().rename_record(m.key, from, to, h.objects().budget())
                || h.dedup().is_some_and(|d| d.shard(m.key).lock().rename_record(m.key, from, to));
            if let Err(e) = self.store.free(if named { m.from } else { m.to }) {
                h.counters().free_failed(&e.to_string());
            }
        }
        moves.len()
    }

    /// The store's read of `id`, timed (`backing_read_busy_ns`).
    fn read_store(&self, id: RecordId, key: u64, out: &mut Vec<u8>) -> std::result::Result<(), ColdError> {
        let _busy = self.read_busy.start();
        self.store.read(id, key, out)
    }

    /// Read the record `id` (written under `rkey`: the page's key, or a
    /// shared object's hash) into `obj` and decode it into `buf`. No lock
    /// may be held.
    pub(crate) fn read_record(&self, objects: &Objects, rkey: u64, id: u64, info: ObjInfo, obj: &mut Vec<u8>, buf: &mut [u8]) -> Result<()> {
        self.read_store(RecordId::from_raw(id), rkey, obj).map_err(ZmemError::Cold)?;
        if obj.len() != info.len as usize {
            return Err(ZmemError::Inconsistent { key: rkey, what: format!("record {id:#x} holds {} bytes where the index expects {}", obj.len(), info.len) });
        }
        objects.decode(rkey, info, obj, buf)
    }

    /// Read the extent `id` that holds `key`'s page into `obj` and decode
    /// the page into `buf`. Returns the page's encoding and where its
    /// object lies in `obj`. No lock may be held.
    pub(crate) fn read_member(&self, objects: &Objects, key: u64, id: u64, obj: &mut Vec<u8>, buf: &mut [u8]) -> Result<(ObjInfo, std::ops::Range<usize>)> {
        use crate::index::BLOCK_MASK;
        self.read_store(RecordId::from_raw(id), key & !BLOCK_MASK, obj).map_err(ZmemError::Cold)?;
        let (info, r) = crate::extent::find(obj, (key & BLOCK_MASK) as u8)
            .map_err(|e| ZmemError::Inconsistent { key, what: format!("record {id:#x}, which the index names for this page: {e}") })?;
        objects.decode(key, info, &obj[r.clone()], buf)?;
        Ok((info, r))
    }

    /// [`Pool::prefetch`](crate::Pool::prefetch): the records of the pages
    /// of `keys` written back (not shared), read ahead by the store.
    pub(crate) fn prefetch(&self, h: &impl TierHost, keys: std::ops::Range<u64>) -> usize {
        // Nothing on the store (O(1)): no shard lock per page of the request.
        if keys.end.saturating_sub(keys.start) < 2 || self.store.stats().records == 0 {
            return 0;
        }
        let mut ids: Vec<RecordId> = keys.filter_map(|k| h.index().shard(k).lock().get(k)?.record().map(RecordId::from_raw)).collect();
        // The pages of one extent name one record.
        ids.dedup();
        let _busy = self.read_busy.start();
        self.store.prefetch(&ids)
    }

    /// Serve a load of `key` from its record `id`, read with no lock held;
    /// then bring the object back to RAM if the pool has room and the entry
    /// still names this record.
    pub(crate) fn load_backed(&self, h: &impl TierHost, key: u64, id: u64, buf: &mut [u8]) -> Result<()> {
        OBJ.with_borrow_mut(|obj| {
            let (info, r) = self.read_member(h.objects(), key, id, obj, buf)?;
            if !self.promotes() || h.held_pages() >= h.admission().accept_pages() {
                return Ok(());
            }
            let old = {
                let mut s = h.index().shard(key).lock();
                if s.get(key).and_then(Entry::record) != Some(id) {
                    return Ok(());
                }
                let Ok(handle) = h.objects().write(&obj[r]) else { return Ok(()) };
                match h.publish_locked(&mut s, key, Entry::obj(handle, info)) {
                    Ok(old) => old,
                    Err(_) => {
                        // No room for its place in the index or the LRU:
                        // served from the file, and it stays there.
                        drop(s);
                        h.release(Entry::obj(handle, info));
                        return Ok(());
                    }
                }
            };
            if let Some(o) = old {
                // The record the page came from (freed with its last page).
                h.release(o);
            }
            self.promoted.fetch_add(1, Relaxed);
            Ok(())
        })
    }

    /// [`load_backed`](Self::load_backed) for a page whose shared object
    /// `hash` was written back as record `id`.
    pub(crate) fn load_backed_shared(&self, h: &impl TierHost, key: u64, hash: u64, id: u64, info: ObjInfo, buf: &mut [u8]) -> Result<()> {
        let Some(d) = h.dedup() else {
            return Err(ZmemError::Inconsistent { key, what: "a written-back shared object without dedup or a backing store".into() });
        };
        OBJ.with_borrow_mut(|obj| {
            self.read_record(h.objects(), hash, id, info, obj, buf).map_err(|e| match e {
                // Name the page, not the hash, in what the caller sees.
                ZmemError::Corrupt { source, .. } => ZmemError::Corrupt { key, source },
                e => e,
            })?;
            if !self.promote || h.held_pages() >= h.admission().accept_pages() {
                return Ok(());
            }
            {
                let mut ds = d.shard(hash).lock();
                let (b, shard) = (h.objects().budget(), d.shard_index(hash));
                if self.prepare_shared(shard, b).is_err() {
                    return Ok(()); // no room for its place: it stays on the file
                }
                let Some(gen) = ds.promote(hash, id, || h.objects().write(obj).ok()) else { return Ok(()) };
                self.queue_shared(&ds, shard, hash, gen, b);
            }
            if let Err(e) = self.store.free(RecordId::from_raw(id)) {
                h.counters().free_failed(&e.to_string());
            }
            self.settle_backing(h.objects().budget(), 0);
            self.promoted.fetch_add(1, Relaxed);
            Ok(())
        })
    }
}

/// A record of a batch: the key it is written under (a page's, the first
/// of an extent's block, or a shared object's hash) and its bytes.
struct Record<'b> {
    key: u64,
    /// An extent, made here; or a single object, as it lies in the batch.
    bytes: std::borrow::Cow<'b, [u8]>,
}

/// Lay a batch out as records, in key order (of each source): for a
/// store that `keeps` them, each page's object in an extent of its own,
/// written under its block's first key; each shared object, and each
/// object given to a store that drops it, alone (no extent header).
/// Returns the records and each victim's record (the victims keep their
/// order: a failed write puts them back on their LRUs in it).
fn layout_records<'b>(victims: &[Victim], sources: &[Source<'_>], buf: &'b [u8], keeps: bool) -> (Vec<Record<'b>>, Vec<usize>) {
    use crate::extent;
    let mut order: Vec<usize> = (0..victims.len()).collect();
    order.sort_unstable_by_key(|&i| (victims[i].src, victims[i].key));
    let mut records: Vec<Record> = Vec::with_capacity(victims.len());
    let mut rec_of = vec![0; victims.len()];
    for i in order {
        let v = &victims[i];
        let bytes = &buf[v.off..v.off + v.info.len as usize];
        rec_of[i] = records.len();
        if !keeps || matches!(sources[v.src], Source::Shared(..)) {
            records.push(Record { key: v.key, bytes: bytes.into() });
            continue;
        }
        let mut rec = Vec::with_capacity(extent::header_len(1) + bytes.len());
        extent::put_header(&[((v.key & crate::index::BLOCK_MASK) as u8, v.info)], &mut rec);
        rec.extend_from_slice(bytes);
        records.push(Record { key: v.key & !crate::index::BLOCK_MASK, bytes: rec.into() });
    }
    (records, rec_of)
}

/// After a failed write: put each victim that is still unchanged back on
/// its LRU: at the cold end, or at the hot end if a load referenced it
/// while the write ran (before, such an entry lost its item for good and
/// was pinned in RAM).
/// `out` is how many of the victims the shrinker took out of this queue:
/// their places were kept, so putting them back never grows it.
fn requeue_keys<'v>(t: &Tier, b: &Budget, s: &Shard, lru: &mut Lru, victims: impl DoubleEndedIterator<Item = &'v Victim>, out: usize) {
    for v in victims.rev() {
        let (Some(item), Some(now)) = (v.item, s.get(v.key)) else { continue };
        if now.gen() != item.gen || now.slot() != v.entry.slot() {
            continue; // overwritten or gone: its new entry has its own item
        }
        if now.referenced() && !t.exclusive() {
            lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
        } else {
            lru.push_front(item, b);
        }
    }
    lru.return_out(out);
}

fn requeue_shared<'v>(t: &Tier, b: &Budget, ds: &DedupShard, lru: &mut Lru, victims: impl DoubleEndedIterator<Item = &'v Victim>, out: usize) {
    for v in victims.rev() {
        let (Some(item), Some(referenced)) = (v.item, ds.still_in_ram(v.key, v.gen, v.handle)) else { continue };
        if referenced {
            lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
        } else {
            lru.push_front(item, b);
        }
    }
    lru.return_out(out);
}

/// What settling a batch leaves to do once the shard locks are dropped.
#[derive(Default)]
struct Settled {
    /// Objects that left RAM: free them.
    freed: Vec<Handle>,
    /// Per record of the batch: whether an entry now names it. Those that
    /// none does (every page in it was overwritten, invalidated or loaded
    /// while we wrote) are freed.
    taken: Vec<bool>,
    /// How many of `freed` the store dropped rather than kept.
    dropped: u64,
}

/// After a successful write: swap each unchanged entry for its record, or
/// remove it if the store dropped the object; then move the written-back
/// keys of each index block it touched to their cold block. Collects the
/// handles to free and marks the records an entry took.
fn settle_keys<'v>(
    t: &Tier,
    b: &Budget,
    s: &mut Shard,
    lru: &mut Lru,
    done: impl Iterator<Item = (&'v Victim, usize, Option<RecordId>)>,
    settled: &mut Settled,
    out: usize,
) {
    let mut blocks: Vec<u64> = Vec::new();
    for (v, r, id) in done {
        let now = s.get(v.key);
        // With exclusive loads, a load during the write changes nothing:
        // the object was going to the cold end anyway.
        if let Some(cur) = now.filter(|&n| n == v.entry || (t.exclusive() && n == v.entry.with_referenced(true))) {
            match id {
                Some(id) => {
                    s.replace(v.key, cur, Entry::backed(id.to_raw(), v.info).with_gen(v.entry.gen()));
                    settled.taken[r] = true;
                    let block = v.key & !crate::index::BLOCK_MASK;
                    if blocks.last() != Some(&block) {
                        blocks.push(block);
                    }
                }
                None => {
                    s.remove(v.key, b);
                    settled.dropped += 1;
                }
            }
            settled.freed.push(v.handle);
            continue;
        }
        // A load only set the referenced bit: the object is still here and
        // keeps its place in the LRU, at the hot end.
        if let (Some(item), Some(now)) = (v.item, s.get(v.key)) {
            if now.gen() == item.gen && now.slot() == v.entry.slot() {
                lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
            }
        }
    }
    s.make_cold(&blocks, b);
    lru.return_out(out);
    // The victims' places are free now: give the room back once it is
    // most of the queue's.
    trim_keys(lru, s, b);
}

/// [`settle_keys`] for shared objects. A dropped one stays in the table,
/// as `Loc::Dropped`, until its last key lets go: its keys then miss.
fn settle_shared<'v>(
    t: &Tier,
    b: &Budget,
    ds: &mut DedupShard,
    lru: &mut Lru,
    done: impl Iterator<Item = (&'v Victim, usize, Option<RecordId>)>,
    settled: &mut Settled,
    out: usize,
) {
    for (v, r, id) in done {
        match ds.written_back(v.key, v.gen, v.handle, v.referenced, id.map(RecordId::to_raw)) {
            ToCold::Stale => {}
            ToCold::Referenced => {
                // Loaded or shared again while we wrote: stays, at the hot end.
                if let Some(item) = v.item {
                    lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
                }
            }
            ToCold::Moved { dropped } => {
                settled.taken[r] |= !dropped;
                settled.dropped += dropped as u64;
                settled.freed.push(v.handle);
            }
        }
    }
    lru.return_out(out);
}
