//! A zsmalloc-style allocator for compressed objects.
//!
//! Compressed pages come in every size from a few bytes to a full page, and
//! a general-purpose allocator serves them badly: a malloc header per object,
//! per-thread caches that hoard memory, and no way to hand back a page that
//! has one survivor in it. Linux's zsmalloc (the allocator under zram and
//! zswap) solves this with four ideas, all reproduced here in userspace:
//!
//! * **Size classes.** Object lengths are rounded up to a multiple of
//!   [`CLASS_DELTA`] (16 bytes), with [`MIN_OBJ_SIZE`] (32) the smallest
//!   class and [`PAGE_SIZE`] the largest: 255 classes. Internal
//!   fragmentation is therefore below 16 bytes per object. The 4096 class is
//!   the "huge" class: one incompressible page per 1-page span.
//!
//! * **Spans (zspages).** Each class packs objects back to back into spans
//!   of `k` contiguous pages, `k` in `1..=max_span_pages` chosen per class to
//!   minimise the fraction of the span that cannot hold a whole object (ties
//!   go to the smallest `k`), as zsmalloc's `get_pages_per_zspage` does.
//!   E.g. 3264-byte objects waste 20% of a single page but only 0.4% of a
//!   16-page span. Objects may straddle page boundaries; unlike the kernel,
//!   which must `kmap` two physical pages, our spans are virtually
//!   contiguous, so every object is a plain slice. The price of large spans
//!   is coarser release granularity: a single live object pins all `k` pages.
//!
//! * **No headers in span memory.** Everything the allocator knows lives in
//!   metadata: a per-class handle table (handle index -> span + slot,
//!   threaded into a free list when unused; in the arena, below), and in
//!   the heap span descriptors and a per-span back-pointer array (slot -> handle index) that doubles as the span's
//!   free-slot list. The back-pointers are what make compaction possible:
//!   moving an object means rewriting exactly one handle-table entry, so
//!   [`Handle`]s held by callers stay valid forever. Metadata costs about
//!   4 bytes per slot plus 8 per handle plus ~24 per span
//!   ([`AllocStats::metadata_bytes`] reports it exactly, from capacities).
//!
//! * **Fullness groups and compaction.** Live spans of a class sit in one of
//!   eight occupancy groups (by eighths) or the full group, as intrusive
//!   doubly-linked lists with a bitmask of non-empty groups, so every
//!   operation's bookkeeping is O(1). Allocation always takes from the
//!   fullest non-full span, which concentrates objects and lets sparse spans
//!   drain. A span that becomes empty is released at once
//!   (a hole punched in the arena file, below); its address range and descriptor are kept
//!   for reuse. When frees leave a class with at least a span's worth of
//!   holes, [`ZsPool::compact`] does what `__zs_compact` does: move objects
//!   from the emptiest spans into the fullest non-full ones, updating the
//!   handle table, and release each span it empties.
//!
//! **Memory.** Span memory comes in per-class chunks that grow
//! geometrically (8 spans, then doubling, up to 4 MiB), never one mapping
//! per span (`vm.max_map_count`). The chunks and the handle tables are
//! regions of one file in RAM, the pool's *arena* (`memfd_create`, mapped
//! shared; [`arena`]), so they outlive the process: whoever holds the file
//! can give it to a new process, and [`ZsPool::open`] rebuilds the
//! allocator's heap metadata (span descriptors, back-pointers, free lists,
//! groups) from the handle tables and the arena's directory of regions. A
//! released span's pages are a hole punched in the file. Chunks opt out of
//! transparent huge pages, so RSS tracks live spans. [`AllocStats::pages_used`] counts the
//! pages of live spans only. Those pages and every growth of the metadata
//! tables are charged to a [`Budget`] before they are taken, so an optional
//! byte limit ([`AllocConfig::limit_bytes`], or a budget shared with the
//! rest of a pool, [`ZsPool::with_budget`]) caps pages *and* metadata: an
//! allocation that would take the total past it fails with
//! [`AllocError::LimitReached`] and changes nothing visible. Compaction
//! charges a destination page before it writes into it, and stops when it
//! cannot, so it never takes the pool past its limit either.
//!
//! **Concurrency.** There is no global lock. Each class has its own
//! `RwLock`: allocation, free and each compaction step take it for writing;
//! [`ZsPool::read`] holds it for reading while the caller's closure runs, so
//! compaction can never move an object out from under a reader (the kernel
//! gets the same effect with per-zspage migration locks). Compaction drops
//! the lock between spans so readers and writers of a class interleave with
//! it. Pool-wide counters are atomics.
//!
//! **Handles** are 64-bit: `generation:24 | class:8 | index:32`. Freeing
//! bumps the slot's generation, so stale handles, double frees and garbage
//! values are reported as [`AllocError::InvalidHandle`] (a stale handle can
//! only alias after the same index is reused 2^24 times). A valid handle is
//! never 0, so callers may use 0 as a sentinel.
//!
//! Trade-offs versus the kernel: no class merging (zsmalloc merges classes
//! with equal `k` and objects-per-span; we keep the 16-byte granularity so a
//! handle's class fixes the object's slice size), no per-CPU mapping areas
//! (not needed, spans are contiguous), and an empty span is released
//! immediately, so a class oscillating around one object pays a hole punch
//! and a page fault per cycle, exactly as zsmalloc frees and reallocates a
//! zspage.

#![deny(unsafe_code)]

pub mod arena;
mod budget;
mod handles;
#[allow(unsafe_code)]
mod mem;
mod open;
mod table;

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub use arena::{ArenaError, ARENA_VERSION};
use budget::grow_charged;
pub use budget::Budget;
pub use mem::ArenaLock;
pub use table::{SharedTable, TABLE_PAGE_ENTRIES};

