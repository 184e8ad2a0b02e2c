//! The writeback tier: an LRU with second chance over the pool's objects,
//! a background shrinker, and a [`ColdStore`] that takes what they evict:
//! compressed writeback to a backing file (zmem-backing), or nothing at
//! all for a clean-page cache (`DropCold`: the entry goes, the next load
//! misses). This file and its children split the work in two rooms, as
//! `mm/zswap.c` does between its LRU walk and `zswap_writeback_entry`:
//! which objects leave RAM and in what order (here: the LRU, second
//! chance, exclusive loads, explicit writeback's picks; `tier/lru.rs` the
//! queues, `tier/first.rs` the pages named to go first, `tier/shrinker.rs`
//! the thread and the stores that wait for it), and moving their bytes to
//! and from the cold store (`tier/transfer.rs`: batches, records, settling
//! the index afterwards, loads of written-back pages). `cold.rs` says what
//! leaving means.
//!
//! # Design
//! zswap keeps every entry on an LRU; when its pool is full a worker
//! (`shrink_worker`) walks the LRU from the cold end, rotating entries a
//! load has marked referenced (one more round in RAM) and writing the rest
//! back to swap. zram instead writes back on request (`writeback` of idle,
//! huge or incompressible pages, under a `writeback_limit` budget). zmem
//! does both, with three differences:
//!
//! * **Compressed writeback.** The object goes to the file as it is in RAM,
//!   packed with its neighbours in one write, so a written-back page costs
//!   its compressed size in I/O, not 4 KiB.
//! * **A record a page.** Each page goes to the file as a record of its
//!   own (an extent of one member, `extent.rs`), laid out in key order
//!   within the batch, so that a swap device's neighbouring slots sit
//!   side by side on the file. (Extents of a whole index block were tried:
//!   the cap held more pages, but every read read its whole extent;
//!   docs/experiments/.)
//! * **No LRU inversion.** A store that meets a full pool is not sent to the
//!   disk while cold pages stay in RAM (zswap's behaviour when it rejects):
//!   it waits for the shrinker to push the cold end out, then goes in.
//!
//! # The shrinker thread and the three marks
//! `max_pool` is a limit, as zswap's is, on the pool's pages plus the
//! metadata that grows with the data ([`Tier::held_pages`]; zswap counts
//! pages only; `admission.rs` keeps it and its marks). Below it sit two
//! marks: the
//! **high mark**, halfway between the accept threshold and `max_pool`, and
//! the **accept threshold** (`accept_threshold_percent` of `max_pool`). A
//! store that leaves the pool at or over the high mark wakes the shrinker
//! (one atomic flag; no lock unless it was asleep), which writes back from
//! the cold end until the pool is under the accept threshold. So under a
//! steady stream the shrinker runs ahead and stores never wait; only a
//! store that would take the pool over `max_pool` waits (with no lock held)
//! for the shrinker's progress, and is refused (`PoolFull`) only when the
//! shrinker has tried and cannot make room: the disk fails or is full, or
//! nothing in RAM can be written back. A round that fails backs off for
//! 100 ms before the next, so a dead disk is not hammered.
//!
//! A round compacts the allocator before each batch and writes back only
//! when compaction freed nothing: spans return pages only when they empty,
//! and writing back more than the pages still to free trades disk I/O for
//! nothing. For the same reason a batch carries at most the compressed
//! bytes of the pages still to free.
//!
//! # LRU
//! The tier keeps a FIFO of [`LruItem`]s in store order for each index
//! shard, and one for each dedup shard's shared objects (`tier/lru.rs`; a
//! shared object is written back once, and every key that refers to it
//! follows it: their entries name the hash, and the dedup record says
//! where the object is). Items carry a
//! pool-wide sequence number so the shrinker starts from the queue whose
//! oldest item is oldest overall, and the generation of what they were
//! queued for, so an overwritten or invalidated key leaves a stale item that
//! is skipped (and swept once there are more than three per object in
//! RAM, so they cannot pile up behind written-back pages). A load sets
//! the referenced bit (the entry's, or the shared record's: zswap's
//! `referenced` lives in its entry too); the shrinker clears it and
//! re-queues the item at the hot end instead of writing it back. The
//! pool hands the tier no lock: a store makes its item's place
//! ([`Tier::reserve`]) in the critical section that publishes the page and
//! queues the item once its shard's lock is dropped ([`Tier::queue`], as
//! zswap adds an entry to its `list_lru` after the tree's store); what
//! looks at what an item names (a pick, a settlement, a sweep) takes the
//! shard's lock, then the queue's (`tier/lru.rs`). A page's object and a
//! shared one go through the same paths: what differs is what their shard
//! answers about an item (`tier/holder.rs`). The policy (what to write
//! back, in which order, who gets a second chance) is all in this file.
//!
//! A pool without a cold store has a tier too, one that does nothing
//! ([`Tier::writes_back`] is false: no queues, no shrinker thread), so the
//! pool calls it the same way whatever its store.
//!
//! With exclusive loads (zswap drops an entry when the kernel loads it into
//! its swap cache; a block device is not told when the slot is freed, so
//! the copy must stay) a load does the opposite: the first load of an
//! object queues a second item for it at the cold end, marked by the same
//! bit so it is queued once, and the shrinker writes it back before any
//! object not yet loaded. That holds more unread pages in RAM where loads
//! are last uses, and reads more from the file where the kernel evicts
//! pages clean and reads them again (read faults on swap), so it is an
//! option, switched at run time
//! ([`Pool::set_exclusive_loads`](crate::Pool::set_exclusive_loads)):
//! `zmem swap on` follows the kernel's own rule by default
//! (`--exclusive-loads auto`: on while the system's swap is more than half
//! full, when the kernel frees a slot at every swap-in, read faults too).
//! A switch changes what the referenced bit means for bits already set:
//! that costs a second chance or an early writeback, never data.
//!
//! # Loads of written-back pages
//! A load notes the record id under the shard lock, drops every lock,
//! reads the record (its checksum is verified: a mismatch is an error,
//! never data) and decompresses it. Then, if the pool is under its accept
//! threshold and the entry still names that record, it brings the object
//! back into RAM and frees the record: the page has just proved hot.
//! Otherwise, and always with exclusive loads or with promotion off
//! (`PoolConfig::promote_loads`), it is served from the file and stays
//! there (zram's behaviour for pages on its backing device).
//!
//! # Records the cold store moves
//! A backing file compacts by copying records, and its ids are places, so
//! a copy has a new id ([`ColdStore::take_moves`]). After each batch the
//! tier takes the moves ([`Tier::apply_moves`]): the keys of the block
//! (or the shared object) that name a record's old id name the copy, and
//! the old record is freed; if nothing names it any more, the copy is
//! freed. A batch refused for want of room is tried once more when moves
//! were taken (their frees are the room compaction made).
//!
//! Same-filled pages hold no memory and are never written back.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::{Condvar, Mutex};
use zmem_alloc::{AllocError, Budget};

