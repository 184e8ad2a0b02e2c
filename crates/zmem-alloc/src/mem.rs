//! The only module with `unsafe`: shared mappings of the arena's regions.
//!
//! A [`Region`] owns one `mmap(MAP_SHARED)` of a page-aligned range of the
//! pool's arena file ([`crate::arena`]) and hands out ordinary Rust slices
//! into it: bytes for span memory, atomic words for the handle tables and
//! the arena's header. Aliasing is enforced by the borrow checker: shared
//! slices come from `&self`, mutable slices and page release need
//! `&mut self`. The rest of the crate is safe code that only deals in
//! offsets.
//!
//! The mapping is shared with the file, not with another process's Rust
//! objects: one process at a time writes an arena (the one holding its
//! lock, [`crate::arena::ArenaFile`]), and a process that maps it after
//! another died sees the bytes that one wrote, nothing moving under it.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::arena::ArenaFile;
use crate::PAGE_SIZE;

/// One shared mapping of `len` bytes of the arena file at offset `at`.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    at: u64,
    /// Kept open while the mapping lives (a mapping holds its file
    /// anyway; this is for `fallocate`).
    file: Arc<ArenaFile>,
}

// SAFETY: a Region exclusively owns its mapping within this process (no
// other pointer to it exists outside the slices it lends out, whose
// lifetimes are tied to the Region), so moving it to another thread is as
// safe as moving a Vec<u8>.
unsafe impl Send for Region {}
// SAFETY: through `&Region` only shared `&[u8]` views, atomic words and
// `mincore` are available; every plain mutation (writes, page release)
// requires `&mut Region`. That is exactly the contract of `Sync` for a byte
// buffer.
unsafe impl Sync for Region {}

impl Region {
    /// Map `len` bytes (whole pages) of `file` at offset `at` (page
    /// aligned), shared: what is written here is the file's.
    pub(crate) fn map(file: &Arc<ArenaFile>, at: u64, len: usize) -> io::Result<Region> {
        assert!(len > 0 && len.is_multiple_of(PAGE_SIZE) && at.is_multiple_of(PAGE_SIZE as u64), "regions are whole pages");
        let off = libc::off_t::try_from(at).map_err(|_| io::Error::other("arena offset out of range"))?;
        // SAFETY: a fresh shared mapping of our own file at a kernel-chosen
        // address (no MAP_FIXED) cannot alias any existing Rust object; the
        // result is checked against MAP_FAILED before use.
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_NORESERVE, file.raw_fd(), off) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Transparent huge pages would make one live 4 KiB span pin 2 MiB of
        // RSS and defeat per-span release; opt out (best effort, ignore errors).
        // SAFETY: [p, p+len) is the mapping we just created and own.
        unsafe {
            libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Region { ptr, len, at, file: Arc::clone(file) })
    }

    /// The region's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Shared view of `len` bytes at `off`. Panics if out of bounds.
    #[inline]
    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        let end = off.checked_add(len).expect("region range overflow");
        assert!(end <= self.len, "region range out of bounds");
        // SAFETY: [off, off+len) is inside our live mapping (checked above),
        // which is readable and always initialised (zero-filled by the kernel
        // or written by us or a previous owner of the arena). The slice
        // borrows `self`, so the mapping outlives it, and no `&mut` view can
        // coexist because writers need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Exclusive view of `len` bytes at `off`. Panics if out of bounds.
    #[inline]
    pub(crate) fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let end = off.checked_add(len).expect("region range overflow");
        assert!(end <= self.len, "region range out of bounds");
        // SAFETY: in bounds of our writable mapping (checked above); `&mut self`
        // guarantees no other view of the region exists for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }

    /// The whole region as 64-bit words, for regions used only this way
    /// (handle tables, the arena's header: never [`Region::bytes`]).
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned (so 8-byte aligned) and `len`
        // is whole pages, so it holds exactly len / 8 properly aligned u64s;
        // AtomicU64 has u64's size and alignment, any bit pattern is a valid
        // value, and atomics may be shared (`&`) and written through. The
        // slice borrows `self`, so the mapping outlives it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }

    /// The whole region as 16-byte words, each loaded and stored whole,
    /// for regions used only this way (the owner's table: never
    /// [`Region::bytes`] or [`Region::words`]).
    #[inline]
    pub(crate) fn pairs(&self) -> &[portable_atomic::AtomicU128] {
        const _: () = assert!(std::mem::align_of::<portable_atomic::AtomicU128>() <= PAGE_SIZE);
        // SAFETY: the mapping is page aligned (so 16-byte aligned) and `len`
        // is whole pages, so it holds exactly len / 16 properly aligned
        // u128s; AtomicU128 has u128's size and alignment (at most a page,
        // checked above at compile time), any bit pattern is a valid value,
        // and atomics may be shared (`&`) and written through. The slice
        // borrows `self`, so the mapping outlives it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<portable_atomic::AtomicU128>(), self.len / 16) }
    }

    /// Punch `[off, off+len)` (whole pages) of a region used only through
    /// atomics ([`Region::words`], [`Region::pairs`]): its entries read
    /// back as zero, as if stored so, and cost no memory.
    pub(crate) fn clear_atomics(&self, off: usize, len: usize) {
        let end = off.checked_add(len).expect("region range overflow");
        assert!(end <= self.len && off.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE));
        if len > 0 {
            self.file.punch(self.at + off as u64, len as u64);
        }
    }

    /// Pages of the region that hold data (not holes), as page ranges
    /// (`lseek(SEEK_DATA/SEEK_HOLE)` on the file: reading a hole through
    /// the mapping would fill it).
    pub(crate) fn data_pages(&self) -> Vec<std::ops::Range<usize>> {
        self.file
            .data_ranges(self.at, self.len as u64)
            .into_iter()
            .map(|r| (r.start / PAGE_SIZE as u64) as usize..(r.end / PAGE_SIZE as u64) as usize)
            .collect()
    }

    /// Give the pages of `[off, off+len)` back: a hole punched in the file
    /// (`fallocate(PUNCH_HOLE)`), which frees them in every process that
    /// maps them, locked (`mlockall`) or not. The range reads back as
    /// zeros. Best effort: an error only means the pages stay resident.
    pub(crate) fn discard(&mut self, off: usize, len: usize) {
        let end = off.checked_add(len).expect("region range overflow");
        assert!(end <= self.len && off.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE));
        // (`&mut self`: no Rust slice into the range is alive, so its bytes
        // turning to zeros cannot be observed through a reference.)
        if len > 0 {
            self.file.punch(self.at + off as u64, len as u64);
        }
    }

    /// How many pages of `[off, off+len)` are resident in RAM (mincore(2)).
    pub(crate) fn resident_pages(&self, off: usize, len: usize) -> usize {
        let end = off.checked_add(len).expect("region range overflow");
        assert!(end <= self.len && off.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE));
        let mut vec = vec![0u8; len.div_ceil(PAGE_SIZE)];
        // SAFETY: page-aligned range inside our mapping; `vec` has one byte per
        // page of the range, as mincore requires, and outlives the call.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().add(off).cast(), len, vec.as_mut_ptr().cast()) };
        if rc != 0 {
            return 0;
        }
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and are being dropped, so no slice into
        // it can still be alive (they all borrow `self`). The file's pages
        // stay: they are the file's, freed when its last holder closes it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// An arena's data held in RAM by a process that does not use it: one
