//! The arena: one file that holds a pool's span memory and handle tables,
//! so that they outlive the process that wrote them.
//!
//! A swap device must survive its server (a crash, an upgrade): the pages
//! it holds cannot live in the server's heap. The arena is a file made
//! with `memfd_create` (RAM, no path, freed when its last holder closes
//! it); whoever holds it (a keeper process, a new server) can map it again
//! and [`crate::ZsPool::open`] rebuilds the allocator from it. What the
//! allocator must find again lives here; everything that can be derived
//! (span descriptors, back-pointers, free lists, fullness groups, counts)
//! stays in the heap and is rebuilt.
//!
//! Layout (offsets in the file; the file is [`ARENA_BYTES`] long and
//! sparse: only pages written cost memory):
//!
//! ```text
//!  0       header: magic, version, page size, span pages, classes, check
//!  48      directory length (entries committed)
//!  512     directory: 16-byte entries, one per region, in the order made
//!  1 MiB   regions, bump-allocated: span chunks and handle-table segments
//! ```
//!
//! A directory entry names a region: its kind (a chunk of a class's spans,
//! or a segment of a class's handle table), its class, its number within
//! that class (the n-th chunk, the n-th segment), and its place. An entry
//! is written whole, then counted (a release store of the length), so a
//! process killed between the two leaves an entry nobody reads and a
//! region nobody uses. Regions are never given back to the file's
//! directory: a chunk's freed pages are holes punched in the file, and
//! cost nothing.
//!
//! One process at a time writes an arena: the one holding its lock, an
//! exclusive `flock` on an open file description of its own (opened again
//! through `/proc/self/fd`, so a keeper holding the same file does not hold
//! the lock). The kernel drops the lock when that process dies.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::{FallocateFlags, FlockOperation, MemfdFlags, Mode, OFlags};

use crate::mem::Region;
use crate::{NUM_CLASSES, PAGE_SIZE};

/// Size of the arena file (sparse: a limit on addresses, not memory).
pub const ARENA_BYTES: u64 = 1 << 40;
/// The header and directory.
const HEADER_BYTES: usize = 1 << 20;
/// The format this build writes and reads.
pub const ARENA_VERSION: u64 = 2;
const MAGIC: u64 = u64::from_le_bytes(*b"zmemarn\0");

// Header words.
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_PAGE: usize = 2;
const W_SPAN_PAGES: usize = 3;
const W_CLASSES: usize = 4;
const W_CHECK: usize = 5;
const W_DIR_LEN: usize = 6;
const DIR_WORD: usize = 64;
/// Directory entries the header has room for (two words each).
const DIR_CAP: usize = (HEADER_BYTES / 8 - DIR_WORD) / 2;

/// Why an arena cannot be opened. Nothing is changed by a refusal.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("cannot use the arena file: {0}")]
    Io(#[from] io::Error),
    #[error("another process holds this arena (its server is still running): stop that one first")]
    Busy,
    #[error("not a zmem arena (its header does not carry zmem's mark): refusing to read it")]
    Foreign,
    #[error("the arena is format version {found}, this zmem reads version {expected}: run the zmem that wrote it")]
    Version { found: u64, expected: u64 },
    #[error("the arena's header checksum is wrong: its state cannot be trusted, nothing was read")]
    Checksum,
    #[error("the arena is corrupt ({0}): its state cannot be trusted, nothing was read")]
    Corrupt(String),
}

/// What a region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Spans of one class.
    Chunk = 1,
    /// A segment of one class's handle table.
    Handles = 2,
    /// The owner's table ([`crate::SharedTable`]).
    Table = 3,
    /// The first entries of every class's handle table (`handles.rs`).
    Nursery = 4,
}

/// A region as the directory names it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirEntry {
    pub kind: Kind,
    pub class: usize,
    /// The n-th region of this kind in this class.
    pub index: u32,
    pub at: u64,
    pub len: usize,
}

/// The arena file, and this process's lock on it.
pub(crate) struct ArenaFile {
    fd: OwnedFd,
    /// Our own open of the file, holding the `flock` (none for a new
    /// arena where `/proc` cannot be read: nobody else holds it yet).
    _lock: Option<OwnedFd>,
}

