//! The policy threads a server runs beside its pool: what the kernel does
//! on its own schedule, here done by a thread until the server stops.
//!
//! * Following the system's swap fullness (`--exclusive-loads auto`):
//!   loads are exclusive while swap is more than half full, the kernel's
//!   own rule (`vm_swap_full()`).
//! * Sizing the pool (`--pool-size auto`): the cap moves to where the
//!   machine gets the most work done (`sizing.rs`).
//! * Idle recompression (`--recompress-idle`): pages idle this long are
//!   rewritten with the pool's recompression algorithms, within a share
//!   of one CPU: a set one, or (`--recompress-cpu auto`) half of what the
//!   machine's CPUs leave idle, their iowait counted as idle only while
//!   the rest of the machine (all but this server, whose CPU serves the
//!   workload's waits) uses under 30 % of its CPUs, so that a workload
//!   that keeps the CPUs busy between its waits (a build on two cores)
//!   gets them and one that mostly waits on its disk (a heap swapping)
//!   lends them. The thread runs at nice 19 either way: the CPU it takes
//!   is what nobody else asked for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Scope;
use std::time::{Duration, Instant};

use zmem_core::Pool;

/// How often the swap-fullness follower looks.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// Which policy threads a server runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    /// Switch the pool's exclusive loads to whether the system's swap is
    /// more than half full ([`swap_over_half_full`]).
    pub follow_swap_fullness: bool,
    /// Recompress pages idle this long in the background.
    pub recompress_idle: Option<IdleRecompress>,
    /// Size the pool's cap ([`crate::sizing`]).
    pub size_pool: Option<SizePool>,
}

/// `--pool-size auto`: the cap's bound and whose work it follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizePool {
    /// `--max-pool`: the cap moves up to it.
    pub max: u64,
    pub work: crate::sizing::Work,
}

/// `--recompress-idle` and `--recompress-cpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleRecompress {
    pub idle_secs: u32,
    pub cpu: RecompressCpu,
}

/// The share of one CPU idle recompression may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecompressCpu {
    /// This many percent (1 to 100).
    Percent(u8),
    /// Half of what the machine's CPUs leave idle, up to one CPU, their
    /// iowait included only where the machine is not busy ([`SpareCpu`]).
    Spare,
}

/// How often [`SpareCpu`] looks at the machine's idle time.
const SPARE_EVERY: Duration = Duration::from_millis(500);

/// The share of the idle CPU that `--recompress-cpu auto` takes: half,
/// leaving the rest for the bursts of whatever runs beside it.
const SPARE_TAKEN: f64 = 0.5;

/// The share of the machine's CPUs that the rest of its work (all but
/// idle, iowait and this server's own threads) may use for the CPUs'
/// iowait to count as spare. A CPU in iowait has nothing to run now but a
/// task that wants it back the moment its read completes: where the rest
/// of the machine is busy (a build on two cores, whose compilers run
/// between their swap-ins) that time is the workload's; where it mostly
/// waits (a heap that swaps, whose CPU is this server's, serving it) it is
/// lent. The server's own CPU is left out: it is the workload's waiting.
const IOWAIT_SPARE_BELOW: f64 = 0.3;

/// What the machine's CPUs left idle over the last [`SPARE_EVERY`], with
/// the calling thread's own time counted as idle (what would have been
/// idle had it not run), as a share of one CPU to take.
struct SpareCpu {
    at: Instant,
    then: Times,
    share: f64,
}

/// The CPU seconds [`SpareCpu`] reads: the machine's by kind, this
/// process's and this thread's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Times {
    machine: zmem_host::IdleTimes,
    server: f64,
    mine: f64,
}

impl Times {
    /// Now (what is not readable reads as none, and so gives no share).
    fn now() -> Times {
        Times {
            machine: zmem_host::machine_idle_times().unwrap_or_default(),
            server: zmem_host::cpu_secs(std::process::id()).unwrap_or(0.0),
            mine: zmem_host::thread_cpu_secs().unwrap_or(0.0),
        }
    }

    /// What passed from `then` to `self`.
    fn since(self, then: Times) -> Times {
        let (m, t) = (self.machine, then.machine);
        Times {
            machine: zmem_host::IdleTimes { idle: m.idle - t.idle, iowait: m.iowait - t.iowait, all: m.all - t.all },
            server: self.server - then.server,
            mine: self.mine - then.mine,
        }
    }
}

