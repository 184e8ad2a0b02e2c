//! The backing store of zmem's writeback tier.
//!
//! # Why
//! When a compressed pool fills up, the kernel pushes its coldest pages out
//! to disk: zswap writes them back to the swap device, zram writes idle or
//! huge pages to its `backing_dev`. Both write whole, *uncompressed* 4 KiB
//! pages, so every written-back page costs 4 KiB of I/O and 4 KiB of disk
//! even when it compressed to 1 KiB. zmem writes the **compressed object**
//! instead, packed tightly, so a written-back page costs about its
//! compressed size. This crate is that store: an append-only, segmented
//! file of checksummed records, each named by its place.
//!
//! # Layout
//! The file is a sequence of fixed [`SEGMENT_SIZE`] (1 MiB) segments. A
//! record is a [`RECORD_HEADER_SIZE`] (16-byte) little-endian header —
//! magic `u16`, payload length `u16`, key `u64`, checksum `u32` (the low 32
//! bits of xxh3-64 over the key's 8 bytes then the payload) — followed by
//! the payload (a compressed page, or the tier's extent of an index
//! block's pages, at most [`MAX_PAYLOAD`] bytes), each record starting on
//! a 16-byte boundary (zeros between).
//! [`BackingStore::write_batch`] appends a whole batch at the open
//! segment's tail in one write, padded to 4096 only at its end, so the
//! tail stays aligned for `O_DIRECT`. A batch that does not fit in the
//! open segment continues in a fresh one (one write per segment touched);
//! 64 incompressible pages take 263 KiB, a quarter of a segment. Fresh
//! segments come from the free list (lowest index first) before the file
//! grows, so the file fills from the front.
//!
//! # Tables (RAM)
//! A [`RecordId`] is the record's place: its segment, its offset there
//! and its span (records start on 16-byte boundaries and take multiples
//! of 16 bytes, so 16 bits and 12), with the segment's generation, in 64
//! bits, of which the 28 below the segment are all the engine keeps for
//! each of a segment's records it names in a cold index block. The exact
//! length is in the record's header, which must round up to the span.
//! There is no record table: each segment keeps the offsets of its live
//! records, sorted, 2 bytes a record (a closed segment's list gives back
//! its room as its records die, 32 bytes at a time), and a live id is one
//! whose segment has its generation and lists its offset (with room for
//! its span before the next record).
//! A freed id is refused ([`BackingError::InvalidRecord`]) rather than
//! read as someone else's page: its offset leaves the list, and a
//! segment's generation moves each time it is freed, so an id from before
//! is dead after (until the 8-bit generation wraps, 255 reuses of that
//! segment later; the header's key and checksum are checked on every read
//! too). The key is not kept in RAM: it is in the header, and
//! [`BackingStore::read`] checks it. [`BackingStore::metadata_bytes`]
//! reports the tables' size from their capacities (the live lists, the
//! segment table and its free list, a byte a segment for the generations
//! of segments truncated away). Appends and compaction also own two 1 MiB
//! aligned buffers; each reading thread owns a 16 KiB one.
//!
//! # Reads
//! A read looks the id up, reads the 4096-aligned span covering the record
//! (1–3 blocks with `O_DIRECT`, exactly the record otherwise), and checks
//! magic, length, key and checksum before copying the payload out. Any
//! mismatch is [`BackingError::Checksum`]; corrupt bytes are never
//! returned.
//!
//! # Space: freeing, compaction, truncation
//! Freeing a record only updates the tables. A closed segment with no live
//! records goes back on the free list. [`BackingStore::compact`] copies
//! the live records of every closed segment that is under half live
//! (sparsest first) to the open segment. A copy is at a new place, so it
//! has a new id: the store queues a [`Moved`](zmem_core::Moved) for each
//! (key, old id, new id) and marks the segment evacuated. Whoever keeps
//! the old id (the engine's tier, [`BackingStore::take_moves`]) names the
//! copy instead and frees the old record, or frees the copy if it no
//! longer keeps the old one; until then both are live and read the same,
//! and the evacuated segment is freed with the last of its records. Then,
//! while the file is longer than twice the live bytes plus two segments
//! and a free segment lies below its end (and no copies wait to be taken),
//! it copies the last segment's records down, and truncates the file once
//! they are freed. At most 4096 records are copied a call. Compaction runs
//! automatically after a write when the occupied segments (evacuated ones
//! counted as free) exceed twice the live bytes plus one segment, but then
//! goes only as far as it must: sparse segments until the occupied ones
//! are back under that target, and a dense last segment only when the
//! file is over `4 × live + 4 segments` (records die by themselves, under
//! a swap storm within seconds, and every record copied is read and
//! written again). So under any churn, with the moves taken, the file
//! stays within about `4 × live + 4 segments`, and an explicit `compact`
//! (repeated while it copies) brings it to `2 × live + 2 segments`. A
//! record that fails verification during compaction is never copied (that
//! could make a transient read fault permanent): its segment is left alone
//! and logged.
//!
//! # Failure atomicity
//! An append reserves space, writes, and only then makes its records
//! live. If any write fails or is short, the reserved segments go back
//! to the free list, the open segment's tail does not move, and the error
//! is returned: nothing was recorded, the caller still owns its data, and
//! the next append overwrites the garbage.
//!
//! # Concurrency
//! [`BackingStore`] is `Send + Sync`. One `RwLock` guards the tables;
//! appends and compaction are serialised by a separate mutex and do their
//! writes **without** the table lock (they only write space no live id
//! names), taking it briefly to reserve and to commit. Reads take the
//! table lock only to look a record up, and do their `pread` without it: a live
//! record's bytes can only be overwritten after its segment is freed, and
//! every segment free bumps a counter, so a read that saw the counter move
//! during its I/O reads again (after a few tries it holds the lock across
//! the I/O, so it always finishes). A stuck read blocks nobody.
//!
//! # I/O
//! All I/O goes through the [`BlockFile`] trait: [`OsFile`] is the real
//! file (`O_DIRECT` when the filesystem allows, buffered otherwise, and it
//! tells you why); [`MemFile`] and [`FaultyFile`] are test doubles. The
//! store keeps no on-disk index: like swap, the file's contents mean
//! nothing after a restart, and [`BackingStore::open`] truncates it. Only
//! a swap device's keeper, which holds the file open across its servers,
//! has the next server's store take over the records its pool still
//! names ([`BackingStore::adopt`], from the ids in the pool's ledger). It
//! opens only a regular file or a block device, never through a symbolic
//! link, and refuses one that holds data other than a zmem store unless
//! told to overwrite it ([`Existing`]).
//!
//! # Size limit
//! An optional limit caps the file length, in whole segments. Appends may
//! fill all but one segment of it; the last is kept for compaction, which
//! always needs a place to move records to. An append that finds no room
//! compacts and retries once before failing with [`BackingError::Full`].
//!
//! A full *filesystem* is the same problem without a known limit. Whenever
//! the file grows by a segment for an append, the blocks of that segment
//! and of one spare after it are reserved (`fallocate`, keeping the file's
//! length). When the filesystem cannot reserve them, the append compacts:
//! the live records of sparse segments move into the spare, which was
//! reserved earlier, and the segments they leave are reused. Only if that
//! frees nothing does the append fail, with [`BackingError::NoSpace`].
//! There is no `unsafe` code in this crate.

