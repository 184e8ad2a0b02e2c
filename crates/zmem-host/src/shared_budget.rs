//! One memory budget for a memory cgroup and a compressed pool outside it.
//!
//! Kernel zswap takes its pool from the same RAM as the processes whose
//! pages it holds: the more it holds, the less they have, and when it holds
//! little they have nearly all of it. A pool that lives outside the
//! processes' memory cgroup (zmem's server, kernel zram, and zswap's own
//! pool, which this kernel does not charge to a cgroup v1) adds to the
//! cgroup's limit instead of sharing it. Two fixes are wrong:
//!
//! * **The server inside the cgroup.** A page fault of the server at the
//!   limit enters reclaim, which swaps a page to the server's own device
//!   and waits for it: a deadlock (seen here, `wbt_wait` then
//!   `blk_mq_get_tag` under `swap_writeout`). `PR_SET_IO_FLUSHER` would
//!   keep the server's reclaim off I/O, but it needs `CAP_SYS_RESOURCE`,
//!   which this VM withholds even from root.
//! * **A fixed share.** Running the processes in budget − cap wastes the
//!   cap whenever the pool holds less than that, which is most of the time.
//!
//! So the pool stays outside and [`SharedBudget`] moves the cgroup's limit
//! instead: every [`TICK`] it sets `memory.limit_in_bytes` to budget − pool
//! (never below a floor, so the processes are not starved by a pool that
//! overshoots). It runs on a thread of its own, never one that serves the
//! pool: lowering a limit makes the writer reclaim, which may wait for a
//! swap-out to the pool, and the pool's own threads stay free to finish it.
//!
//! The trade-off: between two ticks the pool may grow past its share, and
//! a limit lowered below the cgroup's usage takes effect only as reclaim
//! catches up. The keeper samples usage + pool on every tick and keeps the
//! peak ([`BudgetStats::peak_total`]) so a report can show how far over the
//! budget the pair went.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{HostError, Result};

/// How often the limit follows the pool.
pub const TICK: Duration = Duration::from_millis(10);
/// A limit is raised only by at least this much (lowered by any amount):
/// a pool that shrinks page by page does not cost a write per tick.
const RAISE_STEP: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// What cgroup v1 reports as "no limit" is near 2^63; anything above this
/// is no budget.
const UNLIMITED: u64 = 1 << 60;

/// What the keeper did, for a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BudgetStats {
    /// The budget for the cgroup and the pool together.
    pub budget: u64,
    /// The cgroup's limit now.
    pub limit: u64,
    /// The pool's memory at the last tick.
    pub pool: u64,
    /// Highest pool memory seen.
    pub pool_peak: u64,
    /// Highest cgroup usage + pool memory seen on a tick.
    pub peak_total: u64,
    /// Lowest limit set.
    pub limit_min: u64,
    /// Limit writes done.
    pub updates: u64,
    /// Limit writes the kernel refused (EBUSY: it could not reclaim down
    /// to the new limit); retried on the next tick.
    pub refused: u64,
    /// Ticks on which the floor, not budget − pool, set the limit: the
    /// pair was over the budget.
    pub floor_ticks: u64,
}

#[derive(Default)]
struct Counters {
    limit: AtomicU64,
    pool: AtomicU64,
    pool_peak: AtomicU64,
    peak_total: AtomicU64,
    limit_min: AtomicU64,
    updates: AtomicU64,
    refused: AtomicU64,
    floor_ticks: AtomicU64,
}