use parking_lot::RwLock;

use arena::{Arena, Kind};
use handles::HandleTable;
use mem::Region;

/// Page size the allocator is built around (spans are whole pages).
pub const PAGE_SIZE: usize = 4096;
/// The smallest size class.
pub const MIN_OBJ_SIZE: usize = 32;
/// Granularity of size classes.
pub const CLASS_DELTA: usize = 16;

/// Number of size classes: 32, 48, ..., 4096.
const NUM_CLASSES: usize = (PAGE_SIZE - MIN_OBJ_SIZE) / CLASS_DELTA + 1;
/// Default and hard upper bound for [`AllocConfig::max_span_pages`].
const DEFAULT_SPAN_PAGES: usize = 32;
pub(crate) const MAX_SPAN_PAGES: usize = 32;
/// Largest chunk we map at once (unless one span is bigger).
const MAX_CHUNK_BYTES: usize = 4 << 20;
/// Spans in a class's first chunk; later chunks double.
const FIRST_CHUNK_SPANS: usize = 8;

/// Occupancy groups: 0..8 partial (by eighths), then full, then released.
const PARTIAL_GROUPS: u8 = 8;
const G_FULL: u8 = PARTIAL_GROUPS;
const G_EMPTY: u8 = PARTIAL_GROUPS + 1;
const NUM_GROUPS: usize = PARTIAL_GROUPS as usize + 2;
const PARTIAL_MASK: u16 = (1 << PARTIAL_GROUPS) - 1;

const NIL: u32 = u32::MAX;
const SLOT_NIL: u16 = u16::MAX;
/// Back-pointer word of a free slot: FREE_BIT | next free slot.
const FREE_BIT: u32 = 1 << 31;

// Handle: [gen:24 @40][class:8 @32][index:32 @0]
const GEN_SHIFT: u32 = 40;
const GEN_MASK: u64 = (1 << 24) - 1;
const CLASS_SHIFT: u32 = 32;
/// Handle indices stay below 2^31 so they fit a back-pointer word.
const MAX_HANDLES: usize = 1 << 31;

// Handle-table entry: [gen:24 @40][live:1 @39][span:27 @12][slot:12 @0];
// a free entry has live = 0 and the next free index in the low 32 bits.
const E_LIVE: u64 = 1 << 39;
const E_SPAN_SHIFT: u32 = 12;
const E_SPAN_MASK: u64 = (1 << 27) - 1;
const E_SLOT_MASK: u64 = (1 << 12) - 1;
const MAX_SPANS: usize = 1 << 27;

/// An opaque, stable reference to an allocated object. Survives compaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(u64);

impl Handle {
    /// The handle as a plain integer (never 0 for a handle this crate issued).
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuild a handle from [`Handle::to_raw`]. Any value is accepted;
    /// invalid ones are rejected by the pool with [`AllocError::InvalidHandle`].
    pub fn from_raw(raw: u64) -> Handle {
        Handle(raw)
    }
    fn new(class: usize, idx: u32, gen: u64) -> Handle {
        Handle((gen << GEN_SHIFT) | ((class as u64) << CLASS_SHIFT) | idx as u64)
    }
    fn class(self) -> usize {
        ((self.0 >> CLASS_SHIFT) & 0xFF) as usize
    }
    fn index(self) -> u32 {
        self.0 as u32
    }
    fn gen(self) -> u64 {
        self.0 >> GEN_SHIFT
    }
}

/// Errors from [`ZsPool`] operations. A failed operation changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("invalid object size {len}: must be 1..=4096")]
    InvalidSize { len: usize },
    #[error("invalid, stale or freed handle {raw:#x}")]
    InvalidHandle { raw: u64 },
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("memory limit of {limit_bytes} bytes reached")]
    LimitReached { limit_bytes: u64 },
    #[error("{0}")]
    Unsupported(String),
}

/// Pool configuration.
#[derive(Clone, Debug)]
pub struct AllocConfig {
    /// Upper bound on pages per span (default 16, clamped to 1..=32).
    pub max_span_pages: usize,
    /// Cap on `pages_used * 4096`; `None` = unlimited.
    pub limit_bytes: Option<u64>,
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig { max_span_pages: DEFAULT_SPAN_PAGES, limit_bytes: None }
    }
}

/// A snapshot of pool statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Pages of all live spans (zsmalloc's `zs_get_total_pages`).
    pub pages_used: u64,
    /// High-water mark of `pages_used`.
    pub pages_used_max: u64,
    /// Heap bytes of bookkeeping (handle tables, span descriptors,
    /// back-pointer arrays, chunk lists, class locks), from capacities.
    pub metadata_bytes: u64,
    /// Object slots in live spans.
    pub objs_allocated: u64,
    /// Live objects.
    pub objs_used: u64,
    /// Sum of class sizes of live objects.
    pub obj_bytes_used: u64,
    /// Cumulative pages freed by [`ZsPool::compact`].
    pub pages_compacted: u64,
    /// Cumulative spans given back to the OS (by free or compaction).
    pub spans_released: u64,
}

/// Pages per span for a class: minimise the wasted fraction of the span
/// (tail that cannot hold a whole object), ties to the smallest span.
fn pages_per_span(class_size: usize, max_pages: usize) -> usize {
    let mut best = 1;
    let mut best_waste = PAGE_SIZE % class_size;
    for k in 2..=max_pages {
        let waste = (k * PAGE_SIZE) % class_size;
        // waste/k*P < best_waste/best*P  <=>  waste*best < best_waste*k
        if waste * best < best_waste * k {
            best = k;
            best_waste = waste;
        }
    }
    best
}

fn next_gen(gen: u64) -> u64 {
    if gen >= GEN_MASK {
        1
    } else {
        gen + 1
    }
}