#![forbid(unsafe_code)]

mod error;
mod file;
mod record;
mod store;

pub use error::BackingError;
pub use file::{BlockFile, Existing, FaultyFile, MemFile, OsFile};
pub use record::{MAX_PAYLOAD, RECORD_HEADER_SIZE};
pub use store::{BackingStore, BUFFER_BYTES, MIN_READAHEAD, RECORD_ALIGN, SEGMENT_SIZE};

/// The engine's name for a cold object, which this store issues (see the
/// [`ColdStore`] implementation for what its bits mean here).
pub use zmem_core::RecordId;
use zmem_core::{ColdError, ColdStats, ColdStore};

/// Largest payload (and the page size zmem stores).
pub const PAGE_SIZE: usize = 4096;

impl From<BackingError> for ColdError {
    /// A record that is not live is the engine's retryable case; every
    /// other failure is kept whole, with its advice to the operator.
    fn from(e: BackingError) -> ColdError {
        match e {
            BackingError::InvalidRecord { id } => ColdError::NotLive { id },
            e => ColdError::Store(Box::new(e)),
        }
    }
}

/// The engine's seam: the tier hands batches of cold objects to the file
/// and reads them back by id. A [`RecordId`] of this store is the record's
/// place and its segment's generation (bits 0..12 its span and 12..28 its
/// offset, in 16-byte units, 28..32 zero, 32..56 the segment, 56..64 the
/// generation, never 0), so an id kept after [`BackingStore::free`] is
/// refused; compaction gives a record a new id, which the tier takes from
/// [`ColdStore::take_moves`].
impl ColdStore for BackingStore {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, ColdError> {
        Ok(self.write_batch(objects)?.into_iter().map(Some).collect())
    }
    fn read(&self, id: RecordId, key: u64, out: &mut Vec<u8>) -> Result<(), ColdError> {
        Ok(BackingStore::read(self, id, key, out)?)
    }
    fn free(&self, id: RecordId) -> Result<(), ColdError> {
        Ok(BackingStore::free(self, id)?)
    }
    fn take_moves(&self) -> Vec<zmem_core::Moved> {
        BackingStore::take_moves(self)
    }
    fn prefetch(&self, ids: &[RecordId]) -> usize {
        BackingStore::prefetch(self, ids)
    }
    fn growth_bound(&self, records: usize, bytes: usize) -> u64 {
        BackingStore::growth_bound(self, records, bytes)
    }
    fn metadata_bytes(&self) -> u64 {
        BackingStore::metadata_bytes(self)
    }
    fn buffer_bytes(&self) -> u64 {
        BackingStore::buffer_bytes(self)
    }
    fn stats(&self) -> ColdStats {
        BackingStore::stats(self)
    }
    fn adoptable(&self) -> bool {
        true
    }
    fn adopt(&self, ids: &[RecordId]) -> Result<Vec<bool>, ColdError> {
        Ok(BackingStore::adopt(self, ids)?)
    }
}
