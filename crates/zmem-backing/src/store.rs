//! The store itself: the segments, their live records, and the I/O paths.

use std::cell::RefCell;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::file::{BlockFile, Existing, OsFile};
use crate::record::{header_len, parse, put_record, verify, MAX_PAYLOAD, RECORD_HEADER_SIZE};
use zmem_core::{BusyClock, ColdStats, Moved, RecordId};

use crate::{BackingError, PAGE_SIZE};

/// Size of one segment of the backing file. A batch of 64 incompressible
/// pages (64 × 4112 bytes) fits in a quarter of one.
pub const SEGMENT_SIZE: usize = 1 << 20;
const SEG: u64 = SEGMENT_SIZE as u64;
const ALIGN: u64 = PAGE_SIZE as u64;
/// Records start on multiples of this, so that a record's offset in its
/// segment fits 16 bits and its span (header and payload, rounded up to
/// this) 12: its id's low half takes 28 bits (see [`record_id`]).
const REC_ALIGN: u32 = 16;
/// Records start on multiples of this many bytes, and take a multiple of
/// it (a live record's bytes in [`ColdStats::live_bytes`]).
pub const RECORD_ALIGN: usize = REC_ALIGN as usize;
/// Segments an id can name: 2^24, a 16 TiB file.
const MAX_SEGS: u64 = 1 << 24;
/// Offsets a closed segment's live list gives back at once: 32 bytes,
/// the least malloc splits off a chunk to reuse.
const SHRINK_SLACK: usize = 16;
/// Records compaction moves in one call at most: what its moves and the
/// live lists it grows may take in RAM before the engine takes them
/// ([`BackingStore::take_moves`]) is bounded by this.
const MAX_MOVES: usize = 4096;

type Result<T> = std::result::Result<T, BackingError>;

/// Where a live record is: its segment, its offset there (bytes) and its
/// span, in [`REC_ALIGN`] units (header and payload, rounded up: its
/// exact length is in its header). Its [`RecordId`] says all three, with
/// the segment's generation: bits 0..12 the span, 12..28 the offset in
/// [`REC_ALIGN`] units, 28..32 zero, 32..56 the segment, 56..64 the
/// generation. (28 bits below the segment: the engine's cold blocks keep
/// just the bits a low half needs.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    seg: u32,
    off: u32,
    span: u16,
}

/// Spans fit 12 bits: the largest record is 3,073 units.
const SPAN_BITS: u32 = 12;
const _: () = assert!((RECORD_HEADER_SIZE + MAX_PAYLOAD).div_ceil(REC_ALIGN as usize) < 1 << SPAN_BITS);

impl Place {
    /// The span of a record of `len` payload bytes.
    fn span_of(len: usize) -> u16 {
        (RECORD_HEADER_SIZE + len).div_ceil(REC_ALIGN as usize) as u16
    }
    /// Bytes of its span: what it takes in its segment, and what a read of
    /// it reads.
    fn bytes(self) -> usize {
        self.span as usize * REC_ALIGN as usize
    }
}

fn record_id(p: Place, gen: u8) -> RecordId {
    debug_assert!(u64::from(p.seg) < MAX_SEGS && p.off.is_multiple_of(REC_ALIGN) && (p.off as usize) < SEGMENT_SIZE && p.span < 1 << SPAN_BITS, "{p:?}");
    RecordId::from_raw(u64::from(gen) << 56 | u64::from(p.seg) << 32 | u64::from(p.off / REC_ALIGN) << SPAN_BITS | u64::from(p.span))
}

/// An id's place and generation (whether it is live is the segment's to
/// say; an id with bits 28..32 set was not issued here).
fn split_id(id: RecordId) -> Option<(Place, u8)> {
    let raw = id.to_raw();
    let off16 = (raw >> SPAN_BITS) & (0xffff_ffff >> SPAN_BITS);
    let p = Place { seg: (raw >> 32) as u32 & 0xff_ffff, off: off16 as u32 * REC_ALIGN, span: (raw & ((1 << SPAN_BITS) - 1)) as u16 };
    (off16 <= 0xffff).then_some((p, (raw >> 56) as u8))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SegState {
    /// On the free list; its contents are garbage.
    Free,
    /// Being appended to (at most one).
    Open,
    /// Full (or retired); only frees and compaction change it.
    Closed,
    /// Taken by an append in flight; not yet committed.
    Reserved,
}

#[derive(Debug)]
struct Segment {
    state: SegState,
    /// Bytes from the segment start that have been written (4096-aligned).
    used: u32,
    live_bytes: u32,
    /// The offsets of its live records, in [`REC_ALIGN`] units, ascending
    /// (appends only go past the end): 2 bytes a record, the only RAM a
    /// record costs. Its length is in its id and in its header.
    live: Vec<u16>,
    /// Bumped each time the segment is freed, and part of every id naming
    /// a record in it: an id from before a free is refused after it.
    gen: u8,
    /// Compaction found a record here that failed verification; leave the
    /// segment alone until it empties.
    bad: bool,
    /// Compaction copied its live records elsewhere; it is freed when the
    /// engine has moved its entries to the copies and freed these.
    evacuated: bool,
}

impl Segment {
    fn new(state: SegState) -> Segment {
        Segment { state, used: 0, live_bytes: 0, live: Vec::new(), gen: 1, bad: false, evacuated: false }
    }
    fn live_records(&self) -> usize {
        self.live.len()
    }
}

#[derive(Debug, Default)]
struct State {
    segs: Vec<Segment>,
    /// Free segment indices, sorted descending: `last()` is the lowest, so
    /// the file fills from the front and its tail can be truncated.
    free_segs: Vec<u32>,
    open: Option<u32>,
    file_len: u64,
    records: u64,
    live_bytes: u64,
    /// Bumped whenever a segment is freed: the only event after which a
    /// live record's old place can hold other bytes. Lock-free readers
    /// compare it before and after their I/O.
    reuse: u64,
    /// Bytes of the segments' live lists (their capacities).
    live_list_bytes: u64,
    /// Segments evacuated and not yet freed, and their live bytes: space
    /// that comes back once the engine takes the moves.
    evac_segs: u64,
    evac_live: u64,
    /// The generations of segments truncated off the file's end, by
    /// index (as long as the segment table ever was): a segment made there
    /// again starts past them, so that an id of a record in the old one
    /// stays dead.
    old_gens: Vec<u8>,
}

impl State {
    /// Where the live record `id` is; [`BackingError::InvalidRecord`] if
    /// it is not live (never issued, freed, or its segment freed since).
    fn lookup(&self, id: RecordId) -> Result<Place> {
        let bad = || BackingError::InvalidRecord { id: id.to_raw() };
        let (p, gen) = split_id(id).ok_or_else(bad)?;
        let s = self.segs.get(p.seg as usize).ok_or_else(bad)?;
        let at = s.live.binary_search(&((p.off / REC_ALIGN) as u16));
        if s.gen != gen || !matches!(s.state, SegState::Open | SegState::Closed) || at.is_err() {
            return Err(bad());
        }
        // The length must fit before the next record (or the segment's
        // end): an id this store did not issue is refused, never read.
        let next = at.ok().and_then(|i| s.live.get(i + 1)).map_or(s.used, |&o| u32::from(o) * REC_ALIGN);
        if p.span == 0 || p.off + p.bytes() as u32 > next {
            return Err(bad());
        }
        Ok(p)
    }

    /// A record now live at `p` (past every live record of its segment).
    fn add_record(&mut self, p: Place) -> RecordId {
        let s = &mut self.segs[p.seg as usize];
        let off16 = (p.off / REC_ALIGN) as u16;
        debug_assert!(s.live.last().is_none_or(|&l| l < off16), "{p:?} after {:?}", s.live.last());
        let cap = s.live.capacity();
        s.live.push(off16);
        s.live_bytes += p.bytes() as u32;
        let grown = (s.live.capacity() - cap) * size_of::<u16>();
        let id = record_id(p, s.gen);
        self.live_list_bytes += grown as u64;
        self.records += 1;
        self.live_bytes += p.bytes() as u64;
        id
    }

    /// Forget the live record at `p` (looked up); frees its segment if it
    /// was closed and is now empty. Returns whether it was freed.
    fn remove_record(&mut self, p: Place) -> bool {
        let bytes = p.bytes() as u32;
        let s = &mut self.segs[p.seg as usize];
        if let Ok(i) = s.live.binary_search(&((p.off / REC_ALIGN) as u16)) {
            s.live.remove(i);
            // Records die one by one; 2 bytes a live record is the whole
            // cost a list may keep. A closed segment's list never grows
            // again: it gives back its room as soon as malloc can reuse
            // it (32 bytes: its chunks are multiples of 16, and at least
            // 32 are split off), a realloc every 16 frees at most. The
            // open segment's keeps room to grow until it is a quarter full.
            let cap = s.live.capacity();
            if s.state == SegState::Closed && cap - s.live.len() >= SHRINK_SLACK {
                s.live.shrink_to_fit();
            } else if s.live.len() < cap / 4 {
                s.live.shrink_to(2 * s.live.len());
            }
            self.live_list_bytes -= ((cap - s.live.capacity()) * size_of::<u16>()) as u64;
        }
        s.live_bytes = s.live_bytes.saturating_sub(bytes);
        let (empty, closed, evacuated) = (s.live.is_empty(), s.state == SegState::Closed, s.evacuated);
        self.records -= 1;
        self.live_bytes = self.live_bytes.saturating_sub(u64::from(bytes));
        if evacuated {
            self.evac_live = self.evac_live.saturating_sub(u64::from(bytes));
        }
        if empty && closed {
            self.free_segment(p.seg);
            return true;
        }
        false
    }

    fn free_segment(&mut self, seg: u32) {
        let s = &mut self.segs[seg as usize];
        debug_assert_eq!(s.live_records(), 0);
        if s.evacuated {
            self.evac_segs -= 1;
        }
        self.live_list_bytes -= (s.live.capacity() * size_of::<u16>()) as u64;
        // (Generation 0 is never used: no id is 0.)
        let gen = s.gen.wrapping_add(1).max(1);
        *s = Segment { gen, ..Segment::new(SegState::Free) };
        self.reuse += 1;
        let pos = self.free_segs.partition_point(|&x| x > seg);
        self.free_segs.insert(pos, seg);
    }

    /// Retire a segment from appending: closed (its live list trimmed to
    /// its length: nothing is appended to it again), or free if empty.
    fn close(&mut self, seg: u32) {
        if self.open == Some(seg) {
            self.open = None;
        }
        if self.segs[seg as usize].live_records() == 0 {
            self.free_segment(seg);
        } else {
            let s = &mut self.segs[seg as usize];
            let cap = s.live.capacity();
            s.live.shrink_to_fit();
            s.state = SegState::Closed;
            let shrunk = (cap - s.live.capacity()) * size_of::<u16>();
            self.live_list_bytes -= shrunk as u64;
        }
    }

    /// Take a free segment (lowest first) or grow the file by one. Under a
    /// limit, appends leave the last segment's worth of room to compaction
    /// (`for_compaction`), which needs somewhere to move records to.
    fn take_segment(&mut self, limit: Option<u64>, for_compaction: bool) -> Result<u32> {
        if let Some(limit) = limit {
            let max_segs = limit / SEG;
            let allowed = if for_compaction || max_segs < 2 { max_segs } else { max_segs - 1 };
            if self.occupied_bytes() / SEG + 1 > allowed {
                return Err(BackingError::Full { limit_bytes: limit });
            }
        }
        if let Some(s) = self.free_segs.pop() {
            self.segs[s as usize].state = SegState::Reserved;
            return Ok(s);
        }
        let n = self.segs.len() as u64;
        let limit_bytes = limit.unwrap_or(MAX_SEGS * SEG).min(MAX_SEGS * SEG);
        if (n + 1) * SEG > limit_bytes {
            return Err(BackingError::Full { limit_bytes });
        }
        grow_gently(&mut self.segs, 8);
        let gen = self.old_gens.get(n as usize).copied().unwrap_or(1);
        self.segs.push(Segment { gen, ..Segment::new(SegState::Reserved) });
        // (Kept as long as the table ever was, so that a truncation, which
        // a free can cause, never allocates.)
        if self.old_gens.len() < self.segs.len() {
            self.old_gens.push(1);
        }
        // Every segment index fits the free list without it growing, so a
        // free (from any thread) never allocates.
        let room = self.segs.capacity() - self.free_segs.len();
        self.free_segs.reserve_exact(room);
        Ok(n as u32)
    }

    /// Heap bytes of the tables (segments, their live lists, the free
    /// list, the truncated segments' generations).
    fn metadata_bytes(&self) -> u64 {
        (self.segs.capacity() * size_of::<Segment>() + self.free_segs.capacity() * size_of::<u32>() + self.old_gens.capacity()) as u64 + self.live_list_bytes
    }

    /// Bytes of segments not on the free list.
    fn occupied_bytes(&self) -> u64 {
        (self.segs.len() - self.free_segs.len()) as u64 * SEG
    }

    /// Compaction is worth running: some closed segment must be under half
    /// full, or the file is long while a free segment sits below its end.
    fn needs_compaction(&self) -> bool {
        let target = 2 * self.live_bytes + SEG;
        self.over_target() || (self.file_len > target + SEG && self.hole_below_top())
    }

    /// The segments in use hold more than twice the live bytes (plus one
    /// segment of slack), counting evacuated segments as the free space
    /// they are about to be.
    fn over_target(&self) -> bool {
        self.occupied_bytes() - self.evac_segs * SEG > 2 * (self.live_bytes - self.evac_live) + SEG
    }

    fn hole_below_top(&self) -> bool {
        match (self.free_segs.last(), self.segs.len()) {
            (Some(&lo), n) => (lo as usize) + 1 < n,
            _ => false,
        }
    }
}

/// Make room for one more element, growing by an eighth (at least `min`)
/// rather than doubling: these tables are charged to the pool's memory
/// budget from their capacities, so slack is memory the pool pays for.
fn grow_gently<T>(v: &mut Vec<T>, min: usize) {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 8).max(min));
    }
}

