//! Counters, named as the kernel names them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// Event counters that are not derived from the index (zswap's debugfs names).
#[derive(Default)]
pub(crate) struct Counters {
    pub stores: AtomicU64,
    pub loads: AtomicU64,
    pub reject_alloc_fail: AtomicU64,
    pub pool_limit_hit: AtomicU64,
    pub decompress_fail: AtomicU64,
    pub reject_reclaim_fail: AtomicU64,
    pub dedup_hits: AtomicU64,
    pub dedup_collisions: AtomicU64,
    pub failed_reads: AtomicU64,
    pub failed_writes: AtomicU64,
    pub invalid_io: AtomicU64,
    pub notify_free: AtomicU64,
    pub free_fail: AtomicU64,
    pub recompressed_pages: AtomicU64,
    pub recompress_saved_bytes: AtomicU64,
    pub recompress_marked: AtomicU64,
    /// Warnings from paths that cannot return an error (frees, the shrinker).
    pub warn: RateLimited,
}

impl Counters {
    /// An allocation that failed, counted as zswap counts it (at the limit:
    /// `pool_limit_hit`; otherwise `reject_alloc_fail`), as the error.
    pub fn alloc_failed(&self, e: zmem_alloc::AllocError) -> crate::error::ZmemError {
        match e {
            zmem_alloc::AllocError::LimitReached { .. } => self.pool_limit_hit.fetch_add(1, Relaxed),
            _ => self.reject_alloc_fail.fetch_add(1, Relaxed),
        };
        crate::error::ZmemError::from(e)
    }

    /// A store that needs memory is refused at `max_pool` (`max_pages`).
    pub fn reject_full(&self, max_pages: u64) -> crate::error::ZmemError {
        self.reject_reclaim_fail.fetch_add(1, Relaxed);
        crate::error::ZmemError::PoolFull { limit_bytes: max_pages * crate::entry::PAGE_SIZE as u64 }
    }

    /// A free that failed (a stale handle or record: a bug) cannot be
    /// returned to anyone: it is counted (`free_fail`) and logged.
    pub fn free_failed(&self, msg: &str) {
        self.free_fail.fetch_add(1, Relaxed);
        self.warn.warn(|| format!("could not free a page's storage: {msg}"));
    }

    pub fn fill(&self, st: &mut Stats) {
        st.stores = self.stores.load(Relaxed);
        st.loads = self.loads.load(Relaxed);
        st.reject_alloc_fail = self.reject_alloc_fail.load(Relaxed);
        st.pool_limit_hit = self.pool_limit_hit.load(Relaxed);
        st.decompress_fail = self.decompress_fail.load(Relaxed);
        st.reject_reclaim_fail = self.reject_reclaim_fail.load(Relaxed);
        st.dedup_hits = self.dedup_hits.load(Relaxed);
        st.dedup_collisions = self.dedup_collisions.load(Relaxed);
        st.failed_reads = self.failed_reads.load(Relaxed);
        st.failed_writes = self.failed_writes.load(Relaxed);
        st.invalid_io = self.invalid_io.load(Relaxed);
        st.notify_free = self.notify_free.load(Relaxed);
        st.free_fail = self.free_fail.load(Relaxed);
        st.recompressed_pages = self.recompressed_pages.load(Relaxed);
        st.recompress_saved_bytes = self.recompress_saved_bytes.load(Relaxed);
        st.recompress_marked = self.recompress_marked.load(Relaxed);
        st.warnings_suppressed = self.warn.suppressed_total();
    }
}

/// A warning that may repeat at high rate (a failing disk under a swap
/// storm): logged at most once per interval, with the count of the ones
/// suppressed since.
pub struct RateLimited {
    last: parking_lot::Mutex<Option<std::time::Instant>>,
    suppressed: AtomicU64,
    suppressed_total: AtomicU64,
}

impl Default for RateLimited {
    fn default() -> Self {
        RateLimited { last: parking_lot::Mutex::new(None), suppressed: AtomicU64::new(0), suppressed_total: AtomicU64::new(0) }
    }
}

impl RateLimited {
    const INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

    /// Log `msg()` as a warning, unless one was logged in the last 10 s.
    pub fn warn(&self, msg: impl FnOnce() -> String) {
        let now = std::time::Instant::now();
        {
            let mut last = self.last.lock();
            if last.is_some_and(|t| now.duration_since(t) < Self::INTERVAL) {
                self.suppressed.fetch_add(1, Relaxed);
                self.suppressed_total.fetch_add(1, Relaxed);
                return;
            }
            *last = Some(now);
        }
        match self.suppressed.swap(0, Relaxed) {
            0 => tracing::warn!("{}", msg()),
            n => tracing::warn!("{} ({n} similar warnings suppressed in the last {}s)", msg(), Self::INTERVAL.as_secs()),
        }
    }

