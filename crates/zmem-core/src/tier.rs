//! The writeback tier: an LRU with second chance over the pool's objects,
//! a background shrinker, and a [`ColdStore`] that takes what they evict:
//! compressed writeback to a backing file (zmem-backing), or nothing at
//! all for a clean-page cache (`DropCold`: the entry goes, the next load
//! misses). This file decides which objects leave RAM; `cold.rs` what
//! leaving means.
//!
//! # Design
//! zswap keeps every entry on an LRU; when its pool is full a worker
//! (`shrink_worker`) walks the LRU from the cold end, rotating entries a
//! load has marked referenced (one more round in RAM) and writing the rest
//! back to swap. zram instead writes back on request (`writeback` of idle,
//! huge or incompressible pages, under a `writeback_limit` budget). zmem
//! does both, with two differences:
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
//! metadata that grows with the data (`TierHost::held_pages`; zswap counts
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
//! re-queues the item at the hot end instead of writing it back. A queue
//! changes only under the lock of the shard it belongs to, which the store
//! or load already holds; the shard is asked one thing of an item: whether
//! it still names the object it was queued for
//! ([`Shard::queued_object`], [`DedupShard::cold_candidate`]). The policy
//! (what to write back, in which order, who gets a second chance) is all
//! in this file.
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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use zmem_alloc::{Budget, Handle};

use crate::admission::Admission;
use crate::cold::{ColdError, ColdStore, RecordId};
use crate::latency::BusyClock;

mod lru;

use crate::dedup::DedupTable;
use crate::dedup::{DedupLock, DedupShard, ToCold};
use crate::entry::{Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;
use crate::shard::Index;
use crate::shard::{Shard, ShardLock};
use crate::stats::Counters;
use crate::stats::Stats;
use lru::{Lru, LruItem, Queues};

/// Pages written back per batch (one write to the file).
const BATCH: usize = 64;
/// How long a store over `max_pool` waits for the shrinker to make room.
const ADMIT_WAIT: Duration = Duration::from_secs(10);
/// Pause after a shrinker round that failed, before the next.
const BACKOFF: Duration = Duration::from_millis(100);

thread_local! {
    /// Per-thread buffer for an object read from the cold store.
    pub(crate) static OBJ: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(PAGE_SIZE));
}

/// What the tier needs of the pool it serves, and nothing more: the
/// components it moves objects between (the index, the dedup table, the
/// object store), the counters, the limit it works to, and the two pool
/// operations a page brought back to RAM goes through. The tier sees no
/// engine: this is its whole view of one.
pub(crate) trait TierHost {
    fn index(&self) -> &Index;
    fn dedup(&self) -> Option<&DedupTable>;
    fn objects(&self) -> &Objects;
    fn counters(&self) -> &Counters;
    /// What `max_pool` bounds now, in pages.
    fn held_pages(&self) -> u64;
    /// `max_pool` and its marks.
    fn admission(&self) -> &Admission;
    /// Seconds since the pool was created (access times).
    fn now(&self) -> u32;
    /// Put `new` under `key` in its locked shard, as a store does; returns
    /// the entry replaced (to be released with no lock held).
    fn publish_locked(&self, s: &mut Shard, key: u64, new: Entry) -> Result<Option<Entry>>;
    /// Drop one reference to what `e` names.
    fn release(&self, e: Entry);
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

/// The shrinker's state, under [`Tier::ctl`].
#[derive(Default)]
struct Ctl {
    stop: bool,
    running: bool,
    /// Rounds completed.
    rounds: u64,
    /// The last round ended with the pool still at `max_pool`: the disk
    /// failed, or nothing was left to write back.
    last_failed: bool,
    /// A store is waiting for room: cut a backoff short.
    urgent: bool,
    /// Since when rounds have failed on the cold store's errors (None:
    /// the last round did not fail that way).
    failing_since: Option<Instant>,
}

/// What a load of a written-back page does
/// ([`PoolConfig::exclusive_loads`](crate::PoolConfig::exclusive_loads), at
/// start; [`PoolConfig::promote_loads`](crate::PoolConfig::promote_loads)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loads {
    pub exclusive: bool,
    pub promote: bool,
}

