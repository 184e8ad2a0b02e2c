//! Dictionaries the pool trains from its own pages.
//!
//! # Why
//! A 4 KiB page is too short for lz4 or zstd to learn much from itself. A
//! dictionary of the strings pages share fills that gap: on this machine
//! a 64 KiB zstd dictionary trained on 1/64 of the pages took zstd:9 from
//! 0.758 to 0.703 × the bytes of lz4 alone on `/usr/lib` pages, and from
//! 0.578 to 0.516 on a python process's memory (`cargo bench -p zmem-bench
//! --bench dict`). zram (6.12) takes a dictionary only as a file the user
//! trains offline; here the pool makes its own, and keeps it current.
//!
//! # Design
//! * **Sampling, only while collecting.** With `--dict auto` a pool starts
//!   out collecting: every `sample_every`-th page a store compresses is
//!   copied into a ring of `samples` pages (4 MiB by default, charged to
//!   the budget; a store never waits for it: a busy ring skips the sample).
//! * **Training, off the store path.** A thread of the pool (`zmem-dict`)
//!   wakes every second. Once the ring is full it trains a dictionary
//!   (zstd's trainer) on half of the pages and measures it on the other
//!   half against compression without one and against the dictionary in
//!   use. It installs the new one only if it saves at least
//!   `min_gain_percent` of the bytes, and more than it costs in memory at
//!   the pool's current size. Either way the ring is freed: a pool that is
//!   not collecting holds no samples.
//! * **Drift.** Every store adds its compressed size to a window; every
//!   `drift_window` stores (16,384) the trainer compares the window's mean with the
//!   first window after the last round. When new stores come out 15 %
//!   larger (the data changed, and the dictionary fits it less), the pool
//!   collects again and trains a new one, which it keeps only if it beats
//!   the current one on fresh pages.
//! * **Versions.** An object written with a dictionary says so in its
//!   entry's algorithm tag: tags 3..=12 are (slot, lz4 or zstd) for five
//!   slots, so an entry stays 12 bytes and an object carries no extra
//!   byte. Each slot holds one [`Dictionary`] with a pool-unique id (which
//!   zstd frames also carry, so that a mixed-up dictionary is an error,
//!   never wrong data). New objects use the current slot; older
//!   dictionaries stay while any object uses them.
//! * **Reference counts for free.** Each index shard and dedup shard
//!   counts its objects per slot, in the same accounting that counts
//!   their bytes, so moving an object to the backing file and back keeps
//!   the count. The trainer frees a slot that is not current, not held by
//!   a store in flight, and counted zero on two rounds a second apart
//!   (the second round covers a load that read a written-back object just
//!   before its key was overwritten). An old dictionary's objects leave it
//!   as their keys are rewritten, freed, or recompressed (lz4 objects).
//! * **Prepared once.** A dictionary is parsed once into zstd's DDict, a
//!   CDict per zstd level the pool uses (its compressor's and its
//!   recompression algorithms'), and an lz4 stream; threads keep their
//!   own contexts, so a page never pays for loading it.
//! * **Kept.** A pool with a ledger records each dictionary in it as it
//!   is installed, before any object is written with it, and clears it
//!   as it is retired (`ledger.rs`); a pool opened again takes them back
//!   into their slots ([`Dicts::restore`]), the newest current.
//! * **Memory.** The dictionaries (with their prepared forms, which for a
//!   strong zstd level are several times the dictionary) and the sample
//!   ring count in `mem_used_total` (`dict_bytes`).
//!
//! # Trade-offs
//! * lz4 gains little from a dictionary (its window is 64 KiB and it has
//!   no entropy stage: 2-7 % on the same pages), so lz4 stores use one
//!   only when asked (`lz4: true`); zstd always does once there is one.
//! * Five slots: a sixth dictionary waits until an old one drains.
//! * A store looks up the current dictionary under a read lock and holds
//!   a reference to it until its object is published.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use zmem_alloc::Budget;
use zmem_compress::{Algorithm, CompressError, Compressor, Dictionary};

use crate::entry::{DICT_SLOTS, PAGE_SIZE};
use crate::ledger::Ledger;

