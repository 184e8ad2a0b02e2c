//! The pool: the index, same-filled pages, dedup, compression, allocation.
//!
//! # The index and its entries
//! Keys (page numbers from every frontend) hash to one of N shards (64 by
//! default); whole 16-key blocks go to one shard, so a run of keys shares a
//! lock and a block. A shard (`shard.rs`) is a mutex over a block map
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
//! and map growth and its LRU place, the dedup table its resizes, the tier
//! the backing store's tables. A refused charge is `PoolFull` and changes
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
//!   LRU state that a rewrite would have to reset. Without one, the rewrite
//!   keeps the handle, so whoever compares an entry to see that a page is
//!   unchanged (recompression) must compare the object's bytes too.
//! * Access times cost 5 bytes a page in every pool (0.2 % of
//!   `mem_used_total` on the `/usr/lib` pages), so idle pages can be named
//!   for writeback and recompression whether or not there is a backing file.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::MutexGuard;
use zmem_alloc::{AllocConfig, Budget, Handle, ZsPool};

use crate::admission::{Admission, Verdict};
use crate::cold::{ColdError, ColdStore};
use zmem_compress::{Algorithm, Compressor};

use crate::dedup::{DedupTable, Loc, Released};
use crate::dict::{DictConfig, DictSource, Dicts, TrainReport};
use crate::entry::{fill_pattern, same_filled, Entry, ObjInfo, Slot, DICT_SLOTS, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::objects::{with_page_buf, Objects};
use crate::recompress::{self, Recompress, RecompressReport, MAX_RECOMP_ALGORITHMS};
use crate::shard::{Index, Shard};
use crate::stats::{Counters, Stats};
use crate::tier::{Resident, Tier, TierHost, WritebackMode, OBJ};

/// Where a stored page lives (see [`Pool::residency`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// A compressed (or huge, raw) object in RAM.
    Ram,
    /// One repeated word, kept in the index entry.
    SameFilled,
    /// An object in RAM shared with other keys by deduplication.
    Shared,
    /// Written back to the backing store.
    Backed,
}

/// How a pool is set up. `PoolConfig::default()` is zram's behaviour with lz4.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Compressor for new objects; may be changed later with [`Pool::set_compressor`].
    pub compressor: Compressor,
    /// Share identical pages (hash to find candidates, full compare to confirm).
    pub dedup: bool,
    /// Pages that compress to this many bytes or more are stored raw as whole
    /// pages (zram's huge pages), which also makes them the fastest to load.
    pub huge_threshold: usize,
    /// Store pages that do not compress below `huge_threshold` raw (zram) or
    /// reject them with [`ZmemError::CompressPoor`] (zswap).
    pub store_incompressible: bool,
    /// Cap on `mem_used_total`, in bytes (zram's `mem_limit`): allocator
    /// pages and every table the pool keeps, all charged before they grow.
    pub mem_limit: Option<u64>,
    /// Number of index shards (rounded up to a power of two).
    pub shards: usize,
    /// Largest span the allocator may use for a size class, in pages.
    pub max_span_pages: usize,
    /// zswap's `max_pool_percent`, in bytes: past it, a pool with a backing
    /// store writes its coldest pages back; one without rejects stores
    /// (`pool_limit_hit`) until it is below the accept threshold. It bounds
    /// the allocator's pages plus the metadata that grows with the data
    /// (allocator tables, index, LRU, dedup table, the backing store's
    /// record tables), so that it bounds what the pool takes from the
    /// machine; metadata counts for at most 3/4 of it, so pages always keep
    /// a quarter (the tables of written-back pages cannot be written back).
    /// Fixed costs (the shard arrays, the backing store's I/O buffers) are
    /// not counted.
    pub max_pool: Option<u64>,
    /// zswap's `accept_threshold_percent`: after hitting `max_pool`, accept
    /// again (or stop writing back) below this share of it.
    pub accept_threshold_percent: u8,
    /// zswap's exclusive loads, as far as a block device allows: a load is
    /// taken to be the page's last use in the pool, because whoever reads
    /// a block device through the page cache or the swap cache now holds
    /// the page itself (the kernel frees a swap slot when it writes to the
    /// page, and says so to zmem only when it reuses or discards the slot).
    /// So a loaded object goes to the cold end of the LRU, to be the first
    /// written back, instead of getting a second chance in RAM; and a
    /// written-back page that is loaded stays in the file instead of coming
    /// back to RAM. The copy is never dropped: a clean page the kernel
    /// evicts is read from its slot again (2 % of loads on a swap storm).
    /// Shared (deduplicated) objects keep their second chance: a load
    /// through one key says nothing about the others.
    ///
    /// It pays only where loads are mostly last uses: a workload that
    /// writes every page it reads, or swap while the device is more than
    /// half full (then the kernel frees the slot at every swap-in,
    /// `vm_swap_full()`). Where most loads are read faults whose pages the
    /// kernel keeps the slots of, evicts clean and reads again, writing
    /// them back first costs more reads from the file than it saves
    /// (docs/MEASUREMENTS.md, "Exclusive loads").
    /// Off by default; [`Pool::set_exclusive_loads`] switches them at run
    /// time (`zmem swap on` does, following the swap's fullness).
    pub exclusive_loads: bool,
    /// Write back a victim with the other pages in RAM of its 16-key index
    /// block, as one record (an extent, `extent.rs`): a page on the file
    /// then costs the tables a few bytes of RAM instead of about 40, but a
    /// load reads its whole extent. Off: every page its own record. Off by
    /// default until a page can be read from its extent alone
    /// (docs/MEASUREMENTS.md, "What the cap holds").
    pub extents: bool,
    /// zram's `recomp_algorithm`: up to three algorithms for
    /// [`Pool::recompress`], by priority (the first is priority 1; the
    /// pool's `compressor` is priority 0). Empty: no recompression.
    pub recomp_algorithms: Vec<Compressor>,
    /// Dictionaries: none, trained from the pool's pages, or given
    /// (`dict.rs`). zstd stores and recompressions use one when there is
    /// one; lz4 stores only with `dict.lz4`.
    pub dict: DictConfig,
}

