//! Recompression: zram's `recompress`, rewriting objects in RAM with a
//! stronger algorithm.
//!
//! # Design
//! A pool stores with a fast compressor (lz4) so that stores and loads of
//! hot pages run at its speed. Pages that have sat idle, or that the fast
//! compressor could not shrink (huge pages, stored raw), are worth the CPU
//! of a stronger one: ChromeOS found zstd packs about half of the pages lzo
//! gave up on. As in zram, a pool has up to three recompression algorithms
//! in priority order (1..=3; the pool's own compressor is priority 0), and
//! [`Pool::recompress`](crate::Pool::recompress) takes a filter (idle for S
//! seconds, huge, compressed size at least N) and optionally one priority.
//!
//! For each object in RAM that the filter picks, under its shard lock: the
//! entry is noted and the object's bytes copied (the lock keeps it alive,
//! as for a load). With no lock held, it is decompressed and each algorithm above the object's
//! priority compresses the page in turn; the first whose output lands in a
//! smaller size class of the allocator wins (a smaller output in the same
//! class frees nothing, so zram's rule rejects it too). Its object is
//! allocated, and under the shard lock again, if the entry is unchanged
//! (same object, same generation, not loaded meanwhile) and so are the
//! object's bytes (a store of the same length rewrites an object in place,
//! under the same handle), it is swapped in,
//! keeping its LRU generation, and the old object is freed. A page changed
//! meanwhile keeps its new contents and the rewritten copy is freed: the
//! race costs CPU, never data.
//!
//! An object that no algorithm up to the top priority could shrink is
//! marked (zram's `incompressible`), and later passes skip it without
//! decompressing it. A recompressed object records the priority that
//! wrote it and its algorithm's tag, so loads decode it whatever the pool
//! does next, and only higher priorities are tried on it again.
//!
//! # Trade-offs
//! * Shared (deduplicated) objects and written-back pages are left alone:
//!   a shared object would need its dedup shard's lock held across the
//!   swap, and a record on disk costs no RAM.
//! * Each pass walks the shard's index under its lock to pick candidates
//!   (O(entries), like zram's scan of its slots), then takes the lock once
//!   per candidate; loads and stores of other keys in the shard wait at
//!   most one decompression.
//! * An idle pass ([`Pool::recompress_idle_until`](crate::Pool::recompress_idle_until))
//!   leaves alone the pages the pool was told to write back first (a swap
//!   device's pages no page table points to, `zmem-swap`'s scan): they
//!   leave RAM at the pool's next need for room, and most are dead, so
//!   rewriting them is CPU for nothing. A pass asked for by hand
//!   ([`Pool::recompress`](crate::Pool::recompress)) takes them too.
//! * Loads of pages never recompressed do not change at all: the algorithm
//!   is in the entry, so a recompressed neighbour costs them nothing.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use zmem_compress::Compressor;

use crate::entry::{Entry, ObjInfo, Slot, PAGE_SIZE};
use crate::error::{Result, ZmemError};
use crate::objects::Objects;
use crate::shard::{Index, Shard, ShardLock};
use crate::stats::Counters;
use crate::tier::Tier;

/// The most recompression algorithms a pool may have (zram: 4 algorithms
/// with the primary).
pub const MAX_RECOMP_ALGORITHMS: usize = 3;

/// Below this share of a CPU, idle recompression does no work: it waits
/// [`NO_SHARE_NAP`] and asks again.
const MIN_SHARE: f64 = 0.01;
const NO_SHARE_NAP: Duration = Duration::from_millis(200);

/// Which objects [`Pool::recompress`](crate::Pool::recompress) rewrites,
/// and with what. Every condition given must hold (zram's `type=idle`,
/// `type=huge`, `type=huge_idle`, `threshold=`); none given picks every
/// object in RAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recompress {
    /// Not accessed for at least this many seconds.
    pub idle_secs: Option<u32>,
    /// Stored raw (zram's huge pages).
    pub huge: bool,
    /// Compressed size at least this many bytes (raw pages count 4096).
    pub min_size: Option<u32>,
    /// Only this priority (1..=3); by default each one above the object's.
    pub prio: Option<u8>,
    /// At most this many objects rewritten.
    pub limit: Option<u64>,
}

impl Recompress {
    fn picks(&self, info: ObjInfo, ac: u32, now: u32) -> bool {
        self.idle_secs.is_none_or(|s| now.saturating_sub(ac) >= s) && (!self.huge || info.is_huge()) && self.min_size.is_none_or(|m| info.len as u32 >= m)
    }
}