/// Keeps a memory cgroup's limit at budget − pool until dropped, then puts
/// the budget back as its limit.
pub struct SharedBudget {
    cgroup: PathBuf,
    budget: u64,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SharedBudget {
    /// The cgroup's current limit as the budget (what `zmem swap on
    /// --charge-to` does): an error if it has none.
    pub fn budget_of(cgroup: &Path) -> Result<u64> {
        let f = cgroup.join("memory.limit_in_bytes");
        let text = std::fs::read_to_string(&f).map_err(|e| HostError::file("read the limit of a cgroup v1 memory cgroup at", &f, e))?;
        let limit: u64 = text.trim().parse().map_err(|_| HostError::NotANumber { path: f.clone(), text: text.trim().to_string() })?;
        if limit >= UNLIMITED {
            return Err(HostError::NoBudget { cgroup: cgroup.to_path_buf(), file: f });
        }
        Ok(limit)
    }

    /// Starts the keeper: `pool()` is the memory held outside the cgroup
    /// (`None` when it cannot be read this time: the last value stands).
    /// The limit never goes below `floor`.
    pub fn start(cgroup: &Path, budget: u64, floor: u64, mut pool: impl FnMut() -> Option<u64> + Send + 'static) -> Result<SharedBudget> {
        if floor >= budget {
            return Err(HostError::BadFloor { floor, budget });
        }
        let limit_file = cgroup.join("memory.limit_in_bytes");
        let usage_file = cgroup.join("memory.usage_in_bytes");
        let read = |f: &Path| std::fs::read_to_string(f).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let limit = crate::read_trim(&limit_file)?;
        let limit = limit.parse::<u64>().map_err(|_| HostError::NotANumber { path: limit_file.clone(), text: limit })?;
        let counters = Arc::new(Counters::default());
        counters.limit.store(limit, Ordering::Relaxed);
        counters.limit_min.store(limit, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&counters), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("zmem-budget".into())
            .spawn(move || {
                let mut held = 0u64;
                while !s.load(Ordering::Relaxed) {
                    held = pool().unwrap_or(held);
                    c.pool.store(held, Ordering::Relaxed);
                    c.pool_peak.fetch_max(held, Ordering::Relaxed);
                    if let Some(usage) = read(&usage_file) {
                        c.peak_total.fetch_max(usage + held, Ordering::Relaxed);
                    }
                    let share = budget.saturating_sub(held) / PAGE * PAGE;
                    if share < floor {
                        c.floor_ticks.fetch_add(1, Ordering::Relaxed);
                    }
                    let target = share.max(floor);
                    let cur = c.limit.load(Ordering::Relaxed);
                    if target < cur || target >= cur + RAISE_STEP {
                        match std::fs::write(&limit_file, target.to_string()) {
                            Ok(()) => {
                                c.limit.store(target, Ordering::Relaxed);
                                c.limit_min.fetch_min(target, Ordering::Relaxed);
                                c.updates.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                c.refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    std::thread::park_timeout(TICK);
                }
            })
            .map_err(|source| HostError::Thread { name: "zmem-budget", source })?;
        Ok(SharedBudget { cgroup: cgroup.to_path_buf(), budget, counters, stop, thread: Some(thread) })
    }

    pub fn stats(&self) -> BudgetStats {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BudgetStats {
            budget: self.budget,
            limit: n(&c.limit),
            pool: n(&c.pool),
            pool_peak: n(&c.pool_peak),
            peak_total: n(&c.peak_total),
            limit_min: n(&c.limit_min),
            updates: n(&c.updates),
            refused: n(&c.refused),
            floor_ticks: n(&c.floor_ticks),
        }
    }

    /// Stops the keeper and gives the cgroup its budget back as its limit.
    pub fn finish(mut self) -> BudgetStats {
        self.stop_thread();
        self.stats()
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                eprintln!("zmem: the budget keeper of {} panicked", self.cgroup.display());
            }
            let f = self.cgroup.join("memory.limit_in_bytes");
            if self.cgroup.exists() {
                if let Err(e) = std::fs::write(&f, self.budget.to_string()) {
                    eprintln!("zmem: could not give {} its limit back ({e}); finish it by hand: echo {} > {}", self.cgroup.display(), self.budget, f.display());
                }
            }
        }
    }
}

impl Drop for SharedBudget {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// A process's resident memory (`/proc/PID/statm`), all of it: pool, tables,
/// buffers, stacks and the binary's own pages.
pub fn rss_of(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    Some(s.split_whitespace().nth(1)?.parse::<u64>().ok()? * PAGE)
}

/// A process's resident memory of its own: its anonymous pages
/// (`RssAnon` of `/proc/PID/status`), for a process that maps what another
/// one's [`rss_of`] counts already: the swap keeper maps and locks the
/// server's pool (shared memory), and runs the server's binary, whose code
/// pages the server maps too (file pages two processes map count in each
/// one's RSS; the keeper's own few go uncounted).
pub fn rss_private_of(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = s.lines().find_map(|l| l.strip_prefix("RssAnon:")?.split_whitespace().next()?.parse::<u64>().ok())?;
    Some(kib << 10)
}

/// The process serving the device a `zmem serve` or `zmem swap serve`
/// started as `pid` runs: the keeper's child (its server now), or `pid`
/// itself when it has none.
pub fn served_by(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok().and_then(|c| c.split_whitespace().next()?.parse().ok()).unwrap_or(pid)
}

/// A device's resident memory: its server's ([`rss_of`]) and its keeper's
/// own ([`rss_private_of`]), for the device a process started as `pid`.
pub fn device_rss_of(pid: u32) -> Option<u64> {
    let server = served_by(pid);
    let keeper = if server == pid { 0 } else { rss_private_of(pid).unwrap_or(0) };
    Some(rss_of(server)? + keeper)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_children_serves_itself() {
        let me = std::process::id();
        assert_eq!(served_by(me), me);
        assert!(device_rss_of(me).is_some_and(|r| r > 0));
        assert_eq!(served_by(u32::MAX), u32::MAX, "no such process");
    }

    /// A directory that looks like a cgroup v1 memory cgroup to the keeper
    /// (plain files: the kernel's refusals cannot be imitated, the
    /// arithmetic can).
    fn fake_cgroup(limit: u64, usage: u64) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        std::fs::write(d.path().join("memory.usage_in_bytes"), usage.to_string()).unwrap();
        d
    }

    /// The fake limit file's value. The keeper rewrites a plain file
    /// (truncate, then write), so a read can land between the two and see
    /// it empty, which the kernel's own file never shows: such a torn read
    /// is read again, anything else that does not parse fails the test.
    fn limit(d: &Path) -> u64 {
        let f = d.join("memory.limit_in_bytes");
        for _ in 0..1000 {
            let s = std::fs::read_to_string(&f).unwrap();
            if !s.trim().is_empty() {
                return s.trim().parse().unwrap_or_else(|e| panic!("{} holds {s:?}: {e}", f.display()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{} stayed empty for a second", f.display());
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < end, "the keeper did not get there in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_limit_follows_the_pool_and_comes_back() {
        let d = fake_cgroup(100 << 20, 30 << 20);
        let budget = SharedBudget::budget_of(d.path()).unwrap();
        let pool = Arc::new(AtomicU64::new(10 << 20));
        let p = Arc::clone(&pool);
        let k = SharedBudget::start(d.path(), budget, 25 << 20, move || Some(p.load(Ordering::Relaxed))).unwrap();
        wait_for(|| limit(d.path()) == 90 << 20);
        // Shrinking by less than a step leaves the limit; by a step raises it.
        pool.store((10 << 20) - PAGE, Ordering::Relaxed);
        std::thread::sleep(TICK * 3);
        assert_eq!(limit(d.path()), 90 << 20);
        pool.store(5 << 20, Ordering::Relaxed);
        wait_for(|| limit(d.path()) == 95 << 20);
        // A pool past budget − floor: the floor holds, and it is counted.
        pool.store(90 << 20, Ordering::Relaxed);
        wait_for(|| limit(d.path()) == 25 << 20);
        wait_for(|| k.stats().floor_ticks > 0);
        let st = k.finish();
        assert_eq!(limit(d.path()), 100 << 20, "the budget is the limit again");
        assert_eq!((st.pool_peak, st.limit_min, st.budget), (90 << 20, 25 << 20, 100 << 20));
        assert_eq!(st.peak_total, (30 << 20) + (90 << 20));
        assert!(st.updates >= 3, "{st:?}");
    }

    #[test]
    fn an_unreadable_pool_keeps_the_last_value() {
        let d = fake_cgroup(64 << 20, 0);
        let mut calls = 0;
        let k = SharedBudget::start(d.path(), 64 << 20, 0, move || {
            calls += 1;
            (calls == 1).then_some(8 << 20)
        })
        .unwrap();
        wait_for(|| limit(d.path()) == 56 << 20);
        std::thread::sleep(TICK * 3);
        assert_eq!(limit(d.path()), 56 << 20);
        assert_eq!(k.stats().pool, 8 << 20);
    }

    #[test]
    fn a_cgroup_without_a_limit_has_no_budget() {
        let d = fake_cgroup(9223372036854771712, 0);
        let e = SharedBudget::budget_of(d.path()).unwrap_err().to_string();
        assert!(e.contains("no memory limit"), "{e}");
        let e = SharedBudget::budget_of(Path::new("/nonexistent")).unwrap_err().to_string();
        assert!(e.contains("cgroup v1"), "{e}");
        assert!(SharedBudget::start(d.path(), 10, 10, || None).is_err());
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(rss_of(std::process::id()).unwrap() > 1 << 20);
        // Its own share: the anonymous pages, part of the whole.
        let (own, all) = (rss_private_of(std::process::id()).unwrap(), rss_of(std::process::id()).unwrap());
        assert!(own > 0 && own <= all, "{own} of {all}");
        assert_eq!(rss_private_of(u32::MAX), None);
        assert_eq!(rss_of(u32::MAX), None);
    }
}
