//! A byte-addressed block image over a page pool: what a block-device
//! frontend serves, whatever carries the requests (the NBD server in
//! `zmem-nbd`, the FUSE file in `zmem-fuse`).
//!
//! Page `i` of the device is pool key `i` (offset / 4096). A page that was
//! never written (or was trimmed) is absent from the pool and reads as zeroes.
//! Writes that cover part of a page read the page, patch it and store it
//! back; a striped lock per page makes that read-modify-write atomic against
//! every other writer of the same page, so concurrent writes to different
//! sectors of one page (several requests in flight, several connections)
//! never lose each other's data.
//!
//! An export made [`with_origin`](Export::with_origin) is a read cache in
//! front of a slower device instead: the pool holds compressed copies of
//! the origin's pages and may drop any of them; reads that miss and every
//! write go to the origin (`cached.rs` has the design).

#![deny(unsafe_code)]

mod cached;
pub mod origin;

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use zmem_core::{Pool, Residency, ZmemError, PAGE_SIZE};

pub use cached::OriginStats;
pub use origin::{FileOrigin, Origin};

/// Linux errno values of the failures (NBD's error values are the same).
pub const EIO: u32 = libc::EIO as u32;
pub const EINVAL: u32 = libc::EINVAL as u32;
pub const ENOSPC: u32 = libc::ENOSPC as u32;
/// [`Export::block_status`] flags: a hole (nothing stored), and reads as
/// zeroes. They are NBD's `base:allocation` bits.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

const PAGE: u64 = PAGE_SIZE as u64;
const LOCK_STRIPES: usize = 1024;
/// BLOCK_STATUS looks at no more than this many bytes per request (the spec
/// lets the server describe less than asked; clients ask again).
pub const BLOCK_STATUS_SCAN: u64 = 256 << 20;

/// Why an export operation failed; maps to an NBD error value.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("range {offset}+{len} is outside the device ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("{0}")]
    Pool(#[from] ZmemError),
    #[error("the origin failed a {op} of {len} bytes at {offset}: {source}")]
    Origin { op: &'static str, offset: u64, len: u64, source: std::io::Error },
}

impl ExportError {
    /// The errno for this failure (also its NBD error value).
    pub fn errno(&self) -> u32 {
        match self {
            ExportError::OutOfRange { .. } => EINVAL,
            ExportError::Pool(ZmemError::PoolFull { .. }) => ENOSPC,
            ExportError::Pool(_) => EIO,
            ExportError::Origin { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => ENOSPC,
            ExportError::Origin { .. } => EIO,
        }
    }
}

/// One piece of a byte range that lies within a single page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    key: u64,
    /// Offset within the page.
    start: usize,
    len: usize,
    /// Offset within the caller's buffer.
    buf_off: usize,
}

impl Piece {
    fn full(&self) -> bool {
        self.start == 0 && self.len == PAGE_SIZE
    }
}

pub(crate) fn pieces(offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let key = pos / PAGE;
        let start = (pos % PAGE) as usize;
        let n = ((PAGE - start as u64).min(end - pos)) as usize;
        let p = Piece { key, start, len: n, buf_off: (pos - offset) as usize };
        pos += n as u64;
        Some(p)
    })
}

/// Locks over pages, striped: a page's lock is one of [`LOCK_STRIPES`].
pub(crate) struct Stripes(Box<[Mutex<()>]>);

impl Stripes {
    fn new() -> Stripes {
        Stripes((0..LOCK_STRIPES).map(|_| Mutex::new(())).collect())
    }

    pub(crate) fn index(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % LOCK_STRIPES
    }

    pub(crate) fn lock(&self, key: u64) -> MutexGuard<'_, ()> {
        self.0[self.index(key)].lock()
    }

    pub(crate) fn lock_index(&self, i: usize) -> MutexGuard<'_, ()> {
        self.0[i].lock()
    }
}

/// A block device of `size` bytes backed by a shared [`Pool`], or cached
/// by one in front of an [`Origin`].
pub struct Export {
    pool: Arc<Pool>,
    size: u64,
    locks: Stripes,
    origin: Option<cached::Cached>,
}

impl Export {
    pub fn new(pool: Arc<Pool>, size: u64) -> Export {
        Export { pool, size, locks: Stripes::new(), origin: None }
    }

