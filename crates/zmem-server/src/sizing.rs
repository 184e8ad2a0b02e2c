//! Sizing a swap device's pool by what the machine gets done
//! (`--pool-size auto`).
//!
//! # Why
//! A swap device's pool shares the machine's RAM with the workload: every
//! page of it is a page the workload does not have. Whether that pays
//! depends on the workload, and measured, no fixed cap wins both of the
//! built-in ones (docs/MEASUREMENTS.md, "Pool size"): a build's short
//! processes fault their pages back soon or never, so a large pool mostly
//! serves faults its own memory caused and the build runs fastest with a
//! small one; a long-lived heap read at random saves disk reads with every
//! page the pool holds. Nothing the pool counts tells the two apart (the
//! refault distance of its hits, `tier/reuse.rs`, splits both about
//! evenly: the kernel evicts clean swap-cache pages without telling the
//! device). The kernel's zswap shrinker does not either: it shrinks the
//! pool under any memory pressure, protecting as many pages as were
//! recently read back from the disk, and both workloads read back about
//! everything they write.
//!
//! # How
//! So this policy asks the machine instead. It measures the work done (the
//! user CPU time of every process but the server: a process stalled on a
//! fault or on reclaim does none) with the cap at its current size (A) and
//! one step away (B), and moves the cap to whichever did more: perturb
//! and observe, the way a solar charger finds its panel's best point. A
//! trial is four epochs of [`EPOCH`] in the order A B B A, so a workload
//! whose pace drifts steadily across the trial favours neither side. B
//! wins if it did more work (a larger B by more than [`MARGIN`]; a smaller
//! B if it did at most that much less: memory and CPU the pool does not
//! need go back to the machine). A B that wins becomes the cap and the
//! next trial steps the same way; a B that loses turns the direction. The
//! cap moves by a factor of 3/2 between an eighth of `--max-pool` and
//! `--max-pool`, starting halfway (geometrically). A trial with an epoch in
//! which the pool served no page is dropped: without swap-ins the machine
//! is not short of memory, and the work done says nothing about the pool.
//!
//! # Costs and limits
//! Reading `/proc/stat` and `/proc/self/stat` once an epoch, and the pool's
//! counters. Work is the whole machine's user time, so another job's pace
//! moves it too: that is noise a trial must outweigh, and it only ever
//! moves the cap within its bounds. A shrink takes effect at once (the
//! shrinker writes back the coldest pages); a growth as the pool fills.
//! [`Sizer`] is the decision alone, a state machine fed epochs, so it is
//! tested without a machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zmem_core::Pool;

/// One epoch of a trial.
pub const EPOCH: Duration = Duration::from_secs(5);
/// How much more work a larger cap must do to win a trial, and how much
/// less a smaller one may do and still win.
pub const MARGIN: f64 = 0.01;
/// The cap's lower bound, as a share of `--max-pool`: 1/`MIN_SHARE`.
const MIN_SHARE: u64 = 8;

/// One epoch, as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epoch {
    /// User CPU seconds of every process but the server.
    pub work: f64,
    /// Pages the pool served (from RAM or its cold store).
    pub loads: u64,
}

/// Which way the next trial's B lies from A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Up,
    Down,
}

/// The decision (see the module notes): fed one [`Epoch`] at a time, it
/// says which cap the next epoch runs at.
#[derive(Debug)]
pub struct Sizer {
    min: u64,
    max: u64,
    /// A: the cap the last trial settled on.
    cap: u64,
    way: Way,
    /// The epochs of the trial under way, at most four.
    epochs: Vec<Epoch>,
    /// Trials decided, and of them those that moved the cap.
    pub trials: u64,
    pub moves: u64,
}

impl Sizer {
    /// A sizer for a pool whose cap may go up to `max` bytes.
    pub fn new(max: u64) -> Sizer {
        let max = max.max(1);
        let min = (max / MIN_SHARE).clamp(1, max);
        // Halfway between min and max, geometrically.
        let cap = ((min as f64 * max as f64).sqrt() as u64).clamp(min, max);
        Sizer { min, max, cap, way: Way::Down, epochs: Vec::with_capacity(4), trials: 0, moves: 0 }
    }