/// Default huge threshold: pages that compress to 4032 bytes or more are
/// stored raw.
///
/// zram stores raw whatever reaches zsmalloc's `huge_class_size` (about
/// 3264 bytes with 4-page zspages, ~3.6 KiB with 8-page chains), because a
/// zspage cannot pack such objects without waste. Our allocator packs every
/// 16-byte class into spans of up to 32 pages and charges only the pages
/// objects reach into, so even a 4000-byte object costs less stored
/// compressed than raw; the last 64 bytes are kept as the margin below
/// which the saving is not worth a decompression on every load.
pub const DEFAULT_HUGE_THRESHOLD: usize = 4032;

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            compressor: Compressor::default(),
            dedup: false,
            huge_threshold: DEFAULT_HUGE_THRESHOLD,
            store_incompressible: true,
            mem_limit: None,
            shards: 64,
            max_span_pages: 32,
            max_pool: None,
            accept_threshold_percent: 90,
            exclusive_loads: false,
            extents: false,
            recomp_algorithms: Vec::new(),
            dict: DictConfig::default(),
        }
    }
}

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
    /// The writeback tier, if the pool has a backing store.
    tier: Option<Tier>,
    /// Time zero for access times.
    epoch: Instant,
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
        let (exclusive, extents) = (cfg.exclusive_loads, cfg.extents);
        Self::build(cfg, Some(Tier::new(store, exclusive, extents)))
    }

    fn build(cfg: PoolConfig, tier: Option<Tier>) -> Result<Pool> {
        let e = Arc::new(Engine::build(cfg, tier)?);
        let shrinker = match e.tier {
            Some(_) => {
                let worker = Arc::clone(&e);
                let h = std::thread::Builder::new()
                    .name("zmem-shrink".into())
                    .spawn(move || {
                        if let Some(t) = &worker.tier {
                            crate::tier::shrinker_main(&*worker, t);
                        }
                    })
                    .map_err(|err| ZmemError::Config(format!("cannot start the shrinker thread: {err}")))?;
                Some(h)
            }
            None => None,
        };
        let mut pool = Pool { e, shrinker, trainer: None };
        if pool.e.objects.dicts().is_some_and(|d| d.cfg.background) {
            let worker = Arc::clone(&pool.e);
            let h = std::thread::Builder::new()
                .name("zmem-dict".into())
                .spawn(move || worker.dict_main())
                .map_err(|err| ZmemError::Config(format!("cannot start the dictionary thread: {err}")))?;
            pool.trainer = Some(h);
        }
        Ok(pool)
    }

    pub fn config(&self) -> &PoolConfig {
        &self.e.cfg
    }

    /// The compressor used for new stores.
    pub fn compressor(&self) -> Compressor {
        self.e.objects.compressor()
    }

    /// Switch the compressor for new stores; existing objects keep theirs.
    pub fn set_compressor(&self, c: Compressor) {
        self.e.objects.set_compressor(c);
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
    /// `idle_secs`, using at most `cpu_percent` of one CPU. After each
    /// shard it sleeps long enough to keep that share of the time it
    /// worked; after each pass over the pool it waits a quarter of
    /// `idle_secs` (1 to 60 s), since pages grow idle in the meantime.
    /// Returns the totals, or the first error (a pool with no
    /// recompression algorithm).
    pub fn recompress_idle_until(&self, idle_secs: u32, cpu_percent: u8, stop: &AtomicBool) -> Result<RecompressReport> {
        self.e.recompression().idle_until(idle_secs, cpu_percent, stop)
    }

    /// Switch exclusive loads on or off ([`PoolConfig::exclusive_loads`]),
    /// e.g. when the kernel starts or stops freeing swap slots on swap-in.
    /// A pool without a backing store has no LRU and ignores it.
    pub fn set_exclusive_loads(&self, on: bool) {
        if let Some(t) = &self.e.tier {
            t.set_exclusive(on);
        }
    }

    /// Whether loads are exclusive now (false without a backing store).
    pub fn exclusive_loads(&self) -> bool {
        self.e.tier.as_ref().is_some_and(Tier::exclusive)
    }

    /// Change zram's `mem_limit` (None: unlimited). It caps
    /// `mem_used_total`: allocator pages and every table the pool keeps.
    /// Lowering it below what is held frees nothing; stores that need new
    /// memory are refused until enough is freed.
    pub fn set_mem_limit(&self, limit: Option<u64>) {
        self.e.objects.set_limit(limit);
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
        self.e.tier.as_ref().map_or(0, |t| t.prefetch(&*self.e, keys))
    }

    /// The pages that are objects of their own in RAM now (see
    /// [`Resident`]); empty without a cold store.
    pub fn resident(&self) -> Resident {
        let mut items = Vec::new();
        if self.e.tier.is_some() {
            for sh in self.e.index.shards() {
                items.extend(sh.lock().iter().filter(|(_, e, _)| matches!(e.slot(), Slot::Obj(..))).map(|(k, e, _)| (k, e)));
            }
        }
        Resident::new(items)
    }

    /// Write the pages `pages` names back before anything on the LRU, when
    /// the pool next needs room: a hint from a user that knows which pages
    /// are most likely unneeded (a swap device's pages that no page table
    /// points to). It replaces the last hint; a page that changed since
    /// [`Pool::resident`] named it (stored again, loaded, freed) is passed
    /// over, and nothing is ever dropped. Returns the pages it names (0
    /// without a cold store, or when the budget has no room for the list).
    pub fn write_back_first(&self, pages: Resident) -> usize {
        self.e.tier.as_ref().map_or(0, |t| t.write_first(self.e.budget(), pages, true))
    }

    /// Count `pages` in the stats as [`Pool::write_back_first`] does
    /// (`first_out_named` of `first_out_of`), and change nothing else:
    /// the same measure without its effect. It drops the last hint.
    pub fn note_first(&self, pages: Resident) {
        if let Some(t) = &self.e.tier {
            t.write_first(self.e.budget(), pages, false);
        }
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
        let t = self.e.tier.as_ref().ok_or(ZmemError::NoBackingStore)?;
        t.writeback(&*self.e, mode, limit_pages)
    }

    /// Wait (up to `timeout`) until the shrinker has nothing left to do:
    /// the pool is under its high mark, or the shrinker's last round gave up.
    /// Returns whether it settled in time. Immediate without a backing store.
    pub fn settle(&self, timeout: std::time::Duration) -> bool {
        match &self.e.tier {
            Some(t) => t.settle(timeout),
            None => true,
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let (Some(h), Some(d)) = (self.trainer.take(), self.e.objects.dicts()) {
            d.stop.store(true, Relaxed);
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("the dictionary thread panicked");
            }
        }
        if let (Some(h), Some(t)) = (self.shrinker.take(), &self.e.tier) {
            t.stop();
            if h.join().is_err() {
                tracing::error!("the shrinker thread panicked; pages it was writing back stayed in RAM");
            }
        }
    }
}