    /// Warnings not logged because of the limit, since the start.
    pub fn suppressed_total(&self) -> u64 {
        self.suppressed_total.load(Relaxed)
    }
}

/// A snapshot of a pool's counters.
///
/// The first nine fields are zram's `mm_stat`, in its order; the zswap block
/// uses zswap's debugfs names; `dup_data_size`/`meta_data_size` are the zram
/// dedup patch's. All sizes are bytes, all `*_pages` are 4 KiB pages.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
// (A field an older server did not report reads as 0: the bench reads the
// stats of the binary it is given, which may be older than itself.)
#[serde(default)]
pub struct Stats {
    // zram mm_stat
    /// Uncompressed size of everything stored.
    pub orig_data_size: u64,
    /// Compressed bytes of every stored object (huge pages count 4096; shared objects once).
    pub compr_data_size: u64,
    /// The real footprint: allocator pages + allocator metadata + index + dedup table.
    pub mem_used_total: u64,
    /// zram's mem_limit (0: none); caps mem_used_total (pages and tables).
    pub mem_limit: u64,
    /// High-water mark of mem_used_total.
    pub mem_used_max: u64,
    /// Same-filled pages (no allocation).
    pub same_pages: u64,
    /// Pages freed by compaction, cumulative.
    pub pages_compacted: u64,
    /// Pages stored raw because they did not compress below the huge threshold.
    pub huge_pages: u64,
    /// Pages stored raw since the pool was created (zram's 9th field).
    pub huge_pages_since: u64,

    // zram recompression (`Pool::recompress`)
    /// Objects rewritten smaller by a recompression algorithm, cumulative.
    pub recompressed_pages: u64,
    /// Compressed bytes those rewrites saved, cumulative.
    pub recompress_saved_bytes: u64,
    /// Objects marked as beyond recompression (zram's `incompressible`).
    pub recompress_marked: u64,

    // trained dictionaries (`PoolConfig::dict`)
    /// Id of the dictionary new objects are written with (0: none).
    pub dict_id: u32,
    /// Dictionaries alive (the current one and older ones still in use).
    pub dict_count: u64,
    /// Bytes they hold, with their prepared forms and the sample ring
    /// (counted in mem_used_total).
    pub dict_bytes: u64,
    /// Objects written with a dictionary (in RAM or written back).
    pub dict_pages: u64,
    /// Dictionaries trained, installed, and freed after their last object.
    pub dict_trainings: u64,
    pub dict_installs: u64,
    pub dict_retired: u64,
    /// Sampling pages for the next training round (`--dict auto`).
    pub dict_collecting: bool,

    // zswap debugfs
    pub stored_pages: u64,
    pub same_filled_pages: u64,
    /// Bytes of allocator pages (zswap's pool_total_size).
    pub pool_total_size: u64,
    pub pool_limit_hit: u64,
    pub reject_compress_poor: u64,
    pub reject_compress_fail: u64,
    pub reject_alloc_fail: u64,
    pub decompress_fail: u64,
    /// Stores refused at max_pool, or shrinks that failed to make room.
    pub reject_reclaim_fail: u64,
    /// Pages written back to the backing store, cumulative.
    pub written_back_pages: u64,
    /// Pages the cold store dropped instead (a clean cache; zcache's
    /// evictions), cumulative.
    pub evicted_pages: u64,