impl ArenaFile {
    fn locked(fd: OwnedFd) -> Result<ArenaFile, ArenaError> {
        let again = rustix::fs::open(format!("/proc/self/fd/{}", fd.as_raw_fd()), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(io::Error::from)?;
        match rustix::fs::flock(&again, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(ArenaFile { fd, _lock: Some(again) }),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(ArenaError::Busy),
            Err(e) => Err(ArenaError::Io(e.into())),
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Free the file's pages in `[at, at+len)` (they read back as zeros).
    pub(crate) fn punch(&self, at: u64, len: u64) {
        let _ = rustix::fs::fallocate(&self.fd, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, at, len);
    }

    /// The ranges of `[at, at+len)` that hold data, relative to `at`, in
    /// whole pages. (On an error, the whole range: reading it is slower,
    /// never wrong.)
    pub(crate) fn data_ranges(&self, at: u64, len: u64) -> Vec<std::ops::Range<u64>> {
        data_ranges(self.fd.as_fd(), at, len)
    }
}

/// The ranges of `[at, at+len)` of file `fd` that hold data, in whole
/// pages, relative to `at` (`lseek(SEEK_DATA/SEEK_HOLE)`; the whole range
/// if the file cannot say).
pub(crate) fn data_ranges(fd: BorrowedFd<'_>, at: u64, len: u64) -> Vec<std::ops::Range<u64>> {
    data_ranges_said(fd, at, len).unwrap_or_else(|_| std::iter::once(0..len).collect())
}

/// [`data_ranges`], or the error of a file that cannot say.
pub(crate) fn data_ranges_said(fd: BorrowedFd<'_>, at: u64, len: u64) -> std::io::Result<Vec<std::ops::Range<u64>>> {
    use rustix::fs::SeekFrom;
    let end = at + len;
    let mut out = Vec::new();
    let mut pos = at;
    while pos < end {
        let data = match rustix::fs::seek(fd, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if data >= end {
            break;
        }
        let hole = rustix::fs::seek(fd, SeekFrom::Hole(data)).unwrap_or(end).min(end);
        let (a, b) = (data / PAGE_SIZE as u64 * PAGE_SIZE as u64, hole.next_multiple_of(PAGE_SIZE as u64).min(end));
        out.push(a - at..b - at);
        pos = b.max(pos + 1);
    }
    Ok(out)
}

/// An arena: its file, its header, and where the next region goes.
pub(crate) struct Arena {
    file: Arc<ArenaFile>,
    header: Region,
    dir: Mutex<Bump>,
    /// The handle tables' nursery, once made or found.
    nursery: Mutex<Option<Arc<Region>>>,
}

struct Bump {
    /// Entries in the directory.
    len: usize,
    /// Offset of the next region.
    next: u64,
}

/// A word mixer (splitmix64's finaliser) for the header's and entries' checks.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn header_check(w: &[u64]) -> u64 {
    w.iter().fold(0x5a5a_5a5a_5a5a_5a5a, |acc, &x| mix(acc ^ x))
}

/// An entry's two words: `[kind:8][class:8][check:16][index:32]` and
/// `[at in pages:32][len in pages:32]`.
fn encode(kind: Kind, class: usize, index: u32, at: u64, len: usize) -> (u64, u64) {
    let w1 = ((at / PAGE_SIZE as u64) << 32) | (len / PAGE_SIZE) as u64;
    let w0 = ((kind as u64) << 56) | ((class as u64) << 48) | u64::from(index);
    (w0 | (entry_check(w0, w1) << 32), w1)
}

fn entry_check(w0_without_check: u64, w1: u64) -> u64 {
    mix(w0_without_check ^ mix(w1)) & 0xffff
}

fn decode(i: usize, w0: u64, w1: u64, file_len: u64) -> Result<DirEntry, ArenaError> {
    let bad = |what: &str| ArenaError::Corrupt(format!("directory entry {i}: {what}"));
    let plain = w0 & !(0xffff << 32);
    if (w0 >> 32) & 0xffff != entry_check(plain, w1) {
        return Err(bad("checksum"));
    }
    let kind = match w0 >> 56 {
        1 => Kind::Chunk,
        2 => Kind::Handles,
        3 => Kind::Table,
        4 => Kind::Nursery,
        k => return Err(bad(&format!("unknown kind {k}"))),
    };
    let class = ((w0 >> 48) & 0xff) as usize;
    let (at, len) = ((w1 >> 32) * PAGE_SIZE as u64, (w1 & 0xffff_ffff) as usize * PAGE_SIZE);
    if class >= NUM_CLASSES || len == 0 || at < HEADER_BYTES as u64 || at + len as u64 > file_len {
        return Err(bad("out of range"));
    }
    Ok(DirEntry { kind, class, index: w0 as u32, at, len })
}

impl Arena {
    /// A new, empty arena in a new memfd, locked by this process.
    pub(crate) fn create(span_pages: usize) -> io::Result<Arena> {
        let fd = rustix::fs::memfd_create("zmem-arena", MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, ARENA_BYTES)?;
        // (The lock keeps a second process out of an arena handed over;
        // a pool that cannot take it, with no `/proc`, still works.)
        let file = Arc::new(match ArenaFile::locked(fd.try_clone()?) {
            Ok(f) => f,
            Err(_) => ArenaFile { fd, _lock: None },
        });
        let header = Region::map(&file, 0, HEADER_BYTES)?;
        let w = header.words();
        let fields = [MAGIC, ARENA_VERSION, PAGE_SIZE as u64, span_pages as u64, NUM_CLASSES as u64];
        for (i, &v) in fields.iter().enumerate() {
            w[i].store(v, Relaxed);
        }
        w[W_CHECK].store(header_check(&fields), Release);
        Ok(Arena { file, header, dir: Mutex::new(Bump { len: 0, next: HEADER_BYTES as u64 }), nursery: Mutex::new(None) })
    }

    /// Open the arena in `fd`: lock it, check its header, and read its
    /// directory. Returns the arena, its span pages, and its regions in
    /// the order they were made.
    pub(crate) fn open(fd: OwnedFd) -> Result<(Arena, usize, Vec<DirEntry>), ArenaError> {
        let mode = rustix::fs::fcntl_getfl(&fd).map_err(io::Error::from)? & OFlags::RWMODE;
        if mode != OFlags::RDWR {
            return Err(ArenaError::Io(io::Error::new(io::ErrorKind::PermissionDenied, "the arena file must be open for reading and writing")));
        }
        let file_len = rustix::fs::fstat(&fd).map_err(io::Error::from)?.st_size as u64;
        if file_len < HEADER_BYTES as u64 {
            return Err(ArenaError::Foreign);
        }
        let file = Arc::new(ArenaFile::locked(fd)?);
        let header = Region::map(&file, 0, HEADER_BYTES)?;
        let w = header.words();
        let fields: Vec<u64> = (0..W_CHECK).map(|i| w[i].load(Acquire)).collect();
        if fields[W_MAGIC] != MAGIC {
            return Err(ArenaError::Foreign);
        }
        if fields[W_VERSION] != ARENA_VERSION {
            return Err(ArenaError::Version { found: fields[W_VERSION], expected: ARENA_VERSION });
        }
        if w[W_CHECK].load(Relaxed) != header_check(&fields) {
            return Err(ArenaError::Checksum);
        }
        let span_pages = fields[W_SPAN_PAGES] as usize;
        if fields[W_PAGE] != PAGE_SIZE as u64 || fields[W_CLASSES] != NUM_CLASSES as u64 || !(1..=crate::MAX_SPAN_PAGES).contains(&span_pages) {
            return Err(ArenaError::Corrupt(format!("geometry: page {}, classes {}, span pages {span_pages}", fields[W_PAGE], fields[W_CLASSES])));
        }
        let len = w[W_DIR_LEN].load(Acquire) as usize;
        if len > DIR_CAP {
            return Err(ArenaError::Corrupt(format!("directory length {len}")));
        }
        let mut entries = Vec::with_capacity(len);
        let mut next = HEADER_BYTES as u64;
        for i in 0..len {
            let e = decode(i, w[DIR_WORD + 2 * i].load(Relaxed), w[DIR_WORD + 2 * i + 1].load(Relaxed), file_len)?;
            if e.at < next {
                return Err(ArenaError::Corrupt(format!("directory entry {i} overlaps the one before")));
            }
            next = e.at + e.len as u64;
            entries.push(e);
        }
        let arena = Arena { file, header, dir: Mutex::new(Bump { len, next }), nursery: Mutex::new(None) };
        let mut nurseries = entries.iter().filter(|e| e.kind == Kind::Nursery);
        if let Some(e) = nurseries.next() {
            if e.len != crate::handles::NURSERY_BYTES || nurseries.next().is_some() {
                return Err(ArenaError::Corrupt("the handle tables' nursery".into()));
            }
            *arena.nursery.lock() = Some(Arc::new(arena.map(e)?));
        }
        Ok((arena, span_pages, entries))
    }

    /// Make a region of `len` bytes (whole pages) for `kind` in `class`,
    /// the `index`-th of its kind there, and record it in the directory.
    pub(crate) fn add(&self, kind: Kind, class: usize, index: u32, len: usize) -> io::Result<Region> {
        let mut dir = self.dir.lock();
        if dir.len >= DIR_CAP || dir.next + len as u64 > ARENA_BYTES {
            return Err(io::Error::other("the arena is full"));
        }
        let region = Region::map(&self.file, dir.next, len)?;
        let (w0, w1) = encode(kind, class, index, dir.next, len);
        let w = self.header.words();
        w[DIR_WORD + 2 * dir.len].store(w0, Relaxed);
        w[DIR_WORD + 2 * dir.len + 1].store(w1, Relaxed);
        dir.len += 1;
        w[W_DIR_LEN].store(dir.len as u64, Release);
        dir.next += len as u64;
        Ok(region)
    }

    /// The handle tables' nursery (made the first time it is asked for).
    pub(crate) fn nursery(&self) -> io::Result<Arc<Region>> {
        let mut n = self.nursery.lock();
        if let Some(r) = &*n {
            return Ok(Arc::clone(r));
        }
        let r = Arc::new(self.add(Kind::Nursery, 0, 0, crate::handles::NURSERY_BYTES)?);
        *n = Some(Arc::clone(&r));
        Ok(r)
    }

    /// The nursery, if one was made or found.
    pub(crate) fn found_nursery(&self) -> Option<Arc<Region>> {
        self.nursery.lock().clone()
    }

    /// Map a region the directory names (when opening).
    pub(crate) fn map(&self, e: &DirEntry) -> io::Result<Region> {
        Region::map(&self.file, e.at, e.len)
    }

    /// The arena file, to hand to a process that keeps it.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd.as_fd()
    }
}