/// read-only shared mapping of the whole file, locked on fault
/// (`mlock2(MLOCK_ONFAULT)`: nothing is faulted in by the lock itself),
/// and each range of it that holds data faulted in (`MADV_POPULATE_READ`;
/// holes are not touched, which would fill them), which locks it. The swap
/// keeper holds one and refreshes it ([`ArenaLock::refresh`]), so that the
/// pages no live server maps (a server under `mlockall(MCL_ONFAULT)`
/// locks only what it touches, and a dead one nothing) cannot be
/// reclaimed onto the swap device they make up. Pages freed later (a hole
/// punched) go all the same. A hole punched between the listing of the
/// ranges and their fault is filled again with a zeroed page: free space
/// to the pool, which it reuses. Dropped: unmapped, and with that
/// unlocked.
pub struct ArenaLock {
    ptr: NonNull<u8>,
    len: usize,
    locked: u64,
}

// SAFETY: the mapping is only ever unmapped (on drop); no reference into
// it is handed out, so the pointer may move between and be shared by
// threads.
unsafe impl Send for ArenaLock {}
// SAFETY: as for Send: `&ArenaLock` gives access to nothing but a count.
unsafe impl Sync for ArenaLock {}

/// `mlock2`'s flag (not in the libc crate for glibc targets).
const MLOCK_ONFAULT: libc::c_uint = 1;

impl ArenaLock {
    /// Map arena file `fd` and lock what it holds now.
    pub fn take(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<ArenaLock> {
        let size = rustix::fs::fstat(fd)?.st_size as u64;
        let len = usize::try_from(size).map_err(|_| io::Error::other("arena too large to map"))?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "an empty file is not an arena"));
        }
        // SAFETY: a fresh read-only shared mapping at a kernel-chosen address
        // (no MAP_FIXED) cannot alias any Rust object; it is checked against
        // MAP_FAILED, never read or written through, only locked, populated
        // and unmapped.
        let p =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_NORESERVE, std::os::fd::AsRawFd::as_raw_fd(&fd), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let mut lock = ArenaLock { ptr, len, locked: 0 };
        // SAFETY: the whole of our own mapping; with MLOCK_ONFAULT the call
        // only marks it (one area, never split), faulting nothing in.
        if unsafe { libc::mlock2(lock.ptr.as_ptr().cast(), len, MLOCK_ONFAULT) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lock.refresh(fd)?;
        Ok(lock)
    }

    /// Lock what arena file `fd` (the file taken) holds now: the ranges
    /// filled since the last call too. Returns the bytes locked. A page
    /// that was swapped out comes back in first, so call it where a wait
    /// on the swap device harms nothing.
    pub fn refresh(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
        let mut locked = 0;
        for r in crate::arena::data_ranges_said(fd, 0, self.len as u64)? {
            // SAFETY: `r` lies within the mapping (data_ranges clips to its
            // length) and is page aligned; MADV_POPULATE_READ only faults
            // the range in (read-only), which the mapping's lock pins.
            let rc = unsafe { libc::madvise(self.ptr.as_ptr().add(r.start as usize).cast(), (r.end - r.start) as usize, libc::MADV_POPULATE_READ) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            locked += r.end - r.start;
        }
        self.locked = locked;
        Ok(locked)
    }

    /// Bytes locked.
    pub fn locked_bytes(&self) -> u64 {
        self.locked
    }
}

impl Drop for ArenaLock {
    fn drop(&mut self) {
        // SAFETY: our own mapping, never lent out; unmapping it unlocks it
        // and leaves the file's pages to their other holders.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
