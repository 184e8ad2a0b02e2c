//! malloc's tuning for a process under `mlockall`: the crate's only
//! `unsafe` (libc has no safe wrapper for `mallopt`).

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