/// Where a pool's dictionary comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DictSource {
    /// No dictionary.
    #[default]
    Off,
    /// Train from sampled pages, and again when the data drifts.
    Auto,
    /// This zstd dictionary (e.g. `zstd --train` output), for the pool's life.
    Bytes(Vec<u8>),
}

/// How a pool uses dictionaries ([`PoolConfig::dict`](crate::PoolConfig::dict)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DictConfig {
    pub source: DictSource,
    /// lz4 stores use the dictionary too (zstd always does).
    pub lz4: bool,
    /// Largest dictionary trained, in bytes.
    pub max_size: usize,
    /// Sample one compressed store in this many.
    pub sample_every: u32,
    /// Pages in the sample ring (one training's worth).
    pub samples: usize,
    /// A trained dictionary is installed only if it saves this share of
    /// the compressed bytes on pages it was not trained on.
    pub min_gain_percent: u8,
    /// Stores per drift window (see the module notes).
    pub drift_window: u64,
    /// Run the rounds in the background (the `zmem-dict` thread, once a
    /// second). Off: only [`Pool::train_dictionary`](crate::Pool::train_dictionary)
    /// trains and frees dictionaries (tests, benchmarks that time it).
    pub background: bool,
}

impl Default for DictConfig {
    fn default() -> Self {
        DictConfig {
            source: DictSource::Off,
            lz4: false,
            max_size: 64 << 10,
            sample_every: 16,
            samples: 1024,
            min_gain_percent: 2,
            drift_window: 1 << 14,
            background: true,
        }
    }
}

/// What a training round did ([`Pool::train_dictionary`](crate::Pool::train_dictionary)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TrainReport {
    /// The dictionary installed by this round, if one was.
    pub installed: Option<u32>,
    /// Held-out sample bytes without a dictionary, with the one in use
    /// (if any) and with the one just trained (if any).
    pub plain_bytes: u64,
    pub current_bytes: Option<u64>,
    pub trained_bytes: Option<u64>,
}

/// The pool's dictionaries (see the module notes).
pub(crate) struct Dicts {
    pub cfg: DictConfig,
    /// zstd levels to prepare each dictionary for.
    levels: Vec<i32>,
    slots: RwLock<[Option<Arc<Dictionary>>; DICT_SLOTS]>,
    /// Bytes charged for each slot's dictionary.
    charged: Mutex<[u64; DICT_SLOTS]>,
    /// Slots counted empty once already (freed if still so next round).
    draining: Mutex<[bool; DICT_SLOTS]>,
    /// The slot new objects use, plus one (0: none).
    current: AtomicU8,
    next_id: AtomicU32,
    ring: Mutex<Ring>,
    /// Filling the ring for a training round.
    collecting: AtomicBool,
    /// Compressed bytes and stores since the window began (drift).
    win_bytes: AtomicU64,
    win_stores: AtomicU64,
    /// Mean compressed size in the first window after the last round (0: not yet).
    baseline: AtomicU32,
    pub trainings: AtomicU64,
    pub installs: AtomicU64,
    pub retired: AtomicU64,
    pub stop: AtomicBool,
    /// Where each dictionary is recorded, if the pool keeps a ledger.
    ledger: Option<Arc<Ledger>>,
}

#[derive(Default)]
struct Ring {
    pages: Vec<u8>,
    /// Bytes charged for `pages` (0 until the first sample).
    charged: u64,
    next: usize,
    filled: usize,
}

/// What a dictionary slot holds, for [`Dicts::current`]: a reference that
/// keeps it alive until the object written with it is published.
pub(crate) type DictRef = (usize, Arc<Dictionary>);

impl Dicts {
    pub fn new(cfg: DictConfig, levels: Vec<i32>, ledger: Option<Arc<Ledger>>) -> Dicts {
        let auto = cfg.source == DictSource::Auto;
        Dicts {
            cfg,
            levels,
            slots: RwLock::new(Default::default()),
            charged: Mutex::new([0; DICT_SLOTS]),
            draining: Mutex::new([false; DICT_SLOTS]),
            current: AtomicU8::new(0),
            next_id: AtomicU32::new(1),
            collecting: AtomicBool::new(auto),
            ring: Mutex::new(Ring::default()),
            win_bytes: AtomicU64::new(0),
            win_stores: AtomicU64::new(0),
            baseline: AtomicU32::new(0),
            trainings: AtomicU64::new(0),
            installs: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            ledger,
        }
    }

