//! Process-wide settings: the umask for a socket, malloc's tuning under
//! `mlockall`, and the stop flag that SIGINT and SIGTERM set.
//!
//! `mallopt` is the binary's only `unsafe` (libc has no safe wrapper for
//! it); everything else in the `zmem` binary is safe Rust.

#![allow(unsafe_code)]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// Effective user id.
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Run `f` with the process umask set to `mask`, then restore it. Used to
/// create a socket with its final permissions, with no window where it is
/// more open.
pub fn with_umask<R>(mask: u32, f: impl FnOnce() -> R) -> R {
    use rustix::fs::Mode;
    let old = rustix::process::umask(Mode::from_raw_mode(mask as rustix::fs::RawMode));
    let r = f();
    rustix::process::umask(old);
    r
}

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
pub fn malloc_for_mlock() -> bool {
    [(libc::M_MMAP_THRESHOLD, 64 << 10), (libc::M_TRIM_THRESHOLD, 128 << 10), (libc::M_ARENA_MAX, 2)]
        .into_iter()
        // SAFETY: mallopt only sets malloc's tuning parameters (it takes
        // malloc's own lock); the values are in the documented ranges.
        .all(|(param, value)| unsafe { libc::mallopt(param, value) } == 1)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn malloc_for_mlock() -> bool {
    false
}

static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

fn stop_arc() -> &'static Arc<AtomicBool> {
    STOP.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Make SIGINT and SIGTERM set the returned flag instead of killing the
/// process (signal-hook: its handler only stores to the atomic).
pub fn stop_on_signals() -> std::io::Result<&'static Arc<AtomicBool>> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(stop_arc()))?;
    }
    Ok(stop_arc())
}

/// The flag [`stop_on_signals`] sets (also settable by the program itself).
pub fn stop_flag() -> &'static AtomicBool {
    stop_arc()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn umask_now() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }

    #[test]
    fn umask_is_set_inside_and_restored_after() {
        let before = umask_now();
        let inside = with_umask(0o077, umask_now);
        assert_eq!(inside, 0o077);
        assert_eq!(umask_now(), before);
    }

    #[test]
    fn euid_matches_proc() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let euid: u32 = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)).unwrap().parse().unwrap();
        assert_eq!(geteuid(), euid);
    }
}
