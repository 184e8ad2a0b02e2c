//! Moving bytes to and from the cold store: the mechanism under the
//! tier's policy (`tier.rs` decides which objects leave RAM and in which
//! order; this file writes a batch of them, settles the index and the
//! dedup table afterwards, reads written-back pages and brings them back).
//!
//! A batch is laid out as records in key order ([`layout_records`]),
//! written with no lock held, then each source's lock is taken again and
//! every entry that is still unchanged is swapped for its record
//! ([`settle`]); a failed write puts every victim back on its LRU
//! ([`requeue`]) and changes nothing else. Both are written once for a
//! page's own objects and shared ones ([`Holder`]). The budget is charged a bound for the store's tables
//! before a write and settled after it ([`BackingCharge`]).

use std::sync::atomic::Ordering::Relaxed;

use zmem_alloc::{Budget, Handle};

use super::holder::{Holder, Settled};
use super::lru::{Lru, LruItem};
use super::{trim, Parts, Source, Tier, TierHost, Victim, OBJ};
use crate::cold::{ColdError, RecordId};
use crate::entry::{Entry, ObjInfo};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;

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

    /// The cold store takes the records `ids` over (a pool opened again:
    /// [`ColdStore::adopt`]) and the budget is charged for its tables;
    /// for each id, whether it was taken.
    pub(crate) fn adopt(&self, ids: &[RecordId], b: &Budget) -> std::result::Result<Vec<bool>, String> {
        let taken = self.store.adopt(ids).map_err(|e| e.to_string())?;
        // Tables the pool holds already (as an opened arena's pages are).
        let mut c = self.backing_charged.lock();
        let actual = self.store.metadata_bytes();
        b.force_charge(actual.saturating_sub(c.charged));
        c.charged = c.charged.max(actual);
        Ok(taken)
    }

    /// The pool is left to the next process: see [`ColdStore::leave`].
    pub(crate) fn leave(&self) {
        self.store.leave();
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
        let p = h.parts();
        let (records, rec_of) = layout_records(&victims, sources, buf, self.store.keeps());
        let recs: Vec<(u64, &[u8])> = records.iter().map(|r| (r.key, &r.bytes[..])).collect();
        let mut by_src: Vec<usize> = victims.iter().map(|v| v.src).collect();
        by_src.sort_unstable();
        by_src.dedup();
        let b = p.objects.budget();
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
            Err(e) => Err(p.counters.alloc_failed(e)),
        };
        let mut written = put();
        // A full store may have copied records to make room, which comes
        // back once the copies are named and the old records freed: then
        // once more.
        if written.is_err() && self.apply_moves(&p) > 0 {
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
                    sources[i].with(&self.queues, |s, lru| requeue(self, b, s, lru, mine, out(i)));
                }
                return Err(e);
            }
        };
        let mut settled = Batch { freed: Vec::with_capacity(victims.len()), taken: vec![false; ids.len()], ..Batch::default() };
        for &i in &by_src {
            let mine = victims.iter().zip(&rec_of).filter(|(v, _)| v.src == i).map(|(v, &r)| (v, r, ids[r]));
            sources[i].with(&self.queues, |s, lru| settle(self, b, s, lru, mine, &mut settled, out(i)));
        }
        let Batch { freed, taken, dropped } = settled;
        let n = freed.len() as u64;
        for handle in freed {
            if let Err(e) = p.objects.free(handle) {
                p.counters.free_failed(&e.to_string());
            }
        }
        // Records nobody took (every page in them was overwritten,
        // invalidated or loaded while we wrote).
        for id in ids.iter().zip(&taken).filter(|(_, &t)| !t).filter_map(|(id, _)| *id) {
            if let Err(e) = self.store.free(id) {
                p.counters.free_failed(&e.to_string());
            }
        }
        self.apply_moves(&p);
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
    pub(crate) fn apply_moves(&self, p: &Parts<'_>) -> usize {
        let moves = self.store.take_moves();
        for m in &moves {
            let (from, to) = (m.from.to_raw(), m.to.to_raw());
            let named = p.index.shard(m.key).lock().rename_record(m.key, from, to, p.objects.budget())
                || p.dedup.is_some_and(|d| d.shard(m.key).lock().rename_record(m.key, from, to));
            if let Err(e) = self.store.free(if named { m.from } else { m.to }) {
                p.counters.free_failed(&e.to_string());
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
        let index = h.parts().index;
        let mut ids: Vec<RecordId> = keys.filter_map(|k| index.shard(k).lock().get(k)?.record().map(RecordId::from_raw)).collect();
        // The pages of one extent name one record.
        ids.dedup();
        let _busy = self.read_busy.start();
        self.store.prefetch(&ids)
    }

    /// Serve a load of `key` from its record `id`, read with no lock held;
    /// then bring the object back to RAM if the pool has room and the entry
    /// still names this record.
    pub(crate) fn load_backed(&self, h: &impl TierHost, key: u64, id: u64, buf: &mut [u8]) -> Result<()> {
        let p = h.parts();
        OBJ.with_borrow_mut(|obj| {
            let (info, r) = self.read_member(p.objects, key, id, obj, buf)?;
            if !self.promotes() || self.held_pages(&p) >= p.admission.accept_pages() {
                return Ok(());
            }
            // Without room for its place in the index or the LRU, it is
            // served from the file and stays there.
            let make = || p.objects.write(&obj[r]).ok().map(|handle| Entry::obj(handle, info));
            if h.publish_over(key, id, make) {
                self.promoted.fetch_add(1, Relaxed);
            }
            Ok(())
        })
    }

    /// [`load_backed`](Self::load_backed) for a page whose shared object
    /// `hash` was written back as record `id`.
    pub(crate) fn load_backed_shared(&self, h: &impl TierHost, key: u64, hash: u64, id: u64, info: ObjInfo, buf: &mut [u8]) -> Result<()> {
        let p = h.parts();
        let Some(d) = p.dedup else {
            return Err(ZmemError::Inconsistent { key, what: "a written-back shared object without dedup or a backing store".into() });
        };
        OBJ.with_borrow_mut(|obj| {
            self.read_record(p.objects, hash, id, info, obj, buf).map_err(|e| match e {
                // Name the page, not the hash, in what the caller sees.
                ZmemError::Corrupt { source, .. } => ZmemError::Corrupt { key, source },
                e => e,
            })?;
            if !self.promote || self.held_pages(&p) >= p.admission.accept_pages() {
                return Ok(());
            }
            let (b, shard) = (p.objects.budget(), d.shard_index(hash));
            // No room for its place: it stays on the file.
            let Ok(place) = self.reserve_shared(shard, b) else { return Ok(()) };
            let promoted = {
                let mut ds = d.shard(hash).lock();
                ds.promote(hash, id, || p.objects.write(obj).ok()).map(|gen| (gen, ds.records()))
            };
            let Some((gen, live)) = promoted else {
                self.cancel(place);
                return Ok(());
            };
            self.queue(h, place, hash, gen, live);
            if let Err(e) = self.store.free(RecordId::from_raw(id)) {
                p.counters.free_failed(&e.to_string());
            }
            self.settle_backing(b, 0);
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
    order.sort_unstable_by_key(|&i| (victims[i].src, victims[i].obj.key));
    let mut records: Vec<Record> = Vec::with_capacity(victims.len());
    let mut rec_of = vec![0; victims.len()];
    for i in order {
        let v = &victims[i];
        let (key, info) = (v.obj.key, v.obj.info);
        let bytes = &buf[v.off..v.off + info.len as usize];
        rec_of[i] = records.len();
        if !keeps || sources[v.src].shared() {
            records.push(Record { key, bytes: bytes.into() });
            continue;
        }
        let mut rec = Vec::with_capacity(extent::header_len(1) + bytes.len());
        extent::put_header(&[((key & crate::index::BLOCK_MASK) as u8, info)], &mut rec);
        rec.extend_from_slice(bytes);
        records.push(Record { key: key & !crate::index::BLOCK_MASK, bytes: rec.into() });
    }
    (records, rec_of)
}

/// After a failed write: put each victim that is still unchanged back on
/// its LRU: at the cold end, or at the hot end if a load referenced it
/// while the write ran (before, such an entry lost its item for good and
/// was pinned in RAM).
/// `out` is how many of the victims the shrinker took out of this queue:
/// their places were kept, so putting them back never grows it.
fn requeue<'v>(t: &Tier, b: &Budget, s: &dyn Holder, lru: &mut Lru, victims: impl DoubleEndedIterator<Item = &'v Victim>, out: usize) {
    for v in victims.rev() {
        let (Some(item), Some(hot)) = (v.item, s.unchanged(&v.obj, t.exclusive())) else { continue };
        if hot {
            lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
        } else {
            lru.push_front(item, b);
        }
    }
    lru.return_out(out);
}

/// What settling a batch leaves to do once the shard locks are dropped.
#[derive(Default)]
struct Batch {
    /// Objects that left RAM: free them.
    freed: Vec<Handle>,
    /// Per record of the batch: whether an entry now names it. Those that
    /// none does (every page in it was overwritten, invalidated or loaded
    /// while we wrote) are freed.
    taken: Vec<bool>,
    /// How many of `freed` the store dropped rather than kept.
    dropped: u64,
}

/// After a successful write: swap each unchanged object for its record
/// (or let it go, if the store dropped it); one a load referenced while
/// the write ran stays, at the hot end. Collects the handles to free and
/// marks the records taken.
fn settle<'v>(
    t: &Tier,
    b: &Budget,
    s: &mut dyn Holder,
    lru: &mut Lru,
    done: impl Iterator<Item = (&'v Victim, usize, Option<RecordId>)>,
    batch: &mut Batch,
    out: usize,
) {
    let mut moved: Vec<u64> = Vec::new();
    for (v, r, id) in done {
        match s.settle(&v.obj, id, t.exclusive(), b) {
            Settled::Moved { dropped } => {
                batch.taken[r] |= !dropped;
                batch.dropped += dropped as u64;
                batch.freed.push(v.obj.handle);
                if !dropped {
                    moved.push(v.obj.key);
                }
            }
            Settled::Hot => {
                if let Some(item) = v.item {
                    lru.push_back(LruItem { seq: t.next_seq(), ..item }, b);
                }
            }
            Settled::Stale => {}
        }
    }
    s.settled(&moved, b);
    lru.return_out(out);
    // The victims' places are free now: give the room back once it is
    // most of the queue's.
    trim(lru, s, b);
}
