//! Opening an arena again: the allocator rebuilt from what outlived its
//! process.
//!
//! The arena holds the span memory, the handle tables and the directory of
//! regions ([`crate::arena`]). A handle-table entry that is live names its
//! span (the n-th span of its class, counted through the class's chunks in
//! the directory's order, as they were carved) and its slot; so every
//! live object is found again, and everything the heap held is derived:
//! the span descriptors, which slots are taken (the back-pointers), the
//! free slots and free handles, the fullness groups and the counts.
//!
//! The process that wrote the arena may have died at any instant. What a
//! death can leave, and what becomes of it:
//! * a handle made live whose bytes were not yet (all) written: it is
//!   live here, with whatever bytes are there; its caller never had the
//!   chance to name it, and frees it (every live handle is returned);
//! * a compaction between copying an object and naming the copy: the
//!   entry still names the original, whose slot was not yet freed;
//! * a region made and recorded but not used: an empty span, released;
//! * a directory entry written but not counted: not read.
//!
//! Anything that cannot be one of these (two entries naming one slot, a
//! span past the class's chunks, a region out of order) is corruption:
//! opening stops with [`ArenaError::Corrupt`] and changes nothing.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::arena::{Arena, ArenaError, DirEntry, Kind};
use crate::handles::{seg_bytes, HandleTable};
use crate::{
    Budget, ClassState, Counters, Handle, Padded, SpanMeta, ZsPool, CLASS_DELTA, E_LIVE, E_SLOT_MASK, E_SPAN_MASK, E_SPAN_SHIFT, FREE_BIT, GEN_SHIFT, G_EMPTY,
    MAX_SPANS, MIN_OBJ_SIZE, NIL, NUM_CLASSES, PAGE_SIZE, SLOT_NIL,
};
use parking_lot::RwLock;

impl ZsPool {
    /// Open the arena in `fd` (from [`ZsPool::arena_fd`] of a pool whose
    /// process is gone or has let it go): the pool as that process left
    /// it, charged to `budget` whatever its limit (the memory is already
    /// held), and the handles of every live object. An object allocated
    /// but not yet in its caller's hands when that process died is among
    /// them: the caller frees those it does not name.
    ///
    /// Refuses, changing nothing, an arena another process holds, one
    /// that is not zmem's, of another version, or not consistent.
    pub fn open(fd: OwnedFd, budget: Arc<Budget>) -> Result<(ZsPool, Vec<Handle>), ArenaError> {
        let (arena, max_pages, entries) = Arena::open(fd)?;
        let mut classes: Vec<ClassState> = (0..NUM_CLASSES).map(|c| ClassState::new(MIN_OBJ_SIZE + c * CLASS_DELTA, max_pages)).collect();
        let mut segs: Vec<Vec<crate::mem::Region>> = (0..NUM_CLASSES).map(|_| Vec::new()).collect();
        for e in entries.iter().filter(|e| matches!(e.kind, Kind::Chunk | Kind::Handles)) {
            let cs = &mut classes[e.class];
            let (have, fits) = match e.kind {
                Kind::Chunk => (cs.chunks.len(), e.len.is_multiple_of(cs.span_bytes())),
                Kind::Handles => (segs[e.class].len(), e.len == seg_bytes(e.index as usize)),
                Kind::Table | Kind::Nursery => unreachable!("filtered out"),
            };
            if e.index as usize != have || !fits {
                return Err(bad_region(e));
            }
            let r = arena.map(e)?;
            match e.kind {
                Kind::Chunk => cs.chunks.push(r),
                Kind::Handles => segs[e.class].push(r),
                Kind::Table | Kind::Nursery => unreachable!("filtered out"),
            }
        }
        let mut table = crate::TableSlot::None;
        for e in entries.iter().filter(|e| e.kind == Kind::Table) {
            if !matches!(table, crate::TableSlot::None) {
                return Err(ArenaError::Corrupt("two tables".into()));
            }
            table = crate::TableSlot::Found(arena.map(e)?);
        }
        let mut found = Vec::new();
        let mut plans = Vec::with_capacity(NUM_CLASSES);
        let nursery = arena.found_nursery();
        if nursery.is_none() && segs.iter().any(|s| !s.is_empty()) {
            return Err(ArenaError::Corrupt("handle tables without their nursery".into()));
        }
        for (c, (cs, segs)) in classes.iter_mut().zip(segs).enumerate() {
            cs.handles = HandleTable::opened(c, nursery.clone(), segs);
            plans.push(cs.plan(&mut found)?);
        }
        // Everything checked: from here on the arena is written.
        let counters = Counters::new(budget, Ok(arena));
        let mut pages = 0;
        for (cs, plan) in classes.iter_mut().zip(plans) {
            pages += cs.rebuild(plan);
        }
        counters.pages_used.store(pages, std::sync::atomic::Ordering::Relaxed);
        counters.pages_used_max.store(pages, std::sync::atomic::Ordering::Relaxed);
        let pool = ZsPool { classes: classes.into_iter().map(|c| Padded(RwLock::new(c))).collect(), counters, table: parking_lot::Mutex::new(table) };
        // (The metadata includes the class table's fixed bytes.)
        pool.counters.budget.force_charge(pages * PAGE_SIZE as u64 + pool.stats().metadata_bytes);
        Ok((pool, found))
    }
}

