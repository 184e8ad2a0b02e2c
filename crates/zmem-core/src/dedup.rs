//! Adaptive dedup: records only where sharing pays for them.
//!
//! # The problem
//! The zram dedup patch judged dedup by one rule: `dup_data_size` must
//! exceed `meta_data_size`. A pool that gives every stored page a shared
//! record (hash, place, encoding, reference count: about 47 bytes with the
//! hash table's slack) breaks it on ordinary data: a cargo `target/release`
//! copied onto ext4 found 518 duplicate pages of 87,000, saved 240,809
//! bytes and spent 3,282,432 on records, 1.6 % above dedup off.
//!
//! # The design
//! * Every page is hashed (xxh3, ~20 GB/s) and looked up in the record
//!   table, so a page always shares an existing record when it has a twin.
//! * **Full mode** (the start): a page with no twin gets a record, so its
//!   later twins find it. **Sampling mode**: only a page whose hash is 0
//!   modulo 32 does (a record costs ~47 bytes: ~1.5 bytes a page, 0.4 %
//!   of a 400-byte object); the others are stored as plain objects, with no
//!   record and no metadata beyond a pool without dedup. Twins have equal
//!   hashes, so in sampling mode the pages whose hash is 0 mod 32 still
//!   find every twin: their hit rate is the pool's duplicate rate.
//! * Every 1,024 tracked stores in full mode (256 in sampling mode, that
//!   is every 4,096 stores) the pool weighs what sharing saved
//!   (the compressed bytes of the twins found) against what a record
//!   costs. Less than one record per tracked page: switch to sampling and
//!   give the records back (each index shard, in turn, converts its
//!   unshared records, outside the sample, to plain objects; then the
//!   tables shrink). More than two: switch to full, and each index shard in
//!   turn gives its plain objects records, merging the twins among them,
//!   so pages stored while sampling are not lost to sharing.
//! * A conversion pass runs one index shard per store (1/64 of the pool
//!   under that shard's lock), so no store waits for the whole pool; the
//!   store that ends a share pass also compacts the allocator, since the
//!   twins it merged freed objects all over the size classes.
//!
//! # Trade-offs
//! * A pool with a backing store stays in full mode: its records carry LRU
//!   state that the conversions would have to move between queues.
//! * In sampling mode, twins whose hash is not 0 mod 32 are stored twice
//!   until the pool switches back to full; the first pass then merges them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

use crate::charged::map_insert_new;
use crate::entry::{Entry, Slot, PAGE_SIZE};
use crate::pool::{DedupRec, Engine, Loc};

/// In sampling mode, a page gets a record only if its hash is 0 modulo this.
pub(crate) const SAMPLE: u64 = 32;
/// Tracked stores between two decisions in full mode. In sampling mode a
/// quarter of it (one tracked store in 32: a decision every 8,192 stores),
/// so that twins coming back are seen while they are still being written.
const WINDOW: u64 = 1024;
/// What one record costs: its slot in the table, a control byte, and the
/// table's slack at hashbrown's 7/8 load.
const REC_BYTES: u64 = ((std::mem::size_of::<(u64, DedupRec)>() + 1) * 8 / 7) as u64;

const PASS_NONE: u8 = 0;
const PASS_SHARE: u8 = 1;
const PASS_UNSHARE: u8 = 2;

/// The mode, the window's counters and the conversion pass in progress.
pub(crate) struct DedupMode {
    full: AtomicBool,
    tracked: AtomicU64,
    saved: AtomicU64,
    switches: AtomicU64,
    pass: AtomicU8,
    cursor: AtomicUsize,
}

impl DedupMode {
    pub fn new() -> DedupMode {
        DedupMode {
            full: AtomicBool::new(true),
            tracked: AtomicU64::new(0),
            saved: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            pass: AtomicU8::new(PASS_NONE),
            cursor: AtomicUsize::new(0),
        }
    }

    pub fn full(&self) -> bool {
        self.full.load(Relaxed)
    }

    pub fn switches(&self) -> u64 {
        self.switches.load(Relaxed)
    }

    fn switch(&self, full: bool) {
        self.full.store(full, Relaxed);
        self.switches.fetch_add(1, Relaxed);
        self.cursor.store(0, Relaxed);
        self.pass.store(if full { PASS_SHARE } else { PASS_UNSHARE }, Relaxed);
    }
}

impl Engine {
    /// Whether a page with this hash that finds no twin gets a record.
    pub(crate) fn dedup_tracks(&self, hash: u64) -> bool {
        self.tier.is_some() || self.dedup_mode.full() || hash.is_multiple_of(SAMPLE)
    }