impl SpareCpu {
    fn new() -> SpareCpu {
        SpareCpu { at: Instant::now(), then: Times::now(), share: 0.0 }
    }

    /// The share now (sampled anew once [`SPARE_EVERY`] has passed).
    fn share(&mut self) -> f64 {
        let dt = self.at.elapsed();
        if dt >= SPARE_EVERY {
            let now = Times::now();
            self.share = spare_share(now.since(self.then), dt.as_secs_f64());
            (self.at, self.then) = (Instant::now(), now);
        }
        self.share
    }
}

/// The share of one CPU to take, given the CPU seconds that passed over
/// `secs` of wall time: half of the machine's idle time and this thread's,
/// and of its iowait too while the rest of the machine (all but this
/// server) uses under [`IOWAIT_SPARE_BELOW`] of its CPUs.
fn spare_share(d: Times, secs: f64) -> f64 {
    let m = d.machine;
    if secs <= 0.0 || m.all <= 0.0 {
        return 0.0;
    }
    let (idle, iowait, mine) = (m.idle.max(0.0), m.iowait.max(0.0), d.mine.max(0.0));
    let others = (m.all - idle - iowait - d.server.max(mine)).max(0.0) / m.all;
    let spare = if others < IOWAIT_SPARE_BELOW { idle + iowait + mine } else { idle + mine };
    (spare / secs * SPARE_TAKEN).clamp(0.0, 1.0)
}

impl Policies {
    /// Start the threads, in `scope`, until `stop`.
    pub fn spawn<'s>(&self, scope: &'s Scope<'s, '_>, pool: &'s Pool, stop: &'s AtomicBool) {
        if self.follow_swap_fullness {
            scope.spawn(move || follow_swap_fullness(pool, stop));
        }
        if let Some(r) = self.recompress_idle {
            scope.spawn(move || recompress_idle(pool, r, stop));
        }
        if let Some(s) = self.size_pool.clone() {
            scope.spawn(move || crate::sizing::size_pool(pool, s.max, &s.work, stop));
        }
    }
}

/// The kernel's `vm_swap_full()`: free swap slots are fewer than half of
/// all of them. While it holds, a swap-in frees its slot at once, even for
/// a read fault (`should_try_to_free_swap` in mm/memory.c), and reclaim
/// frees the slots of swap-cache pages it keeps; so a load is the last use
/// of what the pool holds for that slot.
fn swap_half_full(total: u64, free: u64) -> bool {
    free.saturating_mul(2) < total
}

/// Whether the system's swap is more than half full now.
pub fn swap_over_half_full() -> bool {
    let s = rustix::system::sysinfo();
    swap_half_full(s.totalswap, s.freeswap)
}

/// Idle recompression until `stop` (an error, such as no algorithm, is
/// logged and ends it).
fn recompress_idle(pool: &Pool, r: IdleRecompress, stop: &AtomicBool) {
    // (This thread alone: Linux keeps a nice value per thread.)
    if let Err(e) = rustix::process::setpriority_process(None, 19) {
        tracing::warn!("idle recompression runs at the server's priority: nice 19 refused ({e})");
    }
    let mut spare = SpareCpu::new();
    let share = move || match r.cpu {
        RecompressCpu::Percent(p) => f64::from(p.clamp(1, 100)) / 100.0,
        RecompressCpu::Spare => spare.share(),
    };
    match pool.recompress_idle_until(r.idle_secs, share, stop) {
        Ok(r) => tracing::info!("idle recompression: {} pages rewritten, {} bytes saved", r.recompressed, r.saved_bytes),
        Err(e) => tracing::warn!("idle recompression stopped: {e}"),
    }
}