fn bad_region(e: &DirEntry) -> ArenaError {
    ArenaError::Corrupt(format!("region {:?} {} of class {} is out of order or of the wrong size", e.kind, e.index, e.class))
}

/// What a class's handle table says, checked, before anything is written.
pub(crate) struct Plan {
    spans: usize,
    /// Slot owners: handle index per slot, or FREE_BIT.
    backptr: Vec<u32>,
    /// Live objects per span.
    inuse: Vec<u16>,
    objs_used: u64,
}

impl ClassState {
    /// Check the class's live entries against its spans; collect their
    /// handles into `found`.
    fn plan(&self, found: &mut Vec<Handle>) -> Result<Plan, ArenaError> {
        let spans: usize = self.chunks.iter().map(|c| c.len() / self.span_bytes()).sum();
        if spans > MAX_SPANS {
            return Err(ArenaError::Corrupt(format!("class {}: {spans} spans", self.size)));
        }
        let mut backptr = vec![FREE_BIT; spans * self.objs];
        let mut inuse = vec![0u16; spans];
        let mut objs_used = 0;
        for idx in 0..self.handles.len() {
            let e = self.handles.get(idx).unwrap_or(0);
            if e & E_LIVE == 0 {
                continue;
            }
            let (s, slot) = (((e >> E_SPAN_SHIFT) & E_SPAN_MASK) as usize, (e & E_SLOT_MASK) as usize);
            let b = s * self.objs + slot;
            if s >= spans || slot >= self.objs || backptr[b] & FREE_BIT == 0 {
                return Err(ArenaError::Corrupt(format!("class {}: handle {idx} names span {s} slot {slot}, which is outside or taken", self.size)));
            }
            backptr[b] = idx as u32;
            inuse[s] += 1;
            objs_used += 1;
            found.push(Handle::new(self.class(), idx as u32, e >> GEN_SHIFT));
        }
        Ok(Plan { spans, backptr, inuse, objs_used })
    }

    /// Build the heap side from a checked plan: spans, free slots, free
    /// handles, groups; release what no live object needs. Returns the
    /// pages of live spans.
    fn rebuild(&mut self, plan: Plan) -> u64 {
        let Plan { spans, mut backptr, inuse, objs_used } = plan;
        let span_bytes = self.span_bytes();
        for (c, chunk) in self.chunks.iter().enumerate() {
            for off in (0..chunk.len()).step_by(span_bytes) {
                let m = SpanMeta { chunk: c as u32, off: off as u32, prev: NIL, next: NIL, inuse: 0, free_head: SLOT_NIL, group: G_EMPTY, touched: 0 };
                self.spans.push(m);
            }
        }
        debug_assert_eq!((self.spans.len(), inuse.len()), (spans, spans));
        self.chunk_spans_left = 0;
        self.chunk_next_off = self.chunks.last().map_or(0, |c| c.len());
        // Free handles, lowest first, each keeping its generation (a stale
        // handle stays stale).
        self.handle_free = NIL;
        for idx in (0..self.handles.len()).rev() {
            let e = self.handles.get(idx).unwrap_or(0);
            if e & E_LIVE == 0 {
                let gen = (e >> GEN_SHIFT).max(1);
                self.handles.set(idx, (gen << GEN_SHIFT) | self.handle_free as u64);
                self.handle_free = idx as u32;
            }
        }
        let mut pages = 0;
        for (s, &used) in inuse.iter().enumerate() {
            let base = s * self.objs;
            let mut head = SLOT_NIL as u32;
            let mut top = None;
            for slot in (0..self.objs).rev() {
                if backptr[base + slot] & FREE_BIT != 0 {
                    backptr[base + slot] = FREE_BIT | head;
                    head = slot as u32;
                } else if top.is_none() {
                    top = Some(slot);
                }
            }
            let m = &mut self.spans[s];
            m.inuse = used;
            m.free_head = head as u16;
            m.touched = top.map_or(0, |t| ((t + 1) * self.size).div_ceil(PAGE_SIZE) as u8);
            let (chunk, off, touched) = (m.chunk as usize, m.off as usize, m.touched as usize);
            // Pages past the live objects (all of an empty span's) may hold
            // what was freed there: give them back.
            self.chunks[chunk].discard(off + touched * PAGE_SIZE, span_bytes - touched * PAGE_SIZE);
            if used > 0 {
                let g = self.group_for(used as usize);
                self.link(s as u32, g);
                self.live_spans += 1;
                pages += touched as u64;
            } else {
                self.link(s as u32, G_EMPTY);
            }
        }
        self.backptr = backptr;
        self.objs_used = objs_used;
        pages
    }
}