pub(crate) struct Tier {
    /// What leaving RAM means: a file, nothing (a clean cache), ... (`cold.rs`).
    pub store: Box<dyn ColdStore>,
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

/// The pages a user of the pool named as most likely unneeded (a swap
/// device's pages that no page table points to): the shrinker writes
/// them back before anything on the LRUs. A hint orders writeback and
/// never drops a page: one that changed since it was named (stored again,
/// loaded, freed) is passed over.
#[derive(Default)]
struct FirstOut {
    /// Keys with the entries they held when named; taken from the end.
    keys: Vec<(u64, Entry)>,
    /// What the budget holds for `keys` (its capacity).
    charged: u64,
    /// The last hint: pages named, of the objects in RAM then.
    named: u64,
    of: u64,
    /// Pages the shrinker took from hints.
    taken: u64,
}

/// The keys whose pages are objects in RAM (not shared, not same-filled,
/// not written back) at one moment, with what each held: a caller keeps
/// those it finds unneeded and hands them to
/// [`Pool::write_back_first`](crate::Pool::write_back_first).
pub struct Resident {
    items: Vec<(u64, Entry)>,
    of: u64,
}

impl Resident {
    pub(crate) fn new(items: Vec<(u64, Entry)>) -> Resident {
        let of = items.len() as u64;
        Resident { items, of }
    }

    /// How many pages it names.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Keep the keys `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.items.retain(|&(k, _)| keep(k));
    }
}

/// The budget's charge for the backing store's tables: what they held at
/// the last settlement, and a bound charged ahead of a write in flight.
#[derive(Default)]
struct BackingCharge {
    charged: u64,
    reserved: u64,
}