/// Pool-wide atomic counters.
struct Counters {
    pages_used: AtomicU64,
    pages_used_max: AtomicU64,
    pages_compacted: AtomicU64,
    spans_released: AtomicU64,
    /// Pages and metadata are charged here before they are taken.
    budget: Arc<Budget>,
    /// Where span memory and handle tables come from (or why there is
    /// none: the memfd could not be made, and every allocation fails).
    arena: Result<Arena, String>,
}

impl Counters {
    fn new(budget: Arc<Budget>, arena: Result<Arena, String>) -> Counters {
        Counters {
            pages_used: AtomicU64::new(0),
            pages_used_max: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            spans_released: AtomicU64::new(0),
            budget,
            arena,
        }
    }

    /// Account `pages` more pages of live spans, unless the budget refuses.
    fn reserve(&self, pages: u64) -> Result<(), AllocError> {
        self.budget.try_charge(pages * PAGE_SIZE as u64)?;
        let new = self.pages_used.fetch_add(pages, Relaxed) + pages;
        self.pages_used_max.fetch_max(new, Relaxed);
        Ok(())
    }

    fn unreserve(&self, pages: u64) {
        self.pages_used.fetch_sub(pages, Relaxed);
        self.budget.uncharge(pages * PAGE_SIZE as u64);
    }

    fn arena(&self) -> Result<&Arena, AllocError> {
        self.arena.as_ref().map_err(|e| AllocError::OutOfMemory(format!("no arena: {e}")))
    }
}

/// Descriptor of one span (24 bytes).
#[derive(Clone, Copy, Debug)]
struct SpanMeta {
    /// Index into the class's chunk list and byte offset inside that chunk.
    chunk: u32,
    off: u32,
    /// Intrusive doubly-linked list of the span's fullness group.
    prev: u32,
    next: u32,
    /// Live objects in the span.
    inuse: u16,
    /// First free slot (SLOT_NIL if full).
    free_head: u16,
    group: u8,
    /// Pages of the span that objects have ever been written into since it
    /// was last released or trimmed by compaction (always a prefix).
    /// Untouched pages of a mapping are not resident, so only these are
    /// charged: a class's last, partly filled span costs what it holds,
    /// not its full size.
    touched: u8,
}

/// Everything about one size class; guarded by that class's RwLock.
struct ClassState {
    size: usize,
    span_pages: usize,
    /// Object slots per span (<= 4096).
    objs: usize,
    chunks: Vec<Region>,
    /// Spans not yet carved out of the last chunk.
    chunk_spans_left: usize,
    /// Byte offset of the next span to carve from the last chunk.
    chunk_next_off: usize,
    spans: Vec<SpanMeta>,
    /// `spans.len() * objs` words: handle index of each slot, or
    /// FREE_BIT | next free slot.
    backptr: Vec<u32>,
    /// Handle table, in the arena; see the E_* layout constants.
    handles: HandleTable,
    handle_free: u32,
    heads: [u32; NUM_GROUPS],
    /// Bit g set iff group g is non-empty.
    group_mask: u16,
    live_spans: u64,
    objs_used: u64,
}

impl ClassState {
    fn new(size: usize, max_span_pages: usize) -> ClassState {
        let span_pages = pages_per_span(size, max_span_pages);
        ClassState {
            size,
            span_pages,
            objs: span_pages * PAGE_SIZE / size,
            chunks: Vec::new(),
            chunk_spans_left: 0,
            chunk_next_off: 0,
            spans: Vec::new(),
            backptr: Vec::new(),
            handles: HandleTable::new((size - MIN_OBJ_SIZE) / CLASS_DELTA),
            handle_free: NIL,
            heads: [NIL; NUM_GROUPS],
            group_mask: 0,
            live_spans: 0,
            objs_used: 0,
        }
    }

    fn span_bytes(&self) -> usize {
        self.span_pages * PAGE_SIZE
    }

    /// This class's number.
    fn class(&self) -> usize {
        (self.size - MIN_OBJ_SIZE) / CLASS_DELTA
    }

    #[inline]
    fn group_for(&self, inuse: usize) -> u8 {
        if inuse == 0 {
            G_EMPTY
        } else if inuse >= self.objs {
            G_FULL
        } else {
            (inuse * PARTIAL_GROUPS as usize / self.objs) as u8
        }
    }

    #[inline]
    fn link(&mut self, s: u32, g: u8) {
        let head = self.heads[g as usize];
        let m = &mut self.spans[s as usize];
        m.prev = NIL;
        m.next = head;
        m.group = g;
        if head != NIL {
            self.spans[head as usize].prev = s;
        }
        self.heads[g as usize] = s;
        self.group_mask |= 1 << g;
    }

    #[inline]
    fn unlink(&mut self, s: u32) {
        let SpanMeta { prev, next, group, .. } = self.spans[s as usize];
        if prev != NIL {
            self.spans[prev as usize].next = next;
        } else {
            self.heads[group as usize] = next;
            if next == NIL {
                self.group_mask &= !(1 << group);
            }
        }
        if next != NIL {
            self.spans[next as usize].prev = prev;
        }
    }

    /// Move a linked live span to the group matching its occupancy.
    #[inline]
    fn regroup(&mut self, s: u32) {
        let g = self.group_for(self.spans[s as usize].inuse as usize);
        if g != self.spans[s as usize].group {
            self.unlink(s);
            self.link(s, g);
        }
    }

    #[inline]
    fn pop_slot(&mut self, s: u32) -> usize {
        let m = &mut self.spans[s as usize];
        let slot = m.free_head as usize;
        debug_assert!(m.free_head != SLOT_NIL);
        let next = self.backptr[s as usize * self.objs + slot];
        debug_assert!(next & FREE_BIT != 0);
        m.free_head = (next & !FREE_BIT) as u16;
        m.inuse += 1;
        slot
    }