/// Every [`FOLLOW_EVERY`], switch the pool's exclusive loads to whether
/// the system's swap is more than half full, until `stop`. A switch
/// changes only which pages are written back first.
fn follow_swap_fullness(pool: &Pool, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        pool.set_exclusive_loads(swap_over_half_full());
        std::thread::sleep(FOLLOW_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times over one second on `cpus` CPUs: the machine's idle and
    /// iowait, this server's CPU and this thread's.
    fn times(cpus: f64, idle: f64, iowait: f64, server: f64, mine: f64) -> Times {
        Times { machine: zmem_host::IdleTimes { idle, iowait, all: cpus }, server, mine }
    }

    #[test]
    fn the_spare_share_is_half_the_idle_cpu_up_to_one() {
        let t = |idle, mine| times(2.0, idle, 0.0, mine, mine);
        assert_eq!(spare_share(t(0.0, 0.0), 1.0), 0.0, "no CPU idle: none");
        assert_eq!(spare_share(t(1.0, 0.0), 1.0), 0.5, "one CPU idle: half of it");
        assert_eq!(spare_share(t(0.4, 0.6), 1.0), 0.5, "its own time counts as idle");
        assert_eq!(spare_share(times(8.0, 4.0, 0.0, 0.0, 0.0), 1.0), 1.0, "at most one CPU");
        assert_eq!(spare_share(times(1.0, 0.5, 0.0, 0.0, 0.0), 0.5), 0.5);
        assert_eq!(spare_share(t(1.0, 0.0), 0.0), 0.0, "no time passed: none");
        assert_eq!(spare_share(times(0.0, 0.0, 0.0, 0.0, 0.0), 1.0), 0.0, "no machine time read: none");
        assert_eq!(spare_share(times(2.0, -1.0, -1.0, -1.0, -1.0), 1.0), 0.0, "counters that ran back: none");
    }

    /// iowait is lent by a machine whose work mostly waits (a heap
    /// swapping: of 2 CPU seconds its clients use 0.2 and this server 0.6)
    /// and kept by one that is busy between its waits (a build: its
    /// compilers use 1.0); the server's own CPU never makes it busy.
    #[test]
    fn iowait_is_spare_only_where_the_rest_of_the_machine_is_not_busy() {
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(spare_share(times(2.0, 0.0, 1.2, 0.6, 0.0), 1.0), 0.6), "a heap waiting on its disk: half its iowait");
        assert!(near(spare_share(times(2.0, 0.2, 1.0, 0.6, 0.2), 1.0), 0.7), "with this thread's own time beside it");
        assert_eq!(spare_share(times(2.0, 0.0, 0.6, 0.4, 0.0), 1.0), 0.0, "a build busy between its waits: none");
        assert!(near(spare_share(times(2.0, 0.2, 0.4, 0.4, 0.0), 1.0), 0.1), "only its idle time");
        assert!(near(spare_share(times(2.0, 0.0, 0.8, 1.2, 0.0), 1.0), 0.4), "a busy server is not a busy machine");
        assert!(near(spare_share(times(2.0, 0.0, 1.2, 0.0, 0.4), 1.0), 0.8), "this thread's time is the server's at least");
    }

    /// The share is read from the machine: none before a reading, and
    /// this thread's own work counts as idle (it is what the thread would
    /// give back), so a thread that spun has a share whatever else the
    /// machine runs.
    #[test]
    fn the_spare_share_is_read_from_the_machine() {
        let mut s = SpareCpu::new();
        assert_eq!(s.share(), 0.0, "no reading yet");
        let (at0, then0) = (s.at, s.then);
        let end = Instant::now() + SPARE_EVERY + Duration::from_millis(100);
        let mut x = 0u64;
        while Instant::now() < end {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let share = s.share();
        assert!(s.at > at0, "a new reading");
        let spun = s.then.since(then0);
        assert!(spun.mine >= 0.01, "the spinning counted: {spun:?}");
        assert!(spun.server >= spun.mine, "the thread's time is in the process's: {spun:?}");
        assert!(spun.machine.all >= spun.mine, "and in the machine's: {spun:?}");
        assert!(share > 0.0 && share <= 1.0, "{share}");
    }

    #[test]
    fn half_full_is_the_kernels_vm_swap_full() {
        // vm_swap_full(): nr_swap_pages * 2 < total_swap_pages.
        assert!(!swap_half_full(0, 0), "no swap at all");
        assert!(!swap_half_full(1000, 1000));
        assert!(!swap_half_full(1000, 500), "exactly half free is not full");
        assert!(swap_half_full(1000, 499));
        assert!(swap_half_full(1000, 0));
        assert!(!swap_half_full(u64::MAX, u64::MAX), "no overflow");
    }
}
