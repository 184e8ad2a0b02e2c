//! A compressed second-chance cache for clean pages: zcache's role.
//!
//! # Why
//! When the kernel evicts a clean page-cache page, zcache compressed it
//! into RAM; if the page was wanted again it came from there instead of the
//! disk, and since the page was clean the cache could drop it at any time
//! and never wrote anything back (iozone read throughput rose about 2.5×
//! with 1 GB of RAM). Cleancache is gone from the kernel; this crate is the
//! same cache for programs that keep their own clean pages (a database, a
//! file server, the caching block device of `zmem serve --origin`).
//!
//! # The design
//! * **A pool per cache pool.** [`CleanCache::create_pool`] makes a zmem
//!   engine pool whose cold store is [`DropCold`]: its shrinker evicts the
//!   coldest pages (LRU with second chance: a page read since it was queued
//!   gets one more round) and drops them. Each has zcache's own
//!   `memlimit`; a global limit is shared by fair shares (below).
//! * **Keys.** Pages are named by `(inode, index)`; an inode gets a slot
//!   on its first put, and a page's engine key is `slot << 40 | index`, so
//!   all pages of an inode are one key range, as long as its highest index:
//!   [`CleanCache::invalidate_inode`] is one range invalidation of that.
//!   Indexes from 2⁴⁰ (4 PiB into a file) are not cached.
//! * **Slots come back.** Each slot counts its pages (puts of new pages,
//!   invalidations, and the evictions the pool's cold store reports). When
//!   a new inode finds the slot table larger than twice the pages held,
//!   the slots counted empty are freed; their key ranges are invalidated
//!   first, under the table's write lock, so a miscount costs a miss and a
//!   reused slot never shows another inode's page. Gets and puts hold the
//!   table's read lock across their engine call.
//! * **zcache's rules.** Pages that do not compress below
//!   `max_compressed` bytes (zcache: half a page) are refused and counted;
//!   same-filled pages cost nothing; dedup is optional.
//! * **Fair shares.** Every pool's cap is its own `memlimit`, and at most
//!   the global limit less what the other pools hold beyond their equal
//!   share: a lone pool may use all of it, and a pool that grows back to
//!   its share makes the others shrink to theirs. Caps are recomputed when
//!   pools come and go and every 1,024 puts.
//! * **Never stale.** A `get` after an `invalidate_*` or a newer `put` of
//!   the same page returns that put's bytes or a miss, never older bytes:
//!   the engine replaces and removes entries under the key's lock, and a
//!   dropped page is a miss.
//!
//! # Trade-offs
//! * The LRU is per pool, not global: fair shares bound what each pool
//!   holds, and within that each pool evicts its own coldest pages.
//! * A put into a full pool waits for that pool's shrinker to drop pages,
//!   which takes no I/O.

#![deny(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use zmem_core::{ColdError, ColdStore, Compressor, DropCold, Pool, PoolConfig, RecordId, ZmemError};

/// Size of a page.
pub const PAGE_SIZE: usize = 4096;
/// Pages of an inode are cached up to this index.
pub const MAX_INDEX: u64 = 1 << 40;
const SLOT_SHIFT: u32 = 40;
/// Slots an inode table may hold (keys are 64 bits).
const MAX_SLOTS: u64 = 1 << 24;
/// Puts between two fair-share rebalances.
const REBALANCE_EVERY: u64 = 1024;

/// How a cache is set up.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub compressor: Compressor,
    /// Share identical pages.
    pub dedup: bool,
    /// Memory all pools together may hold (pages and tables).
    pub memlimit: u64,
    /// Pages that compress to this many bytes or more are refused (zcache:
    /// half a page).
    pub max_compressed: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { compressor: Compressor::default(), dedup: false, memlimit: 256 << 20, max_compressed: PAGE_SIZE / 2 }
    }
}

/// One pool (zcache: one per mounted filesystem).
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolOptions {
    /// This pool's own limit (zcache's per-pool `memlimit`); the global
    /// one applies too.
    pub memlimit: Option<u64>,
}

/// A cache pool's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolId(pub u32);

/// What a `get` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Get {
    Hit,
    Miss,
}

/// What a `put` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    Stored,
    /// Not kept: it compresses too poorly, its index is too large, or the
    /// pool could not make room. Counted; never an error.
    Refused,
}

