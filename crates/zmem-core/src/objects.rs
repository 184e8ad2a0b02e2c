//! The object store: compressed objects in the allocator, and the codec
//! that makes and reads them.
//!
//! # What it owns
//! The allocator (`zmem-alloc`'s `ZsPool`, and through it the pool's one
//! [`Budget`]), the compressor new objects are written with (fixed at
//! creation; recompression rewrites objects with others), the pool's dictionaries (`dict.rs`), and
//! the rule for pages that do not compress: below the huge threshold an
//! object is stored compressed; at or over it, raw (zram's huge pages), or
//! refused (`store_incompressible` off: zswap's `reject_compress_poor`).
//! It counts what only it sees: pages refused for compressing poorly or
//! failing to compress, and huge pages stored since the start.
//!
//! # What it does not know
//! Keys, the index, dedup and the tier: it hands out handles and reads
//! them back, and whoever holds a handle decides when it is freed. An
//! object is read under whatever lock keeps its handle alive (the key's
//! shard, for a load); the allocator's own class locks come after that.
//!
//! # Trade-offs
//! * One scratch buffer per thread (zswap's per-CPU `dstmem`) for
//!   compression and comparison: no allocation on the store path, at the
//!   cost of 8 KiB per thread that ever stored a page.
//! * An object written with a dictionary holds a reference to it
//!   ([`DictRef`]) from compression until the caller has published the
//!   object, so the dictionary cannot be retired in between.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use zmem_alloc::{AllocError, AllocStats, Budget, Handle, ZsPool};
use zmem_compress::{Algorithm, CompressError, Compressor};

use crate::dict::{DictRef, Dicts};
use crate::entry::{ObjInfo, PAGE_SIZE, TAG_RAW, TAG_RAW_INCOMP};
use crate::error::{Result, ZmemError};
use crate::stats::Stats;

const SCRATCH_LEN: usize = 2 * PAGE_SIZE;

thread_local! {
    /// Per-thread compression buffer (zswap's per-CPU `dstmem`).
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; SCRATCH_LEN]);
}

/// Run `f` with this thread's page-sized scratch buffer (not while
/// [`Objects::encode`] holds it: `encode` never calls back into this).
pub(crate) fn with_page_buf<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with_borrow_mut(|s| f(&mut s[..PAGE_SIZE]))
}

/// The allocator and the codec (see the module notes).
pub(crate) struct Objects {
    alloc: ZsPool,
    compressor: Compressor,
    dicts: Option<Dicts>,
    huge_threshold: usize,
    store_incompressible: bool,
    reject_compress_poor: AtomicU64,
    reject_compress_fail: AtomicU64,
    huge_pages_since: AtomicU64,
}

impl Objects {
    pub fn new(alloc: ZsPool, compressor: Compressor, dicts: Option<Dicts>, huge_threshold: usize, store_incompressible: bool) -> Objects {
        Objects {
            alloc,
            compressor,
            dicts,
            huge_threshold,
            store_incompressible,
            reject_compress_poor: AtomicU64::new(0),
            reject_compress_fail: AtomicU64::new(0),
            huge_pages_since: AtomicU64::new(0),
        }
    }

    /// The compressor new objects are written with.
    pub fn compressor(&self) -> Compressor {
        self.compressor
    }

    /// What every growth of the pool is charged to (zram's mem_limit).
    pub fn budget(&self) -> &Budget {
        self.alloc.budget()
    }

    /// The pool's dictionaries, unless it has none.
    pub fn dicts(&self) -> Option<&Dicts> {
        self.dicts.as_ref()
    }

