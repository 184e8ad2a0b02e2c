//! The pool: sharded index, same-filled pages, dedup, compression, allocation.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use zmem_alloc::{AllocConfig, Handle, ZsPool};
use zmem_compress::{Algorithm, CompressError, Compressor};

use crate::entry::{fill_pattern, same_filled, Entry, ObjInfo, Slot, PAGE_SIZE, TAG_RAW, TAG_RAW_INCOMP};
use crate::error::{Result, ZmemError};
use crate::index::{BlockIndex, BLOCK_SHIFT};
use crate::stats::{Counters, Stats};
use crate::tier::Tier;
use zmem_backing::BackingStore;

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
    /// Cap on the pool's allocator pages, in bytes (zram's `mem_limit`).
    pub mem_limit: Option<u64>,
    /// Number of index shards (rounded up to a power of two).
    pub shards: usize,
    /// Largest span the allocator may use for a size class, in pages.
    pub max_span_pages: usize,
    /// zswap's `max_pool_percent`, as bytes of allocator pages: past it, a
    /// pool with a backing store writes its coldest pages back; one without
    /// rejects stores (`pool_limit_hit`) until it is below the accept threshold.
    pub max_pool: Option<u64>,
    /// zswap's `accept_threshold_percent`: after hitting `max_pool`, accept
    /// again (or stop writing back) below this share of it.
    pub accept_threshold_percent: u8,
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
        }
    }
}

/// A fast, well-mixed hasher for the u64 keys of the index (a folded
/// 128-bit multiply: every key bit reaches the low bits hashbrown uses).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let m = ((self.0 ^ n) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_u128);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Heap bytes held by a hashbrown map of `cap` capacity with `slot` bytes per (K, V).
pub(crate) fn map_bytes(cap: usize, slot: usize) -> u64 {
    if cap == 0 {
        return 0;
    }
    let buckets = (cap * 8 / 7).next_power_of_two().max(4);
    (buckets * (slot + 1) + 16) as u64
}

/// One shard of the index, with the counters for the entries it holds.
#[derive(Default)]
pub(crate) struct Shard {
    pub(crate) index: BlockIndex,
    /// Writeback tier only: store order of the shard's in-RAM objects.
    pub(crate) lru: VecDeque<LruItem>,
    /// Generation for the next entry stored (matches entry to LRU item).
    pub(crate) next_gen: u8,
    /// Bytes of non-deduplicated objects referenced from this shard.
    pub(crate) compr_bytes: u64,
    pub(crate) same_pages: u64,
    pub(crate) huge_pages: u64,
    /// Entries written back to the backing store (zram's bd_count).
    pub(crate) backed_pages: u64,
}

impl Shard {
    pub(crate) fn account(&mut self, e: Entry, add: bool) {
        let (compr, same, huge, backed) = match e.slot() {
            Slot::Obj(_, info) => (info.len as u64, 0, info.is_huge() as u64, 0),
            Slot::Same(_) => (0, 1, 0, 0),
            Slot::Dedup(..) => (0, 0, 0, 0),
            Slot::Backed(..) => (0, 0, 0, 1),
        };
        if add {
            self.compr_bytes += compr;
            self.same_pages += same;
            self.huge_pages += huge;
            self.backed_pages += backed;
        } else {
            self.compr_bytes -= compr;
            self.same_pages -= same;
            self.huge_pages -= huge;
            self.backed_pages -= backed;
        }
    }
}

/// A place in a shard's LRU: the key, when it was queued (a pool-wide
/// sequence number, so shards can be compared), and the generation of the
/// entry it was queued for (an overwritten key leaves a stale item behind).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LruItem {
    pub key: u64,
    pub seq: u32,
    pub gen: u8,
}

/// A shared object: one allocation referenced by `refs` index entries.
#[derive(Clone, Copy)]
struct DedupRec {
    handle: Handle,
    info: ObjInfo,
    refs: u32,
}