use crate::admission::Admission;
use crate::cold::{ColdError, ColdStore, RecordId};
use crate::latency::BusyClock;

mod first;
mod holder;
mod lru;
mod shrinker;
mod transfer;

use first::FirstOut;
pub use first::Resident;
use holder::{Candidate, Found, Holder};
pub(crate) use shrinker::shrinker_main;
use shrinker::Ctl;
use transfer::BackingCharge;

use crate::dedup::{DedupLock, DedupTable};
use crate::entry::{Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;
use crate::shard::{Index, ShardLock};
use crate::stats::{Counters, Stats};
use lru::{Lru, LruItem, Queues};

/// Pages written back per batch (one write to the file).
const BATCH: usize = 64;

thread_local! {
    /// Per-thread buffer for an object read from the cold store.
    pub(crate) static OBJ: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(PAGE_SIZE));
}

/// The engine's components the tier moves objects between, borrowed for
/// one call: the index and the dedup table (whose shards it locks itself,
/// in the engine's lock order), the object store, the counters, and the
/// limit it works to.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub index: &'a Index,
    pub dedup: Option<&'a DedupTable>,
    pub objects: &'a Objects,
    pub counters: &'a Counters,
    pub admission: &'a Admission,
}

/// What the tier asks of the pool it serves, and nothing more: its
/// components, the clock, and the publish a page brought back to RAM goes
/// through. The tier sees no engine: this is its whole view
/// of one, and the pool hands it no lock.
pub(crate) trait TierHost {
    fn parts(&self) -> Parts<'_>;
    /// Seconds since the pool was created (access times).
    fn now(&self) -> u32;
    /// Put the entry `make` gives under `key` if the key still names record
    /// `id`, as a store does (a load brings a written-back page back to
    /// RAM). Returns whether it did; a refusal (no room for the key's
    /// place) gives the new entry back.
    fn publish_over(&self, key: u64, id: u64, make: impl FnOnce() -> Option<Entry>) -> bool;
}

