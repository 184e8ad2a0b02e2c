//! The pool: the index, same-filled pages, dedup, compression, allocation.
//!
//! # The index and its entries
//! Keys (page numbers from every frontend) hash to one of N shards (64 by
//! default); whole 256-key cold blocks (sixteen 16-key blocks) go to one
//! shard, so a run of keys shares a lock and a block, and the written-back
//! keys of sixteen blocks one cold block. A shard (`shard.rs`) is a mutex over a block map
//! (`index.rs`) and the counters of the entries it holds. An entry is 12 bytes (`entry.rs`):
//! `Obj(handle, len, tag)` for an object in RAM (the tag names the
//! algorithm, or raw, or a dictionary slot and lz4/zstd: `dict.rs`), `Same(word)` for a page of
//! one repeated word (no memory), `Dedup(hash)` for a page whose object is
//! shared through the dedup table, `Backed(record)` for a page on the
//! backing file. The dedup table (64 shards, chosen by content hash) maps a
//! hash to a record (`dedup.rs`): where the shared object lives (RAM or a record),
//! its encoding and its reference count.
//!
//! # Store
//! same-filled? -> `Same`, no memory, never refused. Dedup on and an equal
//! page already stored? -> one more reference, no memory, never refused.
//! Otherwise compress (no lock held), then take new memory: only this step
//! passes admission (`max_pool`), so a pool at its limit still takes zero
//! pages, duplicates, in-place rewrites and discards. The old entry is
//! released after the shard lock is dropped.
//!
//! # Load
//! Under the key's shard lock (which also stamps the page's access time,
//! zram's `ac_time`, kept by every pool): fill a same-filled page, or decompress the
//! object straight from span memory (the lock is what keeps the object
//! alive: an overwrite or invalidate must take it first). A written-back page
//! is different: the record's id is noted, **every lock is dropped** for the
//! disk read, and the entry is checked again afterwards before the page is
//! brought back to RAM. A record freed in between (the key was overwritten)
//! makes the load start again.
//!
//! # Memory and `mem_limit`
//! One [`Budget`] is shared by the allocator and this engine, and every
//! growth is charged to it before it happens (`charged.rs`): the allocator
//! charges pages and its tables, a publish charges the key's index block
//! and map growth and its place in the tier's queue, the dedup table its
//! resizes, the tier the backing store's tables. A refused charge is `PoolFull` and changes
//! nothing visible; the new object is released. So `mem_used_total` never
//! passes `mem_limit`, and at rest the budget equals it exactly.
//!
//! # Lock order
//! index shard -> dedup shard -> allocator class -> backing store table.
//! Nothing waits for the disk or for the shrinker while holding a shard
//! lock: a store over the hard limit waits for room before it takes one.
//!
//! # Trade-offs
//! * Decompressing under the shard lock costs a little concurrency on one
//!   shard, and saves a reference count per object on the hot path.
//! * Dedup hashes every page (xxh3, ~20 GB/s) and confirms byte for byte.
//!   A record costs ~47 bytes; records are kept for every page only while
//!   the twins found pay for them, else for one page in 32 (`dedup.rs`).
//! * With a backing store, the in-place rewrite is off: tiered entries carry
//!   the tier's generation and queue place, which a rewrite would have to
//!   reset. Without one, the rewrite
//!   keeps the handle, so whoever compares an entry to see that a page is
//!   unchanged (recompression) must compare the object's bytes too.
//! * Access times cost 5 bytes a page in every pool (0.2 % of
//!   `mem_used_total` on the `/usr/lib` pages), so idle pages can be named
//!   for writeback and recompression whether or not there is a backing file.

mod config;
mod reopen;
mod setup;
mod shared;
mod stats;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use zmem_alloc::{Budget, Handle};

pub use config::{PoolConfig, Residency, DEFAULT_HUGE_THRESHOLD};
pub use reopen::Reopened;

