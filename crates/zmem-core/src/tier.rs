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

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::{Condvar, Mutex};
use zmem_alloc::{Budget, Handle};

use crate::admission::Admission;
use crate::cold::ColdStore;
use crate::latency::BusyClock;

mod first;
mod lru;
mod shrinker;
mod transfer;

use first::FirstOut;
pub use first::Resident;
pub(crate) use shrinker::shrinker_main;
use shrinker::Ctl;
use transfer::BackingCharge;

use crate::dedup::DedupTable;
use crate::dedup::{DedupLock, DedupShard};
use crate::entry::{Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::Result;
use crate::objects::Objects;
use crate::shard::Index;
use crate::shard::{Shard, ShardLock};
use crate::stats::Counters;
use crate::stats::Stats;
use lru::{Lru, LruItem, Queues};

/// Pages written back per batch (one write to the file).
const BATCH: usize = 64;

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
    store: Box<dyn ColdStore>,
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
