//! The ledger: every key's entry, kept where the process's death does not
//! take it.
//!
//! # Why
//! A swap device must outlive its server: killed or upgraded, the server's
//! successor must find every page. The objects already outlive it (the
//! allocator's arena, `zmem_alloc::arena`); what names them, the index, is
//! heap. The ledger is the arena's table ([`SharedTable`]): for a pool of a
//! device (keys `0..N`, [`crate::PoolConfig::ledger_keys`]), one 16-byte
//! entry per key, written whole (one atomic store) with every change of
//! the key's entry, under the key's shard lock. [`crate::Pool::open`]
//! rebuilds the index from it. zram's table is the same thing: a flat
//! array with one (handle, flags) per slot; here it is kept beside the
//! index rather than instead of it.
//!
//! # Order
//! What makes a death at any instant safe is the order against the
//! allocator, which the engine already keeps: a new object is written
//! whole before its entry is published (and so recorded), and an entry is
//! recorded gone or replaced, under the shard lock, before the object it
//! named is freed, after that lock. So a recorded entry always names a
//! live object; an object allocated and not yet recorded is named by no
//! entry, and the next process frees it.
//!
//! # Format
//! An entry is `VALID | meta << 64 | payload` (`Entry::to_raw`: the flags
//! that only steer a process, the referenced bit and the LRU generation,
//! are not kept); 0 is a key with no page. The format is part of the
//! arena's: a change here bumps `zmem_alloc::ARENA_VERSION`, which every
//! opening checks, so that a process never reads another's entries wrong. A page of the table holds the
//! 256 keys of one cold block, so it belongs to one shard: a range
//! dropped whole gives its pages back ([`Ledger::clear`]).
//!
//! # Dictionaries
//! Past the keys, the table has an area for each dictionary slot
//! (`dict.rs`): [`DICT_KEPT_BYTES`] of room, of which a dictionary uses
//! what it needs. A slot's first entry is its header (`VALID`, the
//! dictionary's id, its length and an xxh3 checksum of its bytes); the
//! bytes follow, 16 a entry. A dictionary is recorded (bytes, then the
//! header) before any object can be written with it, and its header is
//! cleared before its bytes when it is retired, so a header always
//! names whole bytes; an area whose header is gone is cleared at the
//! next opening. A header whose checksum does not match is damage: the
//! dictionary is not used, and the pages written with it are lost.
//!
//! # Cost
//! 16 bytes a key, in pages of 256 keys charged to the pool's budget the
//! first time one of their keys is recorded (so `mem_used_total` shows
//! it), and one 16-byte store per change of an entry. A dictionary costs
//! its bytes again (charged the same way), written once.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use zmem_alloc::{Budget, SharedTable, TABLE_PAGE_ENTRIES};

use crate::entry::{Entry, DICT_SLOTS};

/// The largest dictionary a ledger keeps (a larger one is refused by a
/// pool that keeps a ledger: `PoolConfig::check`).
pub(crate) const DICT_KEPT_BYTES: usize = (DICT_AREA - 1) * 16;
/// Entries of a dictionary slot's area: 1 MiB with its header.
const DICT_AREA: usize = 1 << 16;

/// Entries of the table of a ledger of `keys` keys (a multiple of a
/// table page): the keys, then the dictionaries' areas.
pub(crate) fn table_entries(keys: u64) -> usize {
    keys as usize + DICT_SLOTS * DICT_AREA
}

const VALID: u128 = 1 << 127;
/// A key whose page could not be proven right (`Shard::mark_lost`).
const LOST: u128 = 1;
const PAGE: u64 = 4096;

/// See the module notes.
pub(crate) struct Ledger {
    table: SharedTable,
    /// Keys recorded: the entries before the dictionaries' areas.
    keys: u64,
    /// A bit per page of the table: charged to `budget`.
    charged: Box<[AtomicU64]>,
    budget: Arc<Budget>,
}

/// What a ledger entry says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    Entry(Entry),
    /// A page lost when the pool was opened before, not stored since.
    Lost,
    /// Not 0 and not an entry: a damaged word.
    Damaged,
}

impl Ledger {
    /// A ledger of `keys` keys over `table` (of [`table_entries`]`(keys)`),
    /// charging its pages to `budget`: those that hold data already (a
    /// table found again) at once.
    pub fn new(table: SharedTable, keys: u64, budget: Arc<Budget>) -> Ledger {
        debug_assert_eq!(table.len(), table_entries(keys));
        let pages = table.len().div_ceil(TABLE_PAGE_ENTRIES);
        let l = Ledger { charged: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(), table, keys, budget };
        for r in l.table.written() {
            for p in r.start / TABLE_PAGE_ENTRIES..r.end.div_ceil(TABLE_PAGE_ENTRIES) {
                l.charge(p);
            }
        }
        l
    }