    /// A caching export of `origin`'s whole pages: `pool` holds compressed
    /// copies it may drop at any time (build it with a
    /// [`DropCold`](zmem_core::DropCold) cold store and a `max_pool`), and
    /// every write reaches the origin before it is answered.
    pub fn with_origin(pool: Arc<Pool>, origin: Box<dyn Origin>) -> Export {
        let size = origin.size() / PAGE * PAGE;
        Export { pool, size, locks: Stripes::new(), origin: Some(cached::Cached::new(origin)) }
    }

    /// The origin's counters and the cache's hits, if this export caches one.
    pub fn origin_stats(&self) -> Option<OriginStats> {
        self.origin.as_ref().map(|c| c.stats())
    }

    /// Whether this export caches an origin: then every write, trim,
    /// zeroing and flush waits for it.
    pub fn has_origin(&self) -> bool {
        self.origin.is_some()
    }

    /// Whether reading `[offset, offset + len)` may wait for a disk: with an
    /// origin, a page it touches is not in the pool; without one, a page it
    /// touches is written back to the pool's cold store. False for a range
    /// out of bounds, which fails at once. A frontend that runs cheap
    /// requests on the thread reading them (the NBD server, the FUSE
    /// image's `/dev/fuse` threads) hands these to a worker instead, so
    /// that a miss does not hold up the hits queued behind it. A hint: the
    /// answer may be stale by the time the read runs, and either thread
    /// reads the same bytes.
    pub fn read_may_wait(&self, offset: u64, len: u64) -> bool {
        if len == 0 || self.check(offset, len).is_err() {
            return false;
        }
        let mut keys = offset / PAGE..(offset + len).div_ceil(PAGE);
        if self.origin.is_some() {
            keys.any(|k| !self.pool.contains(k))
        } else {
            // Without a cold store no page is looked up (a RAM disk's reads).
            self.pool.has_cold_store() && keys.any(|k| self.pool.residency(k) == Some(Residency::Backed))
        }
    }

    /// What the origin is, if any (a path or URI, and how it is opened).
    pub fn origin_description(&self) -> Option<String> {
        self.origin.as_ref().map(|c| c.origin().describe())
    }

    /// Make every acknowledged write durable: the origin's, if any (a pool
    /// alone holds nothing durable).
    pub fn flush(&self) -> Result<(), ExportError> {
        match &self.origin {
            Some(c) => c.flush(),
            None => Ok(()),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    fn lock(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks.lock(key)
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::OutOfRange { offset, len, size: self.size }),
        }
    }