    #[inline]
    fn push_slot(&mut self, s: u32, slot: usize) {
        let m = &mut self.spans[s as usize];
        self.backptr[s as usize * self.objs + slot] = FREE_BIT | m.free_head as u32;
        m.free_head = slot as u16;
        m.inuse -= 1;
    }

    /// Byte offset in its chunk of `slot` of span `s`, and the chunk index.
    #[inline]
    fn obj_location(&self, s: usize, slot: usize) -> (usize, usize) {
        let m = &self.spans[s];
        (m.chunk as usize, m.off as usize + slot * self.size)
    }

    /// Handle-table entry `idx` (one this class handed out).
    #[inline]
    fn entry(&self, idx: u32) -> u64 {
        self.handles.get(idx as usize).expect("a handle index this class handed out")
    }

    /// Validate a handle and return its (span, slot).
    #[inline]
    fn lookup(&self, h: Handle) -> Option<(usize, usize)> {
        let e = self.handles.get(h.index() as usize)?;
        if e & E_LIVE == 0 || e >> GEN_SHIFT != h.gen() {
            return None;
        }
        Some((((e >> E_SPAN_SHIFT) & E_SPAN_MASK) as usize, (e & E_SLOT_MASK) as usize))
    }

    /// Bring a span to life (reuse a released one, or carve a new one).
    /// Returned span is unlinked, has inuse 0 and no touched pages; its
    /// pages are charged as objects are written into them.
    fn activate_span(&mut self, c: &Counters) -> Result<u32, AllocError> {
        let s = if self.heads[G_EMPTY as usize] != NIL {
            let s = self.heads[G_EMPTY as usize];
            self.unlink(s);
            s
        } else {
            self.carve_span(c)?
        };
        self.live_spans += 1;
        Ok(s)
    }

    /// How many leading pages of a span hold some byte of `slot`.
    #[inline]
    fn pages_through(&self, slot: usize) -> u8 {
        ((slot + 1) * self.size).div_ceil(PAGE_SIZE) as u8
    }

    /// Create a brand-new span descriptor, mapping a new chunk if needed.
    /// The descriptor tables' growth is charged to `b` first; a refusal
    /// leaves the class as it was (a chunk mapped for it stays, unused).
    fn carve_span(&mut self, c: &Counters) -> Result<u32, AllocError> {
        let b = &c.budget;
        if self.spans.len() >= MAX_SPANS {
            return Err(AllocError::OutOfMemory("span table full".into()));
        }
        if self.chunk_spans_left == 0 {
            let span_bytes = self.span_bytes();
            let cap = (MAX_CHUNK_BYTES / span_bytes).max(1);
            let n = (FIRST_CHUNK_SPANS << self.chunks.len().min(20)).min(cap);
            grow_charged(&mut self.chunks, 1, b)?;
            let chunk =
                c.arena()?.add(Kind::Chunk, self.class(), self.chunks.len() as u32, n * span_bytes).map_err(|e| AllocError::OutOfMemory(e.to_string()))?;
            self.chunks.push(chunk);
            self.chunk_spans_left = n;
            self.chunk_next_off = 0;
        }
        let s = self.spans.len() as u32;
        grow_charged(&mut self.spans, 1, b)?;
        grow_charged(&mut self.backptr, self.objs, b)?;
        self.spans.push(SpanMeta {
            chunk: (self.chunks.len() - 1) as u32,
            off: self.chunk_next_off as u32,
            prev: NIL,
            next: NIL,
            inuse: 0,
            free_head: 0,
            group: G_EMPTY,
            touched: 0,
        });
        self.chunk_spans_left -= 1;
        self.chunk_next_off += self.span_bytes();
        let objs = self.objs as u32;
        self.backptr.extend((1..=objs).map(|i| FREE_BIT | if i == objs { SLOT_NIL as u32 } else { i }));
        Ok(s)
    }

    /// Return an empty, unlinked span to the OS and park it for reuse.
    fn release_span(&mut self, s: u32, c: &Counters) {
        debug_assert_eq!(self.spans[s as usize].inuse, 0);
        let (chunk, off) = self.obj_location(s as usize, 0);
        let touched = self.spans[s as usize].touched;
        self.chunks[chunk].discard(off, touched as usize * PAGE_SIZE);
        self.spans[s as usize].touched = 0;
        self.link(s, G_EMPTY);
        self.live_spans -= 1;
        c.unreserve(touched as u64);
        c.spans_released.fetch_add(1, Relaxed);
    }