impl Engine {
    fn build(cfg: PoolConfig, tier: Option<Tier>) -> Result<Engine> {
        if !(1..=100).contains(&cfg.accept_threshold_percent) {
            return Err(ZmemError::Config(format!("accept_threshold_percent {} must be between 1 and 100", cfg.accept_threshold_percent)));
        }
        if cfg.max_pool == Some(0) {
            return Err(ZmemError::Config("max_pool must be more than 0 bytes".into()));
        }
        if cfg.huge_threshold < 64 || cfg.huge_threshold > PAGE_SIZE {
            return Err(ZmemError::Config(format!("huge_threshold {} must be between 64 and 4096 bytes", cfg.huge_threshold)));
        }
        if !(1..=64).contains(&cfg.max_span_pages) {
            return Err(ZmemError::Config(format!("max_span_pages {} must be between 1 and 64", cfg.max_span_pages)));
        }
        if cfg.recomp_algorithms.len() > MAX_RECOMP_ALGORITHMS {
            return Err(ZmemError::Config(format!(
                "{} recompression algorithms ({}): at most {MAX_RECOMP_ALGORITHMS}, as zram's priorities 1 to 3",
                cfg.recomp_algorithms.len(),
                crate::recompress::names(&cfg.recomp_algorithms)
            )));
        }
        let index = Index::new(cfg.shards);
        let dedup = cfg.dedup.then(DedupTable::new);
        // One budget for everything the pool holds: the allocator charges
        // its pages and tables to it, the index, dedup table and LRUs their
        // growth, the tier the backing store's tables. The shard arrays are
        // a fixed cost, charged now.
        let budget = Arc::new(Budget::new(cfg.mem_limit));
        // The limit is the budget's.
        let alloc = ZsPool::with_budget(AllocConfig { max_span_pages: cfg.max_span_pages, limit_bytes: None }, Arc::clone(&budget));
        budget.force_charge(index.fixed_bytes() + if dedup.is_some() { DedupTable::fixed_bytes() } else { 0 });
        if let Some(limit) = cfg.mem_limit {
            if budget.used() > limit {
                return Err(ZmemError::Config(format!("mem_limit {limit} is below the {} bytes a pool holds before it stores anything", budget.used())));
            }
        }
        let counters = Counters::default();
        let dicts = match &cfg.dict.source {
            DictSource::Off => None,
            src => {
                let levels: Vec<i32> = std::iter::once(cfg.compressor)
                    .chain(cfg.recomp_algorithms.iter().copied())
                    .filter(|c| c.algorithm == Algorithm::Zstd)
                    .map(|c| c.level)
                    .collect();
                let d = Dicts::new(cfg.dict.clone(), levels);
                if let DictSource::Bytes(bytes) = src {
                    let dict = d.prepare(bytes.clone()).map_err(|e| ZmemError::Config(format!("the dictionary: {e}")))?;
                    d.install(dict, &budget).map_err(|e| ZmemError::Config(format!("the dictionary: {e}")))?;
                }
                Some(d)
            }
        };
        Ok(Engine {
            objects: Objects::new(alloc, cfg.compressor, dicts, cfg.huge_threshold, cfg.store_incompressible),
            admission: Admission::new(cfg.max_pool, cfg.accept_threshold_percent, budget.used()),
            tier,
            epoch: Instant::now(),
            cfg,
            index,
            dedup,
            counters,
        })
    }