use crate::admission::{Admission, Verdict};
use crate::cold::{ColdError, ColdStore};
use crate::dedup::{DedupTable, Loc};
use crate::dict::TrainReport;
use crate::entry::{fill_pattern, same_filled, Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;
use crate::recompress::{self, Recompress, RecompressReport};
use crate::shard::{Index, Shard};
use crate::stats::{Counters, Stats};
use crate::tier::{Parts, Place, Resident, Tier, WritebackMode};

/// A load whose record was freed or moved while it read starts again, at
/// most this many times.
const LOAD_TRIES: u32 = 8;

/// A thread-safe compressed page store with the frontswap/cleancache contract.
///
/// Locks: one mutex per index shard (chosen by key), one per dedup shard
/// (chosen by content hash), and the allocator's per-class locks. Order:
/// index shard -> dedup shard -> allocator class -> backing store. Compression
/// runs with no lock held; decompression of an object in RAM runs under the
/// key's shard lock; disk reads run with no lock held.
///
/// A pool with a backing store owns one background thread, the shrinker
/// (zswap's `shrink_worker`): stores that take the pool over its high mark
/// wake it, and it writes the coldest objects back until the pool is under
/// its accept threshold. Only a store that would take the pool over
/// `max_pool` waits for it. Dropping the pool stops and joins the thread.
pub struct Pool {
    e: Arc<Engine>,
    shrinker: Option<JoinHandle<()>>,
    /// `zmem-dict`: trains dictionaries and frees unused ones (`dict.rs`).
    trainer: Option<JoinHandle<()>>,
}

/// The pool's state, shared with its shrinker thread.
struct Engine {
    cfg: PoolConfig,
    /// The allocator and the codec (`objects.rs`).
    objects: Objects,
    /// Every key's entry, in shards (`shard.rs`).
    index: Index,
    /// Shared objects, by content hash (`dedup.rs`), if dedup is on.
    dedup: Option<DedupTable>,
    counters: Counters,
    /// zswap's `max_pool`, its marks and its pool-full flag (`admission.rs`).
    admission: Admission,
    /// The writeback tier: with no cold store, one that does nothing.
    tier: Tier,
    /// Time zero for access times.
    epoch: Instant,
}

/// A publish made under a shard's lock, and what is left to do once the
/// lock is dropped ([`Engine::finish`]): release the entry it replaced,
/// and queue the new object in the tier's LRU, in the place made for it.
#[must_use]
struct Published {
    old: Option<Entry>,
    place: Place,
    key: u64,
    gen: u8,
    /// The shard's objects in RAM after the publish (the queue's bound).
    live: usize,
}

impl Published {
    /// Nothing replaced, nothing to queue (an object rewritten in place).
    const NOTHING: Published = Published { old: None, place: Place::NONE, key: 0, gen: 0, live: 0 };
}

impl Pool {
    /// A pool in RAM only (zram, or zswap without writeback).
    pub fn new(cfg: PoolConfig) -> Result<Pool> {
        Self::build(cfg, None)
    }

    /// A pool whose coldest objects go to `store` when it nears
    /// `cfg.max_pool` (and on [`Pool::writeback`]): a backing file
    /// (`zmem_backing::BackingStore`: zswap with a swap device, zram with
    /// a `backing_dev`), or [`DropCold`](crate::DropCold) for a clean-page
    /// cache, whose pages then simply miss (`NotFound`). Starts the
    /// shrinker thread.
    pub fn with_cold_store(cfg: PoolConfig, store: Box<dyn ColdStore>) -> Result<Pool> {
        Self::build(cfg, Some(store))
    }

    pub fn config(&self) -> &PoolConfig {
        &self.e.cfg
    }

    /// zram's `recompress`: rewrite the objects in RAM that `req` picks
    /// with a stronger algorithm of [`PoolConfig::recomp_algorithms`],
    /// keeping each only where it lands in a smaller size class; objects
    /// none can shrink are marked and not tried again. See the
    /// `recompress` module's design notes. Loads and stores go on meanwhile.
    pub fn recompress(&self, req: &Recompress) -> Result<RecompressReport> {
        self.e.recompression().run(req, || true)
    }

    /// zram's `recompress type=idle` as a policy (`zmem serve
    /// --recompress-idle`): until `stop`, recompress objects idle for
    /// `idle_secs`, using at most the share of one CPU that `share`
    /// answers (0.0 to 1.0; asked before each shard, so it may follow the
    /// machine's load). After each shard it sleeps long enough to keep
    /// that share of the time it worked; while the share is (next to)
    /// none it does no work; after each pass over the pool it waits a
    /// quarter of `idle_secs` (1 to 60 s), since pages grow idle in the
    /// meantime. Returns the totals, or the first error (a pool with no
    /// recompression algorithm).
    pub fn recompress_idle_until(&self, idle_secs: u32, share: impl FnMut() -> f64, stop: &AtomicBool) -> Result<RecompressReport> {
        self.e.recompression().idle_until(idle_secs, share, stop)
    }

    /// Switch exclusive loads on or off ([`PoolConfig::exclusive_loads`]),
    /// e.g. when the kernel starts or stops freeing swap slots on swap-in.
    /// A pool without a backing store has nothing to load exclusively.
    pub fn set_exclusive_loads(&self, on: bool) {
        self.e.tier.set_exclusive(on);
    }

    /// Bytes charged against `mem_limit` now. Equal to
    /// `stats().mem_used_total` whenever no operation is in flight (during
    /// one it may be ahead: growth is charged before it happens).
    pub fn mem_charged(&self) -> u64 {
        self.e.settle_charges();
        self.e.budget().used()
    }

    /// What counts against `max_pool` now and `max_pool` itself, in bytes
    /// (`max_pool_used_bytes` and `max_pool_bytes` of the stats, without
    /// gathering them); `None` without a `max_pool`. Cheap: two atomics
    /// and the allocator's page count.
    pub fn max_pool_usage(&self) -> Option<(u64, u64)> {
        let max = self.e.admission.max_pages();
        (max != u64::MAX).then(|| (self.e.held_pages() * PAGE_SIZE as u64, max * PAGE_SIZE as u64))
    }

    /// Change zswap's `max_pool` (None: no limit).
    pub fn set_max_pool(&self, bytes: Option<u64>) {
        self.e.admission.set_max_pool(bytes);
        self.e.kick_shrinker();
    }

    /// Store `page` (4096 bytes) under `key`, replacing any previous page.
    ///
    /// On error the key keeps its previous contents, if it had any. Only a
    /// page that needs new memory can be refused for want of room
    /// ([`ZmemError::PoolFull`]): same-filled pages, duplicates and in-place
    /// rewrites always go in.
    pub fn store(&self, key: u64, page: &[u8]) -> Result<()> {
        self.e.store(key, page)
    }

    /// Load the page stored under `key` into `buf` (4096 bytes).
    pub fn load(&self, key: u64, buf: &mut [u8]) -> Result<()> {
        self.e.load(key, buf)
    }

    /// Whether the pool writes pages back to a cold store (a backing
    /// file, a cluster, or a cache's dropping store): without one no page
    /// is ever [`Residency::Backed`].
    pub fn has_cold_store(&self) -> bool {
        self.e.tier.writes_back()
    }

    /// Where the page under `key` lives, if there is one.
    pub fn residency(&self, key: u64) -> Option<Residency> {
        self.e.residency(key)
    }

    /// Say that the pages under `keys` are about to be loaded (one
    /// request's pages): the cold store reads the records of those written
    /// back together, in as few operations as their places allow, so the
    /// loads that follow find them read. A hint: it changes no page and
    /// reports no error. Returns the read operations it made.
    pub fn prefetch(&self, keys: Range<u64>) -> usize {
        self.e.tier.prefetch(&*self.e, keys)
    }

    /// The pages that are objects of their own in RAM now (see
    /// [`Resident`]); empty without a cold store.
    pub fn resident(&self) -> Resident {
        let mut items = Vec::new();
        if self.has_cold_store() {
            for sh in self.e.index.shards() {
                items.extend(sh.lock().iter_in_ram().filter(|(_, e, _)| matches!(e.slot(), Slot::Obj(..))).map(|(k, e, _)| (k, e)));
            }
        }
        Resident::new(items)
    }

    /// Write the pages `pages` names back before anything else, when
    /// the pool next needs room: a hint from a user that knows which pages
    /// are most likely unneeded (a swap device's pages that no page table
    /// points to). It replaces the last hint; a page that changed since
    /// [`Pool::resident`] named it (stored again, loaded, freed) is passed
    /// over, and nothing is ever dropped. Returns the pages it names (0
    /// without a cold store, or when the budget has no room for the list).
    pub fn write_back_first(&self, pages: Resident) -> usize {
        self.e.tier.write_first(self.e.budget(), pages)
    }

    /// The recompression priority of the object in RAM under `key`: 0 if
    /// the pool's compressor wrote it, 1..=3 if a recompression algorithm
    /// rewrote it; None for a same-filled, shared or written-back page, or
    /// no page.
    pub fn recomp_priority(&self, key: u64) -> Option<u8> {
        let e = self.e.index.shard(key).lock().get(key)?;
        matches!(e.slot(), Slot::Obj(..)).then(|| e.prio())
    }

    /// One dictionary round now (`--dict auto` runs one a second): free
    /// unused dictionaries, then train on the sampled pages, whatever their
    /// freshness, and install the result if it pays (see `dict.rs`).
    pub fn train_dictionary(&self) -> Result<TrainReport> {
        self.e.dict_round(true)
    }

    /// The dictionary new objects are written with (zstd's format), e.g.
    /// to save it and give it to another pool (`--dict PATH`).
    pub fn dictionary(&self) -> Option<Vec<u8>> {
        Some(self.e.objects.dicts()?.current_dict()?.bytes().to_vec())
    }

    /// Whether `key` holds a page.
    pub fn contains(&self, key: u64) -> bool {
        // Through residency: a key whose shared object a clean cache
        // dropped holds no page.
        self.e.residency(key).is_some()
    }

    /// Drop the page stored under `key` (zram's slot free, frontswap's
    /// invalidate_page). Returns whether there was one.
    pub fn invalidate(&self, key: u64) -> bool {
        self.e.invalidate(key)
    }

    /// Drop every page whose key lies in `range` (frontswap's invalidate_area,
    /// a block device's discard). Returns how many pages were dropped.
    pub fn invalidate_range(&self, range: Range<u64>) -> u64 {
        self.e.invalidate_range(range)
    }

    /// Number of stored pages.
    pub fn len(&self) -> usize {
        self.e.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Move objects out of sparse spans and give emptied spans back to the
    /// OS (zram's `compact`). Returns pages freed.
    pub fn compact(&self) -> u64 {
        self.e.objects.compact()
    }

    /// A consistent-enough snapshot of every counter (each shard is read under its lock).
    pub fn stats(&self) -> Stats {
        self.e.stats()
    }

    /// zram's `writeback`: write back the pages `mode` names, at most
    /// `limit_pages` of them (zram's `writeback_limit`). A shared object
    /// counts once. Runs while the shrinker is idle. Returns pages written.
    pub fn writeback(&self, mode: WritebackMode, limit_pages: Option<u64>) -> Result<u64> {
        self.e.tier.writeback(&*self.e, mode, limit_pages)
    }

    /// Wait (up to `timeout`) until the shrinker has nothing left to do:
    /// the pool is under its high mark, or the shrinker's last round gave up.
    /// Returns whether it settled in time. Immediate without a backing store.
    pub fn settle(&self, timeout: std::time::Duration) -> bool {
        self.e.tier.settle(timeout)
    }
}

impl Engine {
    /// What `max_pool` bounds, in pages ([`Tier::held_pages`]).
    fn held_pages(&self) -> u64 {
        self.tier.held_pages(&self.parts())
    }

    /// The components the tier moves objects between.
    fn parts(&self) -> Parts<'_> {
        Parts { index: &self.index, dedup: self.dedup.as_ref(), objects: &self.objects, counters: &self.counters, admission: &self.admission }
    }

    /// What every growth of the pool is charged to (zram's mem_limit).
    fn budget(&self) -> &Budget {
        self.objects.budget()
    }

    /// A recompression pass over this pool (`recompress.rs`).
    fn recompression(&self) -> recompress::Pass<'_> {
        recompress::Pass {
            index: &self.index,
            objects: &self.objects,
            counters: &self.counters,
            algs: &self.cfg.recomp_algorithms,
            epoch: self.epoch,
            tier: &self.tier,
        }
    }

    /// Seconds since the pool was created (the unit of access times).
    fn now(&self) -> u32 {
        self.epoch.elapsed().as_secs().min(u32::MAX as u64) as u32
    }

    fn store(&self, key: u64, page: &[u8]) -> Result<()> {
        if page.len() != PAGE_SIZE {
            self.counters.invalid_io.fetch_add(1, Relaxed);
            return Err(ZmemError::BadPageSize { len: page.len() });
        }
        if let Some(keys) = self.cfg.ledger_keys.filter(|&n| key >= n) {
            self.counters.failed_writes.fetch_add(1, Relaxed);
            return Err(ZmemError::PastLedger { key, keys });
        }
        match self.store_inner(key, page) {
            Ok(p) => {
                self.counters.stores.fetch_add(1, Relaxed);
                self.finish(p);
                self.kick_shrinker();
                Ok(())
            }
            Err(e) => {
                self.counters.failed_writes.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    /// Store, returning what is left to do once no lock is held.
    fn store_inner(&self, key: u64, page: &[u8]) -> Result<Published> {
        if let Some(pattern) = same_filled(page) {
            return self.publish(key, Entry::same(pattern));
        }
        if let Some(d) = &self.dedup {
            let hash = xxhash_rust::xxh3::xxh3_64(page);
            d.maintain(&self.index, &self.objects, &self.counters, || self.now());
            // Without a record for every page (adaptive dedup, `dedup.rs`),
            // a page that finds no twin is stored as any other.
            let track = d.tracks(hash);
            let r = self.store_dedup(d, hash, page, track)?;
            d.observe(track, r.as_ref().and_then(|&(_, saved)| saved));
            if let Some((new, _)) = r {
                return self.publish(key, new);
            }
        }
        if self.tier.writes_back() {
            // May wait for the shrinker, so before any lock is taken.
            self.admit()?;
            return self.objects.encode(page, |bytes, info| {
                let h = self.alloc_write(bytes)?;
                self.publish(key, Entry::obj(h, info))
            });
        }
        self.objects.encode(page, |bytes, info| {
            let mut s = self.index.shard(key).lock();
            // A page stored again whose object keeps its size class is
            // rewritten in place under the key's shard lock (which keeps
            // readers out): no allocation, no free, no admission. Not with
            // a ledger: a process killed in the middle would leave the
            // ledger's entry naming half-written bytes.
            if let Some(old) = s.get(key).filter(|_| self.cfg.ledger_keys.is_none()) {
                if let Slot::Obj(h, _) = old.slot() {
                    if self.objects.rewrite(h, bytes).map_err(|e| self.alloc_failed(e))? {
                        s.replace(key, old, Entry::obj(h, info));
                        return Ok(Published::NOTHING);
                    }
                }
            }
            self.admit()?;
            let h = self.alloc_write(bytes)?;
            let r = self.publish_locked(&mut s, key, Entry::obj(h, info));
            drop(s);
            self.or_release(r, Entry::obj(h, info))
        })
    }

    /// Put `new` under `key`; returns what is left to do once no lock is
    /// held. If the key is refused (it needs index memory the budget
    /// cannot pay for), `new` is released here: the caller's reference to
    /// its object is given back.
    fn publish(&self, key: u64, new: Entry) -> Result<Published> {
        let r = self.publish_locked(&mut self.index.shard(key).lock(), key, new);
        self.or_release(r, new)
    }

    /// A refused publish gives back what `new` holds (no lock may be held).
    fn or_release<T>(&self, r: Result<T>, new: Entry) -> Result<T> {
        if r.is_err() {
            self.release(new);
        }
        r
    }

    /// Put `new` under `key` in its (locked) shard, stamped with the
    /// shard's next generation. Charges what the key needs first (an index
    /// block, the map's growth, its place in the tier's queue); a refusal
    /// changes nothing and leaves `new` to the caller. Returns what is
    /// left to do once the shard lock is dropped ([`Engine::finish`]).
    fn publish_locked(&self, s: &mut Shard, key: u64, new: Entry) -> Result<Published> {
        let (b, shard) = (self.budget(), self.index.shard_index(key));
        let place = self.tier.reserve(shard, new, b).map_err(|e| self.alloc_failed(e))?;
        let new = s.stamp(new);
        match s.insert(key, new, self.now(), b) {
            Ok(old) => Ok(Published { old, place, key, gen: new.gen(), live: s.ram_objects() }),
            Err(e) => {
                self.tier.cancel(place);
                Err(self.alloc_failed(e))
            }
        }
    }

    /// With no lock held, after a publish: queue the new object in the
    /// tier and release what it replaced.
    fn finish(&self, p: Published) {
        self.tier.queue(self, p.place, p.key, p.gen, p.live);
        if let Some(o) = p.old {
            self.release(o);
        }
    }

    /// zswap's admission check, made only by a store that needs new memory.
    /// Without a backing store: refuse at `max_pool`, and keep refusing
    /// until the pool is back under the accept threshold (hysteresis, so it
    /// does not flap at the limit). With one: wait for the shrinker to make
    /// room (never call this with a lock held), and refuse only if it cannot.
    fn admit(&self) -> Result<()> {
        let max = self.admission.max_pages();
        if max == u64::MAX {
            return Ok(());
        }
        let used = self.held_pages();
        if self.tier.writes_back() {
            if used < max {
                return Ok(());
            }
            self.counters.pool_limit_hit.fetch_add(1, Relaxed);
            return self.tier.wait_for_room(self, max);
        }
        match self.admission.judge(used) {
            Verdict::Accept => Ok(()),
            Verdict::Refuse { max_pages, hit } => {
                if hit {
                    self.counters.pool_limit_hit.fetch_add(1, Relaxed);
                }
                Err(self.counters.reject_full(max_pages))
            }
        }
    }

    /// Compress `page` into a new object.
    fn encode_new(&self, page: &[u8]) -> Result<(Handle, ObjInfo)> {
        self.objects.encode(page, |bytes, info| Ok((self.alloc_write(bytes)?, info)))
    }

    fn alloc_write(&self, bytes: &[u8]) -> Result<Handle> {
        self.objects.write(bytes).map_err(|e| self.alloc_failed(e))
    }

    fn alloc_failed(&self, e: zmem_alloc::AllocError) -> ZmemError {
        self.counters.alloc_failed(e)
    }

    /// Drop one reference to what `e` points at, freeing the object with its
    /// last user. A failure here (a stale handle or record: a bug) cannot be
    /// returned to anyone; it is counted (`free_fail`) and logged.
    fn release(&self, e: Entry) {
        let r = match e.slot() {
            Slot::Same(_) => Ok(()),
            // (Each written-back page has a record of its own.)
            Slot::Backed(id, _) => self.tier.free_record(id, self.budget()),
            Slot::Obj(h, _) => self.objects.free(h).map_err(|e| e.to_string()),
            Slot::Dedup(hash, _) => self.release_shared(hash),
        };
        if let Err(msg) = r {
            self.free_failed(&msg);
        }
    }

    fn free_failed(&self, msg: &str) {
        self.counters.free_failed(msg);
    }

    fn load(&self, key: u64, buf: &mut [u8]) -> Result<()> {
        if buf.len() != PAGE_SIZE {
            self.counters.invalid_io.fetch_add(1, Relaxed);
            return Err(ZmemError::BadPageSize { len: buf.len() });
        }
        // (One clock read a load: the lookup's access time and the load
        // clock's second.)
        let now = self.now();
        let r = self.load_inner(key, buf, now);
        self.counters.loads.fetch_add(1, Relaxed);
        match &r {
            Ok(()) | Err(ZmemError::NotFound { .. }) => {}
            Err(e) => {
                if matches!(e, ZmemError::Corrupt { .. }) {
                    self.counters.decompress_fail.fetch_add(1, Relaxed);
                }
                self.counters.failed_reads.fetch_add(1, Relaxed);
            }
        }
        r
    }

    /// `now`: the clock, read before the lock (the critical section only
    /// stores it).
    fn load_inner(&self, key: u64, buf: &mut [u8], now: u32) -> Result<()> {
        let mut tries = 0;
        loop {
            tries += 1;
            let mut s = self.index.shard(key).lock();
            let a = s.access(key, now).ok_or_else(|| if s.is_lost(key) { ZmemError::Lost { key } } else { ZmemError::NotFound { key } })?;
            let e = a.entry;
            let r = match e.slot() {
                Slot::Same(p) => {
                    fill_pattern(buf, p);
                    return Ok(());
                }
                Slot::Obj(h, info) => {
                    let r = self.objects.read_object(key, h, info, buf);
                    if a.newly_referenced {
                        // (Once: with exclusive loads the bit now marks an
                        // object queued at the cold end.)
                        let live = s.ram_objects();
                        drop(s);
                        self.tier.queue_cold(self, self.index.shard_index(key), key, e, live);
                    }
                    return r;
                }
                Slot::Dedup(hash, _) => {
                    let d = self.dedup.as_ref().ok_or(ZmemError::Inconsistent { key, what: "a shared-page entry in a pool without dedup".into() })?;
                    let mut ds = d.lock_under(&mut s, hash);
                    let (loc, info) = ds
                        .access(hash, now)
                        .ok_or_else(|| ZmemError::Inconsistent { key, what: format!("shared object {hash:#x} is missing from the dedup table") })?;
                    match loc {
                        Loc::Ram(h) => return self.objects.read_object(key, h, info, buf),
                        // The clean cache dropped it: a miss.
                        Loc::Dropped => return Err(ZmemError::NotFound { key }),
                        Loc::Backed(id) => {
                            drop(ds);
                            drop(s);
                            self.tier.load_backed_shared(self, key, hash, id, info, buf)
                        }
                    }
                }
                Slot::Backed(id, _) => {
                    drop(s);
                    self.tier.load_backed(self, key, id, buf)
                }
            };
            match r {
                // Freed or moved while we read (the key was overwritten, or
                // the page was brought back by another load): look again.
                Err(ZmemError::Cold(ColdError::NotLive { .. })) if tries < LOAD_TRIES => continue,
                r => return r,
            }
        }
    }

    fn invalidate(&self, key: u64) -> bool {
        let old = {
            let mut s = self.index.shard(key).lock();
            s.remove(key, self.budget())
        };
        match old {
            Some(o) => {
                self.release(o);
                self.counters.notify_free.fetch_add(1, Relaxed);
                true
            }
            None => false,
        }
    }

    fn invalidate_range(&self, range: Range<u64>) -> u64 {
        let span = range.end.saturating_sub(range.start);
        if span <= self.len() as u64 {
            return range.filter(|&k| self.invalidate(k)).count() as u64;
        }
        let mut dropped = 0;
        for shard in self.index.shards() {
            let mut victims = Vec::new();
            {
                let mut s = shard.lock();
                s.remove_range(&range, &mut victims, self.budget());
            }
            dropped += victims.len() as u64;
            for o in victims {
                self.release(o);
            }
        }
        self.counters.notify_free.fetch_add(dropped, Relaxed);
        dropped
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
impl Pool {
    /// The pool's dictionaries (`dict.rs`'s tests reach into them).
    pub(crate) fn dicts_for_test(&self) -> Option<&crate::dict::Dicts> {
        self.e.objects.dicts()
    }

    /// One round of freeing unused dictionaries, as the `zmem-dict` thread
    /// runs (`dict.rs`'s tests).
    pub(crate) fn retire_dicts_for_test(&self) {
        if let Some(d) = self.e.objects.dicts() {
            d.retire_unused(self.e.budget(), |slot| self.e.dict_objects(slot));
        }
    }
}
