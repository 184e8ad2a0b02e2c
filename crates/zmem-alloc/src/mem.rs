//! The only module with `unsafe`: anonymous-mmap chunks of span memory.
//!
//! A [`Chunk`] owns one `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` region and hands
//! out ordinary Rust slices into it. Aliasing is enforced by the borrow
//! checker: shared slices come from `&self`, mutable slices and page release
//! (`madvise(MADV_DONTNEED)`) need `&mut self`. The rest of the crate is safe
//! code that only deals in offsets.

use std::io;
use std::ptr::NonNull;

use crate::PAGE_SIZE;

/// One anonymous mapping holding several spans of one size class.
pub(crate) struct Chunk {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Chunk exclusively owns its mapping (no other pointer to it exists
// outside the slices it lends out, whose lifetimes are tied to the Chunk), so
// moving it to another thread is as safe as moving a Vec<u8>.
unsafe impl Send for Chunk {}
// SAFETY: through `&Chunk` only shared `&[u8]` views and `mincore` are
// available; every mutation (writes, MADV_DONTNEED) requires `&mut Chunk`.
// That is exactly the contract of `Sync` for a byte buffer.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Map `len` bytes (a multiple of [`PAGE_SIZE`]) of zero-filled,
    /// lazily-backed anonymous memory.
    pub(crate) fn map(len: usize) -> io::Result<Chunk> {
        assert!(len > 0 && len.is_multiple_of(PAGE_SIZE), "chunk length must be whole pages");
        // SAFETY: a fresh private anonymous mapping at a kernel-chosen address
        // (no fd, offset 0) cannot alias any existing Rust object; the result
        // is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
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
        Ok(Chunk { ptr, len })
    }

    /// Shared view of `len` bytes at `off`. Panics if out of bounds.
    #[inline]
    pub(crate) fn bytes(&self, off: usize, len: usize) -> &[u8] {
        let end = off.checked_add(len).expect("chunk range overflow");
        assert!(end <= self.len, "chunk range out of bounds");
        // SAFETY: [off, off+len) is inside our live mapping (checked above),
        // which is readable and always initialised (zero-filled by the kernel
        // or written by us). The slice borrows `self`, so the mapping outlives
        // it, and no `&mut` view can coexist because writers need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Exclusive view of `len` bytes at `off`. Panics if out of bounds.
    #[inline]
    pub(crate) fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let end = off.checked_add(len).expect("chunk range overflow");
        assert!(end <= self.len, "chunk range out of bounds");
        // SAFETY: in bounds of our writable mapping (checked above); `&mut self`
        // guarantees no other view of the chunk exists for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }

    /// Give the pages of `[off, off+len)` back to the OS (MADV_DONTNEED).
    /// The range stays mapped and reads back as zeros. Best effort: an error
    /// only means the pages stay resident.
    ///
    /// A process that locked its memory (`mlockall`, as a swap server must,
    /// so that the pool is never swapped into itself) cannot `MADV_DONTNEED`
    /// locked pages: the kernel says EINVAL and they would stay resident for
    /// good. Then the range is unlocked, dropped, and locked again on fault
    /// (`mlock2(MLOCK_ONFAULT)`, which populates nothing): the pages leave,
    /// and whatever is written there later is locked again.
    pub(crate) fn discard(&mut self, off: usize, len: usize) {
        let end = off.checked_add(len).expect("chunk range overflow");
        assert!(end <= self.len && off.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE));
        // SAFETY: page-aligned range inside our own mapping; `&mut self` means
        // no Rust slice into it is alive, so zeroing its contents behind our
        // back cannot be observed through a reference.
        let p = unsafe { self.ptr.as_ptr().add(off) }.cast::<libc::c_void>();
        // SAFETY: as above; madvise only changes the range's pages.
        let rc = unsafe { libc::madvise(p, len, libc::MADV_DONTNEED) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // SAFETY: the same range of our own mapping; munlock and mlock2
            // change only whether its pages are locked, madvise drops their
            // contents, which no live reference can observe (`&mut self`).
            unsafe {
                libc::munlock(p, len);
                libc::madvise(p, len, libc::MADV_DONTNEED);
                libc::mlock2(p, len, libc::MLOCK_ONFAULT);
            }
        }
    }

    /// How many pages of `[off, off+len)` are resident in RAM (mincore(2)).
    pub(crate) fn resident_pages(&self, off: usize, len: usize) -> usize {
        let end = off.checked_add(len).expect("chunk range overflow");
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

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and are being dropped, so no slice into
        // it can still be alive (they all borrow `self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
