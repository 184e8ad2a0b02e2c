//! The writeback tier: an LRU with second chance over the pool's objects,
//! and compressed writeback to a backing file (zmem-backing).
//!
//! # Design
//! zswap keeps every entry on an LRU; when its pool is full the shrinker
//! walks the LRU from the cold end, rotating entries a load has marked
//! referenced (one more round in RAM) and writing the rest back to swap.
//! zram instead writes back on request (`writeback` of idle, huge or
//! incompressible pages, under a `writeback_limit` budget). zmem does both,
//! with two differences:
//!
//! * **Compressed writeback.** The object goes to the file as it is in RAM,
//!   packed with its neighbours in one write, so a written-back page costs
//!   its compressed size in I/O, not 4 KiB.
//! * **No LRU inversion.** A store that takes the pool over `max_pool` is
//!   accepted; the cold end of the LRU makes room for it. zswap instead
//!   rejects the new (hot) page to the swap device while old cold pages stay.
//!
//! # LRU
//! Each index shard keeps a FIFO of [`LruItem`]s in store order; items carry
//! a pool-wide sequence number so the shrinker can start from the shard
//! whose oldest item is oldest overall, and the generation of the entry they
//! were queued for, so an overwritten or invalidated key leaves a stale item
//! that is simply skipped (and swept when stale items outnumber live ones).
//! A load sets the entry's referenced bit; the shrinker clears it and
//! re-queues the item at the hot end instead of writing it back. All of this
//! happens under the shard lock the store or load already holds: no extra
//! lock on the hot path, and none at all in pools without a backing store.
//!
//! # Loads of written-back pages
//! A load reads the record (its checksum is verified: a mismatch is an
//! error, never data), decompresses it, and — if the pool is under its
//! accept threshold — brings the object back into RAM and frees the record:
//! the page has just proved hot. Otherwise it is served from the file and
//! stays there (zram's behaviour for pages on its backing device).
//!
//! Deduplicated objects (shared by several keys) and same-filled pages (which
//! hold no memory) are never written back.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};
use zmem_alloc::Handle;
use zmem_backing::{BackingStore, RecordId};

use crate::entry::{Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::pool::{decode, LruItem, Pool, Shard};
use crate::stats::Stats;

/// Pages written back per batch (one write to the file).
const BATCH: usize = 64;

/// What [`Pool::writeback`] writes back (zram's `writeback` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritebackMode {
    /// Pages not accessed for at least this many seconds.
    Idle(u32),
    /// Pages stored raw because they compressed to the huge threshold or more.
    Huge,
    /// Pages the compressor could not shrink at all.
    Incompressible,
    /// Every object in RAM.
    All,
}

pub(crate) struct Tier {
    pub store: BackingStore,
    seq: AtomicU32,
    shrinking: Mutex<()>,
    written_back: AtomicU64,
    promoted: AtomicU64,
    writeback_fail: AtomicU64,
}

/// An object picked for writeback, and where its bytes sit in the batch.
struct Victim {
    key: u64,
    entry: Entry,
    handle: Handle,
    info: ObjInfo,
    item: Option<LruItem>,
    off: usize,
}

impl Tier {
    pub fn new(store: BackingStore) -> Tier {
        Tier {
            store,
            seq: AtomicU32::new(0),
            shrinking: Mutex::new(()),
            written_back: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
            writeback_fail: AtomicU64::new(0),
        }
    }

    fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Stamp a new entry with the shard's next generation and, if it holds
    /// an object in RAM, queue it at the hot end of the shard's LRU.
    pub fn enqueue(&self, s: &mut Shard, key: u64, e: Entry) -> Entry {
        let gen = s.next_gen;
        s.next_gen = s.next_gen.wrapping_add(1);
        let e = e.with_gen(gen);
        if matches!(e.slot(), Slot::Obj(..)) {
            s.lru.push_back(LruItem { key, seq: self.next_seq(), gen });
        }
        e
    }

    /// Sweep stale items once they outnumber the shard's entries.
    pub fn trim_lru(&self, s: &mut Shard) {
        if s.lru.len() <= 2 * s.index.len() + 64 {
            return;
        }
        let index = &s.index;
        s.lru.retain(|it| {
            index
                .get(it.key)
                .is_some_and(|e| e.gen() == it.gen && matches!(e.slot(), Slot::Obj(..)))
        });
        s.lru.shrink_to(s.lru.len() * 2 + 64);
    }

    pub fn free_record(&self, id: u64) {
        if let Err(e) = self.store.free(RecordId::from_raw(id)) {
            tracing::warn!("freeing backing record {id:#x}: {e}");
        }
    }