/// What [`Pool::writeback`](crate::Pool::writeback) writes back (zram's
/// `writeback` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WritebackMode {
    /// Pages not accessed for at least this many seconds.
    Idle(u32),
    /// Pages stored raw because they compressed to the huge threshold or more.
    Huge,
    /// Pages the compressor could not shrink at all.
    Incompressible,
    /// Every object in RAM.
    All,
}

impl WritebackMode {
    fn picks(self, info: ObjInfo, ac: u32, now: u32) -> bool {
        match self {
            WritebackMode::Idle(secs) => now.saturating_sub(ac) >= secs,
            WritebackMode::Huge => info.is_huge(),
            WritebackMode::Incompressible => info.is_incompressible(),
            WritebackMode::All => true,
        }
    }
}

/// What a load of a written-back page does
/// ([`PoolConfig::exclusive_loads`](crate::PoolConfig::exclusive_loads), at
/// start; [`PoolConfig::promote_loads`](crate::PoolConfig::promote_loads)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loads {
    pub exclusive: bool,
    pub promote: bool,
}

/// A place made in a queue for an object about to be published
/// ([`Tier::reserve`]): queued once the shard's lock is dropped
/// ([`Tier::queue`]), or given back if the publish is refused
/// ([`Tier::cancel`]). None: nothing to queue.
#[must_use]
pub(crate) struct Place(Option<usize>);

impl Place {
    /// No place: nothing to queue.
    pub const NONE: Place = Place(None);
}

/// The cold store of a pool that has none. Its tier does nothing: no
/// queues, no shrinker; nothing is ever written back, so nothing reaches
/// the store.
struct NoColdStore;

impl ColdStore for NoColdStore {
    fn put_batch(&self, _objects: &[(u64, &[u8])]) -> std::result::Result<Vec<Option<RecordId>>, ColdError> {
        Err(ColdError::Store("this pool has no cold store".into()))
    }
}

pub(crate) struct Tier {
    /// What leaving RAM means: a file, nothing (a clean cache), ...
    /// (`cold.rs`); [`NoColdStore`] for a pool that has none.
    store: Box<dyn ColdStore>,
    /// Whether there is a cold store: without one the tier does nothing.
    on: bool,
    /// Time with a read of the store in flight (`backing_read_busy_ns`).
    read_busy: BusyClock,
    /// [`PoolConfig::exclusive_loads`](crate::PoolConfig::exclusive_loads),
    /// changed at run time by [`Pool::set_exclusive_loads`](crate::Pool::set_exclusive_loads):
    /// an entry's referenced bit then means "loaded, queued at the cold
    /// end" (written back first), not "give it a second chance". A switch
    /// only changes policy: a bit set under one meaning and read under the
    /// other costs a second chance or an early writeback, never data.
    exclusive: AtomicBool,
    /// [`PoolConfig::promote_loads`](crate::PoolConfig::promote_loads): a
    /// written-back page that is loaded may come back to RAM.
    promote: bool,
    seq: AtomicU32,
    /// Held by whoever writes back: a shrinker round or an explicit
    /// writeback. It holds a batch's buffer of compressed objects, kept
    /// from batch to batch: one allocated per batch was a fresh mapping
    /// of up to [`BATCH`] pages, faulted in and unmapped again, hundreds
    /// of times a second.
    writing: Mutex<Vec<u8>>,
    ctl: Mutex<Ctl>,
    /// Wakes the shrinker.
    wake: Condvar,
    /// Wakes stores waiting for room: after every batch and every round.
    progress: Condvar,
    /// A store asked for a round (checked and cleared by the shrinker).
    wanted: AtomicBool,
    written_back: AtomicU64,
    /// Pages handed to the cold store in batches it took (zram's
    /// `bd_writes`: pages, whatever records they went in).
    pages_written: AtomicU64,
    /// Objects the store dropped (zcache's evictions).
    evicted: AtomicU64,
    promoted: AtomicU64,
    cold_queued: AtomicU64,
    writeback_fail: AtomicU64,
    /// What the budget holds for the backing store's tables.
    backing_charged: Mutex<BackingCharge>,
    /// `BackingCharge::reserved`, readable without the lock (`held_pages`).
    reserved_now: AtomicU64,
    /// Pages to write back before the LRUs' cold ends ([`Tier::write_first`]).
    first: Mutex<FirstOut>,
    /// The LRU: a queue per index shard and per dedup shard (`tier/lru.rs`).
    queues: Queues,
}

