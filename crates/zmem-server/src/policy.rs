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
//!   of one CPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Scope;
use std::time::Duration;

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
    /// The share of one CPU it may use, in percent.
    pub cpu_percent: u8,
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
    match pool.recompress_idle_until(r.idle_secs, r.cpu_percent, stop) {
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
