//! malloc's tuning for a process under `mlockall`, and malloc's own view
//! of its memory: `unsafe`, as `pageout.rs` and `inherit.rs` are (libc has no safe wrappers
//! for `mallopt` and `mallinfo2`).

#![allow(unsafe_code)]

/// Make glibc's malloc give freed memory back in a process under
/// `mlockall`. There, `madvise(MADV_DONTNEED)` fails on every locked page,
/// so memory freed inside malloc's arenas stays resident for good: the
/// swap server held 176 MiB of anonymous memory for a pool of 112 MiB
/// (`zmem bench swap`), because tables that grow by doubling leave their
/// old buffers in the arenas. With a fixed 64 KiB mmap threshold every
/// large buffer is a mapping of its own, unmapped when freed (which works
/// on locked memory); two arenas instead of one per thread keep fewer free
/// lists apart. Returns whether glibc took all three settings.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn for_mlock() -> bool {
    [(libc::M_MMAP_THRESHOLD, 64 << 10), (libc::M_TRIM_THRESHOLD, 128 << 10), (libc::M_ARENA_MAX, 2)]
        .into_iter()
        // SAFETY: mallopt only sets malloc's tuning parameters (it takes
        // malloc's own lock); the values are in the documented ranges.
        .all(|(param, value)| unsafe { libc::mallopt(param, value) } == 1)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn for_mlock() -> bool {
    false
}

/// What malloc holds in its arenas: `(in use, free)` bytes (glibc's
/// `mallinfo2`, summed over its arenas; its own mappings of large
/// buffers are not in either).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn arenas() -> Option<(u64, u64)> {
    // SAFETY: mallinfo2 takes no arguments and returns a plain struct by
    // value; it only reads malloc's state under malloc's own locks.
    let m = unsafe { libc::mallinfo2() };
    Some((m.uordblks as u64, m.fordblks as u64))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn arenas() -> Option<(u64, u64)> {
    None
}
