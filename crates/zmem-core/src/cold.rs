//! What happens to a cold page: the seam between the tier and its store.
//!
//! The writeback tier (`tier.rs`) decides *which* objects leave RAM: it
//! keeps the LRUs, the shrinker and its marks, the second chances and the
//! admission of stores. A [`ColdStore`] decides *what leaving means*, for a
//! batch of compressed objects the shrinker (or an explicit writeback) took
//! from the cold end:
//!
//! * `zmem_backing::BackingStore` keeps each one in a file and can give it
//!   back (zswap's writeback, zram's `backing_dev`): the page's entry then
//!   names its record, and a load reads it.
//! * [`DropCold`] keeps nothing (zcache's clean pages: the page can be
//!   read again from where it came from): the page's entry goes, and a
//!   load of it is [`NotFound`](crate::ZmemError::NotFound), a miss.
//! * `zmem_remote::RemoteStore` keeps them on a Redis Cluster, named by
//!   an id that carries a generation and the hash slot it went to.
//!
//! The trait sees only bytes and ids, never the pool: the pool's index,
//! LRUs and locks stay private to it. A store may keep some objects of a
//! batch and drop others (one `Option` per object).
//!
//! The trait, its ids, its error and its counters live here, with their
//! user, as zswap's `zpool` API lives with zswap: an implementation
//! depends on the engine, never the engine on an implementation, so a
//! frontend that only drops (the clean-page cache) links no file code.

/// The largest payload [`ColdStore::put_batch`] is handed: the tier
/// writes the objects of one index block together as one record (an
/// extent, `extent.rs`), up to this many bytes.
pub const MAX_RECORD_PAYLOAD: usize = 48 << 10;

/// A cold store's name for an object it keeps: a `u64` the store issues
/// and the engine keeps in the page's entry, as given. What the bits mean
/// is the store's business (the backing file's is a table slot and a
/// generation); an id the store did not issue, or has freed, must fail
/// with [`ColdError::NotLive`] when used, never name another object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordId(u64);

impl RecordId {
    /// The id as a `u64`, e.g. to keep in an index entry.
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuild an id from [`to_raw`](Self::to_raw). Any value is accepted;
    /// a value the store did not issue fails when used.
    pub fn from_raw(raw: u64) -> RecordId {
        RecordId(raw)
    }
}

/// A record a cold store copied to a new place (compacting its space),
/// and so to a new id: the engine names `to` wherever it named `from` and
/// frees `from`; if nothing names `from` any more, it frees `to`
/// ([`ColdStore::take_moves`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The key the record was written under (a page's block, or a shared
    /// object's hash).
    pub key: u64,
    pub from: RecordId,
    pub to: RecordId,
}

/// How a cold store fails. A failed [`ColdStore::put_batch`] keeps every
/// object of the batch in RAM; a failed read or free changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum ColdError {
    /// The id is not live in the store: never issued, freed, or moved
    /// under a reader. A load that meets it looks the key up again (its
    /// page may have been rewritten meanwhile).
    #[error("record id {id:#x} is not live in the cold store (never written there, already freed, or stale)")]
    NotLive { id: u64 },
    /// The store failed; its own error (kept whole, with its advice to the
    /// operator) says how.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

/// Counters and sizes of a cold store, with zram's `bd_stat` names where
/// it has them. A store leaves at 0 what it has no such thing for (a store
/// that drops keeps no records).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColdStats {
    /// Live records (zram `bd_count`, in pages).
    pub records: u64,
    /// Bytes of live records, headers included (and the rounding of each
    /// record's place, where a store rounds: the backing file's take
    /// multiples of 16 bytes).
    pub live_bytes: u64,
    /// Bytes the store occupies (the backing file's length).
    pub file_bytes: u64,
    /// Bytes the store accepted: batches, padding and compaction copies.
    pub bytes_written: u64,
    /// Bytes read from the store: record reads and compaction.
    pub bytes_read: u64,
    /// Of those, compaction's.
    pub compaction_bytes_read: u64,
    /// Bytes of the records served to reads, headers included: what the
    /// reads wanted, against which `bytes_read` less compaction's is what
    /// they cost (alignment and read-ahead, less what read-ahead served).
    pub record_bytes_read: u64,
    /// Record reads that went to the store (misses of any read-ahead;
    /// compaction's reads are not counted).
    pub read_ops: u64,
    /// Of those, reads of several records that one request was about to
    /// ask for ([`ColdStore::prefetch`]).
    pub prefetch_ops: u64,
    /// Of those, misses read with the smallest read-ahead (reads looked
    /// scattered).
    pub scattered_reads: u64,
    /// Bytes the reads read past what they wanted (the records asked
    /// for): read-ahead and alignment; and of those, the bytes of records
    /// that later reads found there (read-ahead used).
    pub readahead_bytes: u64,
    pub readahead_used_bytes: u64,
    /// The least a read reads past the records it wants, now (the
    /// read-ahead's floor).
    pub readahead_floor_bytes: u64,
    /// Records served from read-ahead, by how far past what their read
    /// wanted they end: within 1 KiB, 4 KiB, 8 KiB, beyond.
    pub readahead_hits: [u64; 4],
    /// The same hits by how many keys past the highest key of the records
    /// their read wanted: the same key, within 16, 1,024, and beyond (or
    /// before, or not known).
    pub readahead_slot_hits: [u64; 4],
    /// Records written (zram `bd_writes`).
    pub records_written: u64,
    /// Records read successfully (zram `bd_reads`).
    pub records_read: u64,
    /// Segments freed by compaction.
    pub segments_compacted: u64,
    /// Record reads retried because the record moved while they read.
    pub read_retries: u64,
    /// RAM used by the store's tables, from their capacities.
    pub metadata_bytes: u64,
    /// Batches the store refused (their pages stayed in RAM).
    pub failed_writes: u64,
    /// Reads that failed (an error, a timeout, a record that failed its
    /// checks), and reads that found no record.
    pub failed_reads: u64,
    pub missing_reads: u64,
    /// Reads a replica answered because the record's primary copy did not
    /// (a remote tier's master down or hung).
    pub replica_reads: u64,
    /// Round-trip time of a record read: median and 99th percentile, in
    /// nanoseconds (0 for a store that does not measure it).
    pub read_p50_ns: u64,
    pub read_p99_ns: u64,
    /// Batches being written now (the write queue's depth).
    pub in_flight: u64,
    /// Nodes that take no batch now for want of replicas to acknowledge
    /// it (a remote tier's masters with fewer than it asks).
    pub masters_short: u64,
    /// Frees queued and not yet done, and frees given up on.
    pub frees_pending: u64,
    pub frees_failed: u64,
}

