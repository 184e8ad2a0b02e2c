//! What happens to a cold page: the seam between the tier and its store.
//!
//! The writeback tier (`tier.rs`) decides *which* objects leave RAM: it
//! keeps the LRUs, the shrinker and its marks, the second chances and the
//! admission of stores. A [`ColdStore`] decides *what leaving means*, for a
//! batch of compressed objects the shrinker (or an explicit writeback) took
//! from the cold end:
//!
//! * [`BackingStore`] keeps each one in a file and can give it back
//!   (zswap's writeback, zram's `backing_dev`): the page's entry then names
//!   its record, and a load reads it.
//! * [`DropCold`] keeps nothing (zcache's clean pages: the page can be
//!   read again from where it came from): the page's entry goes, and a
//!   load of it is [`NotFound`](crate::ZmemError::NotFound), a miss.
//! * A remote tier is a third implementation: a store that keeps objects
//!   elsewhere and names them by an id.
//!
//! The trait sees only bytes and ids, never the pool: the pool's index,
//! LRUs and locks stay private to it. A store may keep some objects of a
//! batch and drop others (one `Option` per object).

use zmem_backing::{BackingError, BackingStats, BackingStore, RecordId};

/// Where the objects the tier evicts go (see the module notes).
pub trait ColdStore: Send + Sync {
    /// Take a batch of `(key, compressed object)` out of RAM. For each, in
    /// order: `Some(id)` if it is kept and [`read`](Self::read) can give it
    /// back, `None` if it is dropped. An error keeps the whole batch in RAM.
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, BackingError>;
    /// The object kept as `id` (put under `key`), into `out`. A store that
    /// keeps nothing has no ids to read.
    fn read(&self, id: RecordId, _key: u64, _out: &mut Vec<u8>) -> Result<(), BackingError> {
        Err(BackingError::InvalidRecord { id: id.to_raw() })
    }
    /// Forget the object kept as `id`.
    fn free(&self, id: RecordId) -> Result<(), BackingError> {
        Err(BackingError::InvalidRecord { id: id.to_raw() })
    }
    /// The objects `ids` are about to be read: read them ahead, together
    /// where they lie together. A hint; returns the reads it made.
    fn prefetch(&self, _ids: &[RecordId]) -> usize {
        0
    }
    /// An upper bound on what this store's tables grow by for a batch of
    /// `objects` (charged to the pool's budget before the batch).
    fn growth_bound(&self, _objects: usize) -> u64 {
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
    /// Its counters (zram's `bd_stat` and the backing file's sizes).
    fn stats(&self) -> BackingStats {
        BackingStats::default()
    }
}

impl ColdStore for BackingStore {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, BackingError> {
        Ok(self.write_batch(objects)?.into_iter().map(Some).collect())
    }
    fn read(&self, id: RecordId, key: u64, out: &mut Vec<u8>) -> Result<(), BackingError> {
        BackingStore::read(self, id, key, out)
    }
    fn free(&self, id: RecordId) -> Result<(), BackingError> {
        BackingStore::free(self, id)
    }
    fn prefetch(&self, ids: &[RecordId]) -> usize {
        BackingStore::prefetch(self, ids)
    }
    fn growth_bound(&self, objects: usize) -> u64 {
        BackingStore::growth_bound(self, objects)
    }
    fn metadata_bytes(&self) -> u64 {
        BackingStore::metadata_bytes(self)
    }
    fn buffer_bytes(&self) -> u64 {
        BackingStore::buffer_bytes(self)
    }
    fn stats(&self) -> BackingStats {
        BackingStore::stats(self)
    }
}

/// Drop every cold object: a clean-page cache (zcache), whose pages can be
/// fetched again from their origin. Nothing is ever kept, so nothing is
/// ever read or freed (the trait's defaults).
#[derive(Clone, Copy, Debug, Default)]
pub struct DropCold;

impl ColdStore for DropCold {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, BackingError> {
        Ok(vec![None; objects.len()])
    }
}