    /// A tracked store found a twin that saved `saved` bytes, or none;
    /// every `WINDOW` tracked stores, decide the mode.
    pub(crate) fn dedup_observe(&self, tracked: bool, saved: Option<u64>) {
        let m = &self.dedup_mode;
        if !tracked || self.tier.is_some() {
            return;
        }
        if let Some(b) = saved {
            m.saved.fetch_add(b, Relaxed);
        }
        let window = if m.full() { WINDOW } else { WINDOW / 4 };
        if m.tracked.fetch_add(1, Relaxed) + 1 != window {
            return;
        }
        // This store closed the window: the others now count the next one.
        let per_page = m.saved.swap(0, Relaxed) / window;
        m.tracked.store(0, Relaxed);
        if m.full() && per_page < REC_BYTES {
            m.switch(false);
        } else if !m.full() && per_page > 2 * REC_BYTES {
            m.switch(true);
        }
    }

    /// If a conversion pass is under way, do its next index shard.
    pub(crate) fn dedup_maintain(&self) {
        let m = &self.dedup_mode;
        let pass = m.pass.load(Relaxed);
        if pass == PASS_NONE || self.tier.is_some() {
            return;
        }
        let i = m.cursor.fetch_add(1, Relaxed);
        if i >= self.index.shards().len() {
            return;
        }
        if pass == PASS_SHARE {
            self.share_shard(i);
        } else {
            self.unshare_shard(i);
        }
        if i + 1 == self.index.shards().len() {
            let _ = m.pass.compare_exchange(pass, PASS_NONE, Relaxed, Relaxed);
            if pass == PASS_UNSHARE {
                self.shrink_dedup_tables();
            } else {
                // Merged twins freed their objects all over the classes.
                self.objects.compact();
            }
        }
    }

    /// Give every plain object of index shard `i` a record, or join the
    /// record of an equal page (its own object is then freed).
    fn share_shard(&self, i: usize) {
        let Some(d) = &self.dedup else { return };
        let mut page = vec![0u8; PAGE_SIZE];
        let mut frees = Vec::new();
        {
            let mut s = self.index.shards()[i].lock();
            let objs: Vec<(u64, Entry)> = s.iter().filter(|(_, e, _)| matches!(e.slot(), Slot::Obj(..))).map(|(k, e, _)| (k, e)).collect();
            let now = self.now();
            for (key, e) in objs {
                let Slot::Obj(h, info) = e.slot() else { continue };
                if self.objects.read_object(key, h, info, &mut page).is_err() {
                    continue;
                }
                let hash = xxhash_rust::xxh3::xxh3_64(&page);
                let mut ds = Self::dedup_shard(d, hash).lock();
                let new = match ds.map.get(&hash).copied() {
                    Some(rec) => {
                        let Loc::Ram(rh) = rec.loc else { continue };
                        if !self.objects.equals(rh, rec.info, &page) {
                            continue;
                        }
                        let r = ds.map.get_mut(&hash).expect("checked under this lock");
                        r.refs += 1;
                        ds.dup_pages += 1;
                        ds.dup_bytes += rec.info.len as u64;
                        self.counters.dedup_hits.fetch_add(1, Relaxed);
                        frees.push(h);
                        Entry::dedup(hash, rec.info)
                    }
                    None => {
                        let rec = DedupRec { loc: Loc::Ram(h), info, refs: 1, gen: 0, referenced: false, ac: now };
                        if map_insert_new(&mut ds.map, hash, rec, self.budget()).is_err() {
                            continue;
                        }
                        ds.account_ram(&rec, true);
                        Entry::dedup(hash, info)
                    }
                };
                drop(ds);
                s.replace(key, e, new);
            }
        }
        for h in frees {
            if let Err(e) = self.objects.free(h) {
                self.free_failed(&e.to_string());
            }
        }
    }

    /// Turn the records of index shard `i` that nobody shares (and that
    /// are not in the sample) back into plain objects.
    fn unshare_shard(&self, i: usize) {
        let Some(d) = &self.dedup else { return };
        let mut s = self.index.shards()[i].lock();
        let shared: Vec<(u64, Entry)> =
            s.iter().filter(|(_, e, _)| matches!(e.slot(), Slot::Dedup(hash, _) if !hash.is_multiple_of(SAMPLE))).map(|(k, e, _)| (k, e)).collect();
        for (key, e) in shared {
            let Slot::Dedup(hash, _) = e.slot() else { continue };
            let mut ds = Self::dedup_shard(d, hash).lock();
            let Some(rec) = ds.map.get(&hash).copied() else { continue };
            let (1, Loc::Ram(h)) = (rec.refs, rec.loc) else { continue };
            ds.map.remove(&hash);
            ds.account_ram(&rec, false);
            drop(ds);
            s.replace(key, e, Entry::obj(h, rec.info));
        }
    }

    /// After an unshare pass: give the record tables' unused room back.
    fn shrink_dedup_tables(&self) {
        let Some(d) = &self.dedup else { return };
        let b = self.budget();
        for ds in d.iter() {
            let mut ds = ds.lock();
            let before = crate::charged::map_bytes(&ds.map);
            // The new table is built before the old one goes: charge the
            // old size as its bound, then settle.
            if b.try_charge(before).is_ok() {
                ds.map.shrink_to_fit();
                b.uncharge(2 * before - crate::charged::map_bytes(&ds.map));
            }
        }
    }
}
