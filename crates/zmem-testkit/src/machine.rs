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
//! * the root blkio cgroup's throttles.
//!
//! Those tests take a [`turn`] for as long as they hold any of it, and put
//! it back as they found it before the turn ends. `scripts/test.sh` runs
//! test binaries side by side, so a process-wide mutex would not do: the
//! turn is an exclusive `flock` on one file, which the kernel releases
//! when its holder closes it or dies. A test that checks the machine is as
//! it was afterwards compares only what it could have changed itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`turn`] waits before it fails the test: far longer than the
/// longest test that holds a turn takes on a loaded machine (a few
/// minutes), far shorter than CI's limit, so a test stuck with the turn
/// fails its waiters with the holder's name instead of stalling CI.
pub const WAIT: Duration = Duration::from_secs(30 * 60);

/// A test's turn at the machine's shared kernel state; the next test's
/// turn begins when this one is dropped.
#[derive(Debug)]
pub struct Turn {
    _lock: File,
}

/// The file whose lock is the turn: one for each user (`/proc/self` is
/// owned by the process's user). Only root's tests change the machine's
/// state, and a file one user made another cannot open for writing: a
/// shared one, once root made it, failed every later run of another
/// user's tests.
pub fn lock_path() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    std::env::temp_dir().join(format!("zmem-tests-machine.{uid}.lock"))
}

/// Wait for the turn at the machine's shared kernel state, and take it.
///
/// Panics (failing the test) if the lock file cannot be opened or locked,
/// or if the turn is not free within [`WAIT`]: running on without the turn
/// could break another test.
pub fn turn() -> Turn {
    turn_within(&lock_path(), WAIT).unwrap_or_else(|e| panic!("{e}"))
}

/// Wait at most `wait` for the turn whose lock is the file `path`. The
/// holder writes its pid and thread (libtest names a test's thread after
/// the test) into the file, so a waiter that gives up says who held it.
pub fn turn_within(path: &Path, wait: Duration) -> Result<Turn, String> {
    let what = || format!("{} (the tests' turn at the machine)", path.display());
    let mut file = OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| format!("open {}: {e}", what()))?;
    let end = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                return Err(format!("waited {wait:?} for {}, held all that time by {}: that test is stuck", what(), holder.trim()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(format!("lock {}: {e}", what())),
        }
    }
    let me = format!("pid {}, test {}", std::process::id(), std::thread::current().name().unwrap_or("(unnamed thread)"));
    // Who holds it is for a waiter's message only: a failure to say so
    // changes nothing about the turn.
    let _ = file.set_len(0).and_then(|()| file.write_all(me.as_bytes()));
    Ok(Turn { _lock: file })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

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

    /// A waiter that gives up names the test holding the turn.
    #[test]
    fn a_waiter_gives_up_in_time_and_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("zmem-turn-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let held = std::thread::Builder::new().name("the_holder".into()).spawn({
            let path = path.clone();
            move || turn_within(&path, Duration::ZERO).unwrap()
        });
        let held = held.unwrap().join().unwrap();
        let t = Instant::now();
        let e = turn_within(&path, Duration::from_millis(200)).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(200), "gave up early: {e}");
        assert!(e.contains(&format!("pid {}, test the_holder", std::process::id())), "{e}");
        drop(held);
        drop(turn_within(&path, Duration::ZERO).expect("free once its holder is dropped"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