/// Where an append goes: contiguous runs of records, one write each.
#[derive(Debug)]
struct Chunk {
    seg: u32,
    start: u32,
    data_end: u32,
    end: u32,
    recs: Range<usize>,
}

#[derive(Debug)]
struct Plan {
    chunks: Vec<Chunk>,
    /// (segment, offset) of each record.
    places: Vec<(u32, u32)>,
    /// Segments taken from the free list or added for this plan.
    taken: Vec<u32>,
}

/// A heap buffer with a 4096-aligned window, for `O_DIRECT`.
struct AlignedBuf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + PAGE_SIZE];
        let start = (PAGE_SIZE - v.as_ptr() as usize % PAGE_SIZE) % PAGE_SIZE;
        AlignedBuf { v, start, len }
    }
    fn get(&self, len: usize) -> &[u8] {
        &self.v[self.start..self.start + len.min(self.len)]
    }
    fn get_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.v[self.start..self.start + len.min(self.len)]
    }
}

/// RAM of the append buffers (a write buffer and a compaction read buffer).
const APPENDER_BYTES: u64 = 2 * (SEGMENT_SIZE + PAGE_SIZE) as u64;
/// RAM of all the buffers a store holds from its first write: the append
/// buffers, made then, and the most the read windows' may hold.
pub const BUFFER_BYTES: u64 = APPENDER_BYTES + WINDOW_BYTES as u64;

/// Buffers owned by whoever appends or compacts (one at a time).
struct Appender {
    wbuf: AlignedBuf,
    rbuf: AlignedBuf,
}

/// Most bytes read ahead on a miss: loads of written-back pages tend to
/// come in runs (a file read back, a process swapping in), and records
/// written back together sit together, so one 64 KiB read serves the next
/// ~25 records. But not always: under a swap storm the kernel faults pages
/// in an order of its own and the shrinker's writes keep ending windows
/// early, and then every miss reading 64 KiB for one record multiplied the
/// disk bytes read by 16 (seen in `zmem bench swap`). So the read-ahead
/// adapts ([`Windows::victim`], [`Windows::continues`]): a window replaced
/// with less than a quarter of it served quarters it, down to
/// [`MIN_READAHEAD`]; a miss just past the end of a window that served
/// most of what it read doubles it, up to this. Not down to the record's
/// own blocks: on a build swapping to a throttled disk that served fewer
/// records a read and made the build far slower (docs/experiments/build-and-kv-set-by-set.md,
/// `zmem bench swap`), and the disks a swap device meets run out of
/// operations long before bandwidth (3,000 IOPS and 125 MB/s: 41 KB a
/// read; an HDD's 150
/// IOPS and 58 MB/s: 387 KB). Where a disk's operations are cheap (it
/// does not queue them), the floor costs more bytes than the reads it
/// saves are worth, and [`BackingStore::set_read_ahead_auto`] drops it
/// while reads cost less than [`FAST_READ`].
/// The pages of one request are read together by
/// [`BackingStore::prefetch`], whatever the read-ahead.
const READAHEAD: usize = 64 << 10;
/// The smallest read-ahead, unless the store is told otherwise
/// ([`BackingStore::set_min_read_ahead`]).
pub const MIN_READAHEAD: usize = 8 << 10;
/// With the floor chosen by what a read costs
/// ([`BackingStore::set_read_ahead_auto`]): a read of the file that costs
/// less than this (the time with one in flight over the reads, however
/// many overlap) is on a disk that does not queue its operations, where
/// what the floor reads past each record costs more than the few reads
/// it saves, and the floor is 0; from it on (a disk that counts its
/// operations, or one that seeks) the floor is kept. A heap swapping to
/// the benchmark's real disk and to its throttled one lies on either
/// side of it (docs/experiments/read-ahead-auto.md).
pub const FAST_READ: Duration = Duration::from_micros(200);
/// The reads over which the floor's choice judges what one costs.
const COST_READS: u64 = 1024;
/// What a read-ahead at 0 grows to first when reads come in runs.
const FIRST_GROWTH: usize = PAGE_SIZE;
/// Read-ahead hits are counted by how far past the bytes their read
/// wanted the record ends: within 1 KiB (the next record or so), 4 KiB,
/// 8 KiB, and beyond.
const HIT_DISTANCES: [u64; 3] = [1 << 10, 4 << 10, 8 << 10];
/// And by how many keys past the highest key of the records their read
/// wanted: the same key (the engine writes a record under the first key of
/// its block of 16: for a swap device, the same 16 slots), within 16 (the
/// next block), 1,024, and beyond (or before, or in a window whose wanted
/// records were not served yet).
const SLOT_DISTANCES: [u64; 3] = [0, 16, 1024];
/// How far past a window's end a miss still continues its run (a record
/// or two skipped: freed, or read from RAM).
const RUN_GAP: u64 = 2 * PAGE_SIZE as u64;
/// Read windows a store keeps, at most. Shared by every thread that reads,
/// because the pages of one run of swap-ins reach the server as separate
/// requests that different threads serve (with a window per thread, each
/// thread read the same neighbours again), and because several processes
/// swap in at once (with one window, each stream's miss threw the others'
/// windows away before they were used). A window's buffer is the size of
/// its read, and all of them together hold at most [`WINDOW_BYTES`]: 16
/// windows of a whole read-ahead, or 64 of the ~12 KiB a read at the
/// floor takes. 64 rather than 16 of 72 KiB each: in the same RAM a window
/// lives four times as many misses before it is replaced, so a build
/// swapping at the floor hits its read-ahead more often and reads the file
/// less (docs/experiments/read-windows.md).
const WINDOWS: usize = 64;
/// The most one window's read takes: the read-ahead, plus the record's
/// own blocks at either end.
const WINDOW_BUF: usize = READAHEAD + 2 * PAGE_SIZE;
/// RAM all the windows' buffers hold at most; a new window replaces the
/// least recently used ones until it fits.
const WINDOW_BYTES: usize = 16 * WINDOW_BUF;

/// What was read from the file at `lo..lo + len`, when segment `seg`'s
/// window epoch ([`BackingStore::window_epoch`]) was `epoch`. Valid only
/// while that epoch is unchanged (the file was not truncated and the
/// segment not written since the window was read).
struct Window {
    epoch: u64,
    seg: u64,
    lo: u64,
    len: usize,
    /// Where the bytes the read wanted end (the records asked for); what
    /// lies past it is read-ahead.
    need: u64,
    /// The highest key of the records the read wanted, once known (a
    /// prefetch learns it as its loads follow): read-ahead hits are
    /// counted by their keys' distance past it.
    key: Option<u64>,
    /// The bytes read, `len` of them once trusted (a buffer of that
    /// capacity, counted in [`Windows::held`]).
    buf: Vec<u8>,
    /// Record bytes served from this window, the first record's included.
    used: usize,
    /// When it last served a record ([`Windows::clock`]): the least
    /// recently used window is replaced first.
    last: u64,
}

impl Window {
    const EMPTY: Window = Window { epoch: 0, seg: 0, lo: 0, len: 0, need: 0, key: None, buf: Vec::new(), used: 0, last: 0 };

    fn covers(&self, epoch: u64, abs: u64, n: usize) -> bool {
        self.len > 0 && self.epoch == epoch && abs >= self.lo && abs + n as u64 <= self.lo + self.len as u64
    }
}

/// A store's read windows and its read-ahead, under [`BackingStore::windows`].
struct Windows {
    slots: [Window; WINDOWS],
    clock: u64,
    /// The capacity of every window's buffer, at most [`WINDOW_BYTES`].
    held: usize,
    /// Bytes to read past the record on the next miss.
    ahead: usize,
    /// The least of it ([`MIN_READAHEAD`] unless set).
    min: usize,
    /// The least chosen by what a read costs, if it is.
    auto: Option<AutoFloor>,
}

/// The floor chosen by what a read of the file costs ([`FAST_READ`]): the
/// floor kept for a disk whose reads are dear, and the reads made and the
/// time busy when the epoch being judged began.
#[derive(Clone, Copy, Debug)]
struct AutoFloor {
    floor: usize,
    ops: u64,
    busy_ns: u64,
}

impl AutoFloor {
    /// The floor for the reads since the epoch began, given the reads and
    /// busy time so far, once [`COST_READS`] were made (and then a new
    /// epoch begins); `None` before. The busy time is asked for only then
    /// (a lock and a clock read: not for every miss).
    fn judge(&mut self, ops: u64, busy_ns: impl FnOnce() -> u64) -> Option<usize> {
        let reads = ops.saturating_sub(self.ops);
        if reads < COST_READS {
            return None;
        }
        let busy_ns = busy_ns();
        let cost = busy_ns.saturating_sub(self.busy_ns) / reads;
        (self.ops, self.busy_ns) = (ops, busy_ns);
        Some(if cost < FAST_READ.as_nanos() as u64 { 0 } else { self.floor })
    }
}

impl Windows {
    fn new() -> Windows {
        Windows { slots: [const { Window::EMPTY }; WINDOWS], clock: 0, held: 0, ahead: READAHEAD, min: MIN_READAHEAD, auto: None }
    }

    /// A new floor: the read-ahead is at least it from now on.
    fn set_min(&mut self, bytes: usize) {
        self.min = bytes;
        self.ahead = self.ahead.max(bytes);
    }

    /// A run of reads outgrew its window: twice the read-ahead (at least
    /// a page), up to [`READAHEAD`].
    fn grow(&mut self) {
        self.ahead = (self.ahead * 2).max(FIRST_GROWTH).clamp(self.min, READAHEAD);
    }

    /// The window that holds `n` bytes at `abs`, at `epoch`.
    fn find(&mut self, epoch: u64, abs: u64, n: usize) -> Option<&mut Window> {
        self.clock += 1;
        let clock = self.clock;
        let w = self.slots.iter_mut().find(|w| w.covers(epoch, abs, n))?;
        w.last = clock;
        Some(w)
    }

    /// Whether a miss at `abs` in segment `seg` continues a run of reads:
    /// it lies within [`RUN_GAP`] past the end of a window that served at
    /// least half of what it read. Then the window was too short for the
    /// run, and the read-ahead grows. (Any miss within a whole read-ahead
    /// past any window used to count: with 16 windows over the few
    /// segments a swap storm writes, random misses kept landing in that
    /// zone, and the read-ahead never shrank.)
    fn continues(&self, seg: u64, abs: u64) -> bool {
        self.slots.iter().any(|w| {
            let end = w.lo + w.len as u64;
            w.len > 0 && w.seg == seg && w.used * 2 >= w.len && abs >= end && abs < end + RUN_GAP
        })
    }