/// Where the objects the tier evicts go (see the module notes).
pub trait ColdStore: Send + Sync {
    /// Take a batch of `(key, record)` out of RAM: each record a compressed
    /// object or an extent of several (at most [`MAX_RECORD_PAYLOAD`]
    /// bytes; the key is the first of its index block). For each, in
    /// order: `Some(id)` if it is kept and [`read`](Self::read) can give it
    /// back, `None` if it is dropped. An error keeps the whole batch in RAM.
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, ColdError>;
    /// The object kept as `id` (put under `key`), into `out`. A store that
    /// keeps nothing has no ids to read.
    fn read(&self, id: RecordId, _key: u64, _out: &mut Vec<u8>) -> Result<(), ColdError> {
        Err(ColdError::NotLive { id: id.to_raw() })
    }
    /// Forget the object kept as `id`.
    fn free(&self, id: RecordId) -> Result<(), ColdError> {
        Err(ColdError::NotLive { id: id.to_raw() })
    }
    /// The records the store copied since the last call (a store whose
    /// ids name places, compacting). Until the engine has taken a move,
    /// both ids are live and read the same; the engine names the new one
    /// and frees the old, or frees the new one if nothing names the old.
    fn take_moves(&self) -> Vec<Moved> {
        Vec::new()
    }
    /// The objects `ids` are about to be read: read them ahead, together
    /// where they lie together. A hint; returns the reads it made.
    fn prefetch(&self, _ids: &[RecordId]) -> usize {
        0
    }
    /// An upper bound on what this store's tables grow by for a batch of
    /// `records` holding `bytes` of payload (charged to the pool's budget
    /// before the batch).
    fn growth_bound(&self, _records: usize, _bytes: usize) -> u64 {
        0
    }
    /// RAM its tables hold now (counted in `mem_used_total`).
    fn metadata_bytes(&self) -> u64 {
        0
    }
    /// Fixed RAM it holds for I/O (counted, but not against `max_pool`).
    fn buffer_bytes(&self) -> u64 {
        0
    }
    /// How long its writes may fail for a moment and then heal by
    /// themselves (a cluster's failover): a store waiting for room waits
    /// that long for a failing writeback before it is refused. Zero (a
    /// file, whose failures do not heal): refused after the first round
    /// that fails.
    fn ride_through(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// Its counters (zram's `bd_stat` and the store's sizes).
    fn stats(&self) -> ColdStats {
        ColdStats::default()
    }
    /// Whether it keeps what it is given. A store that drops everything
    /// (a clean cache) is given single objects, never extents: dropping a
    /// block's neighbours with its coldest page would be evicting pages
    /// still in use.
    fn keeps(&self) -> bool {
        true
    }
    /// Whether a store made on what this one leaves can take its records
    /// over ([`adopt`](Self::adopt)): a pool with a ledger
    /// ([`PoolConfig::ledger_keys`](crate::PoolConfig::ledger_keys)) can
    /// have no other.
    fn adoptable(&self) -> bool {
        false
    }
    /// Take the records `ids` name as live, in a store just made on what
    /// the store of a process that died left (the pool's ledger names
    /// them: [`Pool::open`](crate::Pool::open)); for each, whether it was
    /// taken (one that cannot be a live record here is not).
    fn adopt(&self, _ids: &[RecordId]) -> Result<Vec<bool>, ColdError> {
        Err(ColdError::Store("this cold store cannot take over another's records".into()))
    }
    /// The process leaves its records to the next one, which takes them
    /// over ([`adopt`](Self::adopt)): dropping this store must not delete
    /// them. (A file's store deletes nothing when dropped: nothing to do.)
    fn leave(&self) {}
}

/// Drop every cold object: a clean-page cache (zcache), whose pages can be
/// fetched again from their origin. Nothing is ever kept, so nothing is
/// ever read or freed (the trait's defaults).
#[derive(Clone, Copy, Debug, Default)]
pub struct DropCold;

impl ColdStore for DropCold {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, ColdError> {
        Ok(vec![None; objects.len()])
    }
    fn keeps(&self) -> bool {
        false
    }
}