/// A shard whose objects the tier queues, and its queue: locked together
/// (the shard first) by [`Source::with`].
#[derive(Clone, Copy)]
enum Source<'a> {
    Index(&'a ShardLock, usize),
    Shared(&'a DedupLock, usize),
}

impl Source<'_> {
    fn queue(self) -> usize {
        let (Source::Index(_, q) | Source::Shared(_, q)) = self;
        q
    }

    fn shared(self) -> bool {
        matches!(self, Source::Shared(..))
    }

    /// Lock the shard, then its queue, and run `f` on both.
    fn with<R>(self, qs: &Queues, f: impl FnOnce(&mut dyn Holder, &mut Lru) -> R) -> R {
        match self {
            Source::Index(sh, q) => f(&mut *sh.lock(), &mut qs.lock(q)),
            Source::Shared(ds, q) => f(&mut *ds.lock(), &mut qs.lock(q)),
        }
    }
}

/// An object picked for writeback, and where its bytes sit in the batch.
struct Victim {
    /// Index of its source in the batch's sources.
    src: usize,
    obj: Found,
    /// The LRU item popped for it (the shrinker; explicit writeback pops none).
    item: Option<LruItem>,
    off: usize,
}

/// A batch being gathered from one queue: take items while the batch has
/// room and the queue's head is at least as old as `bound` (the next
/// queue's head), and always at least one.
struct Pick<'b> {
    t: &'b Tier,
    now: u32,
    bound: Option<u32>,
    src: usize,
    victims: &'b mut Vec<Victim>,
    buf: &'b mut Vec<u8>,
    /// Stop once the batch holds this many compressed bytes.
    max_bytes: usize,
    examined: usize,
}

impl Pick<'_> {
    /// The next item to pop from `lru`, if this queue should give one.
    fn next(&mut self, lru: &Lru) -> Option<LruItem> {
        if self.victims.len() >= BATCH || self.buf.len() >= self.max_bytes || self.examined >= 4 * BATCH {
            return None;
        }
        let item = *lru.front()?;
        if self.examined > 0 && self.bound.is_some_and(|b| self.now.wrapping_sub(item.seq) < b) {
            return None;
        }
        self.examined += 1;
        Some(item)
    }
}

impl Tier {
    /// A tier over `store` (None: a pool without a cold store, whose tier
    /// does nothing), with a queue for each of `index_shards` index shards
    /// and `dedup_shards` dedup shards (whose fixed cost,
    /// [`Tier::fixed_bytes`], the caller charges).
    pub fn new(store: Option<Box<dyn ColdStore>>, loads: Loads, index_shards: usize, dedup_shards: usize) -> Tier {
        let on = store.is_some();
        let queues = if on { Queues::new(index_shards, dedup_shards) } else { Queues::new(0, 0) };
        Tier {
            queues,
            store: store.unwrap_or_else(|| Box::new(NoColdStore)),
            on,
            read_busy: BusyClock::default(),
            exclusive: AtomicBool::new(loads.exclusive),
            promote: loads.promote,
            seq: AtomicU32::new(0),
            writing: Mutex::new(Vec::new()),
            ctl: Mutex::new(Ctl::default()),
            wake: Condvar::new(),
            progress: Condvar::new(),
            wanted: AtomicBool::new(false),
            written_back: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
            cold_queued: AtomicU64::new(0),
            writeback_fail: AtomicU64::new(0),
            backing_charged: Mutex::new(BackingCharge::default()),
            reserved_now: AtomicU64::new(0),
            first: Mutex::new(FirstOut::default()),
        }
    }