    /// The slot to empty next, other than `keep`: an empty or stale one
    /// (`stale(seg, epoch)`), else the least recently used; `None` when
    /// no other slot holds a buffer and `held_only` asks for one that does.
    fn victim(&self, stale: &impl Fn(u64, u64) -> bool, keep: Option<usize>, held_only: bool) -> Option<usize> {
        (0..WINDOWS).filter(|&i| Some(i) != keep && (!held_only || self.slots[i].buf.capacity() > 0)).min_by_key(|&i| {
            let w = &self.slots[i];
            let dead = w.len == 0 || stale(w.seg, w.epoch);
            (!dead, w.last)
        })
    }

    /// Empty slot `i`, giving its buffer back (to drop with no lock held).
    /// The first window replaced with less than a quarter of it served
    /// (`judged` tells whether one was) shrinks the read-ahead to a
    /// quarter; only runs of reads ([`continues`](Self::continues)) grow
    /// it.
    fn evict(&mut self, i: usize, judged: &mut bool) -> Vec<u8> {
        let w = &mut self.slots[i];
        if !*judged && w.len > 0 {
            *judged = true;
            if w.used * 4 < w.len {
                // Below a page, straight to the floor.
                let quarter = self.ahead / 4;
                self.ahead = if quarter < PAGE_SIZE { self.min } else { quarter.max(self.min) };
            }
        }
        w.len = 0;
        let buf = std::mem::take(&mut w.buf);
        self.held -= buf.capacity();
        buf
    }

    /// Keep `new` as a window: in the slot [`victim`](Self::victim) picks,
    /// after as many of the least recently used others as it takes for
    /// the buffers to stay within [`WINDOW_BYTES`]. Returns the buffers
    /// let go, to drop with no lock held.
    fn install(&mut self, new: Window, stale: impl Fn(u64, u64) -> bool) -> Vec<Vec<u8>> {
        let mut judged = false;
        let i = self.victim(&stale, None, false).unwrap_or(0);
        let mut freed = vec![self.evict(i, &mut judged)];
        while self.held + new.buf.capacity() > WINDOW_BYTES {
            let Some(j) = self.victim(&stale, Some(i), true) else { break };
            freed.push(self.evict(j, &mut judged));
        }
        self.held += new.buf.capacity();
        self.slots[i] = new;
        freed
    }
}

thread_local! {
    /// The buffer a thread reads a missed window into (aligned, for
    /// `O_DIRECT`), whose bytes are then copied into a window of their
    /// size: a few KiB copied for a read of the disk.
    static READ_BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

#[derive(Default)]
struct Counters {
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    compaction_bytes_read: AtomicU64,
    record_bytes_read: AtomicU64,
    read_ops: AtomicU64,
    prefetch_ops: AtomicU64,
    scattered_reads: AtomicU64,
    records_written: AtomicU64,
    records_read: AtomicU64,
    segments_compacted: AtomicU64,
    read_retries: AtomicU64,
    readahead_bytes: AtomicU64,
    readahead_used_bytes: AtomicU64,
    readahead_hits: [AtomicU64; HIT_DISTANCES.len() + 1],
    readahead_slot_hits: [AtomicU64; SLOT_DISTANCES.len() + 1],
}

impl Counters {
    /// A record of `n` bytes served from read-ahead, ending `past` bytes
    /// beyond what its window's read wanted, `slots` keys past the highest
    /// key it wanted (`None`: before it, or not known).
    fn count_readahead_hit(&self, past: u64, n: usize, slots: Option<u64>) {
        self.readahead_used_bytes.fetch_add(n as u64, Relaxed);
        let bucket = HIT_DISTANCES.iter().position(|&d| past <= d).unwrap_or(HIT_DISTANCES.len());
        self.readahead_hits[bucket].fetch_add(1, Relaxed);
        let far = SLOT_DISTANCES.len();
        let bucket = slots.map_or(far, |d| SLOT_DISTANCES.iter().position(|&s| d <= s).unwrap_or(far));
        self.readahead_slot_hits[bucket].fetch_add(1, Relaxed);
    }
}

/// How far a compaction goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Effort {
    /// Every sparse segment, and the file as short as moving records makes
    /// it: what [`BackingStore::compact`] asks for.
    Thorough,
    /// After a write: sparse segments, sparsest first, only until the
    /// segments in use are back under twice the live bytes, and a dense
    /// last segment moved down only when the file is over twice its
    /// target. Under a swap storm most records die within seconds (the
    /// kernel writes their page again), so segments empty by themselves,
    /// and every record compaction moves is read and written once more:
    /// compacting everything sparse after each write read 22 % of the
    /// backing I/O of a storm (316 of 1,450 MB), as needed 4 % (47 MB),
    /// for the same peak file length.
    AsNeeded,
}

fn round_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// A log-structured file of compressed records: zmem's writeback tier.
/// See the [crate documentation](crate) for the design.
pub struct BackingStore {
    file: Box<dyn BlockFile>,
    limit: Option<u64>,
    direct: bool,
    state: RwLock<State>,
    /// Serialises appends and compaction; owns their aligned buffers.
    app: Mutex<Option<Appender>>,
    /// Records compaction copied, for the engine to take
    /// ([`take_moves`](Self::take_moves)).
    moves: Mutex<Vec<Moved>>,
    /// The buffers are made (counted in `metadata_bytes`).
    app_made: AtomicBool,
    c: Counters,
    /// What was read last, for the records next to it. Their buffers are
    /// made with the append buffers (a record is read only once written).
    windows: Mutex<Windows>,
    /// The time with a read of a window in flight (what a read costs, for
    /// [`BackingStore::set_read_ahead_auto`]), kept only while `timed`
    /// (the tier times every read of the store on its own: this clock is
    /// for the store's choice alone).
    read_busy: BusyClock,
    timed: AtomicBool,
    /// Bumped after a truncation of the file: a readahead window read at
    /// an older epoch is not trusted.
    epoch: AtomicU64,
    /// Bumped after every write (append, compaction) to a segment whose
    /// index is the slot's modulo [`SEG_EPOCHS`]: a window (which never
    /// spans segments) read at an older epoch of its segment's slot is not
    /// trusted. Per segment, not per file, because under a swap storm the
    /// shrinker appends all the time while loads read older segments: a
    /// file-wide epoch ended every window before its second record.
    seg_epochs: Box<[AtomicU64]>,
    /// Reads start and end on multiples of this ([`BlockFile::read_align`]).
    read_align: u64,
}

/// Slots of per-segment write epochs (segments share a slot modulo this;
/// sharing only ends windows early).
const SEG_EPOCHS: usize = 256;

impl std::fmt::Debug for BackingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackingStore").field("direct", &self.direct).field("limit", &self.limit).field("stats", &self.stats()).finish()
    }
}

impl BackingStore {
    /// A store over `file`, which is treated as empty (the store keeps no
    /// on-disk index: like swap, its contents do not survive a restart).
    /// `limit_bytes` caps the file length, in whole segments.
    pub fn new(file: Box<dyn BlockFile>, limit_bytes: Option<u64>) -> BackingStore {
        let direct = file.direct();
        let read_align = file.read_align() as u64;
        BackingStore {
            file,
            limit: limit_bytes,
            direct,
            state: RwLock::new(State::default()),
            app: Mutex::new(None),
            moves: Mutex::new(Vec::new()),
            app_made: AtomicBool::new(false),
            c: Counters::default(),
            windows: Mutex::new(Windows::new()),
            read_busy: BusyClock::default(),
            timed: AtomicBool::new(false),
            epoch: AtomicU64::new(1),
            seg_epochs: (0..SEG_EPOCHS).map(|_| AtomicU64::new(1)).collect(),
            read_align,
        }
    }

    /// Both epochs a window over segment `seg` is valid for, as one number
    /// (a truncation or a write to the segment changes it).
    fn window_epoch(&self, seg: u64) -> u64 {
        let file = self.epoch.load(std::sync::atomic::Ordering::Acquire);
        let seg = self.seg_epochs[seg as usize % SEG_EPOCHS].load(std::sync::atomic::Ordering::Acquire);
        file << 40 ^ seg
    }

    /// Open a backing file or block device at `path` with [`OsFile::open`]
    /// (see [`Existing`] for what may already be there) and build a store
    /// on it. A block device caps the limit at its size. The second element
    /// says why `O_DIRECT` is not in use, if it is not.
    pub fn open(path: &Path, limit_bytes: Option<u64>, existing: Existing) -> Result<(BackingStore, Option<String>)> {
        let (f, why) = OsFile::open(path, existing)?;
        Ok((BackingStore::on_file(f, limit_bytes)?, why))
    }

    /// A store on `f`, a file [`OsFile::open`] or [`OsFile::kept`] opened
    /// (its limit capped, and checked, as [`BackingStore::open`] does).
    pub fn on_file(f: OsFile, limit_bytes: Option<u64>) -> Result<BackingStore> {
        let path = f.path().to_owned();
        let limit = match (f.device_bytes(), limit_bytes) {
            (Some(dev), Some(l)) => Some(l.min(dev)),
            (Some(dev), None) => Some(dev),
            (None, l) => l,
        };
        if limit.is_some_and(|l| l < SEG) {
            return Err(BackingError::Refused {
                path,
                why: format!("it can hold at most {} bytes; a backing store needs at least one {SEGMENT_SIZE}-byte segment", limit.unwrap_or(0)),
            });
        }
        Ok(BackingStore::new(Box::new(f), limit))
    }

    /// The least a read of a record reads past it (`0`: the record's own
    /// blocks alone; at most [`READAHEAD`], which a run of reads grows it
    /// to). [`MIN_READAHEAD`] unless set.
    pub fn set_min_read_ahead(&self, bytes: usize) -> Result<()> {
        if bytes > READAHEAD {
            return Err(BackingError::ReadAhead { asked: bytes, most: READAHEAD });
        }
        let mut ws = self.windows.lock();
        ws.auto = None;
        self.timed.store(false, Relaxed);
        ws.set_min(bytes);
        Ok(())
    }

    /// The least a read of a record reads past it chosen by what a read
    /// costs: `floor` (as [`set_min_read_ahead`](Self::set_min_read_ahead))
    /// while the reads cost [`FAST_READ`] or more each, none while they
    /// cost less, judged over every [`COST_READS`] reads. It starts at
    /// `floor`.
    pub fn set_read_ahead_auto(&self, floor: usize) -> Result<()> {
        self.set_min_read_ahead(floor)?;
        let mut ws = self.windows.lock();
        self.timed.store(true, Relaxed);
        ws.auto = Some(AutoFloor { floor, ops: self.c.read_ops.load(Relaxed), busy_ns: self.read_busy.busy_ns() });
        Ok(())
    }

    /// The least a read of a record reads past it now.
    pub fn min_read_ahead(&self) -> usize {
        self.windows.lock().min
    }