#[derive(Default)]
struct DedupShard {
    /// Content hash (xxh3-64 of the original page) -> shared object.
    map: Map<DedupRec>,
    compr_bytes: u64,
    huge_pages: u64,
    /// Sum of (refs - 1): pages that cost no allocation thanks to sharing.
    dup_pages: u64,
    /// Compressed bytes those pages would otherwise have taken (zram's dup_data_size).
    dup_bytes: u64,
}

const DEDUP_SHARDS: usize = 64;
const SCRATCH_LEN: usize = 2 * PAGE_SIZE;

thread_local! {
    /// Per-thread compression buffer (zswap's per-CPU `dstmem`).
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; SCRATCH_LEN]);
}

/// A thread-safe compressed page store with the frontswap/cleancache contract.
///
/// Locks: one mutex per index shard (chosen by key), one per dedup shard
/// (chosen by content hash), and the allocator's per-class locks. Order:
/// index shard -> dedup shard -> allocator class. Compression runs with no
/// lock held; decompression runs under the key's shard lock, which is what
/// keeps an object alive while it is read.
pub struct Pool {
    pub(crate) cfg: PoolConfig,
    compressor: AtomicU64,
    pub(crate) alloc: ZsPool,
    pub(crate) shards: Box<[Mutex<Shard>]>,
    shard_bits: u32,
    dedup: Option<Box<[Mutex<DedupShard>]>>,
    pub(crate) counters: Counters,
    /// Allocator pages allowed (u64::MAX: no max_pool).
    pub(crate) max_pool_pages: AtomicU64,
    /// zswap's `zswap_pool_reached_full`: set at max_pool, cleared below the accept threshold.
    pub(crate) pool_full: AtomicBool,
    /// The writeback tier, if the pool has a backing store.
    pub(crate) tier: Option<Tier>,
    /// Time zero for access times.
    pub(crate) epoch: Instant,
}

fn encode_compressor(c: Compressor) -> u64 {
    (c.algorithm.tag() as u64) | ((c.level as u32 as u64) << 8)
}

fn decode_compressor(v: u64) -> Compressor {
    let algorithm = Algorithm::from_tag(v as u8).unwrap_or_default();
    Compressor { algorithm, level: (v >> 8) as u32 as i32 }
}

impl Pool {
    /// A pool in RAM only (zram, or zswap without writeback).
    pub fn new(cfg: PoolConfig) -> Result<Pool> {
        Self::build(cfg, None)
    }

    /// A pool that writes its coldest pages back to `backing` when it
    /// reaches `cfg.max_pool` (zswap with a swap device, zram with a
    /// `backing_dev`), and on request ([`Pool::writeback`]).
    pub fn with_backing(cfg: PoolConfig, backing: BackingStore) -> Result<Pool> {
        Self::build(cfg, Some(Tier::new(backing)))
    }

    fn build(cfg: PoolConfig, tier: Option<Tier>) -> Result<Pool> {
        if !(1..=100).contains(&cfg.accept_threshold_percent) {
            return Err(ZmemError::Config(format!(
                "accept_threshold_percent {} must be between 1 and 100",
                cfg.accept_threshold_percent
            )));
        }
        if cfg.max_pool == Some(0) {
            return Err(ZmemError::Config("max_pool must be more than 0 bytes".into()));
        }
        if cfg.huge_threshold < 64 || cfg.huge_threshold > PAGE_SIZE {
            return Err(ZmemError::Config(format!(
                "huge_threshold {} must be between 64 and 4096 bytes",
                cfg.huge_threshold
            )));
        }
        if !(1..=64).contains(&cfg.max_span_pages) {
            return Err(ZmemError::Config(format!(
                "max_span_pages {} must be between 1 and 64",
                cfg.max_span_pages
            )));
        }
        let nshards = cfg.shards.clamp(1, 1 << 16).next_power_of_two();
        let shards = (0..nshards).map(|_| Mutex::new(Shard::default())).collect();
        let dedup = cfg
            .dedup
            .then(|| (0..DEDUP_SHARDS).map(|_| Mutex::new(DedupShard::default())).collect());
        let alloc = ZsPool::new(AllocConfig {
            max_span_pages: cfg.max_span_pages,
            limit_bytes: cfg.mem_limit,
        });
        let counters = Counters::default();
        counters.mem_limit.store(cfg.mem_limit.unwrap_or(0), Relaxed);
        Ok(Pool {
            compressor: AtomicU64::new(encode_compressor(cfg.compressor)),
            max_pool_pages: AtomicU64::new(
                cfg.max_pool.map_or(u64::MAX, |b| b.div_ceil(PAGE_SIZE as u64)),
            ),
            pool_full: AtomicBool::new(false),
            tier,
            epoch: Instant::now(),
            shard_bits: nshards.trailing_zeros(),
            cfg,
            alloc,
            shards,
            dedup,
            counters,
        })
    }

    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    /// The compressor used for new stores.
    pub fn compressor(&self) -> Compressor {
        decode_compressor(self.compressor.load(Relaxed))
    }