    fn alloc_write(&mut self, class: usize, data: &[u8], c: &Counters) -> Result<Handle, AllocError> {
        // Check everything fallible before mutating anything (growing a
        // table's capacity, charged, is not a change anyone can see).
        if self.handle_free == NIL {
            if self.handles.len() >= MAX_HANDLES {
                return Err(AllocError::OutOfMemory("handle table full".into()));
            }
            self.handles.make_room(c.arena()?, &c.budget)?;
        }
        let partial = self.group_mask & PARTIAL_MASK;
        let s = if partial != 0 {
            // Fullest non-full span first.
            self.heads[(15 - partial.leading_zeros()) as usize]
        } else {
            self.activate_span(c)?
        };
        let fresh = partial == 0;
        // Charge the pages this object reaches into that were never touched.
        let need = self.pages_through(self.spans[s as usize].free_head as usize);
        let touched = self.spans[s as usize].touched;
        if need > touched {
            if let Err(e) = c.reserve((need - touched) as u64) {
                if fresh {
                    self.link(s, G_EMPTY);
                    self.live_spans -= 1;
                }
                return Err(e);
            }
            self.spans[s as usize].touched = need;
        }
        let slot = self.pop_slot(s);
        if fresh {
            let g = self.group_for(self.spans[s as usize].inuse as usize);
            self.link(s, g);
        } else {
            self.regroup(s);
        }

        let idx = if self.handle_free != NIL {
            let idx = self.handle_free;
            self.handle_free = self.entry(idx) as u32;
            idx
        } else {
            self.handles.push(1 << GEN_SHIFT);
            (self.handles.len() - 1) as u32
        };
        let gen = self.entry(idx) >> GEN_SHIFT;
        self.handles.set(idx as usize, (gen << GEN_SHIFT) | E_LIVE | ((s as u64) << E_SPAN_SHIFT) | slot as u64);
        self.backptr[s as usize * self.objs + slot] = idx;
        self.objs_used += 1;

        let (chunk, off) = self.obj_location(s as usize, slot);
        let obj = self.chunks[chunk].bytes_mut(off, self.size);
        let (head, tail) = obj.split_at_mut(data.len());
        head.copy_from_slice(data);
        tail.fill(0);
        Ok(Handle::new(class, idx, gen))
    }

    fn free(&mut self, h: Handle, c: &Counters) -> Result<(), AllocError> {
        let (s, slot) = self.lookup(h).ok_or(AllocError::InvalidHandle { raw: h.to_raw() })?;
        let s = s as u32;
        self.push_slot(s, slot);
        let idx = h.index();
        self.handles.set(idx as usize, (next_gen(h.gen()) << GEN_SHIFT) | self.handle_free as u64);
        self.handle_free = idx;
        self.objs_used -= 1;
        if self.spans[s as usize].inuse == 0 {
            self.unlink(s);
            self.release_span(s, c);
        } else {
            self.regroup(s);
        }
        Ok(())
    }

    /// Can compaction free at least one span? (zsmalloc's zs_can_compact)
    fn can_compact(&self) -> bool {
        let objs = self.objs as u64;
        self.live_spans * objs - self.objs_used >= objs
    }

    /// One step of `__zs_compact`: move objects from the emptiest partial
    /// span into the fullest one until the source is empty or the
    /// destination full. Returns (pages released, pages newly charged in
    /// the destination), or None when done.
    ///
    /// Objects leave the source from its highest slots down, so that what
    /// stays sits at its head and the pages past it are trimmed. With
    /// `tidy`, a step runs even when the class's holes add up to less than
    /// a span (zsmalloc would stop there), as long as two spans are partly
    /// full: after recompression or a wave of rewrites those holes are
    /// scattered over every span of a class and pin their pages.
    fn compact_step(&mut self, c: &Counters, tidy: bool) -> Option<(u64, u64)> {
        if !tidy && !self.can_compact() {
            return None;
        }
        let partial = self.group_mask & PARTIAL_MASK;
        if partial == 0 {
            return None;
        }
        let mut dst = self.heads[(15 - partial.leading_zeros()) as usize];
        let mut src = self.heads[partial.trailing_zeros() as usize];
        if src == dst {
            src = self.spans[src as usize].next;
            if src == NIL {
                return None;
            }
        }
        if self.spans[src as usize].inuse > self.spans[dst as usize].inuse {
            std::mem::swap(&mut src, &mut dst);
        }
        self.unlink(src);
        self.unlink(dst);

        let mut tmp = [0u8; PAGE_SIZE];
        let mut charged = 0u64;
        let mut moved = 0usize;
        let size = self.size;
        let base = src as usize * self.objs;
        for slot in (0..self.objs).rev() {
            if self.spans[src as usize].inuse == 0 || self.spans[dst as usize].free_head == SLOT_NIL {
                break;
            }
            let idx = self.backptr[base + slot];
            if idx & FREE_BIT != 0 {
                continue;
            }
            let need = self.pages_through(self.spans[dst as usize].free_head as usize);
            if need > self.spans[dst as usize].touched {
                // The destination reaches into a page it never touched. At
                // the limit that page cannot be charged (the source's pages
                // come back only once it is empty): stop here.
                let more = (need - self.spans[dst as usize].touched) as u64;
                if c.reserve(more).is_err() {
                    break;
                }
                charged += more;
                self.spans[dst as usize].touched = need;
            }
            let dslot = self.pop_slot(dst);
            let (sc, so) = self.obj_location(src as usize, slot);
            let (dc, dof) = self.obj_location(dst as usize, dslot);
            tmp[..size].copy_from_slice(self.chunks[sc].bytes(so, size));
            self.chunks[dc].bytes_mut(dof, size).copy_from_slice(&tmp[..size]);
            self.backptr[dst as usize * self.objs + dslot] = idx;
            self.push_slot(src, slot);
            moved += 1;
            // (After the copy: the entry names the new place only once
            // the bytes are there, for whoever opens the arena next.)
            let e = self.entry(idx);
            self.handles.set(idx as usize, (e & !((E_SPAN_MASK << E_SPAN_SHIFT) | E_SLOT_MASK)) | ((dst as u64) << E_SPAN_SHIFT) | dslot as u64);
        }

        let g = self.group_for(self.spans[dst as usize].inuse as usize);
        self.link(dst, g);
        if self.spans[src as usize].inuse == 0 {
            let released = self.spans[src as usize].touched as u64;
            self.release_span(src, c);
            Some((released, charged))
        } else {
            let g = self.group_for(self.spans[src as usize].inuse as usize);
            self.link(src, g);
            let trimmed = self.trim_tail(src, c);
            // Nothing could move (the budget is spent): stop, or the same
            // pair would be tried forever.
            (moved > 0).then_some((trimmed, charged))
        }
    }

