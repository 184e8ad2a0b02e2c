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
//!   machine's CPUs leave idle, so that a workload that keeps the CPUs
//!   busy (a build on two cores) gets them and one that waits on its disk
//!   (a heap swapping) lends them. The thread runs at nice 19 either way:
//!   the CPU it takes is what nobody else asked for.

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
    /// Half of what the machine's CPUs leave idle, up to one CPU
    /// ([`SpareCpu`]).
    Spare,
}

/// How often [`SpareCpu`] looks at the machine's idle time.
const SPARE_EVERY: Duration = Duration::from_millis(500);

/// The share of the idle CPU that `--recompress-cpu auto` takes: half,
/// leaving the rest for the bursts of whatever runs beside it.
const SPARE_TAKEN: f64 = 0.5;

/// What the machine's CPUs left idle over the last [`SPARE_EVERY`], with
/// the calling thread's own time counted as idle (what would have been
/// idle had it not run), as a share of one CPU to take.
struct SpareCpu {
    at: Instant,
    idle: f64,
    mine: f64,
    share: f64,
}

impl SpareCpu {
    fn new() -> SpareCpu {
        let (idle, mine) = Self::times();
        SpareCpu { at: Instant::now(), idle, mine, share: 0.0 }
    }

    /// The machine's idle CPU seconds and this thread's CPU seconds
    /// (none readable: none, and so no share).
    fn times() -> (f64, f64) {
        (zmem_host::machine_idle_secs().unwrap_or(0.0), zmem_host::thread_cpu_secs().unwrap_or(0.0))
    }

    /// The share now (sampled anew once [`SPARE_EVERY`] has passed).
    fn share(&mut self) -> f64 {
        let dt = self.at.elapsed();
        if dt >= SPARE_EVERY {
            let (idle, mine) = Self::times();
            self.share = spare_share(idle - self.idle, mine - self.mine, dt.as_secs_f64());
            (self.at, self.idle, self.mine) = (Instant::now(), idle, mine);
        }
        self.share
    }
}

/// The share of one CPU to take, given the machine's idle CPU seconds
/// and this thread's CPU seconds over `secs` of wall time.
fn spare_share(idle: f64, mine: f64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    ((idle.max(0.0) + mine.max(0.0)) / secs * SPARE_TAKEN).clamp(0.0, 1.0)
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

    #[test]
    fn the_spare_share_is_half_the_idle_cpu_up_to_one() {
        assert_eq!(spare_share(0.0, 0.0, 1.0), 0.0, "no CPU idle: none");
        assert_eq!(spare_share(1.0, 0.0, 1.0), 0.5, "one CPU idle: half of it");
        assert_eq!(spare_share(0.4, 0.6, 1.0), 0.5, "its own time counts as idle");
        assert_eq!(spare_share(4.0, 0.0, 1.0), 1.0, "at most one CPU");
        assert_eq!(spare_share(0.5, 0.0, 0.5), 0.5);
        assert_eq!(spare_share(1.0, 0.0, 0.0), 0.0, "no time passed: none");
        assert_eq!(spare_share(-1.0, -1.0, 1.0), 0.0, "counters that ran back: none");
    }

    /// The share is read from the machine: none before a reading, and
    /// this thread's own work counts as idle (it is what the thread would
    /// give back), so a thread that spun has a share whatever else the
    /// machine runs.
    #[test]
    fn the_spare_share_is_read_from_the_machine() {
        let mut s = SpareCpu::new();
        assert_eq!(s.share(), 0.0, "no reading yet");
        let (at0, mine0) = (s.at, s.mine);
        let end = Instant::now() + SPARE_EVERY + Duration::from_millis(100);
        let mut x = 0u64;
        while Instant::now() < end {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let share = s.share();
        assert!(s.at > at0, "a new reading");
        assert!(s.mine - mine0 >= 0.01, "the spinning counted: {} s", s.mine - mine0);
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
