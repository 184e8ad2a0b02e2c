//! The dedup table: shared objects, found by the content hash of their
//! page, and adaptive dedup, which keeps records only where sharing pays.
//!
//! # The table
//! 64 shards, chosen by content hash, each a mutex over a map from the
//! hash (xxh3-64 of the original page) to a [`DedupRec`]: where the shared
//! object lives (RAM, the cold store, or dropped by it), its encoding and
//! its reference count (the writeback tier keeps its own queue of each
//! shard's objects in RAM, changed only under the shard's lock). Every key that shares an object names the hash in its
//! index entry, not the place, so a shared object is written back once and
//! every key follows it. Every change of a record goes through a method of
//! [`DedupShard`], which moves the shard's counters with it (zram's
//! `dup_data_size` and `meta_data_size` among them). A hash match alone
//! never shares: the caller compares the pages byte for byte first.
//!
//! Lock order: an index shard, then a dedup shard, then the tier's queue
//! of that dedup shard or the allocator.
//!
//! # The problem
//! The zram dedup patch judged dedup by one rule: `dup_data_size` must
//! exceed `meta_data_size`. A pool that gives every stored page a shared
//! record (hash, place, encoding, reference count: about 47 bytes with the
//! hash table's slack) breaks it on ordinary data: a cargo `target/release`
//! copied onto ext4 found 518 duplicate pages of 87,000, saved 240,809
//! bytes and spent 3,282,432 on records, 1.6 % above dedup off.
//!
//! # The design
//! * Every page is hashed (xxh3, ~20 GB/s) and looked up in the record
//!   table, so a page always shares an existing record when it has a twin.
//! * **Full mode** (the start): a page with no twin gets a record, so its
//!   later twins find it. **Sampling mode**: only a page whose hash is 0
//!   modulo 32 does (a record costs ~47 bytes: ~1.5 bytes a page, 0.4 %
//!   of a 400-byte object); the others are stored as plain objects, with no
//!   record and no metadata beyond a pool without dedup. Twins have equal
//!   hashes, so in sampling mode the pages whose hash is 0 mod 32 still
//!   find every twin: their hit rate is the pool's duplicate rate.
//! * Every 1,024 tracked stores in full mode (256 in sampling mode, that
//!   is every 4,096 stores) the pool weighs what sharing saved
//!   (the compressed bytes of the twins found) against what a record
//!   costs. Less than one record per tracked page: switch to sampling and
//!   give the records back (each index shard, in turn, converts its
//!   unshared records, outside the sample, to plain objects; then the
//!   tables shrink). More than two: switch to full, and each index shard in
//!   turn gives its plain objects records, merging the twins among them,
//!   so pages stored while sampling are not lost to sharing.
//! * A conversion pass runs one index shard per store (1/64 of the pool
//!   under that shard's lock), so no store waits for the whole pool; the
//!   store that ends a share pass also compacts the allocator, since the
//!   twins it merged freed objects all over the size classes.
//!
//! # Trade-offs
//! * A table that is not adaptive stays in full mode (a pool with a
//!   backing store asks for one: the tier queues its records, and the
//!   conversions would have to move them between its queues).
//! * In sampling mode, twins whose hash is not 0 mod 32 are stored twice
//!   until the pool switches back to full; the first pass then merges them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};
use zmem_alloc::{AllocError, Budget, Handle};

use crate::charged::{map_bytes, map_insert_new, Map};
use crate::entry::{count_dict, Entry, ObjInfo, Slot, DICT_SLOTS, PAGE_SIZE};
use crate::objects::Objects;
use crate::shard::{Index, Shard};
use crate::stats::{Counters, Stats};

/// Shards of the table.
const DEDUP_SHARDS: usize = 64;
/// In sampling mode, a page gets a record only if its hash is 0 modulo this.
pub(crate) const SAMPLE: u64 = 32;
/// Tracked stores between two decisions in full mode. In sampling mode a
/// quarter of it (one tracked store in 32: a decision every 8,192 stores),
/// so that twins coming back are seen while they are still being written.
const WINDOW: u64 = 1024;
/// What one record costs: its slot in the table, a control byte, and the
/// table's slack at hashbrown's 7/8 load.
const REC_BYTES: u64 = ((std::mem::size_of::<(u64, DedupRec)>() + 1) * 8 / 7) as u64;