    /// Give back the pages of span `s` past its highest live object (its
    /// `touched` prefix shrinks; they are charged again when an object
    /// reaches into them). Returns the pages released.
    fn trim_tail(&mut self, s: u32, c: &Counters) -> u64 {
        let base = s as usize * self.objs;
        let Some(top) = (0..self.objs).rev().find(|&i| self.backptr[base + i] & FREE_BIT == 0) else {
            return 0;
        };
        let need = self.pages_through(top);
        let touched = self.spans[s as usize].touched;
        if need >= touched {
            return 0;
        }
        let (chunk, off) = self.obj_location(s as usize, 0);
        self.chunks[chunk].discard(off + need as usize * PAGE_SIZE, (touched - need) as usize * PAGE_SIZE);
        self.spans[s as usize].touched = need;
        c.unreserve((touched - need) as u64);
        (touched - need) as u64
    }

    /// The last step of a compaction: the one partly full span of the
    /// class left (the emptiest, if the budget stopped the steps before)
    /// moves its objects down into its lowest free slots, its free slots
    /// are chained in ascending order (so new objects fill it from the
    /// head), and the pages past its objects are released. A fresh pool's
    /// last span costs what it holds; so, after this, does a compacted one.
    fn pack_last(&mut self, c: &Counters) -> u64 {
        let partial = self.group_mask & PARTIAL_MASK;
        if partial == 0 {
            return 0;
        }
        let s = self.heads[partial.trailing_zeros() as usize];
        let base = s as usize * self.objs;
        let inuse = self.spans[s as usize].inuse as usize;
        let size = self.size;
        let (mut lo, mut hi) = (0usize, self.objs - 1);
        let mut tmp = [0u8; PAGE_SIZE];
        loop {
            while lo < inuse && self.backptr[base + lo] & FREE_BIT == 0 {
                lo += 1;
            }
            while hi >= inuse && self.backptr[base + hi] & FREE_BIT != 0 {
                hi -= 1;
            }
            if lo >= inuse || hi < inuse {
                break;
            }
            let idx = self.backptr[base + hi];
            let (sc, so) = self.obj_location(s as usize, hi);
            let (dc, dof) = self.obj_location(s as usize, lo);
            tmp[..size].copy_from_slice(self.chunks[sc].bytes(so, size));
            self.chunks[dc].bytes_mut(dof, size).copy_from_slice(&tmp[..size]);
            self.backptr[base + lo] = idx;
            self.backptr[base + hi] = FREE_BIT;
            let e = self.entry(idx);
            self.handles.set(idx as usize, (e & !E_SLOT_MASK) | lo as u64);
        }
        // Every live object is now below `inuse`: chain the rest upwards.
        for slot in inuse..self.objs {
            let next = if slot + 1 == self.objs { SLOT_NIL as u32 } else { slot as u32 + 1 };
            self.backptr[base + slot] = FREE_BIT | next;
        }
        self.spans[s as usize].free_head = if inuse < self.objs { inuse as u16 } else { SLOT_NIL };
        self.trim_tail(s, c)
    }

    fn metadata_bytes(&self) -> u64 {
        use std::mem::size_of;
        (self.chunks.capacity() * size_of::<Region>()
            + self.spans.capacity() * size_of::<SpanMeta>()
            + self.backptr.capacity() * size_of::<u32>()
            + self.handles.bytes()) as u64
    }

    /// (resident pages of live spans, resident pages of released spans)
    fn resident_pages(&self) -> (usize, usize) {
        let (mut live, mut released) = (0, 0);
        for (s, m) in self.spans.iter().enumerate() {
            let (chunk, off) = self.obj_location(s, 0);
            let r = self.chunks[chunk].resident_pages(off, self.span_bytes());
            if m.group == G_EMPTY {
                released += r;
            } else {
                live += r;
            }
        }
        (live, released)
    }
}

/// Keeps each class lock on its own cache lines (no false sharing).
#[repr(align(128))]
struct Padded<T>(T);

/// The allocator. `Send + Sync`; share it by reference or `Arc`.
pub struct ZsPool {
    classes: Box<[Padded<RwLock<ClassState>>]>,
    counters: Counters,
    /// The owner's table, between opening the arena and its owner asking
    /// for it ([`ZsPool::shared_table`]).
    table: parking_lot::Mutex<TableSlot>,
}

/// Whether the arena's table was made or found, and handed out.
enum TableSlot {
    None,
    Found(Region),
    Taken,
}

impl ZsPool {
    /// A pool with its own budget, limited to `cfg.limit_bytes`.
    pub fn new(cfg: AllocConfig) -> ZsPool {
        let budget = Arc::new(Budget::new(cfg.limit_bytes));
        ZsPool::with_budget(cfg, budget)
    }

    /// A pool that charges its pages and metadata to `budget` (whose limit
    /// applies; `cfg.limit_bytes` is ignored). The class table, a fixed
    /// cost, is charged at once, whatever the limit.
    pub fn with_budget(cfg: AllocConfig, budget: Arc<Budget>) -> ZsPool {
        budget.force_charge(Self::fixed_bytes());
        let max_pages = cfg.max_span_pages.clamp(1, MAX_SPAN_PAGES);
        let classes = (0..NUM_CLASSES).map(|c| Padded(RwLock::new(ClassState::new(MIN_OBJ_SIZE + c * CLASS_DELTA, max_pages)))).collect();
        let arena = Arena::create(max_pages).map_err(|e| format!("cannot make the pool's memory file: {e}"));
        ZsPool { classes, counters: Counters::new(budget, arena), table: parking_lot::Mutex::new(TableSlot::None) }
    }