    /// The cap the trial's A runs at.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// One step from `cap` the given way, within the bounds.
    fn step(&self, cap: u64, way: Way) -> u64 {
        match way {
            Way::Up => cap.saturating_mul(3) / 2,
            Way::Down => cap * 2 / 3,
        }
        .clamp(self.min, self.max)
    }

    /// B: one step from A in the trial's direction; if A is at that bound,
    /// the direction turns.
    fn probe(&mut self) -> u64 {
        let b = self.step(self.cap, self.way);
        if b != self.cap {
            return b;
        }
        self.way = if self.way == Way::Up { Way::Down } else { Way::Up };
        self.step(self.cap, self.way)
    }

    /// The cap the trial's next epoch runs at (A B B A).
    pub fn next_cap(&mut self) -> u64 {
        match self.epochs.len() {
            1 | 2 => self.probe(),
            _ => self.cap,
        }
    }

    /// An epoch has ended; returns the cap the next one runs at.
    pub fn epoch(&mut self, e: Epoch) -> u64 {
        if e.loads == 0 {
            // Not short of memory: this trial says nothing.
            self.epochs.clear();
            return self.cap;
        }
        self.epochs.push(e);
        if self.epochs.len() == 4 {
            let a = self.epochs[0].work + self.epochs[3].work;
            let b_work = self.epochs[1].work + self.epochs[2].work;
            let b = self.probe();
            self.epochs.clear();
            if b == self.cap {
                return self.cap; // min == max: nothing to try
            }
            let wins = if b > self.cap { b_work > a * (1.0 + MARGIN) } else { b_work >= a * (1.0 - MARGIN) };
            self.trials += 1;
            if wins {
                self.cap = b;
                self.moves += 1;
            } else {
                self.way = if b > self.cap { Way::Down } else { Way::Up };
            }
        }
        self.next_cap()
    }
}

/// User CPU seconds of the whole machine (`/proc/stat`: user and nice)
/// less this process's own (`/proc/self/stat`: utime).
fn others_user_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let mut cpu = stat.lines().next()?.split_whitespace();
    (cpu.next()? == "cpu").then_some(())?;
    let user: u64 = cpu.next()?.parse().ok()?;
    let nice: u64 = cpu.next()?.parse().ok()?;
    let me = std::fs::read_to_string("/proc/self/stat").ok()?;
    // utime is the 14th field; the 2nd (the name) may hold spaces and ends at the last ')'.
    let utime: u64 = me.rsplit_once(')')?.1.split_whitespace().nth(11)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second() as f64;
    Some((user + nice).saturating_sub(utime) as f64 / hz)
}