/// Errors: the caller's mistakes. A cache never fails a `get` for want of
/// a page (that is a miss) nor a `put` for want of room (that is a refusal).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("no cache pool {0}: create one with create_pool")]
    NoSuchPool(u32),
    #[error("a page must be exactly 4096 bytes, got {0}")]
    BadPageSize(usize),
    #[error("bad cache configuration: {0}")]
    Config(String),
    #[error("the cache's engine failed: {0}")]
    Engine(#[from] ZmemError),
}

/// A cache pool's counters (zcache's names where it had them). The layout
/// is the C ABI's `zmem_cache_stats` (zmem-cache-ffi): only u64 fields, in
/// the header's order.
#[repr(C)]
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    pub refused_puts: u64,
    /// Pages dropped to make room (zcache's evicted pages).
    pub evictions: u64,
    pub invalidations: u64,
    /// Pages held now, their original bytes, their compressed bytes, and
    /// all the memory the pool holds (pages and tables).
    pub pages: u64,
    pub orig_bytes: u64,
    pub compr_bytes: u64,
    pub mem_used_bytes: u64,
    /// This pool's cap now (its own limit or its fair share of the global one).
    pub cap_bytes: u64,
    /// Inodes with a slot (pages kept, or not yet found empty).
    pub inodes: u64,
}

/// An inode's slot and the highest index put under it.
struct SlotInfo {
    slot: u64,
    max_index: AtomicU64,
}

struct Slots {
    by_inode: HashMap<u64, SlotInfo>,
    free: Vec<u64>,
    next: u64,
}

/// Pages per slot, kept apart from the slot table: the pool's shrinker
/// reports evictions here and must never wait for the table's lock (a put
/// holding it may be waiting for the shrinker).
#[derive(Default)]
struct Counts(Mutex<HashMap<u64, i64>>);

impl Counts {
    fn add(&self, slot: u64, n: i64) {
        *self.0.lock().entry(slot).or_insert(0) += n;
    }
}

/// The cold store of a cache pool: drop every evicted page, and count it
/// out of its inode's slot.
struct EvictCounter {
    counts: Arc<Counts>,
    /// With dedup, evicted objects are shared records named by their hash,
    /// whose keys stay (and miss): nothing to count.
    dedup: bool,
}

impl ColdStore for EvictCounter {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, ColdError> {
        if !self.dedup {
            let mut c = self.counts.0.lock();
            for &(key, _) in objects {
                *c.entry(key >> SLOT_SHIFT).or_insert(0) -= 1;
            }
        }
        DropCold.put_batch(objects)
    }
    fn keeps(&self) -> bool {
        false
    }
}

struct CachePool {
    pool: Pool,
    memlimit: Option<u64>,
    slots: RwLock<Slots>,
    counts: Arc<Counts>,
    cap: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    refused: AtomicU64,
    invalidations: AtomicU64,
}

/// The cache: pools of compressed clean pages (see the crate notes).
pub struct CleanCache {
    cfg: CacheConfig,
    pools: RwLock<Vec<Option<Arc<CachePool>>>>,
    puts: AtomicU64,
}

impl CleanCache {
    pub fn new(cfg: CacheConfig) -> Result<CleanCache, CacheError> {
        if !(64..=PAGE_SIZE).contains(&cfg.max_compressed) {
            return Err(CacheError::Config(format!("max_compressed {} must be between 64 and 4096 bytes", cfg.max_compressed)));
        }
        if cfg.memlimit < 1 << 20 {
            return Err(CacheError::Config(format!("memlimit {} is below 1 MiB", cfg.memlimit)));
        }
        Ok(CleanCache { cfg, pools: RwLock::new(Vec::new()), puts: AtomicU64::new(0) })
    }

    /// A new pool (zcache: one per mounted filesystem).
    pub fn create_pool(&self, opts: PoolOptions) -> Result<PoolId, CacheError> {
        if opts.memlimit.is_some_and(|m| m < 1 << 20) {
            return Err(CacheError::Config("a pool's memlimit must be at least 1 MiB".into()));
        }
        let cap = opts.memlimit.unwrap_or(self.cfg.memlimit).min(self.cfg.memlimit);
        let cfg = PoolConfig {
            compressor: self.cfg.compressor,
            dedup: self.cfg.dedup,
            huge_threshold: self.cfg.max_compressed,
            store_incompressible: false,
            max_pool: Some(cap),
            shards: 16,
            ..PoolConfig::default()
        };
        let counts = Arc::new(Counts::default());
        let cold = EvictCounter { counts: Arc::clone(&counts), dedup: self.cfg.dedup };
        let pool = Pool::with_cold_store(cfg, Box::new(cold))?;
        let cp = Arc::new(CachePool {
            pool,
            memlimit: opts.memlimit,
            slots: RwLock::new(Slots { by_inode: HashMap::new(), free: Vec::new(), next: 0 }),
            counts,
            cap: AtomicU64::new(cap),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
        });
        let id = {
            let mut pools = self.pools.write();
            match pools.iter().position(Option::is_none) {
                Some(i) => {
                    pools[i] = Some(cp);
                    i
                }
                None => {
                    pools.push(Some(cp));
                    pools.len() - 1
                }
            }
        };
        self.rebalance();
        Ok(PoolId(id as u32))
    }