/// Where a batch of victims comes from: a shard, and its queue.
#[derive(Clone, Copy)]
enum Source<'a> {
    Index(&'a ShardLock, usize),
    Shared(&'a DedupLock, usize),
}

/// An object picked for writeback, and where its bytes sit in the batch.
struct Victim {
    /// Index of its queue in the batch's sources.
    src: usize,
    /// The page's key, or a shared object's hash.
    key: u64,
    /// The index entry (keys only).
    entry: Entry,
    handle: Handle,
    info: ObjInfo,
    /// The generation it was picked at (shared objects only).
    gen: u8,
    /// Its referenced bit when picked (shared objects only): set later
    /// means a load or a new sharer came while the write ran.
    referenced: bool,
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
    /// A tier over `store`, with a queue for each of `index_shards` index
    /// shards and `dedup_shards` dedup shards (whose fixed cost,
    /// [`Tier::fixed_bytes`], the caller charges).
    pub fn new(store: Box<dyn ColdStore>, loads: Loads, index_shards: usize, dedup_shards: usize) -> Tier {
        Tier {
            queues: Queues::new(index_shards, dedup_shards),
            store,
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

    /// Replace the pages to write back first with `r`'s (see [`FirstOut`]).
    /// Its table is charged to the budget; without room the hint is
    /// dropped. Returns the pages it names.
    pub(crate) fn write_first(&self, b: &Budget, mut r: Resident) -> usize {
        let mut f = self.first.lock();
        (f.named, f.of) = (r.items.len() as u64, r.of);
        b.uncharge(std::mem::take(&mut f.charged));
        f.keys = Vec::new();
        r.items.shrink_to_fit();
        let bytes = (r.items.capacity() * std::mem::size_of::<(u64, Entry)>()) as u64;
        if b.try_charge(bytes).is_err() {
            return 0;
        }
        f.charged = bytes;
        // Taken from the end: the lowest keys first.
        r.items.sort_unstable_by_key(|&(k, _)| std::cmp::Reverse(k));
        f.keys = r.items;
        f.keys.len()
    }

    /// Drop from `items` the pages named to go first (with the entry they
    /// were named with) and not yet taken; returns how many it dropped.
    /// Takes the list's lock: not to be called under a shard's.
    pub(crate) fn retain_not_named_first(&self, items: &mut Vec<(u64, Entry)>) -> usize {
        let f = self.first.lock();
        if f.keys.is_empty() {
            return 0;
        }
        let before = items.len();
        // `keys` is sorted by key, highest first.
        items.retain(|&(k, e)| f.keys.binary_search_by(|&(fk, _)| k.cmp(&fk)).map_or(true, |i| f.keys[i].1 != e));
        before - items.len()
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Bytes of the queue array, held from creation to drop.
    pub fn fixed_bytes(&self) -> u64 {
        self.queues.fixed_bytes()
    }

    /// `e`, about to be published under a key of index shard `shard`
    /// (locked: `s`), stamped with the shard's next generation; if it holds
    /// an object in RAM, its place in the shard's queue is made first. A
    /// refusal (the pool's budget) changes nothing.
    pub fn prepare(&self, s: &mut Shard, shard: usize, e: Entry, b: &Budget) -> std::result::Result<Entry, zmem_alloc::AllocError> {
        if matches!(e.slot(), Slot::Obj(..)) {
            self.queues.lock(self.queues.of_index(shard)).reserve_one(b)?;
        }
        Ok(s.stamp(e))
    }

    /// `key`'s entry `e` (prepared, and now published in index shard
    /// `shard`, locked: `s`): if it holds an object in RAM, queue it at the
    /// hot end, in the room made for it.
    pub fn queue(&self, s: &Shard, shard: usize, key: u64, e: Entry, b: &Budget) {
        let mut q = self.queues.lock(self.queues.of_index(shard));
        if matches!(e.slot(), Slot::Obj(..)) {
            q.push_back(LruItem { key, seq: self.next_seq(), gen: e.gen() }, b);
        }
        trim_keys(&mut q, s, b);
    }

    /// Queue `key`'s object (entry `e`, just loaded; index shard `shard`,
    /// locked: `s`) at the cold end, to be written back before any object
    /// not yet loaded
    /// ([`PoolConfig::exclusive_loads`](crate::PoolConfig::exclusive_loads)).
    /// Its item in store order stays and is skipped once the object has
    /// gone. Without room for the item (the pool's budget), nothing changes.
    pub fn queue_cold(&self, s: &Shard, shard: usize, key: u64, e: Entry, b: &Budget) {
        let mut q = self.queues.lock(self.queues.of_index(shard));
        if q.reserve_one(b).is_err() {
            return; // it keeps its place in store order
        }
        // Older than anything queued in store order: ages are counted
        // modulo 2^32 from a point 2^30 ahead of now (writeback_lru_batch).
        let seq = self.seq.load(Relaxed).wrapping_sub(1 << 31);
        q.push_front(LruItem { key, seq, gen: e.gen() }, b);
        self.cold_queued.fetch_add(1, Relaxed);
        trim_keys(&mut q, s, b);
    }

    /// Make a place in dedup shard `shard`'s queue for a new shared object
    /// (before it is made: a refusal changes nothing).
    pub fn prepare_shared(&self, shard: usize, b: &Budget) -> std::result::Result<(), zmem_alloc::AllocError> {
        self.queues.lock(self.queues.of_shared(shard)).reserve_one(b)
    }

    /// Queue the shared object of `hash` (new at generation `gen`, or back
    /// in RAM; dedup shard `shard`, locked: `ds`) at the hot end, in the
    /// room made for it.
    pub fn queue_shared(&self, ds: &DedupShard, shard: usize, hash: u64, gen: u8, b: &Budget) {
        let mut q = self.queues.lock(self.queues.of_shared(shard));
        q.push_back(LruItem { key: hash, seq: self.next_seq(), gen }, b);
        trim_shared(&mut q, ds, b);
    }

    /// Charge `bound` ahead of a write that may grow the backing store's
    /// tables by that much (one write at a time: under `writing`).
    fn reserve_backing(&self, b: &Budget, bound: u64) -> std::result::Result<(), zmem_alloc::AllocError> {
        let mut c = self.backing_charged.lock();
        b.try_charge(bound)?;
        c.reserved += bound;
        self.reserved_now.store(c.reserved, Relaxed);
        Ok(())
    }

    /// The bound charged ahead of the backing write in flight (0: none).
    pub(crate) fn reserved_now(&self) -> u64 {
        self.reserved_now.load(Relaxed)
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

    /// Ask the shrinker for a round (cheap when it is already asked).
    pub fn kick(&self) {
        if !self.wanted.swap(true, Release) {
            let _c = self.ctl.lock();
            self.wake.notify_one();
        }
    }

    pub fn stop(&self) {
        self.ctl.lock().stop = true;
        self.wake.notify_all();
        self.progress.notify_all();
    }

    fn stopping(&self) -> bool {
        self.ctl.lock().stop
    }

    fn note_progress(&self) {
        let _c = self.ctl.lock();
        self.progress.notify_all();
    }

    /// Wait until the shrinker is idle and not asked for another round.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self.ctl.lock();
        while c.running || self.wanted.load(Acquire) {
            if c.stop || self.progress.wait_until(&mut c, deadline).timed_out() {
                return !(c.running || self.wanted.load(Acquire));
            }
        }
        true
    }

    pub fn fill_stats(&self, st: &mut Stats) {
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
        let f = self.first.lock();
        st.lru_bytes += f.charged + self.queues.bytes() + self.fixed_bytes();
        st.first_out_named = f.named;
        st.first_out_of = f.of;
        st.first_out_taken = f.taken;
    }
}

/// The shrinker thread: sleep until asked, run a round, report, repeat.
pub(crate) fn shrinker_main(e: &impl TierHost, t: &Tier) {
    loop {
        {
            let mut c = t.ctl.lock();
            while !c.stop && !t.wanted.load(Acquire) {
                t.wake.wait(&mut c);
            }
            if c.stop {
                return;
            }
            c.running = true;
        }
        t.wanted.store(false, Release);
        let r = t.shrink_round(e);
        let failed = match &r {
            Ok((_, exhausted)) => *exhausted && e.held_pages() >= e.admission().max_pages(),
            Err(err) => {
                e.counters().reject_reclaim_fail.fetch_add(1, Relaxed);
                e.counters().warn.warn(|| format!("writeback failed; the pool stays near its limit: {err}"));
                true
            }
        };
        let mut c = t.ctl.lock();
        c.running = false;
        c.rounds += 1;
        c.last_failed = failed;
        c.failing_since = if r.is_err() { c.failing_since.or(Some(Instant::now())) } else { None };
        t.progress.notify_all();
        if failed {
            // Do not hammer a failing disk on behalf of the high mark: pause,
            // unless a store is waiting for room (it gets one more try) or
            // the pool is dropped.
            let until = Instant::now() + BACKOFF;
            while !c.stop && !c.urgent && !t.wake.wait_until(&mut c, until).timed_out() {}
        }
        c.urgent = false;
    }
}

impl Tier {
    /// After a store: wake the shrinker if the pool is at its high mark.
    pub(crate) fn kick_if_high(&self, h: &impl TierHost) {
        if h.held_pages() >= h.admission().high_pages() {
            self.kick();
        }
    }

    /// A store that needs new memory found the pool at `max` pages: wait
    /// for the shrinker to make room. Called with no lock held. Refuses
    /// when a round that ended while we waited could not get under the
    /// limit (the disk failed, or nothing is left to write back), or after
    /// [`ADMIT_WAIT`]. A cold store whose failures heal by themselves
    /// ([`ColdStore::ride_through`]: a cluster failing over) is waited for
    /// instead, until it has failed that long. A waiting store cuts the
    /// shrinker's backoff short, so a disk that failed once is tried again
    /// for it.
    pub(crate) fn wait_for_room(&self, h: &impl TierHost, max: u64) -> Result<()> {
        let ride = self.store.ride_through();
        let deadline = Instant::now() + ADMIT_WAIT.max(ride);
        let mut c = self.ctl.lock();
        let start = c.rounds;
        loop {
            if h.held_pages() < max {
                return Ok(());
            }
            let healing = c.failing_since.is_some_and(|t| t.elapsed() < ride);
            let gave_up = c.last_failed && !c.running && c.rounds > start && !healing;
            if c.stop || gave_up || Instant::now() >= deadline {
                break;
            }
            c.urgent = true;
            self.wanted.store(true, Release);
            self.wake.notify_all();
            let until = (Instant::now() + Duration::from_millis(20)).min(deadline);
            self.progress.wait_until(&mut c, until);
        }
        drop(c);
        Err(h.counters().reject_full(max))
    }

    /// One shrinker round: write back from the cold end of the LRUs until
    /// the pool is under its target. Returns (pages written back, whether
    /// the LRUs ran out of candidates).
    fn shrink_round(&self, h: &impl TierHost) -> Result<(u64, bool)> {
        let mut buf = self.writing.lock();
        let target = h.admission().shrink_target();
        let mut total = 0;
        let mut exhausted = false;
        while h.held_pages() > target && !self.stopping() {
            // Write back only what compaction cannot free. Under a store
            // storm, new objects fill the holes writeback leaves, so spans
            // rarely empty by themselves: without this, a round would write
            // back far past its target before the pages came free.
            // (A class with less than a span's worth of holes is left alone,
            // so this is cheap when there is nothing to gain.)
            if h.objects().compact_spans() > 0 {
                self.note_progress();
                continue;
            }
            // (At least a page: stores may have freed room since the check.)
            let need = h.held_pages().saturating_sub(target).max(1);
            // A batch writes no more than the pages it must free: a small
            // pool may hold fewer objects than a full batch.
            let r = self.writeback_lru_batch(h, need.saturating_mul(PAGE_SIZE as u64) as usize, &mut buf);
            self.note_progress();
            let (written, examined) = r?;
            total += written;
            if examined == 0 {
                exhausted = true;
                break;
            }
        }
        if h.held_pages() > target {
            h.objects().compact_spans();
        }
        Ok((total, exhausted))
    }

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
        // (Source i is queue i: the index shards', then the dedup shards'.)
        let qs = &self.queues;
        let sources: Vec<Source<'_>> = h
            .index()
            .shards()
            .iter()
            .enumerate()
            .map(|(i, sh)| Source::Index(sh, qs.of_index(i)))
            .chain(h.dedup().into_iter().flat_map(|d| d.shards().iter().enumerate()).map(|(j, ds)| Source::Shared(ds, qs.of_shared(j))))
            .collect();
        let mut heads = std::collections::BinaryHeap::new();
        for (i, src) in sources.iter().enumerate() {
            // (A look at the head needs no shard lock: it only orders.)
            let (Source::Index(_, q) | Source::Shared(_, q)) = *src;
            if let Some(a) = qs.lock(q).front().map(age) {
                heads.push((a, i));
            }
        }
        buf.clear();
        let mut victims = Vec::with_capacity(BATCH);
        let mut examined = self.pick_first(h, &mut victims, buf, max_bytes);
        while victims.len() < BATCH && buf.len() < max_bytes && examined < 16 * BATCH {
            let Some((_, i)) = heads.pop() else { break };
            let bound = heads.peek().map(|&(a, _)| a);
            let mut pick = Pick { t: self, now, bound, src: i, victims: &mut victims, buf, max_bytes, examined: 0 };
            let front = match sources[i] {
                Source::Index(sh, q) => {
                    let mut s = sh.lock();
                    let mut lru = qs.lock(q);
                    Self::pick_cold_keys(h, &mut s, &mut lru, &mut pick);
                    lru.front().map(age)
                }
                Source::Shared(ds, q) => {
                    let mut g = ds.lock();
                    let mut lru = qs.lock(q);
                    Self::pick_cold_shared(h, &mut g, &mut lru, &mut pick);
                    lru.front().map(age)
                }
            };
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

    /// Take the pages named to go first ([`FirstOut`]) into the batch,
    /// those still holding what they held when named and not loaded since.
    /// Their LRU items stay queued and are skipped once they have gone.
    /// Returns the names it looked at.
    fn pick_first(&self, h: &impl TierHost, victims: &mut Vec<Victim>, buf: &mut Vec<u8>, max_bytes: usize) -> usize {
        let mut f = self.first.lock();
        let mut looked = 0;
        let mut taken = 0;
        while victims.len() < BATCH && buf.len() < max_bytes {
            let Some((key, was)) = f.keys.pop() else { break };
            looked += 1;
            let src = h.index().shard_index(key);
            let s = h.index().shards()[src].lock();
            let Some(e) = s.get(key).filter(|&e| e == was) else { continue };
            let Slot::Obj(handle, info) = e.slot() else { continue };
            if victims.iter().any(|v| v.src == src && v.key == key) {
                continue;
            }
            let Some(off) = h.objects().copy_out(handle, info, buf) else { continue };
            victims.push(Victim { src, key, entry: e, handle, info, gen: 0, referenced: false, item: None, off });
            taken += 1;
        }
        f.taken += taken;
        looked
    }

    /// Pop cold objects from a shard's LRU into the batch, copying their
    /// bytes; referenced ones get a second chance at the hot end.
    fn pick_cold_keys(h: &impl TierHost, s: &mut Shard, lru: &mut Lru, p: &mut Pick<'_>) {
        while let Some(item) = p.next(lru) {
            lru.pop_front();
            let Some(e) = s.queued_object(item.key, item.gen) else { continue };
            let Slot::Obj(handle, info) = e.slot() else { continue };
            if e.referenced() && !p.t.exclusive() {
                s.set_flags(item.key, e.with_referenced(false));
                lru.push_back(LruItem { seq: p.t.next_seq(), ..item }, h.objects().budget());
                continue;
            }
            let Some(off) = h.objects().copy_out(handle, info, p.buf) else { continue };
            lru.take_out();
            let v = Victim { src: p.src, key: item.key, entry: e, handle, info, gen: 0, referenced: false, item: Some(item), off };
            p.victims.push(v);
        }
    }

    /// [`pick_cold_keys`](Self::pick_cold_keys) for a dedup shard's shared objects.
    fn pick_cold_shared(h: &impl TierHost, ds: &mut DedupShard, lru: &mut Lru, p: &mut Pick<'_>) {
        while let Some(item) = p.next(lru) {
            lru.pop_front();
            let (handle, info, gen) = match ds.cold_candidate(item.key, item.gen) {
                Ok(c) => c,
                Err(true) => {
                    lru.push_back(LruItem { seq: p.t.next_seq(), ..item }, h.objects().budget());
                    continue;
                }
                Err(false) => continue,
            };
            let Some(off) = h.objects().copy_out(handle, info, p.buf) else { continue };
            lru.take_out();
            let v = Victim { src: p.src, key: item.key, entry: Entry::EMPTY, handle, info, gen, referenced: false, item: Some(item), off };
            p.victims.push(v);
        }
    }

    /// Write the victims' bytes to the backing store in one batch, then swap
    /// each that is still unchanged for its record and free its object. On
    /// a write error nothing changes: every victim stays in RAM and on its
    /// LRU (where a load during the write put it: the hot end).
    ///
    /// A store that keeps what it is given gets each page's object as an
    /// extent of one (`extent.rs`); shared objects, and everything given
    /// to a store that drops it, go as they are.
    fn commit(&self, h: &impl TierHost, sources: &[Source<'_>], victims: Vec<Victim>, buf: &[u8]) -> Result<u64> {
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

    /// zram's `writeback`: write back the pages `mode` names, at most
    /// `limit_pages` of them. Excludes the shrinker while it runs. One pass
    /// over each shard picks the candidates, so the cost is O(entries)
    /// whatever the number of batches.
    pub(crate) fn writeback(&self, h: &impl TierHost, mode: WritebackMode, limit_pages: Option<u64>) -> Result<u64> {
        let _writing = self.writing.lock();
        let now = h.now();
        let mut budget = limit_pages.unwrap_or(u64::MAX);
        let cap = |budget: u64| usize::try_from(budget).unwrap_or(usize::MAX);
        let mut total = 0;
        for (i, shard) in h.index().shards().iter().enumerate() {
            let picked: Vec<(u64, Entry)> = {
                let s = shard.lock();
                let obj = |e: Entry, ac| matches!(e.slot(), Slot::Obj(_, info) if mode.picks(info, ac, now));
                s.iter_in_ram().filter(|&(_, e, ac)| obj(e, ac)).map(|(k, e, _)| (k, e)).take(cap(budget)).collect()
            };
            total += self.writeback_in_batches(h, Source::Index(shard, self.queues.of_index(i)), &picked, &mut budget, |chunk, victims, buf| {
                let s = shard.lock();
                for &(key, e) in chunk {
                    let Slot::Obj(handle, info) = e.slot() else { continue };
                    if s.get(key) == Some(e) {
                        if let Some(off) = h.objects().copy_out(handle, info, buf) {
                            victims.push(Victim { src: 0, key, entry: e, handle, info, gen: 0, referenced: false, item: None, off });
                        }
                    }
                }
            })?;
        }
        for (j, ds) in h.dedup().into_iter().flat_map(|d| d.shards().iter().enumerate()) {
            let picked = ds.lock().ram_picked(|info, ac| mode.picks(info, ac, now), cap(budget));
            total += self.writeback_in_batches(h, Source::Shared(ds, self.queues.of_shared(j)), &picked, &mut budget, |chunk, victims, buf| {
                let g = ds.lock();
                for &(hash, gen) in chunk {
                    let Some((handle, info, referenced)) = g.in_ram(hash, gen) else { continue };
                    if let Some(off) = h.objects().copy_out(handle, info, buf) {
                        victims.push(Victim { src: 0, key: hash, entry: Entry::EMPTY, handle, info, gen, referenced, item: None, off });
                    }
                }
            })?;
        }
        h.objects().compact_spans();
        Ok(total)
    }

    /// Write back one queue's `picked` candidates in batches, within
    /// `budget`: `gather` re-checks a chunk under the queue's lock and
    /// copies the objects still there.
    fn writeback_in_batches<C>(
        &self,
        h: &impl TierHost,
        src: Source<'_>,
        picked: &[C],
        budget: &mut u64,
        gather: impl Fn(&[C], &mut Vec<Victim>, &mut Vec<u8>),
    ) -> Result<u64> {
        let mut total = 0;
        for chunk in picked.chunks(BATCH) {
            if *budget == 0 {
                break;
            }
            let chunk = &chunk[..chunk.len().min(usize::try_from(*budget).unwrap_or(usize::MAX))];
            let (mut victims, mut buf) = (Vec::new(), Vec::new());
            gather(chunk, &mut victims, &mut buf);
            if !victims.is_empty() {
                let n = self.commit(h, &[src], victims, &buf)?;
                total += n;
                *budget = budget.saturating_sub(n);
            }
        }
        Ok(total)
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

/// Sweep a shard's queue of stale items once they outnumber what its
/// objects in RAM can account for ([`Lru::trim`]).
fn trim_keys(lru: &mut Lru, s: &Shard, b: &Budget) {
    lru.trim(s.ram_objects(), |it| s.queued_object(it.key, it.gen).is_some(), b);
}

/// [`trim_keys`] for a dedup shard's queue.
fn trim_shared(lru: &mut Lru, ds: &DedupShard, b: &Budget) {
    lru.trim(ds.records(), |it| ds.in_ram(it.key, it.gen).is_some(), b);
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