    /// Keys the ledger has room for.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    fn charge(&self, page: usize) {
        let bit = 1u64 << (page % 64);
        if self.charged[page / 64].fetch_or(bit, Relaxed) & bit == 0 {
            // (A page is memory held once written: charged whatever the
            // limit, as the index's own blocks of a publish are.)
            self.budget.force_charge(PAGE);
        }
    }

    /// `key`'s entry is now `e` (None: no page). Keys past the table are
    /// not kept (the pool refuses them: `Pool::store`).
    #[inline]
    pub fn record(&self, key: u64, e: Option<Entry>) {
        if key >= self.keys() {
            return;
        }
        let v = match e {
            None => 0,
            Some(e) => {
                self.charge(key as usize / TABLE_PAGE_ENTRIES);
                let (meta, data) = e.to_raw();
                VALID | (meta as u128) << 64 | data as u128
            }
        };
        self.table.set(key as usize, v);
    }

    /// `key`'s page is lost ([`Recorded::Lost`]).
    pub fn record_lost(&self, key: u64) {
        if key < self.keys() {
            self.charge(key as usize / TABLE_PAGE_ENTRIES);
            self.table.set(key as usize, LOST);
        }
    }

    /// No page for any key of `range` whose 256-key page `owned` says is
    /// the caller's (the shard whose lock it holds): whole pages are given
    /// back.
    pub fn clear(&self, range: &Range<u64>, owned: impl Fn(u64) -> bool) {
        let (start, end) = (range.start.min(self.keys()), range.end.min(self.keys()));
        let per = TABLE_PAGE_ENTRIES as u64;
        let mut page = start / per;
        while page * per < end {
            let (a, b) = ((page * per).max(start), ((page + 1) * per).min(end));
            if owned(page * per) {
                self.clear_entries(a as usize..b as usize);
            }
            page += 1;
        }
    }

    /// Entries `range` (within one page of the table, or whole pages) 0,
    /// and the whole pages among them uncharged.
    fn clear_entries(&self, range: Range<usize>) {
        self.table.clear(range.clone());
        for page in range.start.div_ceil(TABLE_PAGE_ENTRIES)..range.end / TABLE_PAGE_ENTRIES {
            let bit = 1u64 << (page % 64);
            if self.charged[page / 64].fetch_and(!bit, Relaxed) & bit != 0 {
                self.budget.uncharge(PAGE);
            }
        }
    }

    /// The first entry of dictionary `slot`'s area.
    fn dict_area(&self, slot: usize) -> usize {
        self.keys as usize + slot * DICT_AREA
    }

    /// Dictionary `slot` now holds `bytes`, numbered `id`: the bytes, then
    /// the header that makes them count. Refused (nothing recorded) for
    /// bytes past [`DICT_KEPT_BYTES`].
    pub fn record_dict(&self, slot: usize, id: u32, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() > DICT_KEPT_BYTES || slot >= DICT_SLOTS {
            return Err(format!("a {}-byte dictionary: a pool that can be opened again keeps dictionaries of at most {DICT_KEPT_BYTES} bytes", bytes.len()));
        }
        let at = self.dict_area(slot);
        for (i, chunk) in bytes.chunks(16).enumerate() {
            let mut w = [0u8; 16];
            w[..chunk.len()].copy_from_slice(chunk);
            self.charge((at + 1 + i) / TABLE_PAGE_ENTRIES);
            self.table.set(at + 1 + i, u128::from_le_bytes(w));
        }
        self.charge(at / TABLE_PAGE_ENTRIES);
        let sum = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, id as u64) as u32;
        self.table.set(at, VALID | (bytes.len() as u128) << 64 | (id as u128) << 32 | sum as u128);
        Ok(())
    }

    /// Dictionary `slot` holds nothing: its header goes first.
    pub fn clear_dict(&self, slot: usize) {
        let at = self.dict_area(slot);
        self.table.set(at, 0);
        self.clear_entries(at..at + DICT_AREA);
    }

    /// The dictionaries recorded: per slot with a header, its id (0 if the
    /// header is damaged) and its bytes, or why they cannot be trusted. An area without a header (a
    /// dictionary being recorded or retired when its process died) is
    /// cleared.
    pub fn dicts(&self) -> Vec<(usize, u32, Result<Vec<u8>, String>)> {
        let written = self.table.written();
        let mut out = Vec::new();
        for slot in 0..DICT_SLOTS {
            let at = self.dict_area(slot);
            if !written.iter().any(|r| r.start < at + DICT_AREA && r.end > at) {
                continue;
            }
            let head = self.table.get(at);
            if head & VALID == 0 {
                if head != 0 {
                    out.push((slot, 0, Err(format!("its header is damaged ({head:#x})"))));
                }
                self.clear_entries(at..at + DICT_AREA);
                continue;
            }
            let (len, id, sum) = ((head >> 64) as u32 as usize, (head >> 32) as u32, head as u32);
            if len > DICT_KEPT_BYTES {
                out.push((slot, id, Err(format!("its header says {len} bytes, more than a slot holds"))));
                continue;
            }
            let mut bytes: Vec<u8> = (0..len.div_ceil(16)).flat_map(|i| self.table.get(at + 1 + i).to_le_bytes()).collect();
            bytes.truncate(len);
            if xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, id as u64) as u32 != sum {
                out.push((slot, id, Err(format!("the checksum of dictionary {id}'s {len} bytes does not match"))));
                continue;
            }
            out.push((slot, id, Ok(bytes)));
        }
        out
    }

    /// Every key with something recorded, and what.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Recorded)> + '_ {
        let keys = self.keys as usize;
        self.table.written().into_iter().filter(move |r| r.start < keys).flat_map(move |r| {
            (r.start..r.end.min(keys)).filter_map(move |k| {
                let v = self.table.get(k);
                (v != 0).then(|| {
                    let e = (v & VALID != 0).then(|| Entry::from_raw((v >> 64) as u32, v as u64)).flatten();
                    let r = match e {
                        Some(e) => Recorded::Entry(e),
                        None if v == LOST => Recorded::Lost,
                        None => Recorded::Damaged,
                    };
                    (k as u64, r)
                })
            })
        })
    }

    /// Bytes charged for the table's pages.
    pub fn bytes(&self) -> u64 {
        self.charged.iter().map(|w| w.load(Relaxed).count_ones() as u64).sum::<u64>() * PAGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::ObjInfo;

    fn ledger(keys: usize) -> (zmem_alloc::ZsPool, Ledger) {
        let pool = zmem_alloc::ZsPool::default();
        let table = pool.shared_table(table_entries(keys as u64)).unwrap();
        let l = Ledger::new(table, keys as u64, Arc::clone(pool.budget()));
        (pool, l)
    }

    #[test]
    fn entries_are_recorded_cleared_and_charged_by_page() {
        let (pool, l) = ledger(4096);
        let base = pool.budget().used();
        let obj = Entry::obj(zmem_alloc::Handle::from_raw(77), ObjInfo::raw()).with_referenced(true).with_gen(9);
        l.record(3, Some(obj));
        l.record(300, Some(Entry::same(0xabab)));
        l.record(301, Some(Entry::same(1)));
        l.record(301, None);
        l.record(1 << 40, Some(Entry::same(2)));
        let got: Vec<_> = l.entries().collect();
        // The flags that steer only this process are not kept.
        assert_eq!(got, vec![(3, Recorded::Entry(obj.with_referenced(false).with_gen(0))), (300, Recorded::Entry(Entry::same(0xabab)))]);
        assert_eq!((pool.budget().used() - base, l.bytes()), (2 * PAGE, 2 * PAGE));
        // A range: the whole page of keys 256..512 goes back; the edge of
        // the first page is written, and only keys the caller owns.
        l.record(255, Some(Entry::same(5)));
        l.clear(&(255..1024), |first| first != 512);
        let got: Vec<_> = l.entries().map(|(k, _)| k).collect();
        assert_eq!(got, vec![3]);
        assert_eq!(l.bytes(), PAGE);
        l.record(600, Some(Entry::same(6)));
        l.clear(&(0..4096), |first| first != 512);
        assert_eq!(l.entries().map(|(k, _)| k).collect::<Vec<_>>(), vec![600], "a page the caller does not own stays");
        // A damaged word is told apart from an entry, and from a lost page.
        l.table.set(7, 5);
        l.record_lost(8);
        let got: Vec<_> = l.entries().filter(|&(k, _)| k == 7 || k == 8).collect();
        assert_eq!(got, vec![(7, Recorded::Damaged), (8, Recorded::Lost)]);
    }

    #[test]
    fn dictionaries_are_kept_whole_or_not_at_all() {
        let (pool, l) = ledger(512);
        let base = pool.budget().used();
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        l.record_dict(2, 9, &bytes).unwrap();
        l.record_dict(4, 10, &bytes[..17]).unwrap();
        assert_eq!(l.dicts(), vec![(2, 9, Ok(bytes.clone())), (4, 10, Ok(bytes[..17].to_vec()))]);
        assert!(l.entries().next().is_none(), "the dictionaries are not keys");
        // 5000 bytes and a header: 313 entries, two table pages; one more for slot 4.
        assert_eq!(pool.budget().used() - base, 3 * PAGE);
        assert!(l.record_dict(0, 11, &vec![0u8; DICT_KEPT_BYTES + 1]).is_err());
        // Retired: nothing left, nothing charged.
        l.clear_dict(4);
        assert_eq!(l.dicts().len(), 1);
        assert_eq!(pool.budget().used() - base, 2 * PAGE);
        // A byte changed is found by the checksum.
        let at = l.dict_area(2);
        l.table.set(at + 3, l.table.get(at + 3) ^ 1);
        match &l.dicts()[..] {
            [(2, 9, Err(why))] => assert!(why.contains("checksum"), "{why}"),
            d => panic!("{d:?}"),
        }
        // Bytes without their header (a death while recording or
        // retiring) are cleared and given back.
        l.table.set(at, 0);
        assert!(l.dicts().is_empty());
        assert_eq!(pool.budget().used(), base);
        assert!(l.table.written().iter().all(|r| r.end <= l.dict_area(0)));
    }
}
