//! A compressed read cache in front of an [`Origin`]: the caching block
//! device of `zmem serve --origin` (zcache's role, as a device).
//!
//! # How a request flows
//! * **Read.** Each page is looked up in the pool; a hit is decompressed
//!   into the reply. The misses of a request are fetched with one aligned
//!   origin read from the first to the last (a gap of more than 32 hits
//!   starts another): a throttled disk counts operations. The reply is
//!   filled from it, and each missed page is then stored in the pool
//!   (compressed) unless a write touched it meanwhile. A request of
//!   256 KiB or more is read by two threads, half each: a reader that waits
//!   for each request gets its pages decompressed twice as fast.
//! * **Write.** The write is widened to whole pages (a partial head or
//!   tail page comes from the pool, or else the origin), written to the
//!   origin, and only then are the pages stored in the pool and the
//!   request answered: the origin always has every acknowledged write, so
//!   the pool may drop any page at any time. A write the origin fails
//!   drops the pool's copies of its pages (what the origin now holds there
//!   is unknown) and fails the request.
//! * **TRIM, WRITE_ZEROES** go to the origin for whole pages (a zeroed
//!   partial page is a write of zeroes); the pool drops those pages.
//!   **FLUSH** flushes the origin; FUA writes are durable at the origin
//!   before they are answered.
//!
//! # Why the cache is never stale
//! Writers, trims and zeroings hold the page-stripe locks of all their
//! pages (taken in stripe order, so two of them cannot deadlock) from
//! before the origin sees them until the pool is updated, and bump a
//! counter per stripe. A read miss notes those counters *before* it reads
//! the origin and stores a fetched page only if its stripe's counter is
//! unchanged, under the stripe's lock: a page fetched before or during a
//! write is never cached after that write's copy. Reads take no lock to
//! fetch, so misses of different requests run in parallel.
//!
//! # The pool
//! The pool is built with a [`DropCold`](zmem_core::DropCold) cold store
//! and a `max_pool`: its shrinker drops the coldest pages (LRU with second
//! chance) instead of writing them anywhere; a dropped page is a miss.
//!
//! **Admission once full.** A scan of more data than the pool holds,
//! repeated (a backup, a search through a tree, iozone), defeats LRU: each
//! page is dropped just before it is read again, and every read misses. So
//! once the pool holds its accept threshold less [`FULL_BELOW_ACCEPT`] % of
//! `max_pool` (80 % by default), a fetched page
//! is kept only one time in [`ADMIT_ONE_IN`] (the pages of one fetch
//! together, so that kept pages, and later misses, come in runs): a
//! repeated scan then finds a stable share of its pages (about what the pool holds, where LRU finds
//! none), and a new working set still moves in, an eighth as fast. Written
//! pages are always kept (or their old copy dropped).
//!
//! **Inclusive.** A block device sees reads, not the page cache's
//! evictions, so a page the kernel holds is in the pool too; zcache, fed
//! by evictions, held only pages the page cache had let go. The pool has
//! to hold the working set by itself.
//! Pages that compress to more than `--cache-max-compressed` bytes are not
//! kept (the pool's `huge_threshold`). zcache kept only pages below half a
//! page, since the page cache held the others for no more memory; this
//! pool squeezes the page cache, so the default keeps every page that
//! compresses at all. The pool never holds the only copy of anything.

use std::cell::RefCell;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use parking_lot::MutexGuard;
use zmem_core::{Pool, ZmemError, PAGE_SIZE};

use crate::origin::{AlignedBuf, Origin};
use crate::{ExportError, Stripes, LOCK_STRIPES};

const PAGE: u64 = PAGE_SIZE as u64;
/// The pool counts as full from this many percent of `max_pool` below its
/// accept threshold (where a shrinker round stops: above it, a round would
/// open the door to every page again).
pub const FULL_BELOW_ACCEPT: u8 = 10;
/// A full pool keeps the pages of one fetch in this many.
pub const ADMIT_ONE_IN: u64 = 8;
/// Misses of one request separated by at most this many hits are fetched
/// with one origin read (the hits' pages are read again, and dropped): a
/// throttled disk counts operations, and a few pages more cost less than
/// another one.
const MERGE_GAP: u64 = 32;
/// Reads of at least this many bytes are done by two threads.
const SPLIT_READ: usize = 256 << 10;
/// A bounce buffer larger than this is freed after its request.
const KEEP_BOUNCE: usize = 4 << 20;