    /// Compress `page` and hand the bytes to be stored to `f`, with their
    /// encoding. `f` runs with the thread's scratch buffer borrowed.
    pub fn encode<R>(&self, page: &[u8], f: impl FnOnce(&[u8], ObjInfo) -> Result<R>) -> Result<R> {
        let c = self.compressor();
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let r = self.compress_page(c, page, &mut s[..]);
            if let Some(d) = &self.dicts {
                let len = r.as_ref().map_or(PAGE_SIZE, |(info, _)| (info.len as usize).min(PAGE_SIZE));
                d.note_store(page, len, self.budget());
            }
            let info = match r {
                Ok((info, dict)) if (info.len as usize) < self.huge_threshold => {
                    let r = f(&s[..info.len as usize], info);
                    // Held until the object is published: see Dicts::retire_unused.
                    drop(dict);
                    return r;
                }
                Ok((info, _)) if (info.len as usize) < PAGE_SIZE => ObjInfo::raw(),
                Ok(_) | Err(CompressError::DoesNotFit { .. }) => ObjInfo::raw_incompressible(),
                Err(e) => {
                    self.reject_compress_fail.fetch_add(1, Relaxed);
                    return Err(ZmemError::Compress(e));
                }
            };
            if !self.store_incompressible {
                self.reject_compress_poor.fetch_add(1, Relaxed);
                return Err(ZmemError::CompressPoor);
            }
            self.huge_pages_since.fetch_add(1, Relaxed);
            f(page, info)
        })
    }

    /// Compress `page` with `c` into `out`, with the current dictionary if
    /// `c` uses one. The reference returned keeps that dictionary alive:
    /// hold it until the object is published.
    pub fn compress_page(&self, c: Compressor, page: &[u8], out: &mut [u8]) -> std::result::Result<(ObjInfo, Option<DictRef>), CompressError> {
        match self.dicts.as_ref().and_then(|d| d.current(c)) {
            Some(dict) => {
                let n = dict.1.compress(c, page, out)?;
                Ok((ObjInfo::with_dict(dict.0, c.algorithm, n), Some(dict)))
            }
            None => Ok((ObjInfo::compressed(c.algorithm, c.compress(page, out)?), None)),
        }
    }

    /// Turn a stored object (`obj`, its exact bytes) back into a page.
    /// `key` names the page in errors.
    pub fn decode(&self, key: u64, info: ObjInfo, obj: &[u8], out: &mut [u8]) -> Result<()> {
        if info.tag == TAG_RAW || info.tag == TAG_RAW_INCOMP {
            if obj.len() != PAGE_SIZE {
                return Err(ZmemError::Inconsistent { key, what: format!("a raw page's object is {} bytes, not 4096", obj.len()) });
            }
            out.copy_from_slice(obj);
            return Ok(());
        }
        if let Some((slot, alg)) = info.dict() {
            let r = self.dicts.as_ref().and_then(|d| d.decompress(slot, alg, obj, out)).ok_or(ZmemError::DictMissing { key, slot })?;
            return r.map_err(|source| ZmemError::Corrupt { key, source });
        }
        let r = Algorithm::from_tag(info.tag).and_then(|alg| zmem_compress::decompress(alg, obj, out));
        r.map_err(|source| ZmemError::Corrupt { key, source })
    }

    /// Decode the object `h` into `out`. `key` names the page in errors.
    pub fn read_object(&self, key: u64, h: Handle, info: ObjInfo, out: &mut [u8]) -> Result<()> {
        match self.alloc.read(h, |obj| self.decode(key, info, &obj[..info.len as usize], out)) {
            Ok(r) => r,
            Err(source) => Err(ZmemError::ObjectUnreadable { key, source }),
        }
    }

    /// Whether the object `h` decodes to `page`.
    pub fn equals(&self, h: Handle, info: ObjInfo, page: &[u8]) -> bool {
        with_page_buf(|out| self.read_object(0, h, info, out).is_ok() && out == page)
    }

    /// Run `f` over the object `h`'s stored bytes (all of its slot).
    pub fn read<R>(&self, h: Handle, f: impl FnOnce(&[u8]) -> R) -> std::result::Result<R, AllocError> {
        self.alloc.read(h, f)
    }

    /// Append object `h`'s bytes to a batch buffer; returns where they start.
    pub fn copy_out(&self, h: Handle, info: ObjInfo, buf: &mut Vec<u8>) -> Option<usize> {
        let off = buf.len();
        self.alloc.read(h, |obj| buf.extend_from_slice(&obj[..info.len as usize])).ok().map(|()| off)
    }

    /// A new object holding `bytes`.
    pub fn write(&self, bytes: &[u8]) -> std::result::Result<Handle, AllocError> {
        self.alloc.alloc_write(bytes)
    }

    /// Rewrite object `h` in place if `bytes` keep its size class.
    pub fn rewrite(&self, h: Handle, bytes: &[u8]) -> std::result::Result<bool, AllocError> {
        self.alloc.rewrite(h, bytes)
    }

    /// The allocator's arena file (`zmem_alloc::ZsPool::arena_fd`).
    pub fn arena_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.alloc.arena_fd()
    }

    pub fn free(&self, h: Handle) -> std::result::Result<(), AllocError> {
        self.alloc.free(h)
    }

    /// Whether an object of `new` bytes lands in a smaller size class than
    /// one of `old` bytes (and below the huge threshold): only then does
    /// rewriting it free anything.
    pub fn smaller_class(&self, new: usize, old: usize) -> bool {
        let old_class = ZsPool::class_size(old).unwrap_or(PAGE_SIZE);
        new < self.huge_threshold && ZsPool::class_size(new).is_some_and(|k| k < old_class)
    }

    /// zram's `compact`: move objects out of sparse spans. Pages freed.
    pub fn compact(&self) -> u64 {
        self.alloc.compact()
    }

    /// zsmalloc's per-batch compaction (the shrinker's). Pages freed.
    pub fn compact_spans(&self) -> u64 {
        self.alloc.compact_spans()
    }

    /// Allocator pages in use.
    pub fn pages_used(&self) -> u64 {
        self.alloc.pages_used()
    }

    pub fn alloc_stats(&self) -> AllocStats {
        self.alloc.stats()
    }

    /// Its own counters, into `st`.
    pub fn fill_stats(&self, st: &mut Stats) {
        st.reject_compress_poor = self.reject_compress_poor.load(Relaxed);
        st.reject_compress_fail = self.reject_compress_fail.load(Relaxed);
        st.huge_pages_since = self.huge_pages_since.load(Relaxed);
    }
}
