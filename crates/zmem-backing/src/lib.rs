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
//! file of checksummed records with stable ids.
//!
//! # Layout
//! The file is a sequence of fixed [`SEGMENT_SIZE`] (1 MiB) segments. A
//! record is a [`RECORD_HEADER_SIZE`] (16-byte) little-endian header —
//! magic `u16`, payload length `u16`, key `u64`, checksum `u32` (the low 32
//! bits of xxh3-64 over the key's 8 bytes then the payload) — followed by
//! the payload, with **no per-record padding**.
//! [`BackingStore::write_batch`] appends a whole batch at the open
//! segment's tail in one write, padded to 4096 only at its end, so the
//! tail stays aligned for `O_DIRECT`. A batch that does not fit in the
//! open segment continues in a fresh one (one write per segment touched);
//! 64 incompressible pages take 263 KiB, a quarter of a segment. Fresh
//! segments come from the free list (lowest index first) before the file
//! grows, so the file fills from the front.
//!
//! # Tables (RAM)
//! A [`RecordId`] names a slot in a record table (`Vec` of 16-byte
//! entries: segment, offset, payload length, generation). Freed slots are
//! threaded into a free list and their generation bumped, so a stale or
//! freed id is caught ([`BackingError::InvalidRecord`]) rather than read
//! as someone else's page. Each segment tracks its live bytes, live record
//! count and the slots appended to it (for compaction). The key is not
//! kept in RAM: it is in the header, and [`BackingStore::read`] checks it.
//! [`BackingStats::metadata_bytes`] reports the tables' size from their
//! capacities (about 16–24 bytes per record). Appends and compaction also
//! own two 1 MiB aligned buffers; each reading thread owns a 16 KiB one.
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
//! records goes back on the free list. [`BackingStore::compact`] re-appends
//! the live records of every closed segment that is under half live
//! (sparsest first), updates their table entries (ids stay valid), and
//! frees the segment; then, while the file is longer than twice the live
//! bytes plus two segments and a free segment lies below its end, it moves
//! the last segment's records down and truncates the file. Compaction runs
//! automatically after a write when the occupied segments exceed twice the
//! live bytes plus one segment, but then goes only as far as it must: sparse
//! segments until the occupied ones are back under that target, and a
//! dense last segment only when the file is over `4 × live + 4 segments`
//! (records die by themselves, under a swap storm within seconds, and
//! every record moved is read and written again). So under any churn the
//! file stays within about `4 × live + 4 segments`, and an explicit
//! `compact` brings it to `2 × live + 2 segments`. A record that fails verification during
//! compaction is never copied (that could make a transient read fault
//! permanent): its segment is left alone and logged.
//!
//! # Failure atomicity
//! An append reserves space, writes, and only then commits the table
//! entries. If any write fails or is short, the reserved segments go back
//! to the free list, the open segment's tail does not move, and the error
//! is returned: nothing was recorded, the caller still owns its data, and
//! the next append overwrites the garbage.
//!
//! # Concurrency
//! [`BackingStore`] is `Send + Sync`. One `RwLock` guards the tables;
//! appends and compaction are serialised by a separate mutex and do their
//! writes **without** the table lock (they only write space no entry points
//! to), taking it briefly to reserve and to commit. Reads take the table
//! lock only to look a record up, and do their `pread` without it: a live
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
//! nothing after a restart, and [`BackingStore::open`] truncates it. It
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
mod store;

pub use error::BackingError;
pub use file::{BlockFile, Existing, FaultyFile, MemFile, OsFile};
pub use store::{BackingStore, BUFFER_BYTES, RECORD_HEADER_SIZE, SEGMENT_SIZE};

/// Largest payload (and the page size zmem stores).
pub const PAGE_SIZE: usize = 4096;

/// The name of a record in a [`BackingStore`]. Stable for the record's
/// whole life (compaction moves the record, not the id); never 0. The low
/// 32 bits are the table slot + 1, the high 32 bits its generation, so an
/// id kept after [`BackingStore::free`] is rejected (until the slot's
/// generation wraps after 2³² reuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordId(u64);

impl RecordId {
    /// The id as a `u64`, e.g. to keep in an index entry. Never 0.
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuild an id from [`to_raw`](Self::to_raw). Any value is accepted;
    /// a value this store did not issue fails with
    /// [`BackingError::InvalidRecord`] when used.
    pub fn from_raw(raw: u64) -> RecordId {
        RecordId(raw)
    }
}

/// Counters and sizes of a [`BackingStore`] (cf. zram's `bd_stat`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackingStats {
    /// Live records (zram `bd_count`, in pages).
    pub records: u64,
    /// Bytes of live records on disk, headers included.
    pub live_bytes: u64,
    /// Length of the backing file.
    pub file_bytes: u64,
    /// Bytes the file accepted: batches, padding and compaction copies.
    pub bytes_written: u64,
    /// Bytes read from the file: record reads and compaction.
    pub bytes_read: u64,
    /// Record reads that went to the file (misses of the read windows;
    /// compaction's reads are not counted).
    pub read_ops: u64,
    /// Of those, reads of several records that one request was about to
    /// ask for ([`BackingStore::prefetch`]).
    pub prefetch_ops: u64,
    /// Of those, misses read with the smallest read-ahead (reads looked
    /// scattered).
    pub scattered_reads: u64,
    /// Records appended by `write_batch` (zram `bd_writes`).
    pub records_written: u64,
    /// Records read successfully (zram `bd_reads`).
    pub records_read: u64,
    /// Segments freed by compaction.
    pub segments_compacted: u64,
    /// Lock-free record reads retried because a segment was freed while
    /// they were reading.
    pub read_retries: u64,
    /// RAM used by the record and segment tables, from their capacities.
    pub metadata_bytes: u64,
}
