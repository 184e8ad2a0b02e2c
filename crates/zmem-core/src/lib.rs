//! The zmem engine: a compressed page store shared by every zmem frontend.
//!
//! # Why
//! Linux trades CPU cycles for I/O with three systems built on one idea:
//! zswap (a compressed cache in front of swap), zram (a compressed RAM block
//! device) and zcache (a compressed second-chance page cache). All three need
//! the same engine: take a 4 KiB page, drop it if it is one repeated word,
//! compress it, pack the result tightly into memory, find it again by key.
//! This crate is that engine, in userspace, so that a block device (NBD or a
//! FUSE file: `zmem-nbd`, `zmem-fuse`), a swap device (`zmem-swap`) and a
//! clean-page cache (`zmem-cache`) all sit on it.
//!
//! # The contract (frontswap/cleancache)
//! [`Pool::store`] puts a 4096-byte page under a 64-bit key (replacing what was
//! there), [`Pool::load`] copies it back, [`Pool::invalidate`] and
//! [`Pool::invalidate_range`] drop keys, [`Pool::stats`] reports counters with
//! the kernel's names (zram `mm_stat`, zswap debugfs, the zram dedup patch's
//! `dup_data_size`/`meta_data_size`). Every failure is a typed [`ZmemError`];
//! a failed store leaves the key's old page in place.
//!
//! # How a page flows
//! 1. **Same-filled check** — if every 8-byte word is equal, the pattern goes
//!    in the index entry and no memory is allocated (zram, not zswap's
//!    zero-only: any repeated word).
//! 2. **Dedup** (optional) — xxh3-64 of the page finds a candidate; the
//!    candidate is decompressed and compared byte for byte; only then is it
//!    shared, with a reference count. A hash match alone never shares. A
//!    page with no twin gets a record of its own only while twins pay for
//!    records (adaptive dedup, `dedup.rs`); otherwise it is stored plainly.
//! 3. **Compress** into a per-thread scratch buffer with the pool's current
//!    compressor. Output at or over the huge threshold is stored raw.
//! 4. **Allocate** with `zmem-alloc`, a zsmalloc-style size-class allocator,
//!    and copy the object in. The handle is stable across compaction.
//! 5. **Index** — the two-word entry goes in the key's shard; a pool of a
//!    device that must outlive its process also records it, whole, in its
//!    ledger (`ledger.rs`), beside the objects in the allocator's arena, so
//!    that another process can open the pool again ([`Pool::open`]).
//!
//! # Trade-offs
//! * Sharded index (64 mutexes by default, each over a hash map of 16-key
//!   blocks) rather than one tree per device: stores and loads from many
//!   threads do not meet on one lock, and runs of keys cost 12 bytes each;
//!   a key without neighbours costs a whole block.
//! * Loads of objects in RAM decompress under the key's shard lock: it is
//!   what keeps the object alive without per-object reference counts on the
//!   hot path. Loads of written-back pages read the disk with no lock held.
//! * With a backing store, a background thread (the shrinker) writes the
//!   coldest objects back ahead of need; only a store that meets a full pool
//!   waits for it, and only a store that needs new memory is ever refused.
//! * `mem_used_total` is honest: allocator pages, allocator metadata, the
//!   index, the dedup table, the LRUs and the backing store's tables are
//!   all counted, from real capacities. And `mem_limit` caps all of it, as
//!   zram's caps its pool: every growth is charged to one budget before it
//!   happens (`zmem_alloc::Budget`), so `mem_used_max` never passes it.

mod admission;
mod charged;
mod cold;
mod dedup;
mod dict;
mod entry;
mod error;
mod extent;
mod index;
mod latency;
mod ledger;
mod lockorder;
mod objects;
mod pool;
mod recompress;
mod shard;
mod stats;
mod tier;

pub use cold::{ColdError, ColdStats, ColdStore, DropCold, Moved, RecordId, MAX_RECORD_PAYLOAD};
pub use dict::{DictConfig, DictSource, TrainReport};
pub use error::{Result, ZmemError};
pub use latency::{BusyClock, Latencies, LatencyHistogram, LATENCY_BOUNDS_NS};
pub use pool::{Pool, PoolConfig, Reopened, Residency, DEFAULT_HUGE_THRESHOLD};
pub use recompress::{Recompress, RecompressReport, MAX_RECOMP_ALGORITHMS};
pub use stats::{RateLimited, Stats};
pub use tier::{Resident, WritebackMode};
/// A pool's arena held in RAM by a process that keeps it for the next one
/// (the keeper): see [`Pool::arena`].
pub use zmem_alloc::ArenaLock;
/// The version of what a pool that can be opened again leaves behind (the
/// arena's layout and the ledger's entries): [`Pool::open`] refuses
/// another.
pub use zmem_alloc::ARENA_VERSION as STATE_VERSION;
pub use zmem_compress::{Algorithm, Compressor, Dictionary};

/// Size of every page the pool stores.
pub const PAGE_SIZE: usize = 4096;