    /// The dictionary `c` should compress new objects with, if any.
    pub fn current(&self, c: Compressor) -> Option<DictRef> {
        let cur = self.current.load(Relaxed);
        if cur == 0 || (c.algorithm == Algorithm::Lz4 && !self.cfg.lz4) {
            return None;
        }
        let slot = cur as usize - 1;
        let d = self.slots.read()[slot].clone()?;
        d.supports(c).then_some((slot, d))
    }

    /// The dictionary in `slot`.
    pub fn get(&self, slot: usize) -> Option<Arc<Dictionary>> {
        self.slots.read().get(slot)?.clone()
    }

    /// Decode `obj`, written by `alg` with the dictionary in `slot`, into
    /// `out`; None if the slot is empty. The slot table's read lock is held
    /// for the call (a load takes no reference to the dictionary).
    pub fn decompress(&self, slot: usize, alg: Algorithm, obj: &[u8], out: &mut [u8]) -> Option<Result<(), CompressError>> {
        let slots = self.slots.read();
        Some(slots.get(slot)?.as_ref()?.decompress(alg, obj, out))
    }

    /// The dictionary new objects use, if any.
    pub fn current_dict(&self) -> Option<Arc<Dictionary>> {
        self.get((self.current.load(Relaxed) as usize).checked_sub(1)?)
    }

    /// Live dictionaries, and the bytes they and the sample ring hold.
    pub fn usage(&self) -> (u64, u64) {
        let live = self.slots.read().iter().filter(|s| s.is_some()).count() as u64;
        let bytes: u64 = self.charged.lock().iter().sum::<u64>() + self.ring.lock().charged;
        (live, bytes)
    }

    /// A store compressed `page` to `len` bytes (with the pool's own
    /// compressor): count it for drift, and while collecting, copy one page
    /// in `sample_every` into the ring. Never waits: a busy ring, or a
    /// budget that cannot pay for the ring, skips the sample.
    pub fn note_store(&self, page: &[u8], len: usize, budget: &Budget) {
        if self.cfg.source != DictSource::Auto {
            return;
        }
        self.win_bytes.fetch_add(len as u64, Relaxed);
        let n = self.win_stores.fetch_add(1, Relaxed);
        if !self.collecting.load(Relaxed) || !n.is_multiple_of(self.cfg.sample_every.max(1) as u64) {
            return;
        }
        let Some(mut r) = self.ring.try_lock() else { return };
        let cap = self.cfg.samples.max(2) * PAGE_SIZE;
        if r.pages.len() < cap {
            if budget.try_charge(cap as u64).is_err() {
                return;
            }
            r.charged = cap as u64;
            r.pages = vec![0u8; cap];
        }
        let at = r.next * PAGE_SIZE;
        r.pages[at..at + PAGE_SIZE].copy_from_slice(page);
        r.next = (r.next + 1) % (cap / PAGE_SIZE);
        r.filled = (r.filled + 1).min(cap / PAGE_SIZE);
    }

    /// Whether the ring is being filled for a training round.
    pub fn collecting(&self) -> bool {
        self.collecting.load(Relaxed)
    }

    /// Drift: once a window of stores is complete, compare its mean
    /// compressed size with the baseline, and start collecting when it
    /// has grown by a sixth or more.
    fn check_drift(&self) {
        if self.collecting.load(Relaxed) || self.win_stores.load(Relaxed) < self.cfg.drift_window.max(1) {
            return;
        }
        let stores = self.win_stores.swap(0, Relaxed).max(1);
        let mean = (self.win_bytes.swap(0, Relaxed) / stores).max(1) as u32;
        match self.baseline.load(Relaxed) {
            0 => self.baseline.store(mean, Relaxed),
            base if mean as u64 * 100 >= base as u64 * (100 + DRIFT_PERCENT) => self.collecting.store(true, Relaxed),
            _ => {}
        }
    }