/// Size `pool`'s cap by [`Sizer`] until `stop`: `max` is `--max-pool`.
pub fn size_pool(pool: &Pool, max: u64, stop: &AtomicBool) {
    let mut sizer = Sizer::new(max);
    pool.set_max_pool(Some(sizer.cap()));
    let (Some(mut work), mut loads) = (others_user_secs(), pool.stats().loads) else {
        tracing::warn!("pool sizing: /proc/stat unreadable; the cap stays at --max-pool");
        pool.set_max_pool(Some(max));
        return;
    };
    tracing::info!("pool sizing: cap {} (between {} and {})", sizer.cap(), max / MIN_SHARE, max);
    let mut cap = sizer.cap();
    let mut start = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if start.elapsed() < EPOCH {
            continue;
        }
        start = Instant::now();
        let (Some(w), l) = (others_user_secs(), pool.stats().loads) else { continue };
        let next = sizer.epoch(Epoch { work: w - work, loads: l - loads });
        (work, loads) = (w, l);
        if next != cap {
            tracing::info!("pool sizing: cap {cap} -> {next} (trial {}, {} moves)", sizer.trials, sizer.moves);
            pool.set_max_pool(Some(next));
            cap = next;
        }
    }
    tracing::info!("pool sizing: {} trials, {} moves, cap {}", sizer.trials, sizer.moves, sizer.cap());
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Run `n` trials against a machine whose work in an epoch is `work(cap)`.
    fn run(s: &mut Sizer, n: usize, work: impl Fn(u64) -> f64) {
        let mut cap = s.cap();
        for _ in 0..4 * n {
            cap = s.epoch(Epoch { work: work(cap), loads: 1 });
        }
    }

    #[test]
    fn it_starts_halfway_and_stays_within_its_bounds() {
        let s = Sizer::new(128 * MIB);
        assert_eq!(s.cap(), ((16.0 * 128.0f64).sqrt() * MIB as f64) as u64, "sqrt(16 MiB * 128 MiB)");
        let mut s = Sizer::new(128 * MIB);
        run(&mut s, 30, |cap| cap as f64);
        assert_eq!(s.cap(), 128 * MIB, "more is better: it climbs to --max-pool and stays");
        let mut s = Sizer::new(128 * MIB);
        run(&mut s, 30, |cap| 1e9 - cap as f64);
        assert_eq!(s.cap(), 16 * MIB, "less is better: it falls to an eighth and stays");
    }

    #[test]
    fn a_trial_runs_a_b_b_a() {
        let mut s = Sizer::new(128 * MIB);
        let a = s.cap();
        let mut caps = vec![];
        for _ in 0..4 {
            caps.push(s.epoch(Epoch { work: 10.0, loads: 1 }));
        }
        // Equal work: the smaller B wins (its first trial steps down).
        let b = a * 2 / 3;
        assert_eq!(caps, vec![b, b, a, b], "A B B A, then the next trial's first epoch at the new A");
        assert_eq!((s.cap(), s.trials, s.moves), (b, 1, 1));
    }

    #[test]
    fn it_finds_a_peak_between_the_bounds() {
        let mut s = Sizer::new(128 * MIB);
        let best = 70 * MIB;
        run(&mut s, 40, |cap| 100.0 - (cap as f64 - best as f64).abs() / MIB as f64);
        let cap = s.cap();
        assert!(cap > best * 2 / 3 && cap < best * 3 / 2, "settles within a step of the peak: {cap}");
    }

    #[test]
    fn a_larger_cap_must_win_by_the_margin() {
        let mut s = Sizer::new(128 * MIB);
        // A larger cap does 0.5 % more work: not worth its memory.
        run(&mut s, 30, |cap| 100.0 + 0.5 * (cap as f64 / (128 * MIB) as f64));
        assert_eq!(s.cap(), 16 * MIB);
    }

    #[test]
    fn an_epoch_without_swap_ins_drops_the_trial() {
        let mut s = Sizer::new(128 * MIB);
        let a = s.cap();
        for _ in 0..3 {
            s.epoch(Epoch { work: 10.0, loads: 1 });
        }
        assert_eq!(s.epoch(Epoch { work: 0.0, loads: 0 }), a, "back to A");
        assert_eq!((s.cap(), s.trials), (a, 0), "nothing decided");
        // A whole trial after it decides again.
        run(&mut s, 1, |_| 10.0);
        assert_eq!(s.trials, 1);
    }

    #[test]
    fn tiny_and_fixed_bounds_do_not_loop_or_panic() {
        for max in [0, 1, 7, 8, 4096] {
            let mut s = Sizer::new(max);
            run(&mut s, 5, |cap| cap as f64);
            assert!(s.cap() <= max.max(1), "{max}: {}", s.cap());
        }
    }

    #[test]
    fn the_machine_reports_user_time() {
        let a = others_user_secs().expect("/proc/stat and /proc/self/stat parse");
        let b = others_user_secs().unwrap();
        assert!(a >= 0.0 && b >= a - 0.5, "{a} then {b}");
    }
}