    /// The arena's table of `entries` 16-byte entries (a multiple of
    /// [`TABLE_PAGE_ENTRIES`]): the one [`ZsPool::open`] found, or a new
    /// one, all 0. One per pool: asked again, or found with another size,
    /// it is refused. Its pages are charged to the budget as they are
    /// written, by the caller (`bytes`), not here.
    pub fn shared_table(&self, entries: usize) -> Result<SharedTable, AllocError> {
        if !portable_atomic::AtomicU128::is_lock_free() {
            return Err(AllocError::Unsupported(
                "this CPU has no 16-byte atomic operations (cmpxchg16b): a table that outlives the process cannot be kept".into(),
            ));
        }
        if entries == 0 || !entries.is_multiple_of(TABLE_PAGE_ENTRIES) {
            return Err(AllocError::InvalidSize { len: entries });
        }
        let mut slot = self.table.lock();
        match std::mem::replace(&mut *slot, TableSlot::Taken) {
            TableSlot::Found(r) if r.len() == entries * 16 => Ok(SharedTable::new(r)),
            TableSlot::Found(r) => {
                let found = r.len() / 16;
                *slot = TableSlot::Found(r);
                Err(AllocError::Unsupported(format!("the arena's table has {found} entries, not {entries}")))
            }
            TableSlot::Taken => Err(AllocError::Unsupported("the arena's table is taken already".into())),
            TableSlot::None => {
                match self.counters.arena().and_then(|a| a.add(Kind::Table, 0, 0, entries * 16).map_err(|e| AllocError::OutOfMemory(e.to_string()))) {
                    Ok(r) => Ok(SharedTable::new(r)),
                    Err(e) => {
                        *slot = TableSlot::None;
                        Err(e)
                    }
                }
            }
        }
    }

    /// The arena file that holds this pool's objects, for a process that
    /// keeps it while this one is replaced ([`ZsPool::open`]); `None` if
    /// it could not be made (every allocation then fails).
    pub fn arena_fd(&self) -> Option<BorrowedFd<'_>> {
        self.counters.arena.as_ref().ok().map(Arena::fd)
    }

    /// Bytes of the class table, held from creation to drop.
    pub fn fixed_bytes() -> u64 {
        (NUM_CLASSES * std::mem::size_of::<Padded<RwLock<ClassState>>>()) as u64
    }

    /// Size class for an object of `len` bytes (1..=4096), else `None`.
    pub fn class_size(len: usize) -> Option<usize> {
        if len == 0 || len > PAGE_SIZE {
            return None;
        }
        Some(len.next_multiple_of(CLASS_DELTA).max(MIN_OBJ_SIZE))
    }

    #[inline]
    fn class_of_len(len: usize) -> Result<usize, AllocError> {
        let size = Self::class_size(len).ok_or(AllocError::InvalidSize { len })?;
        Ok((size - MIN_OBJ_SIZE) / CLASS_DELTA)
    }

    #[inline]
    fn class_of_handle(&self, h: Handle) -> Result<&RwLock<ClassState>, AllocError> {
        self.classes.get(h.class()).map(|p| &p.0).ok_or(AllocError::InvalidHandle { raw: h.to_raw() })
    }

    /// Allocate an object of `data.len()` (1..=4096) bytes and copy `data` in.
    /// Bytes of the class slot past `data.len()` are zeroed.
    pub fn alloc_write(&self, data: &[u8]) -> Result<Handle, AllocError> {
        let class = Self::class_of_len(data.len())?;
        self.classes[class].0.write().alloc_write(class, data, &self.counters)
    }

    /// Run `f` on the object's bytes: a slice of the object's *class* size
    /// (the caller knows the exact length). The class is read-locked while
    /// `f` runs, so keep `f` short and do not call back into this class's
    /// write operations from it.
    #[inline]
    pub fn read<R>(&self, h: Handle, f: impl FnOnce(&[u8]) -> R) -> Result<R, AllocError> {
        let st = self.class_of_handle(h)?.read();
        let (s, slot) = st.lookup(h).ok_or(AllocError::InvalidHandle { raw: h.to_raw() })?;
        let (chunk, off) = st.obj_location(s, slot);
        Ok(f(st.chunks[chunk].bytes(off, st.size)))
    }

    /// Overwrite a live object in place with `data`, if `data.len()` falls in
    /// the object's own size class (the common case when a page is stored
    /// again with similar content). Returns `Ok(false)`, changing nothing,
    /// when the class differs; the caller then allocates anew. The caller
    /// must own the object exclusively (no reader may be inside `read` on it).
    pub fn rewrite(&self, h: Handle, data: &[u8]) -> Result<bool, AllocError> {
        let class = Self::class_of_len(data.len())?;
        if class != h.class() {
            return Ok(false);
        }
        let mut st = self.classes[class].0.write();
        let (s, slot) = st.lookup(h).ok_or(AllocError::InvalidHandle { raw: h.to_raw() })?;
        let (chunk, off) = st.obj_location(s, slot);
        let size = st.size;
        let obj = st.chunks[chunk].bytes_mut(off, size);
        let (head, tail) = obj.split_at_mut(data.len());
        head.copy_from_slice(data);
        tail.fill(0);
        Ok(true)
    }

    /// Free an object. Stale handles and double frees give `InvalidHandle`.
    pub fn free(&self, h: Handle) -> Result<(), AllocError> {
        self.class_of_handle(h)?.write().free(h, &self.counters)
    }

    /// Move objects out of sparse spans and release the emptied spans, class
    /// by class, then pack what zsmalloc's rule leaves (holes adding up to
    /// less than a span, scattered over the class) and release the pages
    /// past it. Returns the number of pages freed. Handles stay valid.
    /// O(slots of the partly full spans) even when there is nothing to
    /// gain: for explicit compaction and after recompression, not for every
    /// writeback batch (see [`compact_spans`](Self::compact_spans)).
    pub fn compact(&self) -> u64 {
        self.compact_with(true)
    }

    /// zsmalloc's compaction alone: only classes with at least a span's
    /// worth of holes are touched, so it is cheap when there is nothing to
    /// gain (the shrinker runs it before every writeback batch; packing
    /// there cost 30 % of store throughput under writeback).
    pub fn compact_spans(&self) -> u64 {
        self.compact_with(false)
    }

    fn compact_with(&self, pack: bool) -> u64 {
        let (mut released, mut charged) = (0u64, 0u64);
        for class in self.classes.iter() {
            let passes: &[bool] = if pack { &[false, true] } else { &[false] };
            for &tidy in passes {
                loop {
                    // Re-take the lock per step so other users of the class interleave.
                    let step = class.0.write().compact_step(&self.counters, tidy);
                    match step {
                        Some((r, ch)) => {
                            released += r;
                            charged += ch;
                        }
                        None => break,
                    }
                }
            }
            if pack {
                released += class.0.write().pack_last(&self.counters);
            }
        }
        let freed = released.saturating_sub(charged);
        self.counters.pages_compacted.fetch_add(freed, Relaxed);
        freed
    }

    /// Change the memory limit. Lowering it below current use frees nothing;
    /// it only makes allocations that need a new span fail.
    pub fn set_limit(&self, limit_bytes: Option<u64>) {
        self.counters.budget.set_limit(limit_bytes);
    }

    /// The budget pages and metadata are charged to (shared with whoever
    /// built the pool with [`ZsPool::with_budget`]).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.counters.budget
    }

    /// A statistics snapshot (takes each class's read lock in turn).
    pub fn stats(&self) -> AllocStats {
        let c = &self.counters;
        let mut st = AllocStats {
            pages_used: c.pages_used.load(Relaxed),
            pages_used_max: c.pages_used_max.load(Relaxed),
            pages_compacted: c.pages_compacted.load(Relaxed),
            spans_released: c.spans_released.load(Relaxed),
            metadata_bytes: Self::fixed_bytes(),
            ..AllocStats::default()
        };
        for class in self.classes.iter() {
            let cs = class.0.read();
            st.metadata_bytes += cs.metadata_bytes();
            st.objs_allocated += cs.live_spans * cs.objs as u64;
            st.objs_used += cs.objs_used;
            st.obj_bytes_used += cs.objs_used * cs.size as u64;
        }
        st
    }

    /// Pages currently held by live spans (one atomic load).
    pub fn pages_used(&self) -> u64 {
        self.counters.pages_used.load(Relaxed)
    }

    /// Test hook: pages of released spans that are still resident (mincore).
    /// Should always be 0.
    #[doc(hidden)]
    pub fn resident_pages_of_released_spans(&self) -> usize {
        self.classes.iter().map(|c| c.0.read().resident_pages().1).sum()
    }

    /// Test hook: pages of live spans that are resident (mincore).
    #[doc(hidden)]
    pub fn resident_pages_of_live_spans(&self) -> usize {
        self.classes.iter().map(|c| c.0.read().resident_pages().0).sum()
    }

    /// Test hook: pages per span chosen for a class size.
    #[doc(hidden)]
    pub fn span_pages_of_class(&self, class_size: usize) -> Option<usize> {
        let i = class_size.checked_sub(MIN_OBJ_SIZE)?;
        if i % CLASS_DELTA != 0 {
            return None;
        }
        self.classes.get(i / CLASS_DELTA).map(|c| c.0.read().span_pages)
    }
}