    /// The round has taken the ring: give back its charge and watch for
    /// drift from a new baseline.
    fn stop_collecting(&self, ring: &Ring, budget: &Budget) {
        budget.uncharge(ring.charged);
        self.collecting.store(false, Relaxed);
        self.baseline.store(0, Relaxed);
        self.win_bytes.store(0, Relaxed);
        self.win_stores.store(0, Relaxed);
    }

    /// Take a new dictionary into a free slot and make it current, charging
    /// what it holds. Fails if no slot is free or the budget refuses.
    pub fn install(&self, d: Dictionary, budget: &Budget) -> Result<u32, String> {
        let bytes = d.heap_bytes();
        let id = d.id();
        let mut slots = self.slots.write();
        let Some(slot) = slots.iter().position(Option::is_none) else {
            return Err(format!("all {DICT_SLOTS} dictionary slots hold dictionaries still in use"));
        };
        budget.try_charge(bytes).map_err(|e| format!("no room for a {bytes}-byte dictionary: {e}"))?;
        if let Some(l) = &self.ledger {
            if let Err(e) = l.record_dict(slot, id, d.bytes()) {
                budget.uncharge(bytes);
                return Err(e);
            }
        }
        self.charged.lock()[slot] = bytes;
        self.draining.lock()[slot] = false;
        slots[slot] = Some(Arc::new(d));
        self.current.store(slot as u8 + 1, Relaxed);
        self.installs.fetch_add(1, Relaxed);
        Ok(id)
    }

    /// Take back the dictionaries a pool opened again finds in its ledger,
    /// each into the slot it had: the newest (highest id) is current, and
    /// new ones are numbered after it. A dictionary that cannot be trusted
    /// or prepared is left out, with the reason (its objects' pages are
    /// then lost: `Engine::rebuild`).
    pub fn restore(&self, budget: &Budget) {
        let Some(l) = &self.ledger else { return };
        let mut slots = self.slots.write();
        let mut newest = None;
        for (slot, id, kept) in l.dicts() {
            // (Ids stay unique, a damaged dictionary's too.)
            self.next_id.fetch_max(id.saturating_add(1), Relaxed);
            let d = kept.and_then(|bytes| Dictionary::from_bytes(id, bytes, &self.levels).map_err(|e| e.to_string()));
            match d {
                Ok(d) => {
                    budget.force_charge(d.heap_bytes());
                    self.charged.lock()[slot] = d.heap_bytes();
                    if newest.is_none_or(|(_, id)| d.id() > id) {
                        newest = Some((slot, d.id()));
                    }
                    slots[slot] = Some(Arc::new(d));
                }
                Err(why) => {
                    // (Its pages are marked lost whether the area is here or not.)
                    tracing::warn!("opening the pool: dictionary slot {slot}: {why}: the pages written with it are lost");
                    l.clear_dict(slot);
                }
            }
        }
        if let Some((slot, _)) = newest {
            self.current.store(slot as u8 + 1, Relaxed);
        }
    }

    /// Make `bytes` (a dictionary given at start) current: the slot that
    /// holds it already (a pool opened again), else a new one. (In a pool
    /// opened again, only once every key is back: a slot whose dictionary
    /// was not restored must not be reused before the pages written with
    /// it are marked lost.)
    pub fn install_given(&self, bytes: &[u8], budget: &Budget) -> Result<(), String> {
        let same = |d: &Dictionary| d.bytes().len() == bytes.len() && d.bytes().get(8..) == bytes.get(8..);
        if let Some(slot) = self.slots.read().iter().position(|s| s.as_deref().is_some_and(same)) {
            self.current.store(slot as u8 + 1, Relaxed);
            return Ok(());
        }
        let d = self.prepare(bytes.to_vec()).map_err(|e| e.to_string())?;
        self.install(d, budget).map(drop)
    }

    /// Make a dictionary from `bytes` (numbered here) and prepare it.
    pub fn prepare(&self, bytes: Vec<u8>) -> Result<Dictionary, CompressError> {
        Dictionary::from_bytes(self.next_id.fetch_add(1, Relaxed), bytes, &self.levels)
    }