    fn pool(&self, id: PoolId) -> Result<Arc<CachePool>, CacheError> {
        self.pools.read().get(id.0 as usize).and_then(Clone::clone).ok_or(CacheError::NoSuchPool(id.0))
    }

    /// Keep `page` as page `index` of `inode`, replacing what was kept.
    pub fn put(&self, id: PoolId, inode: u64, index: u64, page: &[u8]) -> Result<Put, CacheError> {
        if page.len() != PAGE_SIZE {
            return Err(CacheError::BadPageSize(page.len()));
        }
        let p = self.pool(id)?;
        p.puts.fetch_add(1, Relaxed);
        if self.puts.fetch_add(1, Relaxed) % REBALANCE_EVERY == REBALANCE_EVERY - 1 {
            self.rebalance();
        }
        let slots = match (index < MAX_INDEX).then(|| p.slot_for_put(inode)).flatten() {
            Some(s) => s,
            None => {
                p.refused.fetch_add(1, Relaxed);
                return Ok(Put::Refused);
            }
        };
        let info = &slots.by_inode[&inode];
        let key = info.slot << SLOT_SHIFT | index;
        info.max_index.fetch_max(index, Relaxed);
        let had = p.pool.contains(key);
        match p.pool.store(key, page) {
            Ok(()) => {
                if !had {
                    p.counts.add(info.slot, 1);
                }
                Ok(Put::Stored)
            }
            Err(e) => {
                // Whatever was kept for this page is older than this put.
                if p.pool.invalidate(key) {
                    p.counts.add(info.slot, -1);
                }
                match e {
                    ZmemError::CompressPoor | ZmemError::PoolFull { .. } => {
                        p.refused.fetch_add(1, Relaxed);
                        Ok(Put::Refused)
                    }
                    e => Err(e.into()),
                }
            }
        }
    }

    /// Copy page `index` of `inode` into `buf` if it is kept.
    pub fn get(&self, id: PoolId, inode: u64, index: u64, buf: &mut [u8]) -> Result<Get, CacheError> {
        if buf.len() != PAGE_SIZE {
            return Err(CacheError::BadPageSize(buf.len()));
        }
        let p = self.pool(id)?;
        let slots = p.slots.read();
        let r = match slots.by_inode.get(&inode).filter(|_| index < MAX_INDEX) {
            Some(info) => match p.pool.load(info.slot << SLOT_SHIFT | index, buf) {
                Ok(()) => Get::Hit,
                Err(ZmemError::NotFound { .. }) => Get::Miss,
                Err(e) => return Err(e.into()),
            },
            None => Get::Miss,
        };
        drop(slots);
        let c = if r == Get::Hit { &p.hits } else { &p.misses };
        c.fetch_add(1, Relaxed);
        Ok(r)
    }

    /// Forget page `index` of `inode`.
    pub fn invalidate_page(&self, id: PoolId, inode: u64, index: u64) -> Result<(), CacheError> {
        let p = self.pool(id)?;
        p.invalidations.fetch_add(1, Relaxed);
        let slots = p.slots.read();
        if let Some(info) = slots.by_inode.get(&inode).filter(|_| index < MAX_INDEX) {
            if p.pool.invalidate(info.slot << SLOT_SHIFT | index) {
                p.counts.add(info.slot, -1);
            }
        }
        Ok(())
    }

    /// Forget every page of `inode`: one range invalidation, as long as
    /// the highest index put under it.
    pub fn invalidate_inode(&self, id: PoolId, inode: u64) -> Result<(), CacheError> {
        let p = self.pool(id)?;
        p.invalidations.fetch_add(1, Relaxed);
        let mut slots = p.slots.write();
        if let Some(info) = slots.by_inode.remove(&inode) {
            p.release_slot(&mut slots, info);
        }
        Ok(())
    }