    // zram bd_stat (pages), and the backing file in bytes
    /// Pages currently on the backing store.
    pub bd_count: u64,
    /// Pages read from the backing store, cumulative.
    pub bd_reads: u64,
    /// Pages written to the backing store, cumulative.
    pub bd_writes: u64,
    /// Bytes actually written to / read from the backing file.
    pub backing_bytes_written: u64,
    pub backing_bytes_read: u64,
    /// Of the bytes read, compaction's; and the bytes of the records
    /// served to loads (headers included), which the other reads cost
    /// ([`Stats::backing_read_amplification`]).
    pub backing_compaction_bytes_read: u64,
    pub backing_record_bytes_read: u64,
    /// Reads of the backing file for loads (what the read windows missed).
    pub backing_read_ops: u64,
    /// Of those, reads of the written-back pages of one request together.
    pub backing_prefetch_ops: u64,
    /// Of those, reads with the smallest read-ahead (scattered loads).
    pub backing_scattered_reads: u64,
    /// Bytes those reads read past the records they wanted (read-ahead
    /// and alignment), and the bytes of records later loads found there:
    /// read-ahead read against read-ahead used.
    pub backing_readahead_bytes: u64,
    pub backing_readahead_used_bytes: u64,
    /// The least those reads read past the records they want, now (`zmem
    /// swap on --read-ahead`: fixed, or chosen by what a read costs).
    pub backing_readahead_floor_bytes: u64,
    /// Records served from read-ahead, by how far past the bytes their
    /// read wanted they end: within 1 KiB, 4 KiB, 8 KiB, and beyond.
    pub backing_readahead_hits_1k: u64,
    pub backing_readahead_hits_4k: u64,
    pub backing_readahead_hits_8k: u64,
    pub backing_readahead_hits_far: u64,
    /// The same hits by how far past the records their read wanted, in
    /// keys (a swap device's slots): a record is written under the first
    /// key of its block of 16, so in the same block, the next, within
    /// 1,024 keys, and beyond (or before, or not known).
    pub backing_readahead_slot_hits_same: u64,
    pub backing_readahead_slot_hits_next: u64,
    pub backing_readahead_slot_hits_1k: u64,
    pub backing_readahead_slot_hits_far: u64,
    /// Length of the backing file, and bytes of live records in it.
    pub backing_file_bytes: u64,
    pub backing_live_bytes: u64,
    /// RAM used by the backing store's tables (counted in mem_used_total).
    pub backing_metadata_bytes: u64,
    /// Of that, the cold store's fixed I/O buffers (append buffers, read
    /// windows), which do not grow with the data.
    pub backing_buffer_bytes: u64,
    /// RAM the tables hold for the pages that are not in RAM: the
    /// written-back pages' share of the index (its bytes per key) and the
    /// cold store's record tables (without its buffers). Divided by
    /// `bd_count`, what one page costs in RAM once written back
    /// ([`Stats::table_bytes_per_backed_page`]).
    pub backed_table_bytes: u64,
    /// Of `bd_count`, the pages whose index keys are in cold blocks (the
    /// rest are in blocks of keys in RAM), and the cold blocks (256 keys
    /// each at most) that hold them.
    pub cold_index_pages: u64,
    pub cold_index_blocks: u64,
    /// The cold store's own failures: batches it refused, reads that
    /// failed, reads that found no record; frees queued and given up on.
    pub backing_failed_writes: u64,
    pub backing_failed_reads: u64,
    pub backing_missing_reads: u64,
    /// Reads a replica answered because the master did not (a remote
    /// tier riding through a failover).
    pub backing_replica_reads: u64,
    /// Masters that take no writeback now for want of replicas
    /// (`--remote-replicas`): writeback waits for them.
    pub backing_masters_short: u64,
    pub backing_frees_pending: u64,
    pub backing_frees_failed: u64,
    /// A record read's round trip, median and 99th percentile (ns), and
    /// the batches being written now (a remote tier measures these).
    pub backing_read_p50_ns: u64,
    pub backing_read_p99_ns: u64,
    /// Time with at least one read of the cold store in flight (ns): over
    /// `backing_read_ops`, what a read costs however many overlap (the
    /// kernel's `io_ticks` of a disk).
    pub backing_read_busy_ns: u64,
    pub backing_in_flight: u64,
    /// Written-back pages a load brought back into RAM.
    pub promoted_pages: u64,
    /// Loaded pages queued at the cold end under exclusive loads, and
    /// whether loads are exclusive now (`--exclusive-loads auto` switches).
    pub cold_queued_pages: u64,
    /// The last [`Pool::write_back_first`](crate::Pool::write_back_first)
    /// hint:
    /// pages it named, of the objects in RAM when they were listed;
    /// and pages the shrinker has taken from hints in all.
    pub first_out_named: u64,
    pub first_out_of: u64,
    pub first_out_taken: u64,
    pub exclusive_loads: bool,
    /// Writeback batches that failed (the pages stayed in RAM).
    pub writeback_fail: u64,
    /// zswap's max_pool as bytes (0: none), and accept_threshold_percent.
    pub max_pool_bytes: u64,
    /// What max_pool is compared with: pool pages plus the metadata that
    /// grows with the data, at most 3/4 of max_pool of it (pool pages when
    /// there is no max_pool).
    pub max_pool_used_bytes: u64,
    pub accept_threshold_percent: u64,

