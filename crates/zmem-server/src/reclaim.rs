//! Keeping a swap server out of reclaim's way.
//!
//! The kernel may need a swap server to finish a swap-out before it can
//! free memory, so the server must never wait on reclaim itself:
//! `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)` (the pool is never
//! swapped into itself; every mapping costs only the pages touched; the
//! allocator still gives emptied spans back),
//! `PR_SET_IO_FLUSHER` (its allocations do not recurse into I/O reclaim),
//! and `oom_score_adj -1000`. Only `mlockall` is required: the other two
//! need `CAP_SYS_RESOURCE`, which some containers and VMs withhold even
//! from root, and the server then says so and runs without them.

use rustix::mm::{mlockall, MlockAllFlags};
use serde::{Deserialize, Serialize};

/// What the server got of its protection from reclaim; reported on its
/// control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimSafety {
    pub mlockall: bool,
    /// malloc tuned to give freed memory back under mlockall.
    pub malloc_tuned: bool,
    /// Why `PR_SET_IO_FLUSHER` was refused, if it was.
    pub io_flusher: Option<String>,
    /// The server's `oom_score_adj` now.
    pub oom_score_adj: String,
}

/// `mlockall` failed: the server must not run.
#[derive(Debug, thiserror::Error)]
#[error("mlockall failed ({0}): a swap server must never be swapped into itself (run it as root, or raise RLIMIT_MEMLOCK)")]
pub struct LockError(#[source] rustix::io::Errno);

/// Protect this process from reclaim (see the module doc). Warnings for
/// what it could not get go to stderr, and into the result.
pub fn protect() -> Result<ReclaimSafety, LockError> {
    let malloc_tuned = crate::malloc::for_mlock();
    if !malloc_tuned {
        eprintln!("zmem: warning: could not tune malloc for mlockall: memory the server frees may stay resident");
    }
    // Every page is locked once it is touched, what is mapped now (the
    // binary's code and data, the libraries) as what is mapped later (pool
    // spans, malloc's heap, thread stacks, the FUSE workers' buffers). Locking the
    // current mappings whole (MCL_CURRENT without MCL_ONFAULT) faulted in
    // all of the binary's code, about 7 MiB the server never runs (RssFile
    // 10.8 MiB): resident memory a memory budget then takes from the
    // processes whose pages the server holds. A code path first run in a
    // swap storm is read from the binary's file, as any allocation of the
    // server is made, outside the swap device it serves.
    mlockall(MlockAllFlags::CURRENT | MlockAllFlags::FUTURE | MlockAllFlags::ONFAULT).map_err(LockError)?;
    let io_flusher = match rustix::process::configure_io_flusher_behavior(true) {
        Ok(()) => None,
        Err(e) => {
            eprintln!("zmem: warning: PR_SET_IO_FLUSHER refused ({e}; it needs CAP_SYS_RESOURCE): the server's allocations may enter I/O reclaim");
            Some(e.to_string())
        }
    };
    let oom_score_adj = match std::fs::write("/proc/self/oom_score_adj", "-1000") {
        Ok(()) => "-1000".to_string(),
        Err(e) => {
            eprintln!("zmem: warning: oom_score_adj -1000 refused ({e}; it needs CAP_SYS_RESOURCE): the OOM killer may pick the server");
            std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default().trim().to_string()
        }
    };
    Ok(ReclaimSafety { mlockall: true, malloc_tuned, io_flusher, oom_score_adj })
}

/// Gives back the pages of code and read-only data the server ran only
/// to start (argument parsing, the pool's set-up, the mount), which
/// `mlockall` would otherwise hold for its life, once the process that
/// started the server has exited: until then it maps the same binary, and
/// the kernel reclaims no page two processes map. What runs from then on
/// comes back from the page cache or the binary's file and is locked
/// again as it is touched.
pub struct StartupCode {
    /// The parent the server was started by, until its code is given back.
    parent: Option<rustix::process::Pid>,
    /// Give it back at the next tick, whatever the parent does.
    at_once: bool,
}

impl StartupCode {
    /// Remember the parent now (after [`protect`]).
    pub fn new() -> Self {
        Self { parent: rustix::process::getppid(), at_once: false }
    }

    /// For a process whose parent stays (a swap server under its keeper,
    /// which maps the same binary and locks only what it touched itself):
    /// give the start-up code back at the first tick.
    pub fn at_once() -> Self {
        Self { parent: None, at_once: true }
    }

    /// Give the start-up code back if the parent has exited since and it
    /// was not given back yet: `Some` with the bytes of the mappings gone
    /// over when it did now.
    pub fn tick(&mut self) -> Option<std::io::Result<u64>> {
        if std::mem::take(&mut self.at_once) {
            return Some(crate::pageout::startup_code());
        }
        let parent = self.parent?;
        if rustix::process::getppid() == Some(parent) {
            return None;
        }
        self.parent = None;
        Some(crate::pageout::startup_code())
    }
}

impl Default for StartupCode {
    fn default() -> Self {
        Self::new()
    }
}