/// What a recompression pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecompressReport {
    /// Objects the filter picked (not marked, below the top priority).
    pub candidates: u64,
    /// Objects rewritten smaller.
    pub recompressed: u64,
    /// Compressed bytes saved by them (old length minus new).
    pub saved_bytes: u64,
    /// Objects no algorithm could shrink, now marked and skipped later.
    pub marked: u64,
    /// Objects changed, freed or loaded during the pass, or not rewritten
    /// for want of memory: left as they were.
    pub skipped: u64,
    /// Objects an idle pass left alone because the pool was told to write
    /// them back first ([`Pool::write_back_first`](crate::Pool::write_back_first)):
    /// not counted in `candidates`.
    #[serde(default)]
    pub going_first: u64,
}

impl std::ops::AddAssign for RecompressReport {
    fn add_assign(&mut self, r: RecompressReport) {
        self.candidates += r.candidates;
        self.recompressed += r.recompressed;
        self.saved_bytes += r.saved_bytes;
        self.marked += r.marked;
        self.skipped += r.skipped;
        self.going_first += r.going_first;
    }
}

/// What a pass works over: the index, the object store and the counters
/// of the pool, its recompression algorithms, and the time it started.
pub(crate) struct Pass<'a> {
    pub index: &'a Index,
    pub objects: &'a Objects,
    pub counters: &'a Counters,
    /// The pool's recompression algorithms, by priority.
    pub algs: &'a [Compressor],
    /// When the pool was created: access times count seconds from it.
    pub epoch: Instant,
    /// The writeback tier, whose pages named to go first an idle pass
    /// leaves alone.
    pub tier: &'a Tier,
}

/// What became of one candidate.
enum Outcome {
    Recompressed {
        saved: u64,
    },
    Marked,
    /// Left as it was (changed meanwhile, no better size class for this
    /// priority, or no memory for the new object).
    Skipped,
    /// No algorithm shrank it, but not all were tried: left unmarked.
    Kept,
}

/// The page buffers of a pass.
struct Bufs {
    page: Vec<u8>,
    old: Vec<u8>,
    out: Vec<u8>,
}