    /// Whether the file does `O_DIRECT` I/O.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Append a batch of records in one write (split only if it crosses a
    /// segment end): each is a 16-byte header and its payload, packed back
    /// to back, the batch padded to 4096. Returns one [`RecordId`] per
    /// record, in order. Payloads must be at most [`MAX_PAYLOAD`] bytes
    /// (empty payloads are accepted). On any error nothing is recorded and
    /// the caller keeps its data; the next write works normally.
    pub fn write_batch(&self, records: &[(u64, &[u8])]) -> Result<Vec<RecordId>> {
        if let Some(&(_, p)) = records.iter().find(|(_, p)| p.len() > MAX_PAYLOAD) {
            return Err(BackingError::TooLarge { len: p.len() });
        }
        if records.is_empty() {
            return Ok(Vec::new());
        }
        // Laid out by key, not in the order given (the tier's, coldest
        // first): a swap device's neighbouring slots are what the kernel's
        // swap-in read-ahead asks for together, and one request's pages
        // then lie in one read ([`prefetch`](Self::prefetch)).
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&i| records[i].0);
        let sorted: Vec<(u64, &[u8])> = order.iter().map(|&i| records[i]).collect();
        let ids = self.write_sorted(&sorted)?;
        let mut out = vec![RecordId::from_raw(0); records.len()];
        for (&i, id) in order.iter().zip(ids) {
            out[i] = id;
        }
        Ok(out)
    }

    /// [`write_batch`](Self::write_batch) in the order given.
    fn write_sorted(&self, records: &[(u64, &[u8])]) -> Result<Vec<RecordId>> {
        let lens: Vec<usize> = records.iter().map(|(_, p)| p.len()).collect();
        let mut guard = self.app.lock();
        let app = self.appender(&mut guard);
        let plan = match self.plan(&lens, false) {
            Err(BackingError::Full { .. } | BackingError::NoSpace { .. }) => {
                // At the store's limit or the filesystem's: make room by
                // compacting (into the spare segment), then try once more.
                if let Err(e) = self.compact_locked(app, Effort::Thorough) {
                    tracing::warn!("compaction to make room failed: {e}");
                }
                self.plan(&lens, false)?
            }
            r => r?,
        };
        if let Err(e) = self.write_plan(&mut app.wbuf, &plan, records) {
            self.rollback(&plan);
            return Err(e);
        }
        let ids = {
            let mut st = self.state.write();
            let ids: Vec<RecordId> =
                plan.places.iter().zip(&lens).map(|(&(seg, off), &len)| st.add_record(Place { seg, off, span: Place::span_of(len) })).collect();
            self.finish_plan(&mut st, &plan);
            ids
        };
        self.c.records_written.fetch_add(ids.len() as u64, Relaxed);
        if self.state.read().needs_compaction() {
            if let Err(e) = self.compact_locked(app, Effort::AsNeeded) {
                // The batch is safely written; compaction will be retried.
                tracing::warn!("automatic compaction of the backing file failed: {e}");
            }
        }
        Ok(ids)
    }

    /// Read a record's payload into `out` (cleared, then filled only if the
    /// record verifies: magic, length, key and checksum). A mismatch is
    /// [`BackingError::Checksum`], never data.
    ///
    /// The disk read runs with no lock held: the record's place is looked
    /// up under the table's read lock, the lock is dropped for the I/O, and
    /// the read is trusted only if no segment was freed in between (a freed
    /// segment is the only way a live record's bytes can be overwritten:
    /// appends go past a segment's end, compaction copies before it frees).
    /// If one was, the read is retried; after a few tries it falls back to
    /// holding the read lock across the I/O, so progress is guaranteed.
    pub fn read(&self, id: RecordId, key: u64, out: &mut Vec<u8>) -> Result<()> {
        const LOCK_FREE_TRIES: u32 = 8;
        for _ in 0..LOCK_FREE_TRIES {
            let st = self.state.read();
            let e = st.lookup(id)?;
            let reuse = st.reuse;
            drop(st);
            let r = self.read_at_place(id, key, e, out);
            if self.state.read().reuse == reuse {
                return r;
            }
            self.c.read_retries.fetch_add(1, Relaxed);
        }
        let st = self.state.read();
        let e = st.lookup(id)?;
        self.read_at_place(id, key, e, out)
    }

    /// Read and verify the record `id` assumed to be at `e`'s place: from
    /// a window if one holds it, else from the file, reading ahead.
    fn read_at_place(&self, id: RecordId, key: u64, e: Place, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let abs = e.seg as u64 * SEG + e.off as u64;
        let n = e.bytes();
        // Read the epoch before any I/O: a window filled while a write was
        // in flight carries the old epoch and is never trusted.
        let epoch = self.window_epoch(e.seg as u64);
        let ahead = {
            let mut ws = self.windows.lock();
            if let Some(w) = ws.find(epoch, abs, n) {
                let rec = &w.buf[(abs - w.lo) as usize..][..n];
                let r = self.serve(rec, id, key, e.span, out);
                match r {
                    Ok(()) => {
                        w.used += n;
                        if abs >= w.need {
                            self.c.count_readahead_hit(abs + n as u64 - w.need, n, w.key.and_then(|k| key.checked_sub(k)));
                        } else {
                            w.key = Some(w.key.map_or(key, |k| k.max(key)));
                        }
                    }
                    // Never trust this window again: a retry reads the disk.
                    Err(_) => w.len = 0,
                }
                return r;
            }
            // (The busy clock's lock is a leaf: a read takes it with no
            // other held.)
            if let Some(min) = ws.auto.as_mut().and_then(|a| a.judge(self.c.read_ops.load(Relaxed), || self.read_busy.busy_ns())) {
                ws.set_min(min);
            }
            if ws.continues(e.seg as u64, abs) {
                ws.grow();
            }
            let ahead = ws.ahead;
            let scattered = ahead == ws.min;
            drop(ws);
            if scattered {
                self.c.scattered_reads.fetch_add(1, Relaxed);
            }
            ahead
        };
        // Read ahead from the record's block towards the end of its
        // segment, `ahead` bytes past the record, at least the record.
        let a = self.read_align;
        let lo = abs & !(a - 1);
        let seg_end = (e.seg as u64 + 1) * SEG;
        let need = (abs + n as u64).div_ceil(a) * a;
        // (Every bound aligned: an O_DIRECT read of a length the file does
        // not take is EINVAL.)
        let hi = ((need + ahead as u64).div_ceil(a) * a).min(lo + READAHEAD as u64).min(seg_end).max(need);
        self.read_window(e.seg as u64, epoch, (lo, hi), (abs + n as u64, Some(key)), n, n, |buf| {
            self.serve(&buf[(abs - lo) as usize..][..n], id, key, e.span, out)
        })
    }

    /// Read `lo..hi` of segment `seg` (at window epoch `epoch`) in one
    /// operation, hand the bytes to `use_it` (which serves `used` bytes of
    /// records from them), and keep them as a window for the records next
    /// to those. The read is for `wanted` bytes of records ending at
    /// `need`, the highest of their keys `key` if known; the rest is
    /// read-ahead (and alignment). A read that ends before `need` is
    /// [`BackingError::ShortRead`].
    #[allow(clippy::too_many_arguments)]
    fn read_window(
        &self,
        seg: u64,
        epoch: u64,
        (lo, hi): (u64, u64),
        (need, key): (u64, Option<u64>),
        wanted: usize,
        used: usize,
        use_it: impl FnOnce(&[u8]) -> Result<()>,
    ) -> Result<()> {
        READ_BUF.with_borrow_mut(|tb| {
            let buf = tb.get_or_insert_with(|| AlignedBuf::new(WINDOW_BUF));
            let got = {
                let _busy = self.timed.load(Relaxed).then(|| self.read_busy.start());
                self.read_some(buf.get_mut((hi - lo) as usize), lo)?
            };
            if (got as u64) < need - lo {
                return Err(BackingError::ShortRead { expected: (need - lo) as usize, got });
            }
            use_it(buf.get(got))?;
            self.c.readahead_bytes.fetch_add((got as u64).saturating_sub(wanted as u64), Relaxed);
            let mut bytes = Vec::with_capacity(got);
            bytes.extend_from_slice(buf.get(got));
            let mut ws = self.windows.lock();
            let last = ws.clock;
            let new = Window { epoch, seg, lo, len: got, need, key, buf: bytes, used, last };
            let freed = ws.install(new, |seg, epoch| self.window_epoch(seg) != epoch);
            drop(ws);
            drop(freed);
            Ok(())
        })
    }

    /// Read the records `ids` are about to be asked for (the written-back
    /// pages of one request), with as few operations as their places
    /// allow: records of one segment that fit in one window are read
    /// together, and kept as windows for the reads that follow. Best
    /// effort: an id that is gone or a failed read is left for the read of
    /// that record to find and report. Returns the operations it made.
    pub fn prefetch(&self, ids: &[RecordId]) -> usize {
        if ids.len() < 2 {
            return 0;
        }
        let mut places: Vec<(u64, u64)> = {
            let st = self.state.read();
            ids.iter().filter_map(|&id| st.lookup(id).ok()).map(|e| (e.seg as u64 * SEG + e.off as u64, e.bytes() as u64)).collect()
        };
        places.sort_unstable();
        let a = self.read_align;
        let mut ops = 0;
        let mut i = 0;
        while i < places.len() {
            let (abs, n) = places[i];
            let seg = abs / SEG;
            let epoch = self.window_epoch(seg);
            let covered = |abs: u64, n: u64| self.windows.lock().slots.iter().any(|w| w.covers(epoch, abs, n as usize));
            if covered(abs, n) {
                i += 1;
                continue;
            }
            // One window from this record's block over every following
            // record of the segment that ends within it.
            let lo = abs & !(a - 1);
            let limit = (lo + WINDOW_BUF as u64).min((seg + 1) * SEG);
            let mut need = abs + n;
            let mut wanted = n;
            let mut j = i + 1;
            while j < places.len() && places[j].0 + places[j].1 <= limit {
                need = need.max(places[j].0 + places[j].1);
                wanted += places[j].1;
                j += 1;
            }
            if j > i + 1 {
                let hi = (need.div_ceil(a) * a).min(limit);
                // Nothing served from it yet: the loads that follow are.
                if self.read_window(seg, epoch, (lo, hi), (need, None), wanted as usize, 0, |_| Ok(())).is_ok() {
                    ops += 1;
                    self.c.prefetch_ops.fetch_add(1, Relaxed);
                }
            }
            i = j;
        }
        ops
    }

    /// Verify record `id` as read (`rec`: its span, whose header's length
    /// must round up to `span`) and append its payload to `out`; a
    /// mismatch is an error, never data.
    fn serve(&self, rec: &[u8], id: RecordId, key: u64, span: u16, out: &mut Vec<u8>) -> Result<()> {
        let bad = || BackingError::Checksum { id: id.to_raw() };
        let len = header_len(rec).filter(|&l| Place::span_of(l.into()) == span).ok_or_else(bad)?;
        let (_, payload) = verify(rec, len, Some(key)).ok_or_else(bad)?;
        out.extend_from_slice(payload);
        self.c.records_read.fetch_add(1, Relaxed);
        self.c.record_bytes_read.fetch_add((RECORD_HEADER_SIZE + payload.len()) as u64, Relaxed);
        Ok(())
    }

    /// Forget a record. Its id (and any copy of it) becomes invalid.
    pub fn free(&self, id: RecordId) -> Result<()> {
        let trailing_freed = {
            let mut st = self.state.write();
            let e = st.lookup(id)?;
            st.remove_record(e) && e.seg as usize + 1 == st.segs.len()
        };
        if trailing_freed {
            // Shrink the file now if no append is in flight; else the
            // appender will do it.
            if let Some(_g) = self.app.try_lock() {
                self.trim(false);
            }
        }
        Ok(())
    }

    /// Take the records `ids` name as this store's live records: the
    /// store is new, over the file a store of a process that died left
    /// (kept open by its keeper: `OsFile::kept`), and `ids` are the ids its
    /// engine's ledger names (`zmem_core::Pool::open`). Every other byte of
    /// the file is free space: records written and not yet named (a batch
    /// in flight, a compaction's copy not yet taken) are dropped with it.
    /// Returns, for each id, whether it was taken; one that cannot be a
    /// live record of this store is not (past the file's end or its
    /// limit, overlapping one taken, or of another generation than the
    /// rest of its segment's), and its page should be marked lost. An id
    /// named twice is one record. The records' bytes are not read here:
    /// every read checks its record's header, key and checksum as always.
    /// The file is cut past the last record named.
    pub fn adopt(&self, ids: &[RecordId]) -> Result<Vec<bool>> {
        let _app = self.app.lock();
        let mut st = self.state.write();
        if st.records > 0 || !st.segs.is_empty() {
            return Err(BackingError::Adopt { why: "the store has written records of its own already".into() });
        }
        // A record past the file's end (or its limit) was never written.
        let size = self.file.size().map_err(|source| BackingError::Io { op: "stat", source })?;
        let max_segs = self.limit.map_or(MAX_SEGS, |l| (l / SEG).min(MAX_SEGS)).min(size.div_ceil(SEG));
        // (segment, offset, span, generation, index in `ids`), valid ones.
        let mut named: Vec<(u32, u32, u16, u8, usize)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, &id)| {
                let (p, gen) = split_id(id)?;
                let fits = gen != 0 && p.span > 0 && u64::from(p.seg) < max_segs && p.off as usize + p.bytes() <= SEGMENT_SIZE;
                fits.then_some((p.seg, p.off, p.span, gen, i))
            })
            .collect();
        named.sort_unstable();
        let mut taken = vec![false; ids.len()];
        let segs = named.last().map_or(0, |n| n.0 as usize + 1);
        st.segs = (0..segs).map(|_| Segment::new(SegState::Free)).collect();
        let mut at = 0;
        while at < named.len() {
            let seg = named[at].0;
            let end = at + named[at..].iter().take_while(|n| n.0 == seg).count();
            let group = &named[at..end];
            at = end;
            // The generation most of the segment's ids carry: all of them,
            // unless a word was damaged.
            let mut gens: Vec<u8> = group.iter().map(|n| n.3).collect();
            gens.sort_unstable();
            let gen = gens.chunk_by(|a, b| a == b).max_by_key(|c| c.len()).map_or(1, |c| c[0]);
            let s = &mut st.segs[seg as usize];
            s.gen = gen;
            let mut last: Option<(u32, u16)> = None;
            for &(_, off, span, g, i) in group {
                let p = Place { seg, off, span };
                match last {
                    _ if g != gen => continue,
                    Some((o, sp)) if (o, sp) == (off, span) => {}
                    Some((o, sp)) if off < o + u32::from(sp) * REC_ALIGN => continue,
                    _ => {
                        s.live.push((off / REC_ALIGN) as u16);
                        s.live_bytes += p.bytes() as u32;
                        s.used = s.used.max(round_up(u64::from(off) + p.bytes() as u64) as u32);
                        last = Some((off, span));
                    }
                }
                taken[i] = true;
            }
        }
        let mut free = Vec::new();
        for (i, s) in st.segs.iter_mut().enumerate() {
            if s.live.is_empty() {
                free.push(i as u32);
            } else {
                s.state = SegState::Closed;
                s.live.shrink_to_fit();
            }
        }
        free.reverse();
        let (records, live_bytes, lists) =
            st.segs.iter().fold((0, 0, 0), |(r, b, l), s| (r + s.live.len() as u64, b + u64::from(s.live_bytes), l + s.live.capacity() * size_of::<u16>()));
        st.free_segs = free;
        let room = st.segs.capacity() - st.free_segs.len();
        st.free_segs.reserve_exact(room);
        st.old_gens = vec![1; st.segs.len()];
        (st.records, st.live_bytes, st.live_list_bytes) = (records, live_bytes, lists as u64);
        st.file_len = st.segs.last().map_or(0, |s| (segs as u64 - 1) * SEG + u64::from(s.used)).min(size);
        self.file.set_len(st.file_len).map_err(|source| BackingError::Io { op: "truncate", source })?;
        self.epoch.fetch_add(1, Relaxed);
        Ok(taken)
    }

    /// Copy the live records of sparse segments (under half live) into the
    /// open segment, free emptied segments, and truncate free segments off
    /// the end of the file (copying records down from the last segments if
    /// that is what keeps the file short). A record's id is its place, so a
    /// copy has a new id: each copy is a [`Moved`] for the owner of the
    /// old id to take ([`take_moves`](Self::take_moves)); the old record
    /// stays live, and readable, until it is freed, and a segment whose
    /// records were all copied is freed with the last of them. At most
    /// [`MAX_MOVES`] records are copied a call. Returns the segments freed
    /// or evacuated. Runs automatically after a write when the file exceeds
    /// twice the live bytes plus a segment, but then only as far as it
    /// must ([`Effort::AsNeeded`]).
    pub fn compact(&self) -> Result<u64> {
        let mut guard = self.app.lock();
        let app = self.appender(&mut guard);
        self.compact_locked(app, Effort::Thorough)
    }

    /// The records compaction copied since the last call: for each, the
    /// key it was written under, its old id and its copy's. The owner of
    /// the old id names the copy instead and frees the old id; if nothing
    /// names the old id any more (it was freed meanwhile, or is being),
    /// the copy is freed. Until then both are live.
    pub fn take_moves(&self) -> Vec<Moved> {
        std::mem::take(&mut *self.moves.lock())
    }

    /// RAM the store holds for its tables and its append buffers (once
    /// the first append has made them), and the moves not yet taken. O(1).
    pub fn metadata_bytes(&self) -> u64 {
        self.state.read().metadata_bytes() + self.buffer_bytes() + (self.moves.lock().capacity() * size_of::<Moved>()) as u64
    }

    /// RAM of the append buffers and the most the read windows hold, once
    /// the first write made the append buffers (a reading thread's own
    /// buffer, as large as a window's largest read, is not counted). Part of [`metadata_bytes`](Self::metadata_bytes), but a
    /// fixed cost, not one that grows with the data. O(1).
    pub fn buffer_bytes(&self) -> u64 {
        if self.app_made.load(Relaxed) {
            BUFFER_BYTES
        } else {
            0
        }
    }

    /// An upper bound on how much [`metadata_bytes`](Self::metadata_bytes)
    /// can grow during one [`write_batch`](Self::write_batch) of `records`
    /// records holding `bytes` of payload, including the compactions it
    /// may run (two, of [`MAX_MOVES`] copies each): the live lists of the
    /// batch's records and of the copies (each list at most doubling), the
    /// moves themselves, the segment table, its free list and the
    /// generations a truncation keeps for every segment they can take, and
    /// the append buffers if they are not made yet. A caller with a memory budget charges this first and settles
    /// to the real growth afterwards.
    pub fn growth_bound(&self, records: usize, bytes: usize) -> u64 {
        let st = self.state.read();
        // (A write may compact twice: to make room, and after.)
        let copies = 2 * MAX_MOVES;
        let lists = 2 * (records + copies) * size_of::<u16>();
        let moves = 2 * copies * size_of::<Moved>();
        let new_segs = (records * RECORD_HEADER_SIZE + bytes) / SEGMENT_SIZE + 4 + copies * (RECORD_HEADER_SIZE + MAX_PAYLOAD) / SEGMENT_SIZE;
        let segs = (st.segs.len() / 8 + 8 + new_segs) * (size_of::<Segment>() + size_of::<u32>());
        // (A truncation keeps the generations of the segments it drops.)
        let gens = 2 * (st.segs.len() + new_segs);
        (lists + moves + segs + gens) as u64 + (BUFFER_BYTES - self.buffer_bytes())
    }

    /// The append buffers, made on first use (from then on the windows'
    /// most is counted too: a record is read only once written).
    fn appender<'a>(&self, slot: &'a mut Option<Appender>) -> &'a mut Appender {
        slot.get_or_insert_with(|| {
            self.app_made.store(true, Relaxed);
            Appender { wbuf: AlignedBuf::new(SEGMENT_SIZE), rbuf: AlignedBuf::new(SEGMENT_SIZE) }
        })
    }

    /// Counters and sizes, in the spirit of zram's `bd_stat`.
    pub fn stats(&self) -> ColdStats {
        let st = self.state.read();
        let metadata_bytes = st.metadata_bytes() + self.buffer_bytes();
        ColdStats {
            records: st.records,
            live_bytes: st.live_bytes,
            file_bytes: st.file_len,
            bytes_written: self.c.bytes_written.load(Relaxed),
            bytes_read: self.c.bytes_read.load(Relaxed),
            compaction_bytes_read: self.c.compaction_bytes_read.load(Relaxed),
            record_bytes_read: self.c.record_bytes_read.load(Relaxed),
            read_ops: self.c.read_ops.load(Relaxed),
            prefetch_ops: self.c.prefetch_ops.load(Relaxed),
            scattered_reads: self.c.scattered_reads.load(Relaxed),
            records_written: self.c.records_written.load(Relaxed),
            records_read: self.c.records_read.load(Relaxed),
            segments_compacted: self.c.segments_compacted.load(Relaxed),
            read_retries: self.c.read_retries.load(Relaxed),
            readahead_bytes: self.c.readahead_bytes.load(Relaxed),
            readahead_used_bytes: self.c.readahead_used_bytes.load(Relaxed),
            readahead_floor_bytes: self.windows.lock().min as u64,
            readahead_hits: self.c.readahead_hits.each_ref().map(|h| h.load(Relaxed)),
            readahead_slot_hits: self.c.readahead_slot_hits.each_ref().map(|h| h.load(Relaxed)),
            metadata_bytes,
            ..ColdStats::default()
        }
    }

    // ---- internals -----------------------------------------------------

    /// [`State::take_segment`], and when that grows the file, reserve the
    /// new segment's blocks on the filesystem, plus one spare segment for an
    /// append: the spare is where compaction moves records when the
    /// filesystem is full, so space freed inside the file can be reused.
    /// A filesystem that cannot reserve them gives [`BackingError::NoSpace`].
    fn take_segment(&self, st: &mut State, for_compaction: bool) -> Result<u32> {
        let before = st.segs.len();
        let s = st.take_segment(self.limit, for_compaction)?;
        if st.segs.len() > before {
            let want = if for_compaction { SEG } else { 2 * SEG };
            if let Err(source) = self.file.allocate(s as u64 * SEG, want) {
                st.segs.pop();
                return Err(BackingError::NoSpace { source });
            }
        }
        Ok(s)
    }

    /// Lay out records (by payload length) at the open segment's tail,
    /// moving to fresh segments as needed. Takes the state lock briefly.
    fn plan(&self, lens: &[usize], for_compaction: bool) -> Result<Plan> {
        let mut st = self.state.write();
        let mut plan = Plan { chunks: Vec::new(), places: Vec::with_capacity(lens.len()), taken: Vec::new() };
        let mut seg = match st.open {
            Some(s) => s,
            None => {
                let s = self.take_segment(&mut st, for_compaction)?;
                plan.taken.push(s);
                s
            }
        };
        let mut start = st.segs[seg as usize].used;
        let mut pos = start;
        let mut first = 0;
        for (i, &len) in lens.iter().enumerate() {
            let need = (RECORD_HEADER_SIZE + len) as u32;
            // (A segment's tail is 4096-aligned, so records start aligned.)
            if (pos + need) as usize > SEGMENT_SIZE {
                if i > first {
                    plan.chunks.push(Chunk { seg, start, data_end: pos, end: round_up(pos.into()) as u32, recs: first..i });
                }
                seg = match self.take_segment(&mut st, for_compaction) {
                    Ok(s) => s,
                    Err(e) => {
                        drop(st);
                        self.rollback(&plan);
                        return Err(e);
                    }
                };
                plan.taken.push(seg);
                (start, pos, first) = (0, 0, i);
            }
            plan.places.push((seg, pos));
            pos += need.next_multiple_of(REC_ALIGN);
        }
        plan.chunks.push(Chunk { seg, start, data_end: pos, end: round_up(pos.into()) as u32, recs: first..lens.len() });
        Ok(plan)
    }

    /// Give back the segments a failed plan took.
    /// Give back the segments a failed plan took, and cut off anything a
    /// failed write may have added past the committed end of the file.
    /// Caller holds the appender lock.
    fn rollback(&self, plan: &Plan) {
        let grew = {
            let mut st = self.state.write();
            for &s in &plan.taken {
                st.free_segment(s);
            }
            plan.chunks.iter().any(|c| c.seg as u64 * SEG + c.end as u64 > st.file_len)
        };
        self.trim(grew);
    }

    /// After the records of a successful plan are in the table: advance
    /// tails, make the last segment the open one, close the others.
    fn finish_plan(&self, st: &mut State, plan: &Plan) {
        let last = plan.chunks.last().map(|c| c.seg).expect("plan has a chunk");
        for c in &plan.chunks {
            st.segs[c.seg as usize].used = c.end;
            st.file_len = st.file_len.max(c.seg as u64 * SEG + c.end as u64);
        }
        if let Some(prev) = st.open {
            if prev != last {
                st.close(prev);
            }
        }
        for &s in &plan.taken {
            if s != last {
                st.close(s);
            }
        }
        st.segs[last as usize].state = SegState::Open;
        st.open = Some(last);
    }

    fn write_plan(&self, wbuf: &mut AlignedBuf, plan: &Plan, records: &[(u64, &[u8])]) -> Result<()> {
        for c in &plan.chunks {
            let buf = wbuf.get_mut((c.end - c.start) as usize);
            for i in c.recs.clone() {
                let (key, payload) = records[i];
                let at = (plan.places[i].1 - c.start) as usize;
                put_record(&mut buf[at..], key, payload);
                // (No stale bytes between records.)
                let end = at + RECORD_HEADER_SIZE + payload.len();
                buf[end..end.next_multiple_of(REC_ALIGN as usize)].fill(0);
            }
            buf[(c.data_end - c.start) as usize..].fill(0);
            self.write_all(buf, c.seg as u64 * SEG + c.start as u64)?;
        }
        Ok(())
    }

    fn write_all(&self, buf: &[u8], off: u64) -> Result<()> {
        let mut done = 0;
        let res = loop {
            if done == buf.len() {
                break Ok(());
            }
            match self.file.write_at(&buf[done..], off + done as u64) {
                Ok(0) => break Err(BackingError::ShortWrite { expected: buf.len(), written: done }),
                Ok(n) => {
                    done += n;
                    if self.direct && done % PAGE_SIZE != 0 {
                        // The rest would be misaligned for O_DIRECT.
                        break Err(BackingError::ShortWrite { expected: buf.len(), written: done });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => break Err(BackingError::Io { op: "write", source }),
            }
        };
        self.c.bytes_written.fetch_add(done as u64, Relaxed);
        // After the write (even a failed one): windows over the segments it
        // touched, read before now, are stale.
        let end = off + buf.len().max(1) as u64;
        for seg in (off / SEG..end.div_ceil(SEG)).take(SEG_EPOCHS) {
            self.seg_epochs[seg as usize % SEG_EPOCHS].fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        res
    }

    /// Read up to `buf.len()` bytes at `off`, stopping early only at the
    /// end of the file; returns the bytes read.
    fn read_some(&self, buf: &mut [u8], off: u64) -> Result<usize> {
        let mut got = 0;
        let res = loop {
            if got == buf.len() {
                break Ok(got);
            }
            match self.file.read_at(&mut buf[got..], off + got as u64) {
                Ok(0) => break Ok(got),
                Ok(n) => {
                    got += n;
                    if self.direct && got % PAGE_SIZE != 0 {
                        // A short O_DIRECT read ends at the end of the file.
                        break Ok(got);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => break Err(BackingError::Io { op: "read", source }),
            }
        };
        self.c.bytes_read.fetch_add(got as u64, Relaxed);
        self.c.read_ops.fetch_add(1, Relaxed);
        res
    }

    fn read_exact(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let mut got = 0;
        let res = loop {
            if got == buf.len() {
                break Ok(());
            }
            match self.file.read_at(&mut buf[got..], off + got as u64) {
                Ok(0) => break Err(BackingError::ShortRead { expected: buf.len(), got }),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => break Err(BackingError::Io { op: "read", source }),
            }
        };
        self.c.bytes_read.fetch_add(got as u64, Relaxed);
        self.c.compaction_bytes_read.fetch_add(got as u64, Relaxed);
        res
    }

    /// Truncate free segments off the end of the file. Caller holds the
    /// appender lock.
    fn trim(&self, force: bool) {
        let mut st = self.state.write();
        let keep = st.segs.iter().rposition(|s| s.state != SegState::Free).map_or(0, |i| i + 1);
        let drop_n = st.segs.len() - keep;
        let new_len = keep.checked_sub(1).map_or(0, |i| i as u64 * SEG + st.segs[i].used as u64);
        if !force && drop_n == 0 && new_len >= st.file_len {
            return;
        }
        let r = self.file.set_len(new_len);
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::Release);
        if let Err(e) = r {
            tracing::warn!("could not truncate the backing file to {new_len} bytes: {e}");
            return;
        }
        for i in keep..st.segs.len() {
            st.old_gens[i] = st.segs[i].gen;
        }
        st.segs.truncate(keep);
        // The dropped segments are the largest indices: the list's front.
        st.free_segs.drain(..drop_n);
        st.file_len = new_len;
    }

    fn compact_locked(&self, app: &mut Appender, effort: Effort) -> Result<u64> {
        let mut freed = 0;
        let mut moves = 0;
        // 0. An open segment whose records were all freed is just space:
        // retire it, so the next append starts at the lowest free segment.
        {
            let mut st = self.state.write();
            if let Some(open) = st.open.filter(|&o| st.segs[o as usize].live_records() == 0) {
                st.close(open);
                freed += 1;
            }
        }
        // 1. Sparse segments, sparsest first.
        let mut victims: Vec<(u32, u32)> = {
            let st = self.state.read();
            st.segs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state == SegState::Closed && !s.bad && !s.evacuated && (s.live_bytes as u64) * 2 < SEG)
                .map(|(i, s)| (s.live_bytes, i as u32))
                .collect()
        };
        victims.sort_unstable();
        for &(_, v) in &victims {
            if effort == Effort::AsNeeded && !self.state.read().over_target() {
                break;
            }
            match self.evacuate(app, v, &mut moves)? {
                Evacuated::Freed | Evacuated::Copied => freed += 1,
                Evacuated::Left => {}
                Evacuated::NoRoom => break,
            }
        }
        // 2. Keep the file short: copy the last segment's records down
        // into free segments below it, and truncate (once the engine has
        // freed the old copies).
        let mut budget = self.state.read().segs.len() * 2 + 2;
        loop {
            self.trim(false);
            let mut st = self.state.write();
            let target = 2 * st.live_bytes + 2 * SEG;
            // (Not while copies wait to be taken: their old records' frees
            // make the holes, and the top may hold the copies.)
            if budget == 0 || st.file_len <= target || !st.hole_below_top() || st.evac_segs > 0 {
                break;
            }
            budget -= 1;
            let top = st.segs.len() as u32 - 1;
            // (Appends fill the free segments below first, so a dense top
            // segment empties by itself as its records die, at no I/O.)
            let dense = st.segs[top as usize].live_bytes as u64 * 2 >= SEG;
            if effort == Effort::AsNeeded && dense && st.file_len <= 2 * target {
                break;
            }
            match st.segs[top as usize].state {
                SegState::Open => {
                    st.close(top);
                    freed += u64::from(st.segs[top as usize].state == SegState::Free);
                }
                SegState::Closed if !st.segs[top as usize].bad && !st.segs[top as usize].evacuated => {
                    drop(st);
                    match self.evacuate(app, top, &mut moves)? {
                        Evacuated::Freed => freed += 1,
                        Evacuated::Copied => {
                            freed += 1;
                            break;
                        }
                        Evacuated::Left | Evacuated::NoRoom => break,
                    }
                }
                _ => break,
            }
        }
        if freed > 0 {
            let st = self.state.read();
            tracing::debug!(freed, moves, file_bytes = st.file_len, live_bytes = st.live_bytes, "compacted backing file");
        }
        Ok(freed)
    }

    /// Copy every live record out of closed segment `v` (at most
    /// [`MAX_MOVES`] in all, counted in `moves`), queue a [`Moved`] for
    /// each, and mark `v` evacuated: it is freed with the last of its
    /// records, which the engine frees as it takes the moves. A segment
    /// left empty is freed at once.
    fn evacuate(&self, app: &mut Appender, v: u32, moves: &mut usize) -> Result<Evacuated> {
        let Appender { wbuf, rbuf } = app;
        let (live, used, gen) = {
            let mut st = self.state.write();
            let s = &st.segs[v as usize];
            if s.state != SegState::Closed || s.evacuated || s.bad {
                return Ok(Evacuated::Left);
            }
            if s.live.is_empty() {
                st.free_segment(v);
                self.c.segments_compacted.fetch_add(1, Relaxed);
                return Ok(Evacuated::Freed);
            }
            if *moves + s.live.len() > MAX_MOVES {
                return Ok(Evacuated::NoRoom);
            }
            (s.live.clone(), s.used, s.gen)
        };
        // No lock during the read: only this (appender) thread can reuse
        // v's space (v is freed only once empty), and frees never move data.
        // Read the aligned span from the first live record to the end.
        let lo = (u32::from(live[0]) * REC_ALIGN) & !(PAGE_SIZE as u32 - 1);
        let span = (used - lo) as usize;
        self.read_exact(rbuf.get_mut(span), v as u64 * SEG + lo as u64)?;
        let data = rbuf.get(span);
        let mut recs: Vec<(u64, &[u8])> = Vec::with_capacity(live.len());
        for &off16 in &live {
            let off = u32::from(off16) * REC_ALIGN;
            match data.get((off - lo) as usize..).and_then(parse) {
                Some(kp) => recs.push(kp),
                None => {
                    tracing::warn!("backing record at segment {v}, offset {off} fails verification; segment {v} will not be compacted");
                    self.state.write().segs[v as usize].bad = true;
                    return Ok(Evacuated::Left);
                }
            }
        }
        let lens: Vec<usize> = recs.iter().map(|(_, p)| p.len()).collect();
        let plan = self.plan(&lens, true)?;
        if let Err(e) = self.write_plan(wbuf, &plan, &recs) {
            self.rollback(&plan);
            return Err(e);
        }
        let mut st = self.state.write();
        let mut queued = Vec::with_capacity(live.len());
        for ((&off16, &(key, payload)), &(seg, off)) in live.iter().zip(&recs).zip(&plan.places) {
            let span = Place::span_of(payload.len());
            let from = Place { seg: v, off: u32::from(off16) * REC_ALIGN, span };
            // A record freed while it was copied is not moved: its copy's
            // bytes are garbage in the file.
            if st.segs[v as usize].gen == gen && st.segs[v as usize].live.binary_search(&off16).is_ok() {
                let to = st.add_record(Place { seg, off, span });
                queued.push(Moved { key, from: record_id(from, gen), to });
            }
        }
        self.finish_plan(&mut st, &plan);
        *moves += queued.len();
        let s = &mut st.segs[v as usize];
        let (gone, bytes) = (s.state == SegState::Free || s.gen != gen, s.live_bytes);
        if !gone {
            s.evacuated = true;
            st.evac_segs += 1;
            st.evac_live += u64::from(bytes);
        }
        drop(st);
        self.moves.lock().extend(queued);
        self.c.segments_compacted.fetch_add(1, Relaxed);
        Ok(if gone { Evacuated::Freed } else { Evacuated::Copied })
    }
}

/// What [`BackingStore::evacuate`] did with a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Evacuated {
    /// It was empty, and is free.
    Freed,
    /// Its records were copied; it is freed with the last old copy.
    Copied,
    /// Not a candidate (open, bad, evacuated already, or bad bytes found).
    Left,
    /// Copying it would exceed this call's [`MAX_MOVES`].
    NoRoom,
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn a_window_is_trusted_only_for_its_epoch_and_range() {
        let w = Window { epoch: 3, seg: 0, lo: 8192, len: 65536, need: 9000, key: None, buf: Vec::new(), used: 0, last: 0 };
        assert!(w.covers(3, 8192, 100));
        assert!(w.covers(3, 8192 + 65536 - 100, 100));
        assert!(!w.covers(4, 8192, 100), "a write happened since: stale");
        assert!(!w.covers(3, 8191, 100), "starts before the window");
        assert!(!w.covers(3, 8192 + 65536 - 99, 100), "ends past the window");
        assert!(!Window::EMPTY.covers(0, 0, 1), "an empty window holds nothing");
    }

    #[test]
    fn the_victim_is_empty_or_stale_before_it_is_old() {
        let mut ws = Windows::new();
        for (i, w) in ws.slots.iter_mut().enumerate() {
            *w = Window { epoch: 1, seg: i as u64, lo: 0, len: 4096, need: 4096, key: None, buf: Vec::new(), used: 4096, last: 10 + i as u64 };
        }
        ws.slots[5].last = 1;
        let never = |_, _| false;
        assert_eq!(ws.victim(&never, None, false), Some(5), "the least recently used");
        assert_eq!(ws.victim(&never, Some(5), false), Some(0), "the next, when that one is kept");
        ws.slots[6].len = 0;
        assert_eq!(ws.victim(&never, None, false), Some(6), "an empty one first");
        ws.slots[6].len = 4096;
        assert_eq!(ws.victim(&|seg, _| seg == 3, None, false), Some(3), "a stale one first");
        assert_eq!(ws.victim(&never, None, true), None, "no slot holds a buffer");
    }

    /// A window of `len` bytes of segment `seg`, last used at `last`.
    fn window(seg: u64, len: usize, used: usize, last: u64) -> Window {
        Window { epoch: 1, seg, lo: 0, len, need: 0, key: None, buf: vec![0; len], used, last }
    }

    #[test]
    fn windows_hold_their_reads_within_their_bytes() {
        let mut ws = Windows::new();
        let never = |_, _| false;
        // Small reads: a window in every slot.
        for i in 0..WINDOWS {
            assert_eq!(ws.install(window(i as u64, 12 << 10, 12 << 10, i as u64), never).iter().map(Vec::capacity).sum::<usize>(), 0);
        }
        assert_eq!(ws.held, WINDOWS * (12 << 10));
        assert!(ws.slots.iter().all(|w| w.len > 0), "{WINDOWS} windows of 12 KiB fit");
        // Whole read-ahead windows: each replaces the least recently used
        // ones until the bytes fit, and no more.
        for i in 0..40u64 {
            ws.install(window(100 + i, WINDOW_BUF, WINDOW_BUF, 100 + i), never);
            assert!(ws.held <= WINDOW_BYTES, "{} bytes held", ws.held);
            assert_eq!(ws.held, ws.slots.iter().map(|w| w.buf.capacity()).sum::<usize>(), "the count is the buffers'");
        }
        let big = ws.slots.iter().filter(|w| w.len == WINDOW_BUF).count();
        assert_eq!(big, WINDOW_BYTES / WINDOW_BUF, "the newest whole windows, as many as fit");
        assert!(ws.slots.iter().filter(|w| w.len == WINDOW_BUF).all(|w| w.seg >= 140 - big as u64), "the newest are kept");
        // A window replaced with little of it served shrinks the
        // read-ahead, once for each window kept however many go.
        ws.ahead = READAHEAD;
        for w in ws.slots.iter_mut() {
            w.used = 0;
        }
        ws.install(window(500, WINDOW_BUF, WINDOW_BUF, 500), never);
        assert_eq!(ws.ahead, READAHEAD / 4);
    }

    fn forget_windows(s: &BackingStore) {
        for w in s.windows.lock().slots.iter_mut() {
            w.len = 0;
        }
    }

    /// Write `n` records of 1000 bytes in batches of 64, as the shrinker
    /// does; their ids.
    fn filled(n: u64) -> (BackingStore, Vec<RecordId>) {
        let s = BackingStore::new(Box::new(crate::MemFile::new(true)), None);
        let data = vec![7u8; 1000];
        let mut ids = Vec::new();
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let batch: Vec<(u64, &[u8])> = chunk.iter().map(|&k| (k, &data[..])).collect();
            ids.extend(s.write_batch(&batch).unwrap());
        }
        (s, ids)
    }

    /// Bytes read from the file to read `order`, starting with no window.
    fn bytes_read_by(s: &BackingStore, ids: &[RecordId], order: &[usize]) -> u64 {
        forget_windows(s);
        let before = s.stats().bytes_read;
        let mut out = Vec::new();
        for &i in order {
            s.read(ids[i], i as u64, &mut out).unwrap();
            assert_eq!(out, vec![7u8; 1000]);
        }
        s.stats().bytes_read - before
    }

    #[test]
    fn threads_share_what_either_read() {
        // Two threads take turns reading the records in order, as FUSE
        // workers serve the pages of one run of swap-ins: each reads the
        // neighbours the other's window already holds.
        let n = 1024;
        let (s, ids) = filled(n);
        let (b0, ops0) = (s.stats().bytes_read, s.stats().read_ops);
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for me in 0..2 {
                let (s, ids, next) = (&s, &ids, &next);
                sc.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.load(std::sync::atomic::Ordering::Acquire);
                        if i >= n as usize {
                            break;
                        }
                        if i % 2 != me {
                            std::thread::yield_now();
                            continue;
                        }
                        s.read(ids[i], i as u64, &mut out).unwrap();
                        assert_eq!(out, vec![7u8; 1000]);
                        next.store(i + 1, std::sync::atomic::Ordering::Release);
                    }
                });
            }
        });
        let (bytes, ops) = (s.stats().bytes_read - b0, s.stats().read_ops - ops0);
        let file = n * 1016;
        assert!(bytes <= file * 5 / 4, "two threads reading {n} records in turn read {bytes} bytes for {file}");
        assert!(ops <= file / (32 << 10), "{ops} reads for {file} bytes in order");
    }

    #[test]
    fn interleaved_runs_keep_their_windows() {
        // Two processes swapping in at once: two runs of records, far
        // apart, read in alternation by one thread.
        let (s, ids) = filled(4096);
        forget_windows(&s);
        let (b0, ops0) = (s.stats().bytes_read, s.stats().read_ops);
        let mut out = Vec::new();
        for i in 0..512 {
            for r in [i, 3000 + i] {
                s.read(ids[r], r as u64, &mut out).unwrap();
                assert_eq!(out, vec![7u8; 1000]);
            }
        }
        let (bytes, ops) = (s.stats().bytes_read - b0, s.stats().read_ops - ops0);
        let runs = 2 * 512 * 1016;
        eprintln!("two interleaved runs of {runs} bytes: {bytes} bytes in {ops} reads");
        // One window for both (each miss replacing the other run's) read
        // 5.1 times the runs' bytes. Here the read-ahead, judged at every
        // miss by the window read last, still shrinks while the runs
        // alternate, but each run keeps its window.
        assert!(bytes <= runs * 2, "two interleaved runs of {runs} bytes read {bytes}");
        assert!(ops <= 160, "two interleaved runs of {runs} bytes took {ops} reads");
    }

    #[test]
    fn readahead_serves_runs_and_shrinks_for_scattered_reads() {
        let n = 2048;
        let (s, ids) = filled(n);
        let file = n * 1024;
        // In order: read about once.
        let seq: Vec<usize> = (0..n as usize).collect();
        let b = bytes_read_by(&s, &ids, &seq);
        assert!(b <= file * 3 / 2, "sequential reads read {b} bytes for a {file}-byte file");
        // Scattered (a stride that never lands in a window): the
        // read-ahead shrinks to its floor, 8 KiB past the record's own
        // blocks, so far less than 64 KiB a record.
        let scattered: Vec<usize> = (0..n as usize).map(|i| (i * 997) % n as usize).collect();
        let b = bytes_read_by(&s, &ids, &scattered);
        assert!(b <= (n * 14) << 10, "scattered reads read {b} bytes for {n} records (at 64 KiB each: {})", n * (64 << 10));
    }

    #[test]
    fn readahead_is_counted_read_and_used_and_its_floor_is_a_setting() {
        let n = 2048;
        let (s, ids) = filled(n);
        // Scattered reads: the default floor reads 8 KiB past each record,
        // a floor of 0 its own blocks (a 4 KiB-aligned file here).
        let scattered: Vec<usize> = (0..n as usize).map(|i| (i * 997) % n as usize).take(256).collect();
        s.windows.lock().ahead = MIN_READAHEAD;
        let b8 = bytes_read_by(&s, &ids, &scattered);
        s.set_min_read_ahead(0).unwrap();
        s.windows.lock().ahead = 0;
        let before = s.stats();
        let b = bytes_read_by(&s, &ids, &scattered);
        let st = s.stats();
        assert!(b * 2 <= b8, "256 scattered reads read {b} bytes with no read-ahead, {b8} with 8 KiB");
        let misses = st.read_ops - before.read_ops;
        assert!(misses >= 250, "{misses} of 256 scattered reads missed");
        let ahead = st.readahead_bytes - before.readahead_bytes;
        // (Past each record's span: its 16-byte rounding is no read-ahead.)
        let span = (1000 + RECORD_HEADER_SIZE).next_multiple_of(RECORD_ALIGN) as u64;
        assert_eq!(ahead, b - misses * span, "what was read past the records: {st:?}");
        // In order: the run grows the read-ahead from 0, and the records
        // the windows serve are counted as used, each by its distance.
        let before = s.stats();
        let seq: Vec<usize> = (0..n as usize).collect();
        bytes_read_by(&s, &ids, &seq);
        let st = s.stats();
        let hits: u64 = st.readahead_hits.iter().sum();
        let served = (st.records_read - before.records_read) - (st.read_ops - before.read_ops);
        let used = st.readahead_used_bytes - before.readahead_used_bytes;
        let before_hits: u64 = before.readahead_hits.iter().sum();
        assert_eq!(hits - before_hits, served, "every record a window served is a read-ahead hit: {st:?}");
        assert!(served > n / 2, "a run is served by read-ahead: {st:?}");
        assert_eq!(used, served * span);
        assert!(used <= st.readahead_bytes - before.readahead_bytes, "{st:?}");
        assert!(st.readahead_hits[3] > 0 && st.readahead_hits[0] > 0, "near and far hits: {st:?}");
        // The floor is at most the most a read reads ahead.
        assert!(matches!(s.set_min_read_ahead(READAHEAD + 1), Err(BackingError::ReadAhead { .. })));
        s.set_min_read_ahead(READAHEAD).unwrap();
        assert_eq!(s.windows.lock().ahead, READAHEAD);
    }

    #[test]
    fn readahead_hits_are_counted_by_their_slots_past_the_keys_read() {
        let s = BackingStore::new(Box::new(crate::MemFile::new(true)), None);
        let data = vec![7u8; 1000];
        let write = |keys: &[u64]| -> Vec<RecordId> { s.write_batch(&keys.iter().map(|&k| (k, &data[..])).collect::<Vec<_>>()).unwrap() };
        // Records of 1,024 bytes, four a block: slots 0..=23 side by side,
        // then slots 300 apart.
        let run = write(&(0..24).collect::<Vec<_>>());
        let spread_keys: Vec<u64> = (0..24).map(|i| 5000 + 300 * i).collect();
        let spread = write(&spread_keys);
        s.windows.lock().ahead = MIN_READAHEAD;
        let mut out = Vec::new();
        let hits = |s: &BackingStore| s.stats().readahead_slot_hits;
        // Slot 0's read reads its block and 8 KiB past it: slots 1..=11.
        s.read(run[0], 0, &mut out).unwrap();
        for (k, &id) in run.iter().enumerate().take(12).skip(1) {
            s.read(id, k as u64, &mut out).unwrap();
        }
        assert_eq!(s.stats().read_ops, 1);
        assert_eq!(hits(&s), [0, 11, 0, 0], "slots 1-11 within 16 of slot 0");
        // Records next to each other in the file, 300 slots apart: 900 is
        // within 1,024 slots, 1,200 and more beyond.
        forget_windows(&s);
        s.windows.lock().ahead = MIN_READAHEAD;
        let before = hits(&s);
        for (&id, &k) in spread.iter().zip(&spread_keys).take(12) {
            s.read(id, k, &mut out).unwrap();
        }
        let after = hits(&s);
        let d: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        assert_eq!(d, [0, 0, 3, 8], "{after:?}");
        // A prefetch's window learns its keys from the loads that follow:
        // a hit before any is served is counted as beyond.
        forget_windows(&s);
        // (Slots 12 and 13 wanted: the read ends at their block's end, 15.)
        assert_eq!(s.prefetch(&[run[12], run[13]]), 1);
        let before = hits(&s);
        for k in [15, 12, 13, 14] {
            s.read(run[k], k as u64, &mut out).unwrap();
        }
        let after = hits(&s);
        assert_eq!(s.stats().prefetch_ops, 1);
        let d: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        assert_eq!(d, [0, 1, 0, 1], "slot 15 before the loads, 14 one past 13: {after:?}");
        // Records under one key (an extent's block, split): the same key.
        let same = write(&[9000, 9000, 9000]);
        forget_windows(&s);
        let before = hits(&s);
        for &id in &same {
            s.read(id, 9000, &mut out).unwrap();
        }
        let d: Vec<u64> = hits(&s).iter().zip(before).map(|(a, b)| a - b).collect();
        assert_eq!(d, [2, 0, 0, 0]);
    }

    #[test]
    fn the_chosen_floor_follows_what_a_read_costs() {
        let mut a = AutoFloor { floor: MIN_READAHEAD, ops: 100, busy_ns: 5_000 };
        let fast = FAST_READ.as_nanos() as u64 - 1;
        // Too few reads for a verdict: none, the clock not even read, and
        // the epoch goes on.
        assert_eq!(a.judge(100 + COST_READS - 1, || unreachable!("the clock is read only for a verdict")), None);
        assert_eq!(a.judge(100 + COST_READS, || 5_000 + COST_READS * fast), Some(0));
        // A new epoch began there: its reads alone are judged.
        let (ops, busy) = (a.ops, a.busy_ns);
        let dear = FAST_READ.as_nanos() as u64;
        assert_eq!(a.judge(ops + COST_READS, || busy + COST_READS * dear), Some(MIN_READAHEAD));
        assert_eq!(a.judge(ops + 2 * COST_READS, || busy + COST_READS * dear + COST_READS * fast), Some(0));
        // No time at all is fast; a clock that went nowhere is no panic.
        assert_eq!(a.judge(ops + 3 * COST_READS, || 0), Some(0));
    }

    #[test]
    fn a_floor_chosen_by_cost_is_kept_on_a_slow_disk_and_dropped_on_a_fast_one() {
        use std::sync::Arc;
        let f = Arc::new(crate::FaultyFile::new(crate::MemFile::new(true)));
        let s = BackingStore::new(Box::new(Arc::clone(&f)), None);
        let data = vec![7u8; 1000];
        // (Records enough that the windows cover little of them.)
        let n = 8192u64;
        let mut ids = Vec::new();
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let batch: Vec<(u64, &[u8])> = chunk.iter().map(|&k| (k, &data[..])).collect();
            ids.extend(s.write_batch(&batch).unwrap());
        }
        assert!(matches!(s.set_read_ahead_auto(READAHEAD + 1), Err(BackingError::ReadAhead { .. })));
        s.set_read_ahead_auto(MIN_READAHEAD).unwrap();
        assert_eq!(s.min_read_ahead(), MIN_READAHEAD, "it starts at the floor");
        // Scattered reads (a stride that never lands in a window), each a
        // read of the file.
        let scattered: Vec<usize> = (0..n as usize).map(|i| (i * 997) % n as usize).collect();
        let epoch = |s: &BackingStore| {
            let before = s.stats().read_ops;
            let b = bytes_read_by(s, &ids, &scattered[..COST_READS as usize + 64]);
            let ops = s.stats().read_ops - before;
            assert!(ops > COST_READS, "{ops} reads");
            b / ops
        };
        // A disk whose reads cost more than FAST_READ: the floor stays.
        f.delay_reads(Some(FAST_READ * 3 / 2));
        for _ in 0..2 {
            let per_read = epoch(&s);
            assert_eq!(s.min_read_ahead(), MIN_READAHEAD, "a slow disk keeps the floor");
            assert!(per_read >= MIN_READAHEAD as u64, "{per_read} bytes a read with the floor");
        }
        // The same reads at memory's speed: within a few epochs (a
        // loaded machine may stretch one), the floor is 0 and a read
        // reads its record's own blocks.
        f.delay_reads(None);
        let mut epochs = 0;
        while s.min_read_ahead() != 0 {
            epoch(&s);
            epochs += 1;
            assert!(epochs <= 20, "the floor stayed {} on a fast file", s.min_read_ahead());
        }
        let per_read = epoch(&s);
        assert!(per_read <= 2 * PAGE_SIZE as u64, "{per_read} bytes a read without the floor");
        // Slow again: back to the floor.
        f.delay_reads(Some(FAST_READ * 3 / 2));
        epoch(&s);
        epoch(&s);
        assert_eq!(s.min_read_ahead(), MIN_READAHEAD, "the floor comes back when reads are dear");
        // A floor that is set stops the choosing.
        s.set_min_read_ahead(0).unwrap();
        epoch(&s);
        epoch(&s);
        assert_eq!(s.min_read_ahead(), 0, "a set floor stays");
    }

    #[test]
    fn random_reads_keep_to_the_smallest_readahead() {
        use rand::{seq::SliceRandom, SeedableRng};
        // Records in eight segments, read in a random order: a miss often
        // lands a little past one of the windows, which used to count
        // as a run and kept the read-ahead near 64 KiB (78 KB read for
        // each page wanted, seen in `zmem bench swap`). Only a miss next to
        // a window that served most of what it read continues a run.
        let n = 8192;
        let (s, ids) = filled(n);
        let mut order: Vec<usize> = (0..n as usize).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
        let b = bytes_read_by(&s, &ids, &order);
        let ops = s.stats().scattered_reads;
        eprintln!("{n} random reads: {b} bytes, {ops} at the smallest read-ahead");
        // (With any miss within 64 KiB past a window counting as a run:
        // 15.1 KiB a record, half of the reads at the smallest read-ahead.
        // Now: 12.3 KiB, nine in ten.)
        assert!(b <= (n * 27) << 9, "{n} random reads of 1016-byte records read {b} bytes");
        assert!(ops >= n * 8 / 10, "only {ops} of {n} random reads kept to the smallest read-ahead");
        // And a run still grows it again.
        let seq: Vec<usize> = (0..n as usize).collect();
        let b = bytes_read_by(&s, &ids, &seq);
        assert!(b <= n * 1024 * 3 / 2, "sequential reads after random ones read {b} bytes for {}", n * 1024);
    }

    #[test]
    fn a_batch_lies_in_key_order_and_a_request_is_one_read() {
        let s = BackingStore::new(Box::new(crate::MemFile::new(true)), None);
        // The shrinker's order (coldest first) is not the keys' order.
        let keys: Vec<u64> = (0..64u64).map(|i| (i * 37) % 64 + 100).collect();
        let pages: Vec<Vec<u8>> = keys.iter().map(|&k| vec![k as u8; 900]).collect();
        let batch: Vec<(u64, &[u8])> = keys.iter().zip(&pages).map(|(&k, p)| (k, &p[..])).collect();
        let ids = s.write_batch(&batch).unwrap();
        let place = |id: RecordId| {
            let e = s.state.read().lookup(id).unwrap();
            e.seg as u64 * SEG + e.off as u64
        };
        let mut by_key: Vec<(u64, u64)> = keys.iter().zip(&ids).map(|(&k, &id)| (k, place(id))).collect();
        by_key.sort_unstable();
        assert!(by_key.windows(2).all(|w| w[0].1 < w[1].1), "records not in key order: {by_key:?}");
        // A request for keys 110..118 (8 pages, as the kernel's swap-in
        // read-ahead asks): one read, then every load is served from it.
        forget_windows(&s);
        s.windows.lock().ahead = 0;
        let want: Vec<usize> = (0..64).filter(|&i| (110..118).contains(&keys[i])).collect();
        let req: Vec<RecordId> = want.iter().map(|&i| ids[i]).collect();
        let ops0 = s.stats().read_ops;
        assert_eq!(s.prefetch(&req), 1);
        let mut out = Vec::new();
        for &i in &want {
            s.read(ids[i], keys[i], &mut out).unwrap();
            assert_eq!(out, pages[i], "key {}", keys[i]);
        }
        assert_eq!(s.stats().read_ops - ops0, 1, "8 neighbouring records took more than one read");
        assert_eq!(s.stats().prefetch_ops, 1);
        // Gone ids and a lone record are no reason to read.
        s.free(ids[want[0]]).unwrap();
        assert_eq!(s.prefetch(&[ids[want[0]], ids[want[1]]]), 0);
    }

    #[test]
    fn a_write_moves_its_segments_epoch_and_a_truncation_every_one() {
        let s = BackingStore::new(Box::new(crate::MemFile::new(true)), None);
        let (w0, w5) = (s.window_epoch(0), s.window_epoch(5));
        let id = s.write_batch(&[(1, &[1u8; 100][..])]).unwrap()[0];
        let w0b = s.window_epoch(0);
        assert_ne!(w0b, w0, "segment 0 was written");
        assert_eq!(s.window_epoch(5), w5, "segment 5 was not");
        s.write_batch(&[(2, &[2u8; 100][..])]).unwrap();
        assert_ne!(s.window_epoch(0), w0b);
        s.free(id).unwrap();
        let (w0, w5) = (s.window_epoch(0), s.window_epoch(5));
        s.trim(true);
        assert_ne!(s.window_epoch(0), w0);
        assert_ne!(s.window_epoch(5), w5);
    }

    #[test]
    fn reads_are_only_as_aligned_as_the_file_needs() {
        // A file that takes 512-byte aligned reads (as O_DIRECT on ext4
        // over 512-byte sectors does): a record read without read-ahead
        // costs its own sectors, not a 4 KiB block or two.
        let s = BackingStore::new(Box::new(crate::MemFile::new(false)), None);
        assert_eq!(s.read_align, 512);
        let data = vec![7u8; 1000];
        let batch: Vec<(u64, &[u8])> = (0..64u64).map(|k| (k, &data[..])).collect();
        let ids = s.write_batch(&batch).unwrap();
        for i in [3usize, 10, 41, 60] {
            let before = s.stats().bytes_read;
            forget_windows(&s);
            s.windows.lock().ahead = 0;
            let mut out = Vec::new();
            s.read(ids[i], i as u64, &mut out).unwrap();
            assert_eq!(out, data);
            let b = s.stats().bytes_read - before;
            assert!(b <= 1536, "record {i} ({} bytes with its header) cost {b} bytes of reads", 1000 + RECORD_HEADER_SIZE);
        }
    }

    #[test]
    fn an_id_is_its_place_and_its_segments_generation() {
        let last_seg = (MAX_SEGS - 1) as u32;
        let last_off = SEGMENT_SIZE as u32 - REC_ALIGN;
        let largest = Place::span_of(MAX_PAYLOAD);
        for (seg, off, span) in [(0, 0, 1), (1, 4096, 2), (last_seg, last_off, largest), (12345, 0xabcd0, Place::span_of(4096))] {
            for gen in [1, 2, u8::MAX] {
                let p = Place { seg, off, span };
                let id = record_id(p, gen);
                assert_ne!(id.to_raw(), 0);
                assert_eq!(id.to_raw() >> 28 & 0xf, 0, "{p:?}: 28 bits below the segment");
                assert_eq!(split_id(id), Some((p, gen)));
            }
        }
        assert_eq!((Place::span_of(0), Place::span_of(1), Place::span_of(16), Place::span_of(17)), (1, 2, 2, 3));
        assert_eq!(split_id(RecordId::from_raw(1 << 56 | 1 << 28 | 2)), None, "not an id this store issues");
    }

    /// A closed segment's live list gives back what its dead records held
    /// once 32 bytes of it are free: a live record costs 2 bytes and its
    /// list under 32 more, however many died beside it; the bytes counted
    /// are the lists' capacities.
    #[test]
    fn live_lists_shrink_as_records_die() {
        let mut st = State { segs: vec![Segment::new(SegState::Open)], ..State::default() };
        let places: Vec<Place> = (0..4000u32).map(|k| Place { seg: 0, off: k * 4 * REC_ALIGN, span: Place::span_of(40) }).collect();
        for &p in &places {
            st.add_record(p);
        }
        st.segs[0].used = 4000 * 4 * REC_ALIGN;
        st.close(0);
        assert_eq!(st.live_list_bytes, 2 * 4000);
        for &p in places.iter().filter(|p| p.off % (40 * REC_ALIGN) != 0) {
            assert!(!st.remove_record(p));
            assert_eq!(st.live_list_bytes, 2 * st.segs[0].live.capacity() as u64);
            let (len, cap) = (st.segs[0].live.len(), st.segs[0].live.capacity());
            assert!(cap < len + SHRINK_SLACK, "room for {cap} offsets, {len} live");
        }
        assert_eq!(st.segs[0].live.len(), 400);
        assert!(st.live_list_bytes < 2 * (400 + SHRINK_SLACK as u64), "{} bytes for 400 live records", st.live_list_bytes);
        for &p in places.iter().filter(|p| p.off % (40 * REC_ALIGN) == 0) {
            assert_eq!(st.lookup(record_id(p, 1)).unwrap(), p);
        }
    }

    #[test]
    fn reads_count_what_they_wanted_apart_from_compaction() {
        // Records read in order: the read-ahead serves most of them, so the
        // bytes read come near the records' own bytes; compaction's reads
        // are counted apart and serve no load.
        // Four segments of records, so that compaction has closed ones.
        let (s, ids) = filled(4096);
        let rec = (1000 + RECORD_HEADER_SIZE) as u64;
        let mut out = Vec::new();
        for (k, &id) in ids.iter().enumerate() {
            s.read(id, k as u64, &mut out).unwrap();
        }
        let st = s.stats();
        assert_eq!(st.record_bytes_read, 4096 * rec);
        assert_eq!(st.compaction_bytes_read, 0);
        assert!(st.bytes_read >= st.record_bytes_read && st.bytes_read < st.record_bytes_read * 3 / 2, "{st:?}");
        // (A third left: each segment under half live.)
        for (_, &id) in ids.iter().enumerate().filter(|(k, _)| k % 3 != 0) {
            s.free(id).unwrap();
        }
        s.compact().unwrap();
        let after = s.stats();
        assert!(after.compaction_bytes_read > 0, "{after:?}");
        assert_eq!(after.bytes_read - st.bytes_read, after.compaction_bytes_read);
        assert_eq!(after.record_bytes_read, st.record_bytes_read);
    }

    #[test]
    fn appends_elsewhere_do_not_end_a_window() {
        // Four segments of records, then read segment 0 in order while
        // every read is followed by an append (the shrinker at work).
        let (s, ids) = filled(4096);
        let data = [9u8; 1000];
        let before = s.stats().bytes_read;
        let mut out = Vec::new();
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for (i, id) in ids.iter().enumerate().take(512) {
                    s.read(*id, i as u64, &mut out).unwrap();
                    assert_eq!(out, vec![7u8; 1000]);
                    s.write_batch(&[(100_000 + i as u64, &data[..])]).unwrap();
                }
            });
        });
        let b = s.stats().bytes_read - before;
        assert!(b <= 1024 * 512 * 3 / 2, "512 records read in order with appends between cost {b} bytes of reads");
    }
}