    /// Load page `key` into `buf`; an absent page reads as zeroes.
    fn load_page(&self, key: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        match self.pool.load(key, buf) {
            Ok(()) => Ok(()),
            Err(ZmemError::NotFound { .. }) => {
                buf.fill(0);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Read `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        if let Some(c) = &self.origin {
            return c.read(&self.pool, &self.locks, offset, buf);
        }
        // Written-back pages of one request are read from the file together.
        self.pool.prefetch(offset / PAGE..(offset + buf.len() as u64).div_ceil(PAGE));
        for p in pieces(offset, buf.len() as u64) {
            let dst = &mut buf[p.buf_off..p.buf_off + p.len];
            if p.full() {
                self.load_page(p.key, dst)?;
            } else {
                // Zeroed only for partial pages (4 KiB memset per request).
                let mut page = [0u8; PAGE_SIZE];
                self.load_page(p.key, &mut page)?;
                dst.copy_from_slice(&page[p.start..p.start + p.len]);
            }
        }
        Ok(())
    }

    /// Write `data` at `offset`. On error some pages may have been written
    /// (the client sees the whole write fail, as with any block device).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), ExportError> {
        self.write_fua(offset, data, false)
    }

    /// [`write`](Self::write); with `fua`, durable before it returns (the
    /// origin's FUA; a pool alone has nothing durable to force).
    pub fn write_fua(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.check(offset, data.len() as u64)?;
        if let Some(c) = &self.origin {
            return c.write(&self.pool, &self.locks, offset, data, fua);
        }
        for p in pieces(offset, data.len() as u64) {
            let src = &data[p.buf_off..p.buf_off + p.len];
            let _g = self.lock(p.key);
            if p.full() {
                self.pool.store(p.key, src)?;
            } else {
                let mut page = [0u8; PAGE_SIZE];
                self.load_page(p.key, &mut page)?;
                page[p.start..p.start + p.len].copy_from_slice(src);
                self.pool.store(p.key, &page)?;
            }
        }
        Ok(())
    }

    /// Whole pages inside `[offset, offset + len)` (a partial last page of
    /// the device counts as whole when the range reaches the device's end).
    fn whole_pages(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let end = offset + len;
        let first = offset.div_ceil(PAGE);
        let last = if end == self.size { end.div_ceil(PAGE) } else { end / PAGE };
        first..last.max(first)
    }

    /// Discard `[offset, offset + len)`: whole pages are dropped from the
    /// pool (their memory is freed); partial pages are left alone, since a
    /// trim is only a hint.
    pub fn trim(&self, offset: u64, len: u64) -> Result<u64, ExportError> {
        self.check(offset, len)?;
        let r = self.whole_pages(offset, len);
        if let Some(c) = &self.origin {
            return c.trim(&self.pool, &self.locks, r);
        }
        Ok(self.invalidate(r))
    }

    fn invalidate(&self, r: std::ops::Range<u64>) -> u64 {
        // Take each page's stripe lock so a trim cannot interleave with a
        // read-modify-write of the same page.
        if r.end - r.start <= 4096 {
            r.filter(|&k| {
                let _g = self.lock(k);
                self.pool.invalidate(k)
            })
            .count() as u64
        } else {
            self.pool.invalidate_range(r)
        }
    }

    /// Zero `[offset, offset + len)`. Without `no_hole`, whole pages are
    /// dropped (they read back as zeroes and cost nothing); with it, they are
    /// stored as zero-filled pages (zram's same pages: an index entry, no
    /// allocation). Partial pages are patched.
    pub fn write_zeroes(&self, offset: u64, len: u64, no_hole: bool) -> Result<(), ExportError> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let whole = self.whole_pages(offset, len);
        let zero = [0u8; PAGE_SIZE];
        if let Some(c) = &self.origin {
            // Partial pages are writes of zeroes; whole ones go as such.
            let end = offset + len;
            let head_end = (whole.start * PAGE).min(end);
            let tail_start = (whole.end * PAGE).max(head_end);
            for (a, b) in [(offset, head_end), (tail_start, end)] {
                if a < b {
                    c.write(&self.pool, &self.locks, a, &zero[..(b - a) as usize], false)?;
                }
            }
            return c.zero(&self.pool, &self.locks, whole);
        }
        let mut page = [0u8; PAGE_SIZE];
        // Partial head and tail pages.
        let end = offset + len;
        let tail_start = ((end - 1) / PAGE * PAGE).max(offset);
        let mut edges: Vec<Piece> = pieces(offset, len).take(1).collect();
        edges.extend(pieces(tail_start, end - tail_start).map(|mut p| {
            p.buf_off += (tail_start - offset) as usize;
            p
        }));
        edges.dedup_by_key(|p| p.key);
        for p in edges.into_iter().filter(|p| !whole.contains(&p.key)) {
            let _g = self.lock(p.key);
            if !self.pool.contains(p.key) {
                if no_hole {
                    self.pool.store(p.key, &zero)?;
                }
                continue;
            }
            self.load_page(p.key, &mut page)?;
            page[p.start..p.start + p.len].fill(0);
            if !no_hole && page.iter().all(|&b| b == 0) {
                self.pool.invalidate(p.key);
            } else {
                self.pool.store(p.key, &page)?;
            }
        }
        if no_hole {
            for k in whole {
                let _g = self.lock(k);
                self.pool.store(k, &zero)?;
            }
        } else {
            self.invalidate(whole);
        }
        Ok(())
    }

    /// base:allocation extents for `[offset, offset + len)`: (length, flags)
    /// runs; absent pages are `HOLE | ZERO`, stored pages `0`. Describes at
    /// most [`BLOCK_STATUS_SCAN`] bytes and, with `req_one`, one extent.
    pub fn block_status(&self, offset: u64, len: u64, req_one: bool) -> Result<Vec<(u32, u32)>, ExportError> {
        self.check(offset, len)?;
        let len = len.min(BLOCK_STATUS_SCAN);
        if self.origin.is_some() {
            // The origin's data, all of it (the cache does not know holes).
            return Ok(if len == 0 { vec![] } else { vec![(len as u32, 0)] });
        }
        let mut out: Vec<(u32, u32)> = Vec::new();
        for p in pieces(offset, len) {
            let flags = if self.pool.contains(p.key) { 0 } else { STATE_HOLE | STATE_ZERO };
            match out.last_mut() {
                Some((l, f)) if *f == flags => *l += p.len as u32,
                _ => {
                    if req_one && !out.is_empty() {
                        break;
                    }
                    out.push((p.len as u32, flags));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zmem_core::PoolConfig;
    use zmem_testkit::XorShift;

    fn export(size: u64, limit: Option<u64>) -> Export {
        let pool = Pool::new(PoolConfig { mem_limit: limit, ..Default::default() }).unwrap();
        Export::new(Arc::new(pool), size)
    }

    /// Pages held by the pool (from the documented stats).
    fn pages(e: &Export) -> u64 {
        e.pool().stats().orig_data_size / PAGE
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
    }

    #[test]
    fn reads_of_written_back_pages_may_wait_and_others_do_not() {
        let store = zmem_backing::BackingStore::new(Box::new(zmem_backing::MemFile::new(true)), None);
        let pool = Pool::with_cold_store(PoolConfig { max_pool: Some(64 << 20), ..Default::default() }, Box::new(store)).unwrap();
        let e = Export::new(Arc::new(pool), 16 * PAGE);
        let data = pattern(4 * PAGE as usize, 7);
        e.write(0, &data).unwrap();
        assert!(!e.read_may_wait(0, 4 * PAGE), "pages in RAM");
        assert_eq!(e.pool().writeback(zmem_core::WritebackMode::All, None).unwrap(), 4);
        e.write(2 * PAGE, &data[2 * PAGE as usize..3 * PAGE as usize]).unwrap();
        assert!(e.read_may_wait(0, PAGE), "a written-back page");
        assert!(e.read_may_wait(100, 10), "part of one");
        assert!(!e.read_may_wait(2 * PAGE, PAGE), "a page stored again is in RAM");
        assert!(e.read_may_wait(2 * PAGE, 2 * PAGE), "one of two written back");
        assert!(!e.read_may_wait(8 * PAGE, PAGE), "never written");
        assert!(!e.read_may_wait(15 * PAGE, 2 * PAGE), "out of bounds fails at once");
        assert!(!e.read_may_wait(0, 0));
        let mut back = vec![0; 4 * PAGE as usize];
        e.read(0, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn pieces_split() {
        let v: Vec<Piece> = pieces(4000, 5000).collect();
        assert_eq!(
            v,
            vec![
                Piece { key: 0, start: 4000, len: 96, buf_off: 0 },
                Piece { key: 1, start: 0, len: 4096, buf_off: 96 },
                Piece { key: 2, start: 0, len: 808, buf_off: 4192 },
            ]
        );
        assert_eq!(pieces(0, 0).count(), 0);
    }

    #[test]
    fn unaligned_io_matches_a_model() {
        let size = 64 * 4096 + 1000; // not a multiple of the page size
        let e = export(size, None);
        let mut model = vec![0u8; size as usize];
        let mut r = XorShift::from_state(12345);
        for i in 0..400 {
            let x = r.next_u64();
            let off = x % size;
            let len = 1 + (x >> 20) % 20000;
            let len = len.min(size - off);
            let (o, l) = (off as usize, len as usize);
            match i % 5 {
                0 | 1 => {
                    let d = pattern(l, i as u8);
                    e.write(off, &d).unwrap();
                    model[o..o + l].copy_from_slice(&d);
                }
                2 => {
                    e.write_zeroes(off, len, i % 2 == 0).unwrap();
                    model[o..o + l].fill(0);
                }
                3 => {
                    // Trim only drops whole pages; mirror that in the model.
                    e.trim(off, len).unwrap();
                    for k in e.whole_pages(off, len) {
                        let s = (k * PAGE) as usize;
                        let t = (s + PAGE_SIZE).min(size as usize);
                        model[s..t].fill(0);
                    }
                }
                _ => {
                    let mut b = vec![0xAAu8; l];
                    e.read(off, &mut b).unwrap();
                    assert_eq!(b, &model[o..o + l], "read {off}+{len}");
                }
            }
        }
        let mut all = vec![0u8; size as usize];
        e.read(0, &mut all).unwrap();
        assert_eq!(all, model);
    }

    #[test]
    fn range_errors() {
        let e = export(8192, None);
        assert!(matches!(e.read(8192, &mut [0u8; 1]), Err(ExportError::OutOfRange { .. })));
        assert!(e.write(u64::MAX, &[0u8; 2]).is_err());
        assert!(e.trim(1, u64::MAX).is_err());
        assert_eq!(e.read(8191, &mut [0u8; 1]).map_err(|e| e.errno()), Ok(()));
        assert_eq!(e.write(9000, &[1]).unwrap_err().errno(), EINVAL);
    }

    #[test]
    fn trim_frees_and_zeroes_semantics() {
        let e = export(1 << 20, None);
        e.write(0, &pattern(1 << 20, 1)).unwrap();
        assert_eq!(pages(&e), 256);
        // Partial pages are not dropped by trim.
        assert_eq!(e.trim(100, 8192).unwrap(), 1);
        assert_eq!(pages(&e), 255);
        assert_eq!(e.trim(0, 1 << 20).unwrap(), 255);
        assert_eq!(pages(&e), 0);
        // WRITE_ZEROES without NO_HOLE leaves holes, with NO_HOLE same pages.
        e.write(0, &pattern(16384, 2)).unwrap();
        e.write_zeroes(0, 16384, false).unwrap();
        assert_eq!(pages(&e), 0);
        e.write_zeroes(0, 16384, true).unwrap();
        assert_eq!(pages(&e), 4);
        assert_eq!(e.pool().stats().same_pages, 4);
        // A partial zeroing that leaves a page all zero frees it (no NO_HOLE).
        e.trim(0, 1 << 20).unwrap();
        e.write(10, &[7u8; 10]).unwrap();
        e.write_zeroes(0, 100, false).unwrap();
        assert_eq!(pages(&e), 0);
    }

    #[test]
    fn block_status_runs() {
        let e = export(10 * 4096, None);
        e.write(4096, &[1u8; 8192]).unwrap();
        let hz = STATE_HOLE | STATE_ZERO;
        assert_eq!(e.block_status(0, 10 * 4096, false).unwrap(), vec![(4096, hz), (8192, 0), (7 * 4096, hz)]);
        assert_eq!(e.block_status(100, 5000, false).unwrap(), vec![(3996, hz), (1004, 0)]);
        assert_eq!(e.block_status(0, 10 * 4096, true).unwrap(), vec![(4096, hz)]);
        assert!(e.block_status(0, 10 * 4096 + 1, false).is_err());
    }

    #[test]
    fn pool_full_is_enospc_and_old_data_stays() {
        let e = export(64 << 20, Some(256 << 10));
        let mut r = XorShift::from_state(99);
        let mut noise = vec![0u8; 4096];
        let mut full = None;
        for k in 0..16384u64 {
            r.fill(&mut noise);
            if let Err(err) = e.write(k * 4096, &noise) {
                full = Some((k, err));
                break;
            }
        }
        let (k, err) = full.expect("mem_limit must be hit");
        assert_eq!(err.errno(), ENOSPC);
        // The failed page reads as before (zeroes); earlier pages are intact.
        let mut b = vec![1u8; 4096];
        e.read(k * 4096, &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0));
        // Freeing space makes writes succeed again.
        e.trim(0, 64 << 20).unwrap();
        e.write(0, &noise).unwrap();
    }

    #[test]
    fn concurrent_sector_writes_to_one_page() {
        let e = Arc::new(export(1 << 20, None));
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let e = &e;
                s.spawn(move || {
                    for round in 0..200u64 {
                        // Each thread owns one 512-byte sector of each of 4 pages.
                        for page in 0..4u64 {
                            let v = (t as u8) ^ (round as u8);
                            e.write(page * 4096 + t * 512, &[v; 512]).unwrap();
                        }
                    }
                });
            }
        });
        let mut b = vec![0u8; 4 * 4096];
        e.read(0, &mut b).unwrap();
        for page in 0..4 {
            for t in 0..8 {
                let s = page * 4096 + t * 512;
                let want = (t as u8) ^ 199;
                assert!(b[s..s + 512].iter().all(|&v| v == want), "page {page} sector {t}");
            }
        }
    }
}