impl Pass<'_> {
    /// [`Pool::recompress`](crate::Pool::recompress), calling `after_shard`
    /// after each shard; it returns false to stop the pass.
    pub fn run(&self, req: &Recompress, after_shard: impl FnMut() -> bool) -> Result<RecompressReport> {
        self.run_over(req, false, after_shard)
    }

    /// [`Pass::run`]; with `spare_first`, the pages the pool was told to
    /// write back first are left alone (an idle pass: they are about to
    /// leave RAM, and most are a swap device's dead pages).
    fn run_over(&self, req: &Recompress, spare_first: bool, mut after_shard: impl FnMut() -> bool) -> Result<RecompressReport> {
        let top = self.check(req)?;
        let now = self.epoch.elapsed().as_secs().min(u32::MAX as u64) as u32;
        let mut rep = RecompressReport::default();
        let mut budget = req.limit.unwrap_or(u64::MAX);
        let mut bufs = Bufs { page: vec![0u8; PAGE_SIZE], old: vec![0u8; PAGE_SIZE], out: vec![0u8; PAGE_SIZE] };
        for shard in self.index.shards() {
            if budget == 0 {
                break;
            }
            let mut picked = self.candidates(&shard.lock(), req, top, now);
            if spare_first {
                // Not under the shard lock: the tier takes its list's lock
                // before a shard's.
                rep.going_first += self.tier.retain_not_named_first(&mut picked) as u64;
            }
            rep.candidates += picked.len() as u64;
            for (key, e) in picked {
                if budget == 0 {
                    break;
                }
                match self.one(shard, key, e, req, top, &mut bufs) {
                    Outcome::Recompressed { saved } => {
                        rep.recompressed += 1;
                        rep.saved_bytes += saved;
                        budget -= 1;
                    }
                    Outcome::Marked => rep.marked += 1,
                    Outcome::Skipped => rep.skipped += 1,
                    Outcome::Kept => {}
                }
            }
            if !after_shard() {
                break;
            }
        }
        self.counters.recompressed_pages.fetch_add(rep.recompressed, Relaxed);
        self.counters.recompress_saved_bytes.fetch_add(rep.saved_bytes, Relaxed);
        self.counters.recompress_marked.fetch_add(rep.marked, Relaxed);
        self.objects.compact();
        Ok(rep)
    }

    /// The request against the pool's algorithms; returns the top priority.
    fn check(&self, req: &Recompress) -> Result<u8> {
        let top = self.algs.len() as u8;
        if top == 0 {
            return Err(ZmemError::Config("this pool has no recompression algorithm: configure one (zmem serve --recomp-algo zstd:9)".into()));
        }
        if let Some(p) = req.prio {
            if p == 0 || p > top {
                return Err(ZmemError::Config(format!("recompression priority {p} does not exist: this pool has priorities 1..={top} ({})", names(self.algs))));
            }
        }
        Ok(top)
    }

    /// The objects in RAM of a shard that `req` picks (not marked, below
    /// the priority asked).
    fn candidates(&self, s: &Shard, req: &Recompress, top: u8, now: u32) -> Vec<(u64, Entry)> {
        s.iter_in_ram()
            .filter(|&(_, e, ac)| match e.slot() {
                Slot::Obj(_, info) => !e.no_recomp() && e.prio() < req.prio.unwrap_or(top) && req.picks(info, ac, now),
                _ => false,
            })
            .map(|(k, e, _)| (k, e))
            .collect()
    }

    /// Recompress the object of `key`, picked as entry `e` (see the module
    /// notes for the race with stores and loads).
    fn one(&self, shard: &ShardLock, key: u64, e: Entry, req: &Recompress, top: u8, b: &mut Bufs) -> Outcome {
        let Slot::Obj(old_h, old_info) = e.slot() else { return Outcome::Kept };
        let len = old_info.len as usize;
        let copied = {
            let s = shard.lock();
            s.get(key) == Some(e) && self.objects.read(old_h, |obj| obj.get(..len).map(|o| b.old[..len].copy_from_slice(o)).is_some()).unwrap_or(false)
        };
        if !copied || self.objects.decode(key, old_info, &b.old[..len], &mut b.page).is_err() {
            return Outcome::Skipped;
        }
        // The entry alone does not prove the page unchanged: a store of
        // the same length rewrites the object in place.
        let old = &b.old[..len];
        let unchanged = |s: &Shard| s.get(key) == Some(e) && self.objects.read(old_h, |obj| obj.get(..len) == Some(old)).unwrap_or(false);
        let prios = match req.prio {
            Some(p) => p..=p,
            None => e.prio() + 1..=top,
        };
        let mut won = None;
        for p in prios {
            let c = self.algs[p as usize - 1];
            let Ok((info, dict)) = self.objects.compress_page(c, &b.page, &mut b.out) else { continue };
            if self.objects.smaller_class(info.len as usize, len) {
                won = Some((p, info, dict));
                break;
            }
        }
        // The dictionary reference (if any) is held until the swap.
        let Some((p, info, _dict)) = won else {
            // zram marks a page only once the top priority failed too.
            let tried_top = req.prio.is_none_or(|p| p == top);
            let mut s = shard.lock();
            if tried_top && unchanged(&s) {
                s.set_flags(key, e.with_no_recomp());
                return Outcome::Marked;
            }
            return Outcome::Kept;
        };
        let Ok(h) = self.objects.write(&b.out[..info.len as usize]).map_err(|err| self.counters.alloc_failed(err)) else {
            return Outcome::Skipped;
        };
        let new = Entry::obj(h, info).with_gen(e.gen()).with_referenced(e.referenced()).with_prio(p);
        let swapped = {
            let mut s = shard.lock();
            let same = unchanged(&s);
            if same {
                s.replace(key, e, new);
            }
            same
        };
        if let Err(err) = self.objects.free(if swapped { old_h } else { h }) {
            self.counters.free_failed(&err.to_string());
        }
        if swapped {
            Outcome::Recompressed { saved: (old_info.len - info.len) as u64 }
        } else {
            Outcome::Skipped
        }
    }

    /// [`Pool::recompress_idle_until`](crate::Pool::recompress_idle_until).
    pub fn idle_until(&self, idle_secs: u32, mut share: impl FnMut() -> f64, stop: &AtomicBool) -> Result<RecompressReport> {
        let mut total = RecompressReport::default();
        let nap = |d: Duration| {
            let until = Instant::now() + d;
            while !stop.load(Relaxed) && Instant::now() < until {
                std::thread::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_millis(100)));
            }
        };
        // The share now; while it is (next to) none, wait for one.
        let mut share_now = || loop {
            let s = share();
            if s >= MIN_SHARE || stop.load(Relaxed) {
                return s.clamp(MIN_SHARE, 1.0);
            }
            nap(NO_SHARE_NAP);
        };
        while !stop.load(Relaxed) {
            let req = Recompress { idle_secs: Some(idle_secs), ..Recompress::default() };
            share_now();
            let mut since = Instant::now();
            let r = self.run_over(&req, true, || {
                let share = share_now();
                nap(since.elapsed().mul_f64((1.0 - share) / share));
                since = Instant::now();
                !stop.load(Relaxed)
            })?;
            total += r;
            nap(Duration::from_secs(u64::from(idle_secs / 4).clamp(1, 60)));
        }
        Ok(total)
    }
}

/// "zstd:9, lzo": the algorithms by priority, for errors.
pub(crate) fn names(algs: &[Compressor]) -> String {
    algs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
}