    pub fn fill_stats(&self, st: &mut Stats) {
        let b = self.store.stats();
        st.bd_reads = b.records_read;
        st.bd_writes = b.records_written;
        st.backing_bytes_written = b.bytes_written;
        st.backing_bytes_read = b.bytes_read;
        st.backing_file_bytes = b.file_bytes;
        st.backing_live_bytes = b.live_bytes;
        st.backing_metadata_bytes = b.metadata_bytes;
        st.written_back_pages = self.written_back.load(Relaxed);
        st.promoted_pages = self.promoted.load(Relaxed);
        st.writeback_fail = self.writeback_fail.load(Relaxed);
    }
}

impl Pool {
    fn tier(&self) -> Result<&Tier> {
        self.tier.as_ref().ok_or(ZmemError::NoBackingStore)
    }

    /// Allocator pages at which a shrink stops (accept threshold of max_pool).
    fn accept_pages(&self) -> u64 {
        let max = self.max_pool_pages.load(Relaxed);
        if max == u64::MAX {
            return u64::MAX;
        }
        max * self.cfg.accept_threshold_percent as u64 / 100
    }

    /// zswap's shrinker: write back from the cold end of the LRU until the
    /// pool is under the accept threshold. One shrinker runs at a time: with
    /// `wait`, a caller that finds one running waits for it (and then has
    /// little or nothing left to do); without, it returns at once.
    /// Returns (pages written back, whether the LRU ran out of candidates).
    pub(crate) fn shrink(&self, wait: bool) -> Result<(u64, bool)> {
        let t = self.tier()?;
        let _running = if wait {
            t.shrinking.lock()
        } else {
            match t.shrinking.try_lock() {
                Some(g) => g,
                None => return Ok((0, false)),
            }
        };
        let target = self.accept_pages();
        let mut total = 0;
        let mut batches = 0u32;
        let mut exhausted = false;
        while self.alloc.pages_used() > target {
            let (written, examined) = self.writeback_lru_batch(t)?;
            total += written;
            batches += 1;
            if examined == 0 {
                exhausted = true;
                break;
            }
            // Writeback frees objects; their pages come free when spans
            // empty. Compaction turns scattered holes into free pages.
            if batches.is_multiple_of(8) {
                self.alloc.compact();
            }
        }
        if self.alloc.pages_used() > target {
            self.alloc.compact();
        }
        Ok((total, exhausted))
    }

    /// One batch from the shard whose oldest item is oldest. Returns
    /// (pages written back, LRU items examined).
    fn writeback_lru_batch(&self, t: &Tier) -> Result<(u64, usize)> {
        let now = t.seq.load(Relaxed);
        let mut oldest: Option<(usize, u32)> = None;
        for (i, sh) in self.shards.iter().enumerate() {
            if let Some(front) = sh.lock().lru.front() {
                let age = now.wrapping_sub(front.seq);
                if oldest.is_none_or(|(_, a)| age > a) {
                    oldest = Some((i, age));
                }
            }
        }
        let Some((i, _)) = oldest else { return Ok((0, 0)) };
        let shard = &self.shards[i];
        let mut buf = Vec::with_capacity(BATCH * 2048);
        let mut victims = Vec::with_capacity(BATCH);
        let mut examined = 0;
        {
            let mut s = shard.lock();
            let mut budget = s.lru.len();
            while victims.len() < BATCH && budget > 0 {
                budget -= 1;
                let Some(item) = s.lru.pop_front() else { break };
                examined += 1;
                let Some(e) = s.index.get(item.key) else { continue };
                let Slot::Obj(handle, info) = e.slot() else { continue };
                if e.gen() != item.gen {
                    continue;
                }
                if e.referenced() {
                    // Second chance: back to the hot end, unreferenced.
                    s.index.set(item.key, e.with_referenced(false));
                    s.lru.push_back(LruItem { seq: t.next_seq(), ..item });
                    continue;
                }
                let off = buf.len();
                if self.alloc.read(handle, |obj| buf.extend_from_slice(&obj[..info.len as usize])).is_err() {
                    continue;
                }
                victims.push(Victim { key: item.key, entry: e, handle, info, item: Some(item), off });
            }
        }
        if victims.is_empty() {
            return Ok((0, examined));
        }
        Ok((self.commit(t, shard, victims, &buf)?, examined))
    }