    /// Whether there is a cold store: pages leave RAM, a store that meets
    /// a full pool waits for the shrinker, and a thread runs it.
    pub fn writes_back(&self) -> bool {
        self.on
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Bytes of the queue array, held from creation to drop.
    pub fn fixed_bytes(&self) -> u64 {
        self.queues.fixed_bytes()
    }

    /// What `max_pool` bounds now, in pages: the allocator's pages plus
    /// the metadata that grows with the data, less what the cold store
    /// holds for I/O and the bound charged ahead of a write in flight (a
    /// write's growth counts once it has happened). O(1).
    pub fn held_pages(&self, p: &Parts<'_>) -> u64 {
        p.admission.held_pages(p.objects.pages_used(), p.objects.budget().used(), self.uncounted_bytes())
    }

    /// Index shard `i` and its queue.
    fn of_index<'a>(&self, p: &Parts<'a>, i: usize) -> Source<'a> {
        Source::Index(&p.index.shards()[i], self.queues.of_index(i))
    }

    /// The source of queue `q` (an index shard's, or a dedup shard's).
    fn source<'a>(&self, p: &Parts<'a>, q: usize) -> Option<Source<'a>> {
        match self.queues.shared_of(q) {
            None => Some(self.of_index(p, q)),
            Some(j) => Some(Source::Shared(&p.dedup?.shards()[j], q)),
        }
    }

    /// Every source, the index shards' first (the shrinker's numbering).
    fn sources<'a>(&self, p: &Parts<'a>) -> Vec<Source<'a>> {
        let shared = p.dedup.into_iter().flat_map(|d| d.shards().iter().enumerate());
        (0..p.index.shards().len()).map(|i| self.of_index(p, i)).chain(shared.map(|(j, ds)| Source::Shared(ds, self.queues.of_shared(j)))).collect()
    }

    /// Make a place in queue `q` (before the change that needs it: a
    /// refusal, the pool's budget, changes nothing).
    fn reserve_in(&self, q: usize, b: &Budget) -> std::result::Result<Place, AllocError> {
        self.queues.lock(q).reserve_one(b)?;
        Ok(Place(Some(q)))
    }

    /// A place in index shard `shard`'s queue for `e`, about to be
    /// published there, if it holds an object in RAM.
    pub fn reserve(&self, shard: usize, e: Entry, b: &Budget) -> std::result::Result<Place, AllocError> {
        if !self.on || !matches!(e.slot(), Slot::Obj(..)) {
            return Ok(Place::NONE);
        }
        self.reserve_in(self.queues.of_index(shard), b)
    }

    /// A place in dedup shard `shard`'s queue for a new shared object.
    pub fn reserve_shared(&self, shard: usize, b: &Budget) -> std::result::Result<Place, AllocError> {
        if !self.on {
            return Ok(Place::NONE);
        }
        self.reserve_in(self.queues.of_shared(shard), b)
    }

    /// The publish that `place` was made for was refused: give it back.
    pub fn cancel(&self, place: Place) {
        if let Place(Some(q)) = place {
            self.queues.lock(q).unreserve();
        }
    }

    /// Queue `key` (a page's key, or a shared object's hash), just
    /// published at generation `gen` with `live` objects in RAM in its
    /// shard, at the hot end, in the place made for it. Called with no
    /// lock held: an item is a hint, checked against its shard when it
    /// reaches the cold end, so one queued a moment after its publish is
    /// as good (and one whose object changed meanwhile is merely stale).
    pub fn queue(&self, h: &impl TierHost, place: Place, key: u64, gen: u8, live: usize) {
        let Place(Some(q)) = place else { return };
        let mut lru = self.queues.lock(q);
        lru.push_reserved(LruItem { key, seq: self.next_seq(), gen }, false);
        self.trim_if_due(h, q, lru, live);
    }

    /// Queue `key`'s object (entry `e`, just loaded for the first time
    /// since it was stored; index shard `shard`, `live` objects in RAM
    /// there) at the cold end, to be written back before any object not
    /// yet loaded, when loads are exclusive
    /// ([`PoolConfig::exclusive_loads`](crate::PoolConfig::exclusive_loads)).
    /// Its item in store order stays and is skipped once the object has
    /// gone. Without room for the item (the pool's budget), nothing
    /// changes. Called with no lock held.
    pub fn queue_cold(&self, h: &impl TierHost, shard: usize, key: u64, e: Entry, live: usize) {
        if !self.on || !self.exclusive() {
            return;
        }
        let q = self.queues.of_index(shard);
        let mut lru = self.queues.lock(q);
        if lru.reserve_one(h.parts().objects.budget()).is_err() {
            return; // it keeps its place in store order
        }
        // Older than anything queued in store order: ages are counted
        // modulo 2^32 from a point 2^30 ahead of now (writeback_lru_batch).
        let seq = self.seq.load(Relaxed).wrapping_sub(1 << 31);
        lru.push_reserved(LruItem { key, seq, gen: e.gen() }, true);
        self.cold_queued.fetch_add(1, Relaxed);
        self.trim_if_due(h, q, lru, live);
    }

    /// After a push to queue `q` (locked: `lru`): sweep its stale items if
    /// they outnumber what `live` objects can account for, taking the
    /// shard's lock first (the engine's order), so the sweep sees what
    /// each item names.
    fn trim_if_due(&self, h: &impl TierHost, q: usize, lru: parking_lot::MutexGuard<'_, Lru>, live: usize) {
        if !lru.due(live) {
            return;
        }
        drop(lru);
        let p = h.parts();
        if let Some(src) = self.source(&p, q) {
            src.with(&self.queues, |s, lru| trim(lru, s, p.objects.budget()));
        }
    }

    /// Whether loads are exclusive now.
    pub fn exclusive(&self) -> bool {
        self.exclusive.load(Relaxed)
    }

    /// Whether a loaded written-back page may come back to RAM now: not
    /// with exclusive loads, nor with promotion off.
    fn promotes(&self) -> bool {
        self.promote && !self.exclusive()
    }

    pub fn set_exclusive(&self, on: bool) {
        self.exclusive.store(on, Relaxed);
    }

    pub fn fill_stats(&self, st: &mut Stats) {
        if !self.on {
            return;
        }
        let b = self.store.stats();
        st.bd_reads = b.records_read;
        st.bd_writes = self.pages_written.load(Relaxed);
        st.backing_bytes_written = b.bytes_written;
        st.backing_bytes_read = b.bytes_read;
        st.backing_compaction_bytes_read = b.compaction_bytes_read;
        st.backing_record_bytes_read = b.record_bytes_read;
        st.backing_read_ops = b.read_ops;
        st.backing_prefetch_ops = b.prefetch_ops;
        st.backing_scattered_reads = b.scattered_reads;
        st.backing_readahead_bytes = b.readahead_bytes;
        st.backing_readahead_used_bytes = b.readahead_used_bytes;
        st.backing_readahead_floor_bytes = b.readahead_floor_bytes;
        [st.backing_readahead_hits_1k, st.backing_readahead_hits_4k, st.backing_readahead_hits_8k, st.backing_readahead_hits_far] = b.readahead_hits;
        [st.backing_readahead_slot_hits_same, st.backing_readahead_slot_hits_next, st.backing_readahead_slot_hits_1k, st.backing_readahead_slot_hits_far] =
            b.readahead_slot_hits;
        st.backing_file_bytes = b.file_bytes;
        st.backing_live_bytes = b.live_bytes;
        st.backing_metadata_bytes = b.metadata_bytes;
        st.backing_buffer_bytes = self.store.buffer_bytes();
        st.backing_failed_writes = b.failed_writes;
        st.backing_failed_reads = b.failed_reads;
        st.backing_missing_reads = b.missing_reads;
        st.backing_replica_reads = b.replica_reads;
        st.backing_masters_short = b.masters_short;
        st.backing_frees_pending = b.frees_pending;
        st.backing_frees_failed = b.frees_failed;
        st.backing_read_p50_ns = b.read_p50_ns;
        st.backing_read_p99_ns = b.read_p99_ns;
        st.backing_read_busy_ns = self.read_busy.busy_ns();
        st.backing_in_flight = b.in_flight;
        st.written_back_pages = self.written_back.load(Relaxed);
        st.evicted_pages = self.evicted.load(Relaxed);
        st.promoted_pages = self.promoted.load(Relaxed);
        st.cold_queued_pages = self.cold_queued.load(Relaxed);
        st.exclusive_loads = self.exclusive();
        st.writeback_fail = self.writeback_fail.load(Relaxed);
        st.lru_bytes += self.queues.bytes() + self.fixed_bytes();
        self.fill_first_stats(st);
    }
}