    // zram dedup patch
    /// Compressed bytes saved by sharing objects.
    pub dup_data_size: u64,
    /// Bytes of dedup metadata (the hash table of shared objects).
    pub meta_data_size: u64,
    /// Pages that share another page's object.
    pub dup_pages: u64,
    pub dedup_hits: u64,
    pub dedup_collisions: u64,
    /// Adaptive dedup: every new page gets a shared record (full), or only
    /// one in 32 (sampling, the hit rate did not pay for the records);
    /// and how many times it switched.
    pub dedup_full: bool,
    pub dedup_switches: u64,

    // breakdown of mem_used_total
    pub pool_pages: u64,
    pub alloc_metadata_bytes: u64,
    pub index_bytes: u64,
    /// The ledger's pages (`PoolConfig::ledger_keys`: every key's entry,
    /// kept in the arena so that the pool can be opened again); counted in
    /// `index_bytes`.
    pub ledger_bytes: u64,
    /// Pages that could not be proven right when the pool was opened again
    /// (`Pool::open`): their reads fail (EIO) until they are written or
    /// dropped.
    pub lost_pages: u64,
    /// LRU queues (writeback tier only).
    pub lru_bytes: u64,
    pub objs_allocated: u64,
    pub objs_used: u64,
    pub stores: u64,
    pub loads: u64,

    // zram io_stat
    /// Loads that failed (an error other than "not stored").
    pub failed_reads: u64,
    /// Stores that failed (refused or errored; the old page stayed).
    pub failed_writes: u64,
    /// Requests with a bad page size.
    pub invalid_io: u64,
    /// Pages freed by invalidation (zram's slot-free notifications and discards).
    pub notify_free: u64,
    /// Frees that failed (a stale handle or record: a bug, counted and logged).
    pub free_fail: u64,
    /// Repeated warnings not logged because of the rate limit.
    pub warnings_suppressed: u64,
}

impl Stats {
    /// zram's `/sys/block/zramX/mm_stat` line, same fields, same order.
    pub fn mm_stat(&self) -> String {
        format!(
            "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since
        )
    }

    /// zram's `/sys/block/zramX/io_stat` line: failed_reads failed_writes
    /// invalid_io notify_free.
    pub fn io_stat(&self) -> String {
        format!("{:>8} {:>8} {:>8} {:>8}", self.failed_reads, self.failed_writes, self.invalid_io, self.notify_free)
    }

    /// zram's `/sys/block/zramX/bd_stat` line: bd_count bd_reads bd_writes (pages).
    pub fn bd_stat(&self) -> String {
        format!("{:>8} {:>8} {:>8}", self.bd_count, self.bd_reads, self.bd_writes)
    }

    /// Bytes the backing file's reads for loads cost per byte of record
    /// they served (compaction's reads left out): 1.0 when every byte read
    /// is a record a load asked for, more for alignment and read-ahead that
    /// nothing used. `None` before any record is read.
    pub fn backing_read_amplification(&self) -> Option<f64> {
        let read = self.backing_bytes_read.saturating_sub(self.backing_compaction_bytes_read);
        (self.backing_record_bytes_read > 0).then(|| read as f64 / self.backing_record_bytes_read as f64)
    }

    /// What a read of the cold store costs, however many overlap:
    /// `backing_read_busy_ns / backing_read_ops`. `None` before a read.
    pub fn backing_read_cost_ns(&self) -> Option<u64> {
        (self.backing_read_ops > 0).then(|| self.backing_read_busy_ns / self.backing_read_ops)
    }

    /// The share of the bytes read past what reads wanted that later
    /// loads used. `None` before any read-ahead.
    pub fn readahead_used_share(&self) -> Option<f64> {
        (self.backing_readahead_bytes > 0).then(|| self.backing_readahead_used_bytes as f64 / self.backing_readahead_bytes as f64)
    }

    /// Bytes of RAM per written-back page, every table included
    /// (`backed_table_bytes / bd_count`); `None` with nothing written back.
    pub fn table_bytes_per_backed_page(&self) -> Option<f64> {
        (self.bd_count > 0).then(|| self.backed_table_bytes as f64 / self.bd_count as f64)
    }

    /// The share of the pool that holds compressed data: compressed bytes
    /// over what `max_pool` is compared with (pool pages and the tables
    /// that grow with the data), or over `mem_used_total` without a
    /// `max_pool`. The rest is allocator slack and tables. `None` when
    /// the pool holds nothing.
    pub fn pool_data_share(&self) -> Option<f64> {
        let held = if self.max_pool_bytes > 0 { self.max_pool_used_bytes } else { self.mem_used_total };
        (held > 0).then(|| self.compr_data_size as f64 / held as f64)
    }
}