thread_local! {
    /// Each thread's aligned buffer for origin I/O.
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::new());
    /// Each thread's draw for admission once the pool is full.
    static ADMIT_RNG: std::cell::Cell<u64> = std::cell::Cell::new(SEEDS.fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed) | 1);
}

/// Seeds of the threads' admission draws.
static SEEDS: AtomicU64 = AtomicU64::new(0x2545_F491_4F6C_DD1D);

/// What the cache and its origin have done (`zmem stat`'s `cache:` and
/// `origin:` lines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OriginStats {
    /// Pages read from the pool, and pages that had to come from the origin.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Fetched or written pages the pool did not keep: they compress to
    /// more than `--cache-max-compressed`, or the pool could not make room.
    pub cache_refused: u64,
    /// Fetched pages not kept because a write reached them meanwhile.
    pub cache_stale: u64,
    /// Fetched pages not kept because the pool was full (it keeps one in
    /// [`ADMIT_ONE_IN`] then).
    pub cache_not_admitted: u64,
    /// Origin reads (requests) and the bytes they brought.
    pub origin_reads: u64,
    pub origin_read_bytes: u64,
    pub origin_writes: u64,
    pub origin_write_bytes: u64,
    pub origin_flushes: u64,
    pub origin_trims: u64,
    pub origin_zeroes: u64,
    /// Origin operations that failed (each failed its request).
    pub origin_errors: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    refused: AtomicU64,
    stale: AtomicU64,
    not_admitted: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    zeroes: AtomicU64,
    errors: AtomicU64,
}

/// The origin, and the per-stripe write counters that keep fetched pages
/// from going stale (see the module notes).
pub(crate) struct Cached {
    origin: Box<dyn Origin>,
    /// Bumped under the stripe's lock by every write, trim or zeroing.
    seqs: Box<[AtomicU64]>,
    n: Counters,
}