impl Tier {
    /// One batch: the globally coldest objects across every LRU (index
    /// shards and dedup shards), merged by sequence number, up to [`BATCH`]
    /// objects or `max_bytes` of compressed data. Queue heads are
    /// read once into a heap; the coldest queue gives items until its next
    /// one is younger than the next queue's head. The objects are copied
    /// into `buf` (emptied first). Returns (pages written back, LRU items
    /// examined).
    fn writeback_lru_batch(&self, h: &impl TierHost, max_bytes: usize, buf: &mut Vec<u8>) -> Result<(u64, usize)> {
        // Ages count from a point ahead of now, so items re-queued during
        // this batch (newer sequence numbers) are the youngest, not wrapped.
        let now = self.seq.load(Relaxed).wrapping_add(1 << 30);
        let age = |it: &LruItem| now.wrapping_sub(it.seq);
        let p = h.parts();
        let sources = self.sources(&p);
        let mut heads = std::collections::BinaryHeap::new();
        for (i, src) in sources.iter().enumerate() {
            // (A look at the head needs no shard lock: it only orders.)
            if let Some(a) = self.queues.lock(src.queue()).front().map(age) {
                heads.push((a, i));
            }
        }
        buf.clear();
        let mut victims = Vec::with_capacity(BATCH);
        let mut examined = self.pick_first(&p, &mut victims, buf, max_bytes);
        while victims.len() < BATCH && buf.len() < max_bytes && examined < 16 * BATCH {
            let Some((_, i)) = heads.pop() else { break };
            let bound = heads.peek().map(|&(a, _)| a);
            let mut pick = Pick { t: self, now, bound, src: i, victims: &mut victims, buf, max_bytes, examined: 0 };
            let front = sources[i].with(&self.queues, |s, lru| {
                pick_cold(p.objects, s, lru, &mut pick);
                lru.front().map(age)
            });
            examined += pick.examined;
            if let Some(a) = front {
                heads.push((a, i));
            }
        }
        if victims.is_empty() {
            return Ok((0, examined));
        }
        Ok((self.commit(h, &sources, victims, buf)?, examined))
    }