    /// What `max_pool` bounds, in pages: the allocator's pages plus the
    /// metadata that grows with the data, of which at most 3/4 of
    /// `max_pool` counts. O(1): the budget's total, less the allocator's
    /// pages, the fixed costs and the bound charged ahead of a backing
    /// write in flight (a write's growth counts once it has happened).
    fn held_pages(&self) -> u64 {
        // Not counted: the cold store's buffers once made, and the bound
        // charged ahead of a write to it in flight.
        let uncounted = self.tier.as_ref().map_or(0, |t| t.store.buffer_bytes() + t.reserved_now());
        self.admission.held_pages(self.objects.pages_used(), self.budget().used(), uncounted)
    }

    /// What every growth of the pool is charged to (zram's mem_limit).
    fn budget(&self) -> &Budget {
        self.objects.budget()
    }

    /// A recompression pass over this pool (`recompress.rs`).
    fn recompression(&self) -> recompress::Pass<'_> {
        recompress::Pass { index: &self.index, objects: &self.objects, counters: &self.counters, algs: &self.cfg.recomp_algorithms, epoch: self.epoch }
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
        match self.store_inner(key, page) {
            Ok(old) => {
                self.counters.stores.fetch_add(1, Relaxed);
                if let Some(o) = old {
                    self.release(o);
                }
                self.kick_shrinker();
                Ok(())
            }
            Err(e) => {
                self.counters.failed_writes.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    /// Store, returning the replaced entry (to be released by the caller).
    fn store_inner(&self, key: u64, page: &[u8]) -> Result<Option<Entry>> {
        if let Some(pattern) = same_filled(page) {
            return self.publish(key, Entry::same(pattern));
        }
        if let Some(d) = &self.dedup {
            let hash = xxhash_rust::xxh3::xxh3_64(page);
            let tiered = self.tier.is_some();
            d.maintain(&self.index, &self.objects, &self.counters, || self.now(), tiered);
            // Without a record for every page (adaptive dedup, `dedup.rs`),
            // a page that finds no twin is stored as any other.
            let track = d.tracks(hash, tiered);
            let r = self.store_dedup(d, hash, page, track)?;
            d.observe(track, r.as_ref().and_then(|&(_, saved)| saved), tiered);
            if let Some((new, _)) = r {
                return self.publish(key, new);
            }
        }
        if self.tier.is_some() {
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
            // readers out): no allocation, no free, no admission.
            if let Some(old) = s.get(key) {
                if let Slot::Obj(h, _) = old.slot() {
                    if self.objects.rewrite(h, bytes).map_err(|e| self.alloc_failed(e))? {
                        s.replace(key, old, Entry::obj(h, info));
                        return Ok(None);
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

    /// Put `new` under `key`; returns the entry it replaced, to be released
    /// by the caller. If the key is refused (it needs index memory the
    /// budget cannot pay for), `new` is released here: the caller's
    /// reference to its object is given back.
    fn publish(&self, key: u64, new: Entry) -> Result<Option<Entry>> {
        let r = self.publish_locked(&mut self.index.shard(key).lock(), key, new);
        self.or_release(r, new)
    }

    /// A refused publish gives back what `new` holds (no lock may be held).
    fn or_release(&self, r: Result<Option<Entry>>, new: Entry) -> Result<Option<Entry>> {
        if r.is_err() {
            self.release(new);
        }
        r
    }

    /// Put `new` under `key` in its (locked) shard. Charges what the key
    /// needs first (an index block, the map's growth, a place in the LRU);
    /// a refusal changes nothing and leaves `new` to the caller. Returns
    /// the entry replaced, to be released once the shard lock is dropped.
    fn publish_locked(&self, s: &mut Shard, key: u64, new: Entry) -> Result<Option<Entry>> {
        let b = self.budget();
        let new = if self.tier.is_some() {
            if matches!(new.slot(), Slot::Obj(..)) {
                s.lru().reserve_one(b).map_err(|e| self.alloc_failed(e))?;
            }
            s.stamp(new)
        } else {
            new
        };
        let old = s.insert(key, new, self.now(), b).map_err(|e| self.alloc_failed(e))?;
        if let Some(t) = &self.tier {
            t.queue(s, key, new, b);
            s.trim_lru(b);
        }
        Ok(old)
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
        if let Some(t) = &self.tier {
            if used < max {
                return Ok(());
            }
            self.counters.pool_limit_hit.fetch_add(1, Relaxed);
            return t.wait_for_room(self, max);
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

    /// Find an equal page already stored and share it, or (with `create`)
    /// store this one as a new shared object. A hash match only names a
    /// candidate: it is compared byte for byte (read from the backing file,
    /// with no lock held, if it was written back). Returns the entry and,
    /// for a page shared, the compressed bytes it saved; None when there
    /// is no twin and `create` is off (the caller stores the page plainly).
    fn store_dedup(&self, d: &DedupTable, hash: u64, page: &[u8], create: bool) -> Result<Option<(Entry, Option<u64>)>> {
        let shard = d.shard(hash);
        // A tiered pool may wait for room: never with the dedup lock held.
        let mut admitted = false;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut ds = shard.lock();
            let Some(rec) = ds.get(hash) else {
                if !create {
                    return Ok(None);
                }
                if self.tier.is_some() && !admitted {
                    drop(ds);
                    self.admit()?;
                    admitted = true;
                    continue;
                }
                if self.tier.is_none() {
                    self.admit()?;
                }
                let b = self.budget();
                if self.tier.is_some() {
                    ds.reserve_lru(b).map_err(|e| self.alloc_failed(e))?;
                }
                let (handle, info) = self.encode_new(page)?;
                let gen = match ds.insert(hash, handle, info, self.now(), b) {
                    Ok(gen) => gen,
                    Err(e) => {
                        drop(ds);
                        self.release(Entry::obj(handle, info));
                        return Err(self.alloc_failed(e));
                    }
                };
                if let Some(t) = &self.tier {
                    ds.enqueue(hash, gen, t.next_seq(), b);
                }
                return Ok(Some((Entry::dedup(hash, info), None)));
            };
            let equal = match rec.loc {
                Loc::Dropped => false,
                Loc::Ram(h) => self.objects.equals(h, rec.info, page),
                Loc::Backed(id) => {
                    drop(ds);
                    let equal = self.record_equals(id, hash, rec.info, page);
                    ds = shard.lock();
                    let now = ds.get(hash).map(|r| (r.loc, r.gen));
                    if now != Some((rec.loc, rec.gen)) {
                        if tries < LOAD_TRIES {
                            // Promoted, freed or replaced while we read: look again.
                            continue;
                        }
                        false
                    } else {
                        equal
                    }
                }
            };
            if equal {
                ds.add_ref(hash, Some(self.now()));
                self.counters.dedup_hits.fetch_add(1, Relaxed);
                return Ok(Some((Entry::dedup(hash, rec.info), Some(rec.info.len as u64))));
            }
            // A true 64-bit collision (or an unreadable or dropped
            // candidate): store this page unshared.
            let dropped = rec.loc == Loc::Dropped;
            drop(ds);
            if !dropped {
                self.counters.dedup_collisions.fetch_add(1, Relaxed);
            }
            if !admitted {
                self.admit()?;
            }
            let (h, info) = self.encode_new(page)?;
            return Ok(Some((Entry::obj(h, info), None)));
        }
    }

    /// Whether the written-back shared object `id` decodes to `page`.
    fn record_equals(&self, id: u64, hash: u64, info: ObjInfo, page: &[u8]) -> bool {
        let Some(t) = &self.tier else { return false };
        OBJ.with_borrow_mut(|obj| with_page_buf(|out| t.read_record(&self.objects, hash, id, info, obj, out).is_ok() && out == page))
    }

    /// Drop one reference to what `e` points at, freeing the object with its
    /// last user. A failure here (a stale handle or record: a bug) cannot be
    /// returned to anyone; it is counted (`free_fail`) and logged.
    fn release(&self, e: Entry) {
        let r = match e.slot() {
            Slot::Same(_) => Ok(()),
            // A member of an extent that other keys of its block still name.
            Slot::Backed(..) if !e.last() => Ok(()),
            Slot::Backed(id, _) => match &self.tier {
                Some(t) => {
                    let r = t.store.free(crate::cold::RecordId::from_raw(id)).map_err(|e| e.to_string());
                    t.settle_backing(self.budget(), 0);
                    r
                }
                None => Err("a written-back entry in a pool without a backing store".into()),
            },
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

    fn release_shared(&self, hash: u64) -> std::result::Result<(), String> {
        let Some(d) = &self.dedup else {
            return Err("a shared-page entry in a pool without dedup".into());
        };
        let released = d.shard(hash).lock().release(hash)?;
        match released {
            Released::Nothing => Ok(()),
            Released::Object(h) => self.objects.free(h).map_err(|e| e.to_string()),
            Released::Record(id) => match &self.tier {
                Some(t) => {
                    let r = t.store.free(crate::cold::RecordId::from_raw(id)).map_err(|e| e.to_string());
                    t.settle_backing(self.budget(), 0);
                    r
                }
                None => Err("a written-back shared object in a pool without a backing store".into()),
            },
        }
    }

    fn load(&self, key: u64, buf: &mut [u8]) -> Result<()> {
        if buf.len() != PAGE_SIZE {
            self.counters.invalid_io.fetch_add(1, Relaxed);
            return Err(ZmemError::BadPageSize { len: buf.len() });
        }
        let r = self.load_inner(key, buf);
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

    fn load_inner(&self, key: u64, buf: &mut [u8]) -> Result<()> {
        let mut tries = 0;
        loop {
            tries += 1;
            // Read the clock before the lock: the critical section only stores it.
            let now = self.now();
            let s = self.index.shard(key).lock();
            let (mut s, e) = self.access(s, key, now)?;
            let r = match e.slot() {
                Slot::Same(p) => {
                    fill_pattern(buf, p);
                    return Ok(());
                }
                Slot::Obj(h, info) => return self.objects.read_object(key, h, info, buf),
                Slot::Dedup(hash, _) => {
                    let d = self.dedup.as_ref().ok_or(ZmemError::Inconsistent { key, what: "a shared-page entry in a pool without dedup".into() })?;
                    let mut ds = d.lock_under(&mut s, hash);
                    let (loc, info) = ds
                        .access(hash, now, self.tier.is_some())
                        .ok_or_else(|| ZmemError::Inconsistent { key, what: format!("shared object {hash:#x} is missing from the dedup table") })?;
                    match loc {
                        Loc::Ram(h) => return self.objects.read_object(key, h, info, buf),
                        // The clean cache dropped it: a miss.
                        Loc::Dropped => return Err(ZmemError::NotFound { key }),
                        Loc::Backed(id) => {
                            drop(ds);
                            drop(s);
                            self.tier()?.load_backed_shared(self, key, hash, id, info, buf)
                        }
                    }
                }
                Slot::Backed(id, _) => {
                    drop(s);
                    self.tier()?.load_backed(self, key, id, buf)
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

    /// Look `key` up under its shard lock and record the access at `now`
    /// (zram's ac_time; a tiered pool also sets zswap's referenced bit).
    fn access<'a>(&self, mut s: MutexGuard<'a, Shard>, key: u64, now: u32) -> Result<(MutexGuard<'a, Shard>, Entry)> {
        let (e, newly) = s.access(key, now, self.tier.is_some()).ok_or(ZmemError::NotFound { key })?;
        if let Some(t) = self.tier.as_ref().filter(|t| newly && t.exclusive()) {
            // (Once: the bit now marks an object queued at the cold end.)
            t.queue_cold(&mut s, key, e, self.budget());
        }
        Ok((s, e))
    }

    fn residency(&self, key: u64) -> Option<Residency> {
        let e = self.index.shard(key).lock().get(key)?;
        Some(match e.slot() {
            Slot::Obj(..) => Residency::Ram,
            Slot::Same(_) => Residency::SameFilled,
            Slot::Dedup(hash, _) => {
                let d = self.dedup.as_ref()?;
                match d.shard(hash).lock().loc(hash)? {
                    Loc::Ram(_) => Residency::Shared,
                    Loc::Backed(_) => Residency::Backed,
                    Loc::Dropped => return None,
                }
            }
            Slot::Backed(..) => Residency::Backed,
        })
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

    /// Bring charges that lag behind frees up to date (the backing
    /// store's tables shrink when its segments empty).
    fn settle_charges(&self) {
        if let Some(t) = &self.tier {
            t.settle_backing(self.budget(), 0);
        }
    }

    fn stats(&self) -> Stats {
        self.settle_charges();
        let mut st = Stats::default();
        let mut index_bytes = 0;
        for s in self.index.shards() {
            index_bytes += s.lock().add_stats(&mut st);
        }
        // Pages whose data is on the backing store: their own records, and
        // the pages that share a written-back object.
        let mut backed_pages = st.bd_count;
        index_bytes += self.index.fixed_bytes();
        let mut dedup_bytes = 0;
        if let Some(d) = &self.dedup {
            for ds in d.shards() {
                let (backed, table) = ds.lock().add_stats(&mut st);
                backed_pages += backed;
                dedup_bytes += table;
            }
            dedup_bytes += DedupTable::fixed_bytes();
        }
        let keys = st.stored_pages;
        st.stored_pages -= backed_pages;
        let a = self.objects.alloc_stats();
        st.orig_data_size = st.stored_pages * PAGE_SIZE as u64;
        st.pool_pages = a.pages_used;
        st.alloc_metadata_bytes = a.metadata_bytes;
        st.index_bytes = index_bytes;
        st.meta_data_size = dedup_bytes;
        st.dedup_full = self.dedup.as_ref().is_some_and(DedupTable::full);
        st.dedup_switches = self.dedup.as_ref().map_or(0, DedupTable::switches);
        if let Some(d) = self.objects.dicts() {
            (st.dict_count, st.dict_bytes) = d.usage();
            st.dict_id = d.current_dict().map_or(0, |c| c.id());
            st.dict_pages = (0..DICT_SLOTS).map(|slot| self.dict_objects(slot)).sum();
            st.dict_trainings = d.trainings.load(Relaxed);
            st.dict_installs = d.installs.load(Relaxed);
            st.dict_retired = d.retired.load(Relaxed);
            st.dict_collecting = d.collecting();
        }
        if let Some(t) = &self.tier {
            t.fill_stats(&mut st);
        }
        let tier_bytes = st.lru_bytes + st.backing_metadata_bytes;
        if keys > 0 {
            // Every key costs the index alike; the written-back ones also
            // hold the cold store's records.
            let index_share = (index_bytes as u128 * backed_pages as u128 / keys as u128) as u64;
            st.backed_table_bytes = index_share + st.backing_metadata_bytes.saturating_sub(st.backing_buffer_bytes);
        }
        let meta = a.metadata_bytes + index_bytes + dedup_bytes + tier_bytes + st.dict_bytes;
        st.mem_used_total = a.pages_used * PAGE_SIZE as u64 + meta;
        // Everything is charged before it is taken, so the budget's
        // high-water mark bounds every total ever held.
        st.mem_used_max = self.budget().max_used().max(st.mem_used_total);
        st.mem_limit = self.budget().limit().unwrap_or(0);
        st.pages_compacted = a.pages_compacted;
        st.same_filled_pages = st.same_pages;
        st.pool_total_size = a.pages_used * PAGE_SIZE as u64;
        st.objs_used = a.objs_used;
        st.objs_allocated = a.objs_allocated;
        self.admission.fill_stats(&mut st, self.held_pages());
        self.counters.fill(&mut st);
        self.objects.fill_stats(&mut st);
        st
    }
}

impl Engine {
    /// The `zmem-dict` thread: a dictionary round a second until the pool
    /// is dropped.
    fn dict_main(&self) {
        let Some(d) = self.objects.dicts() else { return };
        while !d.stop.load(Relaxed) {
            std::thread::park_timeout(crate::dict::TRAIN_PERIOD);
            if d.stop.load(Relaxed) {
                break;
            }
            if let Err(e) = self.dict_round(false) {
                self.counters.warn.warn(|| format!("dictionary training: {e}"));
            }
        }
    }

    /// Free unused dictionaries, then (with `--dict auto`) train one if
    /// the samples call for it (`force`: whatever they hold).
    fn dict_round(&self, force: bool) -> Result<TrainReport> {
        let Some(d) = self.objects.dicts() else {
            return Err(ZmemError::Config("this pool has no dictionaries: create it with --dict auto".into()));
        };
        d.retire_unused(self.budget(), |slot| self.dict_objects(slot));
        // The compressor whose bytes decide: the first that would use it.
        let eval = std::iter::once(self.objects.compressor())
            .chain(self.cfg.recomp_algorithms.iter().copied())
            .find(|c| c.algorithm == Algorithm::Zstd || (c.algorithm == Algorithm::Lz4 && d.cfg.lz4));
        let (Some(eval), DictSource::Auto) = (eval, &d.cfg.source) else {
            return Ok(TrainReport::default());
        };
        let pages = self.index.len() as u64;
        d.round(eval, pages, self.budget(), force).map_err(ZmemError::Config)
    }

    /// Objects written with the dictionary in `slot`, in RAM or written back.
    fn dict_objects(&self, slot: usize) -> u64 {
        let keys: u64 = self.index.shards().iter().map(|s| s.lock().dict_objects(slot)).sum();
        let shared: u64 = self.dedup.iter().flat_map(|d| d.shards()).map(|ds| ds.lock().dict_objects(slot)).sum();
        keys + shared
    }
}

impl Engine {
    /// After a store: wake the shrinker if the pool is at its high mark.
    fn kick_shrinker(&self) {
        if let Some(t) = &self.tier {
            t.kick_if_high(self);
        }
    }

    /// The tier, which a written-back entry implies.
    fn tier(&self) -> Result<&Tier> {
        self.tier.as_ref().ok_or_else(|| ZmemError::Inconsistent { key: 0, what: "a written-back entry in a pool without a backing store".into() })
    }
}

impl TierHost for Engine {
    fn index(&self) -> &Index {
        &self.index
    }
    fn dedup(&self) -> Option<&DedupTable> {
        self.dedup.as_ref()
    }
    fn objects(&self) -> &Objects {
        &self.objects
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
    fn held_pages(&self) -> u64 {
        Engine::held_pages(self)
    }
    fn admission(&self) -> &Admission {
        &self.admission
    }
    fn now(&self) -> u32 {
        Engine::now(self)
    }
    fn publish_locked(&self, s: &mut Shard, key: u64, new: Entry) -> Result<Option<Entry>> {
        Engine::publish_locked(self, s, key, new)
    }
    fn release(&self, e: Entry) {
        Engine::release(self, e)
    }
}

#[cfg(test)]
impl Pool {
    /// The pool's dictionaries (`dict.rs`'s tests reach into them).
    pub(crate) fn dicts_for_test(&self) -> Option<&Dicts> {
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