    /// Write the victims' bytes to the backing store in one batch, then swap
    /// each entry that is still unchanged for a written-back one and free its
    /// object. On a write error nothing changes: every victim stays in RAM.
    fn commit(&self, t: &Tier, shard: &Mutex<Shard>, victims: Vec<Victim>, buf: &[u8]) -> Result<u64> {
        let recs: Vec<(u64, &[u8])> = victims
            .iter()
            .map(|v| (v.key, &buf[v.off..v.off + v.info.len as usize]))
            .collect();
        let ids = match t.store.write_batch(&recs) {
            Ok(ids) => ids,
            Err(e) => {
                t.writeback_fail.fetch_add(1, Relaxed);
                let mut s = shard.lock();
                for v in victims.iter().rev() {
                    if let Some(item) = v.item {
                        if s.index.get(v.key) == Some(v.entry) {
                            s.lru.push_front(item);
                        }
                    }
                }
                return Err(ZmemError::Backing(e));
            }
        };
        let mut freed = Vec::with_capacity(victims.len());
        let mut stale = Vec::new();
        {
            let mut s: MutexGuard<'_, Shard> = shard.lock();
            for (v, id) in victims.iter().zip(ids) {
                if s.index.get(v.key) == Some(v.entry) {
                    let b = Entry::backed(id.to_raw(), v.info).with_gen(v.entry.gen());
                    s.account(v.entry, false);
                    s.account(b, true);
                    s.index.set(v.key, b);
                    freed.push(v.handle);
                } else {
                    // Overwritten, invalidated or loaded while we wrote. A
                    // load only set the referenced bit: the object is still
                    // here and keeps its place in the LRU, at the hot end.
                    stale.push(id);
                    if let (Some(item), Some(now)) = (v.item, s.index.get(v.key)) {
                        if now.gen() == item.gen && matches!(now.slot(), Slot::Obj(..)) {
                            s.lru.push_back(LruItem { seq: t.next_seq(), ..item });
                        }
                    }
                }
            }
        }
        let n = freed.len() as u64;
        for h in freed {
            let _ = self.alloc.free(h);
        }
        for id in stale {
            t.free_record(id.to_raw());
        }
        t.written_back.fetch_add(n, Relaxed);
        Ok(n)
    }

    /// zram's `writeback`: write back the pages `mode` names, at most
    /// `limit_pages` of them (zram's `writeback_limit`). Returns pages written.
    pub fn writeback(&self, mode: WritebackMode, limit_pages: Option<u64>) -> Result<u64> {
        let t = self.tier()?;
        let now = self.now();
        let mut budget = limit_pages.unwrap_or(u64::MAX);
        let mut total = 0;
        for shard in self.shards.iter() {
            while budget > 0 {
                let mut buf = Vec::new();
                let mut victims = Vec::new();
                {
                    let s = shard.lock();
                    let want = (budget.min(BATCH as u64)) as usize;
                    for (key, e, ac) in s.index.iter() {
                        if victims.len() >= want {
                            break;
                        }
                        let Slot::Obj(handle, info) = e.slot() else { continue };
                        let pick = match mode {
                            WritebackMode::Idle(secs) => now.saturating_sub(ac) >= secs,
                            WritebackMode::Huge => info.is_huge(),
                            WritebackMode::Incompressible => info.is_incompressible(),
                            WritebackMode::All => true,
                        };
                        if !pick {
                            continue;
                        }
                        let off = buf.len();
                        if self.alloc.read(handle, |obj| buf.extend_from_slice(&obj[..info.len as usize])).is_ok() {
                            victims.push(Victim { key, entry: e, handle, info, item: None, off });
                        }
                    }
                }
                if victims.is_empty() {
                    break;
                }
                let n = self.commit(t, shard, victims, &buf)?;
                if n == 0 {
                    break;
                }
                total += n;
                budget = budget.saturating_sub(n);
            }
        }
        self.alloc.compact();
        Ok(total)
    }

    /// Serve a load from the backing store, promoting the page back to RAM
    /// when the pool has room. Called with the key's shard locked.
    pub(crate) fn load_backed(
        &self,
        t: &Tier,
        s: &mut MutexGuard<'_, Shard>,
        key: u64,
        id: u64,
        info: ObjInfo,
        buf: &mut [u8],
    ) -> Result<()> {
        let mut obj = Vec::with_capacity(PAGE_SIZE);
        t.store.read(RecordId::from_raw(id), key, &mut obj).map_err(ZmemError::Backing)?;
        if obj.len() != info.len as usize {
            self.counters.decompress_fail.fetch_add(1, Relaxed);
            return Err(ZmemError::Corrupt {
                key,
                source: zmem_compress::CompressError::WrongLength {
                    alg: zmem_compress::Algorithm::Lz4,
                    got: obj.len(),
                    expected: info.len as usize,
                },
            });
        }
        decode(info, &obj, buf).map_err(|source| {
            self.counters.decompress_fail.fetch_add(1, Relaxed);
            ZmemError::Corrupt { key, source }
        })?;
        if self.alloc.pages_used() < self.accept_pages() {
            if let Ok(h) = self.alloc.alloc_write(&obj) {
                // Replaces `e`, whose record is freed right here.
                self.publish_locked(s, key, Entry::obj(h, info));
                t.free_record(id);
                t.promoted.fetch_add(1, Relaxed);
            }
        }
        Ok(())
    }
}