    /// Forget the pool and everything in it; its id may be reused.
    pub fn invalidate_pool(&self, id: PoolId) -> Result<(), CacheError> {
        let p = self.pools.write().get_mut(id.0 as usize).and_then(Option::take).ok_or(CacheError::NoSuchPool(id.0))?;
        drop(p);
        self.rebalance();
        Ok(())
    }

    /// A pool's counters.
    pub fn stats(&self, id: PoolId) -> Result<PoolStats, CacheError> {
        let p = self.pool(id)?;
        let st = p.pool.stats();
        let inodes = p.slots.read().by_inode.len() as u64;
        Ok(PoolStats {
            hits: p.hits.load(Relaxed),
            misses: p.misses.load(Relaxed),
            puts: p.puts.load(Relaxed),
            refused_puts: p.refused.load(Relaxed),
            evictions: st.evicted_pages,
            invalidations: p.invalidations.load(Relaxed),
            pages: st.stored_pages,
            orig_bytes: st.orig_data_size,
            compr_bytes: st.compr_data_size,
            mem_used_bytes: st.mem_used_total,
            cap_bytes: p.cap.load(Relaxed),
            inodes,
        })
    }

    /// Memory all pools hold now.
    pub fn mem_used_bytes(&self) -> u64 {
        self.pools.read().iter().flatten().map(|p| p.pool.mem_charged()).sum()
    }

    /// Fair shares: each pool may hold its own limit, and at most the
    /// global limit less what the others hold up to an equal share each.
    fn rebalance(&self) {
        let pools: Vec<Arc<CachePool>> = self.pools.read().iter().flatten().cloned().collect();
        if pools.is_empty() {
            return;
        }
        let global = self.cfg.memlimit;
        let share = global / pools.len() as u64;
        let held: Vec<u64> = pools.iter().map(|p| p.pool.mem_charged().min(share)).collect();
        let all: u64 = held.iter().sum();
        for (p, &h) in pools.iter().zip(&held) {
            let room = global.saturating_sub(all - h).max(share);
            let cap = p.memlimit.unwrap_or(global).min(room).max(1 << 20);
            if p.cap.swap(cap, Relaxed) != cap {
                p.pool.set_max_pool(Some(cap));
            }
        }
    }
}

impl CachePool {
    /// The slot table, read-locked, holding `inode` (given a slot now if
    /// it had none); None when no slot is left.
    fn slot_for_put(&self, inode: u64) -> Option<RwLockReadGuard<'_, Slots>> {
        let slots = self.slots.read();
        if slots.by_inode.contains_key(&inode) {
            return Some(slots);
        }
        drop(slots);
        let mut slots = self.slots.write();
        if !slots.by_inode.contains_key(&inode) {
            if slots.free.is_empty() && (slots.next >= MAX_SLOTS || slots.by_inode.len() as u64 >= 2 * self.pool.len() as u64 + 1024) {
                self.reclaim_slots(&mut slots);
            }
            let slot = match slots.free.pop() {
                Some(s) => s,
                None if slots.next < MAX_SLOTS => {
                    slots.next += 1;
                    slots.next - 1
                }
                None => return None,
            };
            slots.by_inode.insert(inode, SlotInfo { slot, max_index: AtomicU64::new(0) });
        }
        Some(RwLockWriteGuard::downgrade(slots))
    }

    /// Free the slots counted empty (under the table's write lock: no get
    /// or put is using any slot).
    fn reclaim_slots(&self, slots: &mut Slots) {
        let empty: Vec<u64> = {
            let c = self.counts.0.lock();
            slots.by_inode.iter().filter(|(_, i)| c.get(&i.slot).is_none_or(|&n| n <= 0)).map(|(&inode, _)| inode).collect()
        };
        for inode in empty {
            if let Some(info) = slots.by_inode.remove(&inode) {
                self.release_slot(slots, info);
            }
        }
    }

    /// Invalidate a slot's keys and put it on the free list (the caller
    /// holds the table's write lock and has removed the inode).
    fn release_slot(&self, slots: &mut Slots, info: SlotInfo) {
        let base = info.slot << SLOT_SHIFT;
        self.pool.invalidate_range(base..base + info.max_index.load(Relaxed) + 1);
        self.counts.0.lock().remove(&info.slot);
        slots.free.push(info.slot);
    }
}