const PASS_NONE: u8 = 0;
const PASS_SHARE: u8 = 1;
const PASS_UNSHARE: u8 = 2;

/// Where a shared object lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Ram(Handle),
    /// A record id in the cold store; the record's key is the hash.
    Backed(u64),
    /// Dropped by the cold store (a clean cache): its keys miss until they
    /// are stored again or freed; the record goes with the last of them.
    Dropped,
}

/// A shared object: one allocation (or one record) referenced by `refs`
/// index entries. Every key that shares it follows it to the cold store
/// and back: their entries name the hash, not the place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DedupRec {
    pub loc: Loc,
    pub info: ObjInfo,
    pub refs: u32,
    /// Tells this record from an earlier one under the same hash (the
    /// writeback tier matches what it queued by it).
    pub gen: u8,
    /// Set by a load or a new sharer: one more round in RAM.
    pub referenced: bool,
    /// Last access, seconds since the pool was created (zram's ac_time).
    pub ac: u32,
}

/// What dropping a reference leaves the caller to free (with no lock held).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Other keys still share it, or the cold store had dropped it.
    Nothing,
    /// The last reference to an object in RAM.
    Object(Handle),
    /// The last reference to a record in the cold store.
    Record(u64),
}

/// What a written-back candidate has become when its write completes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ToCold {
    /// Freed, replaced or moved meanwhile: the record nobody took is stale.
    Stale,
    /// Loaded or shared again meanwhile: it stays, at the hot end; the
    /// record is stale.
    Referenced,
    /// Now in the cold store, or dropped by it: its object is to be freed.
    Moved { dropped: bool },
}

/// The dedup table (see the module notes): its shards and adaptive mode.
pub(crate) struct DedupTable {
    shards: Box<[DedupLock]>,
    mode: DedupMode,
    /// Whether the table may leave full mode (see the module notes).
    adaptive: bool,
}

/// One dedup shard's lock, second in the engine's lock order.
pub(crate) struct DedupLock(Mutex<DedupShard>);

/// A locked dedup shard. While one lives, this thread may not lock an
/// index shard (`lockorder.rs` checks it in debug builds).
pub(crate) struct DedupGuard<'a>(MutexGuard<'a, DedupShard>);

impl DedupLock {
    /// Lock this shard (with or without an index shard locked before it).
    pub fn lock(&self) -> DedupGuard<'_> {
        let g = self.0.lock();
        crate::lockorder::took_dedup_shard();
        DedupGuard(g)
    }
}

impl std::ops::Deref for DedupGuard<'_> {
    type Target = DedupShard;
    fn deref(&self) -> &DedupShard {
        &self.0
    }
}

impl std::ops::DerefMut for DedupGuard<'_> {
    fn deref_mut(&mut self) -> &mut DedupShard {
        &mut self.0
    }
}

impl Drop for DedupGuard<'_> {
    fn drop(&mut self) {
        crate::lockorder::released_dedup_shard();
    }
}

/// One shard of the table, and the counts of its records.
#[derive(Default)]
pub(crate) struct DedupShard {
    /// Content hash (xxh3-64 of the original page) -> shared object.
    map: Map<DedupRec>,
    next_gen: u8,
    /// Bytes and huge pages of the shard's objects in RAM.
    compr_bytes: u64,
    huge_pages: u64,
    /// Sum of (refs - 1): pages that cost no allocation thanks to sharing.
    dup_pages: u64,
    /// Compressed bytes those pages would otherwise have taken (zram's dup_data_size).
    dup_bytes: u64,
    /// Shared objects in the cold store, and the pages that refer to them.
    backed_records: u64,
    backed_refs: u64,
    /// Pages whose shared object the cold store dropped (they miss).
    dropped_refs: u64,
    /// Shared objects (in RAM or written back) per dictionary slot.
    dict_objs: [u64; DICT_SLOTS],
}

impl DedupShard {
    /// A shared object enters or leaves RAM: move its counts.
    fn account_ram(&mut self, rec: &DedupRec, into_ram: bool) {
        let (len, huge) = (rec.info.len as u64, rec.info.is_huge() as u64);
        count_dict(&mut self.dict_objs, rec.info, into_ram);
        if into_ram {
            self.compr_bytes += len;
            self.huge_pages += huge;
        } else {
            self.compr_bytes -= len;
            self.huge_pages -= huge;
        }
    }