    /// Free the slots no object uses any more. `counts(slot)` sums the
    /// objects the shards count for a slot.
    pub fn retire_unused(&self, budget: &Budget, counts: impl Fn(usize) -> u64) {
        let cur = self.current.load(Relaxed) as usize;
        for slot in 0..DICT_SLOTS {
            if slot + 1 == cur {
                continue;
            }
            // Only a store in flight can hold a reference besides the slot
            // (it took it while the slot was current, and publishes before
            // dropping it), and no new one can be taken: not current.
            let idle = self.slots.read()[slot].as_ref().is_some_and(|d| Arc::strong_count(d) == 1);
            if !idle || counts(slot) != 0 {
                self.draining.lock()[slot] = false;
                continue;
            }
            let mut draining = self.draining.lock();
            if !draining[slot] {
                draining[slot] = true;
                continue;
            }
            draining[slot] = false;
            drop(draining);
            if self.current.load(Relaxed) as usize == slot + 1 {
                continue;
            }
            let mut slots = self.slots.write();
            if slots[slot].take().is_some() {
                if let Some(l) = &self.ledger {
                    l.clear_dict(slot);
                }
                budget.uncharge(std::mem::take(&mut self.charged.lock()[slot]));
                self.retired.fetch_add(1, Relaxed);
            }
        }
    }

    /// One training round (see the module notes). `eval` is the compressor
    /// whose bytes decide; `pool_pages` the pages stored now (a dictionary
    /// must save more than it costs at this size). `force` trains on
    /// whatever the ring holds, full or not.
    pub fn round(&self, eval: Compressor, pool_pages: u64, budget: &Budget, force: bool) -> Result<TrainReport, String> {
        let mut rep = TrainReport::default();
        self.check_drift();
        let ring = {
            let mut r = self.ring.lock();
            let ready = if force { r.filled >= 32 } else { r.filled > 0 && r.filled * PAGE_SIZE == r.pages.len() };
            if !ready {
                return Ok(rep);
            }
            std::mem::take(&mut *r)
        };
        self.stop_collecting(&ring, budget);
        let pages = &ring.pages[..ring.filled * PAGE_SIZE];
        let (mut train, mut held) = (Vec::new(), Vec::new());
        for (i, p) in pages.chunks_exact(PAGE_SIZE).enumerate() {
            if i % 2 == 0 {
                train.push(p)
            } else {
                held.push(p)
            }
        }
        let mut out = vec![0u8; 2 * PAGE_SIZE];
        let mut measure = |d: Option<&Dictionary>| -> u64 {
            held.iter()
                .map(|p| {
                    let n = match d {
                        Some(d) => d.compress(eval, p, &mut out),
                        None => eval.compress(p, &mut out),
                    };
                    n.unwrap_or(PAGE_SIZE) as u64
                })
                .sum()
        };
        rep.plain_bytes = measure(None);
        rep.current_bytes = self.current_dict().map(|c| measure(Some(&c)));
        let sizes = vec![PAGE_SIZE; train.len()];
        let d = Dictionary::train(self.next_id.fetch_add(1, Relaxed), &train.concat(), &sizes, self.cfg.max_size, &self.levels).map_err(|e| {
            // Sample again for the next round.
            self.collecting.store(true, Relaxed);
            format!("{e} (on {} sampled pages, for a dictionary of at most {} bytes)", train.len(), self.cfg.max_size)
        })?;
        self.trainings.fetch_add(1, Relaxed);
        let b = measure(Some(&d));
        rep.trained_bytes = Some(b);
        let best_now = rep.current_bytes.unwrap_or(rep.plain_bytes);
        let min_gain = rep.plain_bytes * self.cfg.min_gain_percent as u64 / 100;
        // Bytes the pool would save at its current size.
        let saving = best_now.saturating_sub(b) * pool_pages.max(held.len() as u64) / held.len().max(1) as u64;
        if best_now.saturating_sub(b) >= min_gain.max(1) && saving > d.heap_bytes() {
            rep.installed = Some(self.install(d, budget)?);
        }
        Ok(rep)
    }
}

