//! Taking turns at the machine's shared kernel state, across test binaries.
//!
//! Most root tests make their own kernel objects: a loop device the kernel
//! numbers for them, a mount under their own directory, a cgroup of their
//! own name. A few change what the whole machine has only one of:
//!
//! * the active swap areas (the kernel spreads swap-outs over every area of
//!   the highest priority, so another test's area would take part of a
//!   workload's pages, and its `swapoff` would have to swap them back in);
//! * `/dev/zram0` and zswap's parameters;
//! * FUSE's io_uring switch (`/sys/module/fuse/parameters/enable_uring`);
//! * the root blkio cgroup's throttles.
//!
//! Those tests take a [`turn`] for as long as they hold any of it, and put
//! it back as they found it before the turn ends. `scripts/test.sh` runs
//! test binaries side by side, so a process-wide mutex would not do: the
//! turn is an exclusive `flock` on one file, which the kernel releases
//! when its holder closes it or dies. A test that checks the machine is as
//! it was afterwards compares only what it could have changed itself.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

/// A test's turn at the machine's shared kernel state; the next test's
/// turn begins when this one is dropped.
#[derive(Debug)]
pub struct Turn {
    _lock: File,
}

/// The file whose lock is the turn.
pub fn lock_path() -> PathBuf {
    std::env::temp_dir().join("zmem-tests-machine.lock")
}

/// Wait for the turn at the machine's shared kernel state, and take it.
///
/// Panics (failing the test) if the lock file cannot be opened or locked:
/// running on without the turn could break another test.
pub fn turn() -> Turn {
    let path = lock_path();
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {} (the tests' turn at the machine): {e}", path.display()));
    file.lock().unwrap_or_else(|e| panic!("lock {} (the tests' turn at the machine): {e}", path.display()));
    Turn { _lock: file }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Two turns never overlap, also between threads of one process (each
    /// turn opens the file anew, and `flock` locks belong to an open file).
    #[test]
    fn turns_do_not_overlap() {
        let inside = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (inside, overlaps) = (inside.clone(), overlaps.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let _t = turn();
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.store(true, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        inside.store(false, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(!overlaps.load(Ordering::SeqCst), "two turns overlapped");
    }
}