    fn account_backed(&mut self, rec: &DedupRec, on_disk: bool) {
        count_dict(&mut self.dict_objs, rec.info, on_disk);
        if on_disk {
            self.backed_records += 1;
            self.backed_refs += rec.refs as u64;
        } else {
            self.backed_records -= 1;
            self.backed_refs -= rec.refs as u64;
        }
    }

    /// The record of `hash`.
    pub fn get(&self, hash: u64) -> Option<DedupRec> {
        self.map.get(&hash).copied()
    }

    /// Where the object of `hash` lives.
    pub fn loc(&self, hash: u64) -> Option<Loc> {
        self.map.get(&hash).map(|r| r.loc)
    }

    /// One more page shares the object of `hash` (the caller has compared
    /// them). `touch`: a store's access time, which also marks it
    /// referenced (one more round in RAM). Returns its encoding.
    pub fn add_ref(&mut self, hash: u64, touch: Option<u32>) -> Option<ObjInfo> {
        let r = self.map.get_mut(&hash)?;
        r.refs += 1;
        if let Some(now) = touch {
            r.referenced = true;
            r.ac = now;
        }
        let (info, backed) = (r.info, matches!(r.loc, Loc::Backed(_)));
        self.dup_pages += 1;
        self.dup_bytes += info.len as u64;
        self.backed_refs += backed as u64;
        Some(info)
    }

    /// A new shared object in RAM, referenced once, charging the map's
    /// growth; a refusal changes nothing. Returns its generation.
    pub fn insert(&mut self, hash: u64, handle: Handle, info: ObjInfo, now: u32, b: &Budget) -> Result<u8, AllocError> {
        let gen = self.next_gen;
        let rec = DedupRec { loc: Loc::Ram(handle), info, refs: 1, gen, referenced: false, ac: now };
        map_insert_new(&mut self.map, hash, rec, b)?;
        self.next_gen = gen.wrapping_add(1);
        self.account_ram(&rec, true);
        Ok(gen)
    }

    /// Drop one reference to the object of `hash`; the last one takes the
    /// record out, and the caller frees what it names.
    pub fn release(&mut self, hash: u64) -> Result<Released, String> {
        let Some(rec) = self.map.get_mut(&hash) else {
            return Err(format!("shared object {hash:#x} is missing from the dedup table"));
        };
        let backed = matches!(rec.loc, Loc::Backed(_));
        if rec.loc == Loc::Dropped {
            rec.refs -= 1;
            self.dropped_refs -= 1;
            if rec.refs == 0 {
                self.map.remove(&hash);
            }
            return Ok(Released::Nothing);
        }
        if rec.refs > 1 {
            rec.refs -= 1;
            self.dup_pages -= 1;
            self.dup_bytes -= rec.info.len as u64;
            self.backed_refs -= backed as u64;
            return Ok(Released::Nothing);
        }
        let rec = *rec;
        self.map.remove(&hash);
        Ok(match rec.loc {
            Loc::Ram(h) => {
                self.account_ram(&rec, false);
                Released::Object(h)
            }
            Loc::Dropped => Released::Nothing,
            Loc::Backed(id) => {
                self.account_backed(&rec, false);
                Released::Record(id)
            }
        })
    }

    /// A load of the object of `hash`: where it is and its encoding. The
    /// load marks it referenced and stamps its access (zram's ac_time).
    pub fn access(&mut self, hash: u64, now: u32) -> Option<(Loc, ObjInfo)> {
        let rec = self.map.get_mut(&hash)?;
        rec.referenced = true;
        rec.ac = now;
        Some((rec.loc, rec.info))
    }

    /// The object of `hash`, if one page alone refers to it and it is in
    /// RAM: its record goes, and the caller's entry takes the object.
    fn take_sole(&mut self, hash: u64) -> Option<(Handle, ObjInfo)> {
        let rec = self.map.get(&hash).copied()?;
        let (1, Loc::Ram(h)) = (rec.refs, rec.loc) else { return None };
        self.map.remove(&hash);
        self.account_ram(&rec, false);
        Some((h, rec.info))
    }

