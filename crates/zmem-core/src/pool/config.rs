//! How a pool is set up ([`PoolConfig`]) and what a stored page is
//! ([`Residency`]): the pool's public configuration, checked once when
//! the pool is made.

use zmem_compress::Compressor;

use crate::dict::DictConfig;
use crate::entry::PAGE_SIZE;
use crate::error::{Result, ZmemError};
use crate::recompress::MAX_RECOMP_ALGORITHMS;

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
    /// Compressor for new objects (recompression may rewrite them with another).
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
    /// (allocator tables, index, writeback queues, dedup table, the backing store's
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
    /// So a loaded object goes to the cold end of the writeback order, to be the first
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
    /// (docs/experiments/exclusive-loads.md).
    /// Off by default; [`Pool::set_exclusive_loads`] switches them at run
    /// time (`zmem swap on` does, following the swap's fullness).
    pub exclusive_loads: bool,
    /// A written-back page that is loaded comes back to RAM (and leaves
    /// the file) while the pool is under its accept threshold: it has just
    /// proved hot. Off, it is served from the file and stays there, as
    /// zram serves its backing device's pages and as exclusive loads do,
    /// so the pool's RAM goes to pages not loaded since their store: for
    /// swap, whose loads the kernel keeps in its own RAM (its swap cache)
    /// until it needs the memory, a promoted page is a second copy of one
    /// the workload holds. On by default.
    pub promote_loads: bool,
    /// zram's `recomp_algorithm`: up to three algorithms for
    /// [`Pool::recompress`], by priority (the first is priority 1; the
    /// pool's `compressor` is priority 0). Empty: no recompression.
    pub recomp_algorithms: Vec<Compressor>,
    /// Dictionaries: none, trained from the pool's pages, or given
    /// (`dict.rs`). zstd stores and recompressions use one when there is
    /// one; lz4 stores only with `dict.lz4`.
    pub dict: DictConfig,
    /// Keep every key's entry in the ledger too, for keys below this (a
    /// device's pages; a multiple of 256), so that another process can
    /// open the pool where this one left it ([`Pool::open`], `ledger.rs`).
    /// A store of a key past it is refused. The pool's dictionaries are
    /// kept there too (at most 1 MiB each). For pools without dedup, whose
    /// cold store (if any) can take its records over
    /// (`ColdStore::adoptable`: a backing file), so far. `None`: no ledger.
    pub ledger_keys: Option<u64>,
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
            promote_loads: true,
            recomp_algorithms: Vec::new(),
            dict: DictConfig::default(),
            ledger_keys: None,
        }
    }
}

impl PoolConfig {
    /// Keep a ledger for a device of `pages` pages (rounded up to the
    /// ledger's multiple), if a pool of these settings can keep one (no
    /// dedup, no dictionary past the ledger's room; a cold store other than
    /// a backing file, one that can take its records over, is the caller's
    /// to rule out).
    /// Returns whether it does.
    pub fn keep_ledger(&mut self, pages: u64) -> bool {
        let keys = pages.max(1).next_multiple_of(zmem_alloc::TABLE_PAGE_ENTRIES as u64);
        self.ledger_keys = Some(keys);
        let can = self.check().is_ok();
        if !can {
            self.ledger_keys = None;
        }
        can
    }

    /// Refuse settings no pool can run with, saying which and why.
    pub(crate) fn check(&self) -> Result<()> {
        if !(1..=100).contains(&self.accept_threshold_percent) {
            return Err(ZmemError::Config(format!("accept_threshold_percent {} must be between 1 and 100", self.accept_threshold_percent)));
        }
        if self.max_pool == Some(0) {
            return Err(ZmemError::Config("max_pool must be more than 0 bytes".into()));
        }
        if self.huge_threshold < 64 || self.huge_threshold > PAGE_SIZE {
            return Err(ZmemError::Config(format!("huge_threshold {} must be between 64 and 4096 bytes", self.huge_threshold)));
        }
        if !(1..=64).contains(&self.max_span_pages) {
            return Err(ZmemError::Config(format!("max_span_pages {} must be between 1 and 64", self.max_span_pages)));
        }
        if let Some(keys) = self.ledger_keys {
            if keys == 0 || keys % zmem_alloc::TABLE_PAGE_ENTRIES as u64 != 0 {
                return Err(ZmemError::Config(format!("ledger_keys {keys} must be a positive multiple of {}", zmem_alloc::TABLE_PAGE_ENTRIES)));
            }
            if self.dedup {
                return Err(ZmemError::Config("a pool that can be opened again (a ledger) cannot have dedup yet".into()));
            }
            let given = match &self.dict.source {
                crate::dict::DictSource::Bytes(b) => b.len(),
                _ => 0,
            };
            let largest = given.max(if self.dict.source == crate::dict::DictSource::Auto { self.dict.max_size } else { 0 });
            if largest > crate::ledger::DICT_KEPT_BYTES {
                return Err(ZmemError::Config(format!(
                    "a {largest}-byte dictionary: a pool that can be opened again (a ledger) keeps dictionaries of at most {} bytes",
                    crate::ledger::DICT_KEPT_BYTES
                )));
            }
        }
        if self.recomp_algorithms.len() > MAX_RECOMP_ALGORITHMS {
            return Err(ZmemError::Config(format!(
                "{} recompression algorithms ({}): at most {MAX_RECOMP_ALGORITHMS}, as zram's priorities 1 to 3",
                self.recomp_algorithms.len(),
                crate::recompress::names(&self.recomp_algorithms)
            )));
        }
        Ok(())
    }
}
