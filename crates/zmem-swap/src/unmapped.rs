//! Pages no page table points to go first.
//!
//! The kernel frees a swap slot without telling a loop device (zram hears
//! of each through `swap_slot_free_notify`; a loop device only of whole
//! clusters, through discards), so on a build most of what the pool holds
//! are pages of processes that have exited. Which slots are still wanted
//! can be read from the page tables: `/proc/PID/pagemap` shows each
//! swapped-out anonymous page as its swap type and offset, and the
//! device's offset is the pool's key. This thread lists the pool's pages
//! in RAM, reads the page tables of every process that has pages swapped
//! out (`VmSwap` above zero), and hands the pool the pages none of them
//! points to: the shrinker writes those back before its LRU's cold end.
//!
//! It is a guess, so it orders writeback and never drops a page: a slot
//! held only by the swap cache (a page swapped in and still mapped) or by
//! tmpfs is in no page table, and its page must still read back right.
//! Pages are listed before the page tables are read, so a page stored
//! after the listing is never named; one that changes after it is passed
//! over by the pool.
//!
//! A scan reads every such process's page tables, so it runs at most
//! every [`MIN_PERIOD`] and waits [`IDLE_FACTOR`] times its own length
//! before the next: a bounded share of a CPU whatever the machine runs.
//!
//! (Once an option, `--unmapped-first`: off, counting only, and writing
//! those pages back at once were measured and did no better; see
//! docs/experiments/.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zmem_core::Pool;

/// The shortest time between two scans.
const MIN_PERIOD: Duration = Duration::from_secs(1);
/// A scan is followed by this many times its length of rest (so it uses
/// at most 1/(1+IDLE_FACTOR) of a CPU).
const IDLE_FACTOR: u32 = 20;

/// Until `stop`: every period, name the pages in RAM that no page table
/// points to (see the module's doc). `image` is the device's FUSE file of
/// `size` bytes: the swap areas are the loop devices over it.
pub(crate) fn run(pool: &Pool, image: &Path, size: u64, stop: &AtomicBool) {
    // A bit per page of the device, kept between scans: 32 KiB per GiB,
    // where a set of the slots in use held 16 bytes or more per slot.
    let mut live = Slots::new(size / 4096);
    let mut said = false;
    let mut wait = MIN_PERIOD;
    loop {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
        }
        let areas = areas_of(image);
        if areas.is_empty() {
            continue;
        }
        if !said {
            let types: Vec<String> = areas.iter().map(|a| a.swap_type.to_string()).collect();
            eprintln!("zmem: writing back first the pages in RAM no page table points to (swap types {})", types.join(", "));
            said = true;
        }
        let start = Instant::now();
        let mut scan = Duration::ZERO;
        let mut pages = pool.resident();
        if !pages.is_empty() {
            live.clear();
            zmem_host::swapped_slots(&zmem_host::other_pids(), &areas, &mut |slot| live.insert(slot));
            pages.retain(|key| !live.contains(key));
            pool.write_back_first(pages);
            scan = start.elapsed();
        }
        wait = MIN_PERIOD.max(scan * IDLE_FACTOR).saturating_sub(start.elapsed() - scan);
    }
}

/// A set of a device's pages, a bit each.
struct Slots {
    bits: Vec<u64>,
    pages: u64,
}

impl Slots {
    fn new(pages: u64) -> Slots {
        Slots { bits: vec![0; pages.div_ceil(64) as usize], pages }
    }
    fn clear(&mut self) {
        self.bits.fill(0);
    }
    /// A page past the device's end (a slot of an area no longer over
    /// this image) is not kept.
    fn insert(&mut self, page: u64) {
        if page < self.pages {
            self.bits[(page / 64) as usize] |= 1 << (page % 64);
        }
    }
    fn contains(&self, page: u64) -> bool {
        page < self.pages && self.bits[(page / 64) as usize] & (1 << (page % 64)) != 0
    }
}

/// The swap areas over `image` (the loop devices over it that are
/// swapped on). Empty while none is.
fn areas_of(image: &Path) -> Vec<zmem_host::LoopSwap> {
    let swaps = zmem_host::swap_areas();
    crate::loops_backed_by(image).iter().filter_map(|dev| zmem_host::loop_swap_area(&swaps, dev)).collect()
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn slots_hold_what_was_inserted_and_nothing_past_the_end() {
        let mut s = Slots::new(130);
        for p in [0, 63, 64, 129, 130, 1 << 40] {
            s.insert(p);
        }
        let got: Vec<u64> = (0..200).filter(|&p| s.contains(p)).collect();
        assert_eq!(got, [0, 63, 64, 129]);
        assert!(!s.contains(1 << 40));
        s.clear();
        assert!((0..200).all(|p| !s.contains(p)));
    }
}