impl Drop for ZsPool {
    /// Give back everything this pool charged, so a shared budget stays true.
    fn drop(&mut self) {
        let st = self.stats();
        self.counters.budget.uncharge(st.pages_used * PAGE_SIZE as u64 + st.metadata_bytes);
    }
}

impl Default for ZsPool {
    fn default() -> Self {
        ZsPool::new(AllocConfig::default())
    }
}

impl std::fmt::Debug for ZsPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZsPool").field("stats", &self.stats()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waste_frac(size: usize, k: usize) -> (usize, usize) {
        ((k * PAGE_SIZE) % size, k * PAGE_SIZE)
    }

    #[test]
    fn span_choice_beats_zsmalloc_range() {
        for c in 0..NUM_CLASSES {
            let size = MIN_OBJ_SIZE + c * CLASS_DELTA;
            let k = pages_per_span(size, DEFAULT_SPAN_PAGES);
            assert!((1..=DEFAULT_SPAN_PAGES).contains(&k));
            let (w, t) = waste_frac(size, k);
            for k4 in 1..=4 {
                let (w4, t4) = waste_frac(size, k4);
                assert!(w * t4 <= w4 * t, "class {size}: k={k} wastes more than k={k4}");
            }
            // Tie -> smallest: no smaller k has the same fraction.
            for ks in 1..k {
                let (ws, ts) = waste_frac(size, ks);
                assert!(w * ts < ws * t, "class {size}: k={k} not minimal, {ks} ties");
            }
        }
        assert_eq!(pages_per_span(32, 16), 1);
        assert_eq!(pages_per_span(4096, 16), 1);
        assert_eq!(pages_per_span(3264, 4), 4);
        assert_eq!(pages_per_span(3264, 1), 1);
    }

    #[test]
    fn handle_layout() {
        let h = Handle::new(254, 0x7fff_ffff, GEN_MASK);
        assert_eq!((h.class(), h.index(), h.gen()), (254, 0x7fff_ffff, GEN_MASK));
        assert_eq!(next_gen(GEN_MASK), 1);
        assert_eq!(NUM_CLASSES, 255);
        assert!(std::mem::size_of::<SpanMeta>() <= 24);
    }

    #[test]
    fn pool_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ZsPool>();
    }
}