    /// Give the map's unused room back.
    fn shrink(&mut self, b: &Budget) {
        let before = map_bytes(&self.map);
        // The new table is built before the old one goes: charge the old
        // size as its bound, then settle.
        if b.try_charge(before).is_ok() {
            self.map.shrink_to_fit();
            b.uncharge(2 * before - map_bytes(&self.map));
        }
    }

    /// Add this shard's counts to `st`; returns (pages whose data is in
    /// the cold store or dropped, bytes of the table).
    pub fn add_stats(&self, st: &mut Stats) -> (u64, u64) {
        st.compr_data_size += self.compr_bytes;
        st.huge_pages += self.huge_pages;
        st.dup_pages += self.dup_pages;
        st.dup_data_size += self.dup_bytes;
        st.bd_count += self.backed_records;
        (self.backed_refs + self.dropped_refs, map_bytes(&self.map))
    }

    /// Shared objects in RAM or written back with the dictionary in `slot`.
    pub fn dict_objects(&self, slot: usize) -> u64 {
        self.dict_objs[slot]
    }

    // ---- the writeback tier's side ---------------------------------------

    /// Records in the shard (in RAM, written back or dropped).
    pub fn records(&self) -> usize {
        self.map.len()
    }

    /// What the writeback tier queued as (`hash`, `gen`), popped from the
    /// cold end: the object if it is still in RAM at that generation
    /// (`Err(true)` if it was referenced: the bit is cleared and the
    /// caller gives it a second chance; `Err(false)` if the item is stale).
    pub fn cold_candidate(&mut self, hash: u64, gen: u8) -> Result<(Handle, ObjInfo, u8), bool> {
        let Some(rec) = self.map.get_mut(&hash) else { return Err(false) };
        let Loc::Ram(handle) = rec.loc else { return Err(false) };
        if rec.gen != gen {
            return Err(false);
        }
        if rec.referenced {
            rec.referenced = false;
            return Err(true);
        }
        Ok((handle, rec.info, rec.gen))
    }

    /// The objects in RAM that `picks(info, ac)` names, at most `cap`, as
    /// (hash, generation).
    pub fn ram_picked(&self, picks: impl Fn(ObjInfo, u32) -> bool, cap: usize) -> Vec<(u64, u8)> {
        self.map.iter().filter(|(_, r)| matches!(r.loc, Loc::Ram(_)) && picks(r.info, r.ac)).map(|(&h, r)| (h, r.gen)).take(cap).collect()
    }

    /// The object of `hash` if it is in RAM at generation `gen`: its
    /// handle, encoding and referenced bit.
    pub fn in_ram(&self, hash: u64, gen: u8) -> Option<(Handle, ObjInfo, bool)> {
        let r = self.map.get(&hash).filter(|r| r.gen == gen)?;
        let Loc::Ram(handle) = r.loc else { return None };
        Some((handle, r.info, r.referenced))
    }

    /// Whether the object of `hash` is still `handle` at generation `gen`
    /// (after a write that failed), and if so whether it is referenced now.
    pub fn still_in_ram(&self, hash: u64, gen: u8, handle: Handle) -> Option<bool> {
        let rec = self.map.get(&hash)?;
        (rec.gen == gen && rec.loc == Loc::Ram(handle)).then_some(rec.referenced)
    }

    /// The write of the object of `hash` (picked as `handle` at `gen`, with
    /// its referenced bit `was_referenced`) is done: record `id` now holds
    /// it, or (`None`) the cold store dropped it. A dropped one stays in
    /// the table, as `Loc::Dropped`, until its last key lets go: its keys
    /// then miss.
    pub fn written_back(&mut self, hash: u64, gen: u8, handle: Handle, was_referenced: bool, id: Option<u64>) -> ToCold {
        let Some(rec) = self.map.get_mut(&hash) else { return ToCold::Stale };
        if rec.gen != gen || rec.loc != Loc::Ram(handle) {
            return ToCold::Stale;
        }
        if rec.referenced && !was_referenced {
            return ToCold::Referenced;
        }
        let before = *rec;
        rec.loc = match id {
            Some(id) => Loc::Backed(id),
            None => Loc::Dropped,
        };
        let after = *rec;
        self.account_ram(&before, false);
        match id {
            Some(_) => self.account_backed(&after, true),
            None => {
                let extra = before.refs as u64 - 1;
                self.dup_pages -= extra;
                self.dup_bytes -= extra * before.info.len as u64;
                self.dropped_refs += before.refs as u64;
            }
        }
        ToCold::Moved { dropped: id.is_none() }
    }