    /// zram's `writeback`: write back the pages `mode` names, at most
    /// `limit_pages` of them. Excludes the shrinker while it runs. One pass
    /// over each shard picks the candidates, so the cost is O(entries)
    /// whatever the number of batches.
    pub(crate) fn writeback(&self, h: &impl TierHost, mode: WritebackMode, limit_pages: Option<u64>) -> Result<u64> {
        if !self.on {
            return Err(ZmemError::NoBackingStore);
        }
        let _writing = self.writing.lock();
        let now = h.now();
        let p = h.parts();
        let mut budget = limit_pages.unwrap_or(u64::MAX);
        let mut total = 0;
        for src in self.sources(&p) {
            let cap = usize::try_from(budget).unwrap_or(usize::MAX);
            let picked = src.with(&self.queues, |s, _| s.picked(&|info, ac| mode.picks(info, ac, now), cap));
            for chunk in picked.chunks(BATCH) {
                if budget == 0 {
                    break;
                }
                let chunk = &chunk[..chunk.len().min(usize::try_from(budget).unwrap_or(usize::MAX))];
                let (mut victims, mut buf) = (Vec::new(), Vec::new());
                // Re-checked under the shard's lock: what is still there goes.
                src.with(&self.queues, |s, _| {
                    for obj in chunk.iter().filter_map(|f| s.again(f)) {
                        if let Some(off) = p.objects.copy_out(obj.handle, obj.info, &mut buf) {
                            victims.push(Victim { src: 0, obj, item: None, off });
                        }
                    }
                });
                if !victims.is_empty() {
                    let n = self.commit(h, &[src], victims, &buf)?;
                    total += n;
                    budget = budget.saturating_sub(n);
                }
            }
        }
        p.objects.compact_spans();
        Ok(total)
    }
}

/// Pop cold objects from a shard's LRU into the batch, copying their
/// bytes; referenced ones get a second chance at the hot end.
fn pick_cold(objects: &Objects, s: &mut dyn Holder, lru: &mut Lru, p: &mut Pick<'_>) {
    while let Some(item) = p.next(lru) {
        lru.pop_front();
        let obj = match s.candidate(&item, p.t.exclusive()) {
            Candidate::Go(obj) => obj,
            Candidate::Again => {
                lru.push_back(LruItem { seq: p.t.next_seq(), ..item }, objects.budget());
                continue;
            }
            Candidate::Stale => continue,
        };
        let Some(off) = objects.copy_out(obj.handle, obj.info, p.buf) else { continue };
        lru.take_out();
        p.victims.push(Victim { src: p.src, obj, item: Some(item), off });
    }
}

/// Sweep a shard's queue of stale items once they outnumber what its
/// objects in RAM can account for ([`Lru::trim`]).
fn trim(lru: &mut Lru, s: &dyn Holder, b: &Budget) {
    lru.trim(s.live(), |it| s.is_live(it), b);
}