/// Stripe locks held over a range of pages (in stripe order).
struct Held<'a> {
    stripes: Vec<usize>,
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl Cached {
    pub(crate) fn new(origin: Box<dyn Origin>) -> Cached {
        Cached { origin, seqs: (0..LOCK_STRIPES).map(|_| AtomicU64::new(0)).collect(), n: Counters::default() }
    }

    pub(crate) fn origin(&self) -> &dyn Origin {
        &*self.origin
    }

    pub(crate) fn stats(&self) -> OriginStats {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let n = &self.n;
        OriginStats {
            cache_hits: g(&n.hits),
            cache_misses: g(&n.misses),
            cache_refused: g(&n.refused),
            cache_stale: g(&n.stale),
            cache_not_admitted: g(&n.not_admitted),
            origin_reads: g(&n.reads),
            origin_read_bytes: g(&n.read_bytes),
            origin_writes: g(&n.writes),
            origin_write_bytes: g(&n.write_bytes),
            origin_flushes: g(&n.flushes),
            origin_trims: g(&n.trims),
            origin_zeroes: g(&n.zeroes),
            origin_errors: g(&n.errors),
        }
    }

    /// Count an origin failure and turn it into the request's error.
    fn failed(&self, op: &'static str, offset: u64, len: u64, e: io::Error) -> ExportError {
        self.n.errors.fetch_add(1, Relaxed);
        ExportError::Origin { op, offset, len, source: e }
    }

    fn origin_read(&self, buf: &mut [u8], offset: u64) -> Result<(), ExportError> {
        self.n.reads.fetch_add(1, Relaxed);
        self.origin.read_at(buf, offset).map_err(|e| self.failed("read", offset, buf.len() as u64, e))?;
        self.n.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        Ok(())
    }

    /// Lock every stripe of `keys`, in stripe order.
    fn hold<'a>(&self, stripes: &'a Stripes, keys: Range<u64>) -> Held<'a> {
        let mut idx: Vec<usize> =
            if keys.end - keys.start >= LOCK_STRIPES as u64 { (0..LOCK_STRIPES).collect() } else { keys.map(|k| stripes.index(k)).collect() };
        idx.sort_unstable();
        idx.dedup();
        let guards = idx.iter().map(|&i| stripes.lock_index(i)).collect();
        Held { stripes: idx, _guards: guards }
    }

    /// Tell reads in flight that these stripes changed (under their locks).
    fn bump(&self, held: &Held<'_>) {
        for &i in &held.stripes {
            self.seqs[i].fetch_add(1, SeqCst);
        }
    }

    /// Store a page the origin holds; a page the pool will not keep is
    /// dropped from it (an older copy must not stay).
    fn keep(&self, pool: &Pool, key: u64, page: &[u8]) {
        match pool.store(key, page) {
            Ok(()) => {}
            Err(e) => {
                pool.invalidate(key);
                self.n.refused.fetch_add(1, Relaxed);
                if !matches!(e, ZmemError::CompressPoor | ZmemError::PoolFull { .. }) {
                    tracing::debug!("cache: page {key} not kept: {e}");
                }
            }
        }
    }

    /// Whether to keep the pages of a fetch: always while the pool has
    /// room, one fetch in [`ADMIT_ONE_IN`] (at random) once it is full.
    fn admit(&self, pool: &Pool) -> bool {
        let percent = pool.config().accept_threshold_percent.saturating_sub(FULL_BELOW_ACCEPT).max(1) as u64;
        let full = pool.max_pool_usage().is_some_and(|(used, max)| used * 100 >= max * percent);
        if !full {
            return true;
        }
        let admit = ADMIT_RNG.with(|r| {
            // xorshift64: cheap, and any two threads draw independently.
            let mut x = r.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            r.set(x);
            x % ADMIT_ONE_IN == 0
        });
        if !admit {
            self.n.not_admitted.fetch_add(1, Relaxed);
        }
        admit
    }

    /// Read `buf.len()` bytes at `offset` (already range-checked).
    pub(crate) fn read(&self, pool: &Pool, stripes: &Stripes, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        if buf.len() >= SPLIT_READ && offset.is_multiple_of(PAGE) {
            // Two halves at once: a reader that waits for each request
            // (readahead, one stream) gets its pages decompressed by two
            // threads.
            let half = buf.len() / 2 / PAGE_SIZE * PAGE_SIZE;
            let (a, b) = buf.split_at_mut(half);
            return std::thread::scope(|s| {
                let other = s.spawn(|| self.read_part(pool, stripes, offset + half as u64, b));
                let r = self.read_part(pool, stripes, offset, a);
                let r2 = other.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                r.and(r2)
            });
        }
        self.read_part(pool, stripes, offset, buf)
    }

    fn read_part(&self, pool: &Pool, stripes: &Stripes, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let mut page = [0u8; PAGE_SIZE];
        // Misses not yet fetched, ascending; one origin read covers them
        // all while the hits between two of them are few.
        let mut missed: Vec<u64> = Vec::new();
        for p in crate::pieces(offset, buf.len() as u64) {
            let dst = &mut buf[p.buf_off..p.buf_off + p.len];
            let got = if p.full() { pool.load(p.key, dst) } else { pool.load(p.key, &mut page).map(|()| dst.copy_from_slice(&page[p.start..p.start + p.len])) };
            match got {
                Ok(()) => {
                    self.n.hits.fetch_add(1, Relaxed);
                }
                Err(ZmemError::NotFound { .. }) => {
                    self.n.misses.fetch_add(1, Relaxed);
                    if missed.last().is_some_and(|&l| p.key - l > MERGE_GAP) {
                        self.fetch(pool, stripes, &missed, offset, buf)?;
                        missed.clear();
                    }
                    missed.push(p.key);
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !missed.is_empty() {
            self.fetch(pool, stripes, &missed, offset, buf)?;
        }
        Ok(())
    }

    /// Fetch the pages `missed` (ascending) from the origin with one read
    /// from the first to the last, into the parts of `buf` (which holds
    /// `offset..`) they cover, and keep them in the pool unless a write
    /// reached their stripe since before the fetch (or, the pool being
    /// full, they are not admitted: one draw for all of them, so kept
    /// pages come in runs, and so do later misses).
    fn fetch(&self, pool: &Pool, stripes: &Stripes, missed: &[u64], offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let snaps: Vec<u64> = missed.iter().map(|&k| self.seqs[stripes.index(k)].load(SeqCst)).collect();
        let first = missed[0];
        let (start, end) = (first * PAGE, (missed[missed.len() - 1] + 1) * PAGE);
        let (bstart, bend) = (offset, offset + buf.len() as u64);
        BOUNCE.with(|b| {
            let mut b = b.borrow_mut();
            let data = b.get((end - start) as usize);
            self.origin_read(data, start)?;
            let admit = self.admit(pool);
            for (i, &k) in missed.iter().enumerate() {
                let at = ((k - first) * PAGE) as usize;
                let fetched = &data[at..at + PAGE_SIZE];
                let (lo, hi) = ((k * PAGE).max(bstart), ((k + 1) * PAGE).min(bend));
                buf[(lo - bstart) as usize..(hi - bstart) as usize].copy_from_slice(&fetched[(lo - k * PAGE) as usize..(hi - k * PAGE) as usize]);
                if !admit {
                    continue;
                }
                let _g = stripes.lock(k);
                if self.seqs[stripes.index(k)].load(SeqCst) != snaps[i] {
                    self.n.stale.fetch_add(1, Relaxed);
                    continue;
                }
                self.keep(pool, k, fetched);
            }
            b.shrink(KEEP_BOUNCE);
            Ok(())
        })
    }

    /// Write `data` at `offset` (range-checked) through to the origin, then
    /// into the pool.
    pub(crate) fn write(&self, pool: &Pool, stripes: &Stripes, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let (a0, a1) = (offset / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
        let keys = a0 / PAGE..a1 / PAGE;
        let held = self.hold(stripes, keys.clone());
        let res = BOUNCE.with(|b| {
            let mut b = b.borrow_mut();
            let buf = b.get((a1 - a0) as usize);
            // Partial head and tail pages: what they hold now.
            if offset != a0 {
                self.current(pool, keys.start, &mut buf[..PAGE_SIZE])?;
            }
            if end != a1 && (keys.end - 1 != keys.start || offset == a0) {
                let n = buf.len();
                self.current(pool, keys.end - 1, &mut buf[n - PAGE_SIZE..])?;
            }
            buf[(offset - a0) as usize..(end - a0) as usize].copy_from_slice(data);
            self.n.writes.fetch_add(1, Relaxed);
            match self.origin.write_at(buf, a0, fua) {
                Ok(()) => {
                    self.n.write_bytes.fetch_add(buf.len() as u64, Relaxed);
                    for (i, k) in keys.clone().enumerate() {
                        self.keep(pool, k, &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
                    }
                    Ok(())
                }
                Err(e) => {
                    // Some of it may have reached the origin: drop every copy.
                    pool.invalidate_range(keys.clone());
                    Err(self.failed("write", a0, a1 - a0, e))
                }
            }
        });
        self.bump(&held);
        BOUNCE.with(|b| b.borrow_mut().shrink(KEEP_BOUNCE));
        res
    }

    /// Page `key` as it is now: from the pool, or else the origin (the
    /// caller holds its stripe's lock).
    fn current(&self, pool: &Pool, key: u64, dst: &mut [u8]) -> Result<(), ExportError> {
        match pool.load(key, dst) {
            Ok(()) => Ok(()),
            Err(ZmemError::NotFound { .. }) => self.origin_read(dst, key * PAGE),
            Err(e) => Err(e.into()),
        }
    }

    /// Run `op` on the origin for whole pages `keys`, then drop them from
    /// the pool (whatever `op` did), all under the pages' locks.
    fn whole_pages(
        &self,
        pool: &Pool,
        stripes: &Stripes,
        keys: Range<u64>,
        what: &'static str,
        op: impl FnOnce(u64, u64) -> io::Result<()>,
    ) -> Result<u64, ExportError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let held = self.hold(stripes, keys.clone());
        let (off, len) = (keys.start * PAGE, (keys.end - keys.start) * PAGE);
        let r = op(off, len);
        let dropped = pool.invalidate_range(keys);
        self.bump(&held);
        r.map_err(|e| self.failed(what, off, len, e))?;
        Ok(dropped)
    }

    /// TRIM whole pages `keys`: passed on, dropped from the pool.
    pub(crate) fn trim(&self, pool: &Pool, stripes: &Stripes, keys: Range<u64>) -> Result<u64, ExportError> {
        self.n.trims.fetch_add(1, Relaxed);
        self.whole_pages(pool, stripes, keys, "trim", |o, l| self.origin.trim(o, l))
    }

    /// WRITE_ZEROES whole pages `keys`: passed on, dropped from the pool.
    pub(crate) fn zero(&self, pool: &Pool, stripes: &Stripes, keys: Range<u64>) -> Result<(), ExportError> {
        self.n.zeroes.fetch_add(1, Relaxed);
        self.whole_pages(pool, stripes, keys, "write_zeroes", |o, l| self.origin.write_zeroes(o, l)).map(|_| ())
    }

    pub(crate) fn flush(&self) -> Result<(), ExportError> {
        self.n.flushes.fetch_add(1, Relaxed);
        self.origin.flush().map_err(|e| self.failed("flush", 0, 0, e))
    }
}