    /// Make the shared object of `hash` name record `to` if it named
    /// `from` (the cold store copied it); returns whether it did.
    pub fn rename_record(&mut self, hash: u64, from: u64, to: u64) -> bool {
        match self.map.get_mut(&hash) {
            Some(rec) if rec.loc == Loc::Backed(from) => {
                rec.loc = Loc::Backed(to);
                true
            }
            _ => false,
        }
    }

    /// Bring the object of `hash` back to RAM from record `id`, if it is
    /// still there: `alloc` makes its object (the caller has made the room
    /// it needs elsewhere first). Returns its new generation (for the
    /// caller to queue it).
    pub fn promote(&mut self, hash: u64, id: u64, alloc: impl FnOnce() -> Option<Handle>) -> Option<u8> {
        if self.map.get(&hash)?.loc != Loc::Backed(id) {
            return None;
        }
        let h = alloc()?;
        let gen = self.next_gen;
        self.next_gen = gen.wrapping_add(1);
        let rec = self.map.get_mut(&hash)?;
        let before = *rec;
        rec.loc = Loc::Ram(h);
        rec.gen = gen;
        let after = *rec;
        self.account_backed(&before, false);
        self.account_ram(&after, true);
        Some(gen)
    }
}

/// The mode, the window's counters and the conversion pass in progress.
struct DedupMode {
    full: AtomicBool,
    tracked: AtomicU64,
    saved: AtomicU64,
    switches: AtomicU64,
    pass: AtomicU8,
    cursor: AtomicUsize,
}

impl DedupMode {
    fn new() -> DedupMode {
        DedupMode {
            full: AtomicBool::new(true),
            tracked: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            pass: AtomicU8::new(PASS_NONE),
            cursor: AtomicUsize::new(0),
        }
    }

    fn full(&self) -> bool {
        self.full.load(Relaxed)
    }

    fn switch(&self, full: bool) {
        self.full.store(full, Relaxed);
        self.switches.fetch_add(1, Relaxed);
        self.cursor.store(0, Relaxed);
        self.pass.store(if full { PASS_SHARE } else { PASS_UNSHARE }, Relaxed);
    }
}

impl DedupTable {
    /// A table in full mode; `adaptive`: it may switch to sampling, and
    /// back, by what sharing saves.
    pub fn new(adaptive: bool) -> DedupTable {
        DedupTable { shards: (0..DEDUP_SHARDS).map(|_| DedupLock(Mutex::new(DedupShard::default()))).collect(), mode: DedupMode::new(), adaptive }
    }

    /// Bytes of the shard array, held from creation to drop.
    pub fn fixed_bytes() -> u64 {
        (DEDUP_SHARDS * std::mem::size_of::<DedupLock>()) as u64
    }

    /// The shard of `hash`.
    pub fn shard(&self, hash: u64) -> &DedupLock {
        &self.shards[self.shard_index(hash)]
    }

    /// Where the shard of `hash` is in [`DedupTable::shards`].
    pub fn shard_index(&self, hash: u64) -> usize {
        (hash as usize) % self.shards.len()
    }

    /// The shard of `hash`, locked under the index shard `_parent` this
    /// thread holds: the guard borrows it, so it is dropped first and the
    /// index shard cannot be used meanwhile.
    pub fn lock_under<'s>(&'s self, _parent: &'s mut Shard, hash: u64) -> DedupGuard<'s> {
        self.shard(hash).lock()
    }

    /// Every shard, in order.
    pub fn shards(&self) -> &[DedupLock] {
        &self.shards
    }

    /// Whether every new page gets a record (full mode), and how many
    /// times the mode switched.
    pub fn full(&self) -> bool {
        self.mode.full()
    }

    pub fn switches(&self) -> u64 {
        self.mode.switches.load(Relaxed)
    }

    /// Whether a page with this hash that finds no twin gets a record.
    pub fn tracks(&self, hash: u64) -> bool {
        self.mode.full() || hash.is_multiple_of(SAMPLE)
    }