/// Growth of the mean compressed size, in percent, that starts a new round.
const DRIFT_PERCENT: u64 = 15;

/// How long the trainer sleeps between rounds.
pub(crate) const TRAIN_PERIOD: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pool, PoolConfig, ZmemError};
    use zmem_testkit::XorShift;

    /// Words from a vocabulary of 600 that pages share but rarely repeat
    /// within one: what a dictionary holds and a page alone does not.
    fn page(k: u64) -> Vec<u8> {
        let word = |i: u64| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (0..11).map(|b| b'a' + ((h >> (b * 5)) % 26) as u8).collect::<Vec<u8>>()
        };
        let mut p = Vec::with_capacity(PAGE_SIZE);
        let mut r = XorShift::from_state(k.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        while p.len() < PAGE_SIZE {
            p.extend_from_slice(&word(r.below(600)));
            p.push(b' ');
        }
        p.truncate(PAGE_SIZE);
        p
    }

    fn trained(alg: Compressor, lz4: bool) -> Pool {
        let dict = DictConfig { source: DictSource::Auto, lz4, samples: 64, sample_every: 1, max_size: 8 << 10, background: false, ..DictConfig::default() };
        let p = Pool::new(PoolConfig { compressor: alg, dict, ..PoolConfig::default() }).unwrap();
        for k in 0..2000 {
            p.store(k, &page(k)).unwrap();
        }
        let rep = p.train_dictionary().unwrap();
        rep.installed.unwrap_or_else(|| panic!("not trained: {rep:?}"));
        for k in 0..300 {
            p.store(k, &page(k)).unwrap();
        }
        assert_eq!(p.stats().dict_pages, 300);
        p
    }

    /// A dictionary gone from its slot is a typed error; another
    /// dictionary in its place is one too for zstd, whose frames carry the
    /// id (lz4 blocks carry none: the pool never changes a slot in use).
    #[test]
    fn a_missing_or_different_dictionary_is_an_error_never_wrong_data() {
        for (alg, lz4) in [(Compressor::zstd(3).unwrap(), false), (Compressor::default(), true)] {
            let p = trained(alg, lz4);
            let d = p.dicts_for_test().unwrap();
            let slot = d.current.load(Relaxed) as usize - 1;
            let kept = d.slots.write()[slot].take();
            let mut buf = vec![0u8; PAGE_SIZE];
            match p.load(7, &mut buf) {
                Err(ZmemError::DictMissing { key: 7, slot: s }) => assert_eq!(s, slot),
                r => panic!("{alg}: {r:?}"),
            }
            if alg.algorithm == Algorithm::Zstd {
                let other = Dictionary::from_bytes(99, kept.as_ref().unwrap().bytes().to_vec(), &[3]).unwrap();
                d.slots.write()[slot] = Some(Arc::new(other));
                assert!(matches!(p.load(7, &mut buf), Err(ZmemError::Corrupt { key: 7, .. })), "{alg}");
            }
            d.slots.write()[slot] = kept;
            p.load(7, &mut buf).unwrap();
            assert_eq!(buf, page(7));
            assert!(p.stats().failed_reads >= 1);
        }
    }

    #[test]
    fn the_current_dictionary_is_never_freed_and_a_held_one_waits() {
        let p = trained(Compressor::zstd(3).unwrap(), false);
        let d = p.dicts_for_test().unwrap();
        let retire = || p.retire_dicts_for_test();
        p.invalidate_range(0..300);
        for _ in 0..3 {
            retire();
        }
        assert_eq!(p.stats().dict_count, 1, "the current one stays with no object");
        // Make it old, and hold a reference as a store in flight does.
        let held = d.current(Compressor::zstd(3).unwrap()).unwrap();
        d.current.store(0, Relaxed);
        for _ in 0..3 {
            retire();
        }
        assert_eq!(p.stats().dict_count, 1, "held by a store in flight");
        drop(held);
        retire();
        assert_eq!(p.stats().dict_count, 1, "found unused once: freed the next round");
        retire();
        let st = p.stats();
        assert_eq!((st.dict_count, st.dict_retired), (0, 1));
        assert_eq!(p.mem_charged(), st.mem_used_total);
    }
}