    /// Switch the compressor for new stores; existing objects keep theirs.
    pub fn set_compressor(&self, c: Compressor) {
        self.compressor.store(encode_compressor(c), Relaxed);
    }

    /// Change zram's `mem_limit` (None: unlimited).
    pub fn set_mem_limit(&self, limit: Option<u64>) {
        self.alloc.set_limit(limit);
        self.counters.mem_limit.store(limit.unwrap_or(0), Relaxed);
    }

    /// Change zswap's `max_pool` (None: no limit).
    pub fn set_max_pool(&self, bytes: Option<u64>) {
        self.max_pool_pages
            .store(bytes.map_or(u64::MAX, |b| b.div_ceil(PAGE_SIZE as u64).max(1)), Relaxed);
        self.pool_full.store(false, Relaxed);
    }

    /// Seconds since the pool was created (the unit of access times).
    pub(crate) fn now(&self) -> u32 {
        self.epoch.elapsed().as_secs().min(u32::MAX as u64) as u32
    }

    pub(crate) fn shard(&self, key: u64) -> &Mutex<Shard> {
        let i = if self.shard_bits == 0 {
            0
        } else {
            // Whole index blocks go to one shard; neighbouring blocks spread.
            ((key >> BLOCK_SHIFT).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.shard_bits)) as usize
        };
        &self.shards[i]
    }

    fn dedup_shard(d: &[Mutex<DedupShard>], hash: u64) -> &Mutex<DedupShard> {
        &d[(hash as usize) % d.len()]
    }

    /// Store `page` (4096 bytes) under `key`, replacing any previous page.
    ///
    /// On error the key keeps its previous contents, if it had any.
    pub fn store(&self, key: u64, page: &[u8]) -> Result<()> {
        if page.len() != PAGE_SIZE {
            return Err(ZmemError::BadPageSize { len: page.len() });
        }
        self.admit()?;
        let old = if let Some(pattern) = same_filled(page) {
            self.publish(key, Entry::same(pattern))
        } else if let Some(d) = &self.dedup {
            let new = self.store_dedup(d, page)?;
            self.publish(key, new)
        } else {
            self.encode(page, |bytes, info| {
                let mut s = self.shard(key).lock();
                // A page stored again whose object keeps its size class is
                // rewritten in place under the key's shard lock (which keeps
                // readers out): no allocation, no free. Not in tiered pools,
                // whose entries carry LRU state.
                if self.tier.is_none() {
                    if let Some(old) = s.index.get(key) {
                        if let Slot::Obj(h, _) = old.slot() {
                            if self.alloc.rewrite(h, bytes)? {
                                let new = Entry::obj(h, info);
                                s.account(old, false);
                                s.account(new, true);
                                s.index.set(key, new);
                                return Ok(None);
                            }
                        }
                    }
                }
                let h = self.alloc.alloc_write(bytes)?;
                Ok(self.publish_locked(&mut s, key, Entry::obj(h, info)))
            })??
        };
        self.counters.stores.fetch_add(1, Relaxed);
        if let Some(o) = old {
            self.release(o);
        }
        self.after_store();
        Ok(())
    }

    /// Put `new` under `key`; returns the entry it replaced, to be released
    /// once the shard lock is dropped.
    fn publish(&self, key: u64, new: Entry) -> Option<Entry> {
        self.publish_locked(&mut self.shard(key).lock(), key, new)
    }

    pub(crate) fn publish_locked(&self, s: &mut Shard, key: u64, new: Entry) -> Option<Entry> {
        let new = match &self.tier {
            Some(t) => t.enqueue(s, key, new),
            None => new,
        };
        s.account(new, true);
        let old = s.index.insert(key, new);
        if let Some(o) = old {
            s.account(o, false);
        }
        if let Some(t) = &self.tier {
            s.index.touch(key, self.now());
            t.trim_lru(s);
        }
        old
    }

    /// zswap's admission check. Without a backing store: refuse stores at
    /// `max_pool`, and keep refusing until the pool is back under the accept
    /// threshold (hysteresis, so it does not flap at the limit). With one:
    /// make room by writeback, and refuse only if that cannot.
    fn admit(&self) -> Result<()> {
        let max = self.max_pool_pages.load(Relaxed);
        if max == u64::MAX {
            return Ok(());
        }
        let used = self.alloc.pages_used();
        if self.tier.is_some() {
            // Other threads may fill what a shrink frees: try a few rounds,
            // and refuse only when writeback fails or finds nothing to write.
            let mut used = used;
            for _ in 0..8 {
                if used < max {
                    return Ok(());
                }
                match self.shrink(true) {
                    Ok((_, true)) => break,
                    Ok((_, false)) => used = self.alloc.pages_used(),
                    Err(_) => break,
                }
            }
            if self.alloc.pages_used() < max {
                return Ok(());
            }
            return Err(self.reject_full(max));
        }
        if self.pool_full.load(Relaxed) {
            if used * 100 < max * self.cfg.accept_threshold_percent as u64 {
                self.pool_full.store(false, Relaxed);
            } else {
                return Err(self.reject_full(max));
            }
        }
        if used >= max {
            self.pool_full.store(true, Relaxed);
            return Err(self.reject_full(max));
        }
        Ok(())
    }

    fn reject_full(&self, max_pages: u64) -> ZmemError {
        self.counters.pool_limit_hit.fetch_add(1, Relaxed);
        self.counters.reject_reclaim_fail.fetch_add(1, Relaxed);
        ZmemError::PoolFull { limit_bytes: max_pages * PAGE_SIZE as u64 }
    }

    /// After a store: a pool with a backing store over `max_pool` writes back
    /// its coldest pages down to the accept threshold, so the page just stored
    /// stays in RAM (no LRU inversion).
    fn after_store(&self) {
        if self.tier.is_some() && self.alloc.pages_used() > self.max_pool_pages.load(Relaxed) {
            self.counters.pool_limit_hit.fetch_add(1, Relaxed);
            if let Err(e) = self.shrink(false) {
                self.counters.reject_reclaim_fail.fetch_add(1, Relaxed);
                tracing::warn!("writeback failed, pool stays over max_pool: {e}");
            }
        }
    }

    /// Compress `page` and hand the bytes to be stored to `f`, with their encoding.
    fn encode<R>(
        &self,
        page: &[u8],
        f: impl FnOnce(&[u8], ObjInfo) -> std::result::Result<R, zmem_alloc::AllocError>,
    ) -> Result<std::result::Result<R, ZmemError>> {
        let c = self.compressor();
        let res = SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let info = match c.compress(page, &mut s[..]) {
                Ok(n) if n < self.cfg.huge_threshold => {
                    return Ok(f(&s[..n], ObjInfo::compressed(c.algorithm, n)));
                }
                Ok(n) if n < PAGE_SIZE => ObjInfo::raw(),
                Ok(_) | Err(CompressError::DoesNotFit { .. }) => ObjInfo::raw_incompressible(),
                Err(e) => {
                    self.counters.reject_compress_fail.fetch_add(1, Relaxed);
                    return Err(ZmemError::Compress(e));
                }
            };
            if !self.cfg.store_incompressible {
                self.counters.reject_compress_poor.fetch_add(1, Relaxed);
                return Err(ZmemError::CompressPoor);
            }
            Ok(f(page, info))
        })?;
        Ok(res.map_err(|e| self.alloc_failed(e)))
    }

    /// Compress `page` into a new object.
    fn encode_new(&self, page: &[u8]) -> Result<(Handle, ObjInfo)> {
        self.encode(page, |bytes, info| self.alloc.alloc_write(bytes).map(|h| (h, info)))?
    }

    fn alloc_failed(&self, e: zmem_alloc::AllocError) -> ZmemError {
        match e {
            zmem_alloc::AllocError::LimitReached { .. } => {
                self.counters.pool_limit_hit.fetch_add(1, Relaxed)
            }
            _ => self.counters.reject_alloc_fail.fetch_add(1, Relaxed),
        };
        ZmemError::from(e)
    }

    fn store_dedup(&self, d: &[Mutex<DedupShard>], page: &[u8]) -> Result<Entry> {
        let hash = xxhash_rust::xxh3::xxh3_64(page);
        let mut ds = Self::dedup_shard(d, hash).lock();
        if let Some(rec) = ds.map.get(&hash).copied() {
            // A hash match only names a candidate: confirm byte for byte.
            let equal = SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let out = &mut s[..PAGE_SIZE];
                self.read_object(rec.handle, rec.info, out).map(|()| out == page)
            });
            match equal {
                Ok(true) => {
                    let r = ds.map.get_mut(&hash).expect("present under the same lock");
                    r.refs += 1;
                    ds.dup_pages += 1;
                    ds.dup_bytes += rec.info.len as u64;
                    self.counters.dedup_hits.fetch_add(1, Relaxed);
                    return Ok(Entry::dedup(hash, rec.info));
                }
                Ok(false) | Err(_) => {
                    // A true 64-bit collision (or an unreadable candidate):
                    // store this page unshared.
                    drop(ds);
                    self.counters.dedup_collisions.fetch_add(1, Relaxed);
                    let (h, info) = self.encode_new(page)?;
                    return Ok(Entry::obj(h, info));
                }
            }
        }
        let (handle, info) = self.encode_new(page)?;
        ds.map.insert(hash, DedupRec { handle, info, refs: 1 });
        ds.compr_bytes += info.len as u64;
        ds.huge_pages += info.is_huge() as u64;
        Ok(Entry::dedup(hash, info))
    }

    /// Drop one reference to what `e` points at, freeing the object with its last user.
    pub(crate) fn release(&self, e: Entry) {
        match e.slot() {
            Slot::Same(_) => {}
            Slot::Backed(id, _) => {
                if let Some(t) = &self.tier {
                    t.free_record(id);
                }
            }
            Slot::Obj(h, _) => {
                // The handle came from our own allocator and is unreachable now.
                let _ = self.alloc.free(h);
            }
            Slot::Dedup(hash, _) => {
                let Some(d) = &self.dedup else { return };
                let mut ds = Self::dedup_shard(d, hash).lock();
                let Some(rec) = ds.map.get_mut(&hash) else { return };
                if rec.refs > 1 {
                    rec.refs -= 1;
                    let len = rec.info.len as u64;
                    ds.dup_pages -= 1;
                    ds.dup_bytes -= len;
                } else {
                    let rec = *rec;
                    ds.map.remove(&hash);
                    ds.compr_bytes -= rec.info.len as u64;
                    ds.huge_pages -= rec.info.is_huge() as u64;
                    let _ = self.alloc.free(rec.handle);
                }
            }
        }
    }

    pub(crate) fn read_object(&self, h: Handle, info: ObjInfo, out: &mut [u8]) -> std::result::Result<(), CompressError> {
        let r = self.alloc.read(h, |obj| decode(info, &obj[..info.len as usize], out));
        match r {
            Ok(r) => r,
            Err(e) => Err(CompressError::Corrupt { alg: Algorithm::Lz4, msg: format!("allocator: {e}") }),
        }
    }

    /// Load the page stored under `key` into `buf` (4096 bytes).
    pub fn load(&self, key: u64, buf: &mut [u8]) -> Result<()> {
        if buf.len() != PAGE_SIZE {
            return Err(ZmemError::BadPageSize { len: buf.len() });
        }
        let mut s = self.shard(key).lock();
        if let Some(t) = &self.tier {
            // zswap's referenced bit and zram's ac_time, only where a
            // writeback tier will read them.
            let Some(slot) = s.index.access(key, self.now()) else {
                return Err(ZmemError::NotFound { key });
            };
            let e = *slot;
            if matches!(e.slot(), Slot::Obj(..)) {
                *slot = e.with_referenced(true);
            }
            if let Slot::Backed(id, info) = e.slot() {
                let r = self.load_backed(t, &mut s, key, id, info, buf);
                drop(s);
                self.counters.loads.fetch_add(1, Relaxed);
                return r;
            }
        }
        let Some(e) = s.index.get(key) else {
            return Err(ZmemError::NotFound { key });
        };
        let res = match e.slot() {
            Slot::Same(p) => {
                fill_pattern(buf, p);
                Ok(())
            }
            Slot::Obj(h, info) => self.read_object(h, info, buf),
            Slot::Dedup(hash, info) => match &self.dedup {
                Some(d) => match Self::dedup_shard(d, hash).lock().map.get(&hash) {
                    Some(rec) => self.read_object(rec.handle, info, buf),
                    None => Err(CompressError::Corrupt { alg: Algorithm::Lz4, msg: "shared object missing".into() }),
                },
                None => Err(CompressError::Corrupt { alg: Algorithm::Lz4, msg: "dedup entry in a pool without dedup".into() }),
            },
            Slot::Backed(..) => Err(CompressError::Corrupt {
                alg: Algorithm::Lz4,
                msg: "written-back entry in a pool without a backing store".into(),
            }),
        };
        drop(s);
        self.counters.loads.fetch_add(1, Relaxed);
        res.map_err(|source| {
            self.counters.decompress_fail.fetch_add(1, Relaxed);
            ZmemError::Corrupt { key, source }
        })
    }

    /// Where the page under `key` lives, if there is one.
    pub fn residency(&self, key: u64) -> Option<Residency> {
        let e = self.shard(key).lock().index.get(key)?;
        Some(match e.slot() {
            Slot::Obj(..) => Residency::Ram,
            Slot::Same(_) => Residency::SameFilled,
            Slot::Dedup(..) => Residency::Shared,
            Slot::Backed(..) => Residency::Backed,
        })
    }

    /// Whether `key` holds a page.
    pub fn contains(&self, key: u64) -> bool {
        self.shard(key).lock().index.contains(key)
    }

    /// Drop the page stored under `key`. Returns whether there was one.
    pub fn invalidate(&self, key: u64) -> bool {
        let old = {
            let mut s = self.shard(key).lock();
            let old = s.index.remove(key);
            if let Some(o) = old {
                s.account(o, false);
            }
            old
        };
        match old {
            Some(o) => {
                self.release(o);
                true
            }
            None => false,
        }
    }

    /// Drop every page whose key lies in `range` (frontswap's invalidate_area,
    /// a block device's discard). Returns how many pages were dropped.
    pub fn invalidate_range(&self, range: Range<u64>) -> u64 {
        let span = range.end.saturating_sub(range.start);
        if span <= self.len() as u64 {
            return range.filter(|&k| self.invalidate(k)).count() as u64;
        }
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut victims = Vec::new();
            {
                let mut s = shard.lock();
                s.index.remove_range(&range, &mut victims);
                for &o in &victims {
                    s.account(o, false);
                }
            }
            dropped += victims.len() as u64;
            for o in victims {
                self.release(o);
            }
        }
        dropped
    }

    /// Number of stored pages.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().index.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Move objects out of sparse spans and give emptied spans back to the
    /// OS (zram's `compact`). Returns pages freed.
    pub fn compact(&self) -> u64 {
        self.alloc.compact()
    }

    /// A consistent-enough snapshot of every counter (each shard is read under its lock).
    pub fn stats(&self) -> Stats {
        let mut st = Stats::default();
        let mut index_bytes = 0;
        for s in self.shards.iter() {
            let s = s.lock();
            st.stored_pages += s.index.len() as u64;
            st.compr_data_size += s.compr_bytes;
            st.same_pages += s.same_pages;
            st.huge_pages += s.huge_pages;
            st.bd_count += s.backed_pages;
            index_bytes += s.index.heap_bytes();
            st.lru_bytes += (s.lru.capacity() * std::mem::size_of::<LruItem>()) as u64;
        }
        st.stored_pages -= st.bd_count;
        index_bytes += (self.shards.len() * std::mem::size_of::<Mutex<Shard>>()) as u64;
        let mut dedup_bytes = 0;
        if let Some(d) = &self.dedup {
            for ds in d.iter() {
                let ds = ds.lock();
                st.compr_data_size += ds.compr_bytes;
                st.huge_pages += ds.huge_pages;
                st.dup_pages += ds.dup_pages;
                st.dup_data_size += ds.dup_bytes;
                dedup_bytes += map_bytes(ds.map.capacity(), std::mem::size_of::<(u64, DedupRec)>());
            }
            dedup_bytes += (d.len() * std::mem::size_of::<Mutex<DedupShard>>()) as u64;
        }
        let a = self.alloc.stats();
        st.orig_data_size = st.stored_pages * PAGE_SIZE as u64;
        st.pool_pages = a.pages_used;
        st.alloc_metadata_bytes = a.metadata_bytes;
        st.index_bytes = index_bytes;
        st.meta_data_size = dedup_bytes;
        let mut tier_bytes = st.lru_bytes;
        if let Some(t) = &self.tier {
            t.fill_stats(&mut st);
            tier_bytes += st.backing_metadata_bytes;
        }
        let meta = a.metadata_bytes + index_bytes + dedup_bytes + tier_bytes;
        st.mem_used_total = a.pages_used * PAGE_SIZE as u64 + meta;
        let max_candidate = a.pages_used_max * PAGE_SIZE as u64 + meta;
        st.mem_used_max = self
            .counters
            .mem_used_max
            .fetch_max(max_candidate.max(st.mem_used_total), Relaxed)
            .max(max_candidate)
            .max(st.mem_used_total);
        st.mem_limit = self.counters.mem_limit.load(Relaxed);
        st.pages_compacted = a.pages_compacted;
        st.same_filled_pages = st.same_pages;
        st.pool_total_size = a.pages_used * PAGE_SIZE as u64;
        st.objs_used = a.objs_used;
        st.objs_allocated = a.objs_allocated;
        let max = self.max_pool_pages.load(Relaxed);
        st.max_pool_bytes = if max == u64::MAX { 0 } else { max * PAGE_SIZE as u64 };
        st.accept_threshold_percent = self.cfg.accept_threshold_percent as u64;
        self.counters.fill(&mut st);
        st
    }
}

/// Turn a stored object (`obj`, its exact bytes) back into a page.
pub(crate) fn decode(info: ObjInfo, obj: &[u8], out: &mut [u8]) -> std::result::Result<(), CompressError> {
    if info.tag == TAG_RAW || info.tag == TAG_RAW_INCOMP {
        if obj.len() != PAGE_SIZE {
            return Err(CompressError::WrongLength { alg: Algorithm::Lz4, got: obj.len(), expected: PAGE_SIZE });
        }
        out.copy_from_slice(obj);
        Ok(())
    } else {
        zmem_compress::decompress(Algorithm::from_tag(info.tag)?, obj, out)
    }
}