    /// A tracked store found a twin that saved `saved` bytes, or none;
    /// every `WINDOW` tracked stores, decide the mode.
    pub fn observe(&self, tracked: bool, saved: Option<u64>) {
        let m = &self.mode;
        if !tracked || !self.adaptive {
            return;
        }
        if let Some(b) = saved {
            m.saved.fetch_add(b, Relaxed);
        }
        let window = if m.full() { WINDOW } else { WINDOW / 4 };
        if m.tracked.fetch_add(1, Relaxed) + 1 != window {
            return;
        }
        // This store closed the window: the others now count the next one.
        let per_page = m.saved.swap(0, Relaxed) / window;
        m.tracked.store(0, Relaxed);
        if m.full() && per_page < REC_BYTES {
            m.switch(false);
        } else if !m.full() && per_page > 2 * REC_BYTES {
            m.switch(true);
        }
    }

    /// If a conversion pass is under way, do its next index shard.
    /// `now` (the pool's clock) is read only if a pass runs.
    pub fn maintain(&self, index: &Index, objects: &Objects, counters: &Counters, now: impl FnOnce() -> u32) {
        let m = &self.mode;
        let pass = m.pass.load(Relaxed);
        // (A table that is not adaptive never switches: no pass.)
        if pass == PASS_NONE {
            return;
        }
        let shards = index.shards();
        let i = m.cursor.fetch_add(1, Relaxed);
        if i >= shards.len() {
            return;
        }
        if pass == PASS_SHARE {
            let frees = self.share_shard(&mut shards[i].lock(), objects, counters, now());
            // The merged twins' objects, with no lock held.
            for h in frees {
                if let Err(e) = objects.free(h) {
                    counters.free_failed(&e.to_string());
                }
            }
        } else {
            self.unshare_shard(&mut shards[i].lock());
        }
        if i + 1 == shards.len() {
            let _ = m.pass.compare_exchange(pass, PASS_NONE, Relaxed, Relaxed);
            if pass == PASS_UNSHARE {
                for ds in self.shards.iter() {
                    ds.lock().shrink(objects.budget());
                }
            } else {
                // Merged twins freed their objects all over the classes.
                objects.compact();
            }
        }
    }

    /// Give every plain object of index shard `s` a record, or join the
    /// record of an equal page; returns the objects of the pages that
    /// joined one, to be freed once the shard's lock is dropped.
    fn share_shard(&self, s: &mut Shard, objects: &Objects, counters: &Counters, now: u32) -> Vec<Handle> {
        let mut page = vec![0u8; PAGE_SIZE];
        let mut frees = Vec::new();
        let objs: Vec<(u64, Entry)> = s.iter_in_ram().filter(|(_, e, _)| matches!(e.slot(), Slot::Obj(..))).map(|(k, e, _)| (k, e)).collect();
        for (key, e) in objs {
            let Slot::Obj(h, info) = e.slot() else { continue };
            if objects.read_object(key, h, info, &mut page).is_err() {
                continue;
            }
            let hash = xxhash_rust::xxh3::xxh3_64(&page);
            let mut ds = self.lock_under(s, hash);
            let new = match ds.get(hash) {
                Some(rec) => {
                    let Loc::Ram(rh) = rec.loc else { continue };
                    if !objects.equals(rh, rec.info, &page) {
                        continue;
                    }
                    let Some(info) = ds.add_ref(hash, None) else { continue };
                    counters.dedup_hits.fetch_add(1, Relaxed);
                    frees.push(h);
                    Entry::dedup(hash, info)
                }
                None => {
                    if ds.insert(hash, h, info, now, objects.budget()).is_err() {
                        continue;
                    }
                    Entry::dedup(hash, info)
                }
            };
            drop(ds);
            s.replace(key, e, new);
        }
        frees
    }

    /// Turn the records of index shard `s` that nobody shares (and that
    /// are not in the sample) back into plain objects.
    fn unshare_shard(&self, s: &mut Shard) {
        let shared: Vec<(u64, Entry)> =
            s.iter_in_ram().filter(|(_, e, _)| matches!(e.slot(), Slot::Dedup(hash, _) if !hash.is_multiple_of(SAMPLE))).map(|(k, e, _)| (k, e)).collect();
        for (key, e) in shared {
            let Slot::Dedup(hash, _) = e.slot() else { continue };
            let Some((h, info)) = self.lock_under(s, hash).take_sole(hash) else { continue };
            s.replace(key, e, Entry::obj(h, info));
        }
    }
}
