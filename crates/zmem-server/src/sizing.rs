//! Sizing a swap device's pool by what the machine gets done
//! (`--pool-size auto`).
//!
//! # Why
//! A swap device's pool shares the machine's RAM with the workload: every
//! page of it is a page the workload does not have. Whether that pays
//! depends on the workload, and measured, no fixed cap wins both of the
//! built-in ones (docs/experiments/pool-size.md): a build's short
//! processes fault their pages back soon or never, so a large pool mostly
//! serves faults its own memory caused and the build runs fastest with a
//! small one; a long-lived heap read at random saves disk reads with every
//! page the pool holds. Nothing the pool counts tells the two apart (the
//! refault distance of its hits, once counted, split both about evenly:
//! the kernel evicts clean swap-cache pages without telling the device). The kernel's zswap shrinker does not either: it shrinks the
//! pool under any memory pressure, protecting as many pages as were
//! recently read back from the disk, and both workloads read back about
//! everything they write.
//!
//! # How
//! So this policy asks the machine instead. It measures the work done (the
//! user CPU time of the workload's processes, [`Work`]: a process stalled
//! on a fault or on reclaim does none) with the cap at its current size (A) and
//! one step away (B), and moves the cap to whichever did more: perturb
//! and observe, the way a solar charger finds its panel's best point. A
//! trial is four epochs of [`EPOCH`] in the order A B B A, so a workload
//! whose pace drifts steadily across the trial favours neither side. B
//! wins only if it did more work by more than chance would: by [`MARGIN`],
//! and by [`Z`] times the noise of the measurement itself. That noise is
//! the kernel's: it counts a process's user and system time by sampling,
//! at each tick, which mode the running process is in, so a workload that
//! spends half its CPU in the kernel (one bound by its swap-ins) gets a
//! user time whose error is a few percent of a trial's, as large as what a
//! step of the cap changes (measured: docs/experiments/pool-size-auto.md).
//! A B that wins becomes the cap and the next trial steps the same way; a
//! B that loses turns the direction, and the cap rests at A before the
//! next trial: a trial's length after the first loss in a row, doubling to
//! eight ([`MAX_REST_SHIFT`]). Every trial runs half its time at B and
//! makes the shrinker write back (or the pool refill) the difference, so a
//! workload whose cap is already right pays for each probe (kv lost 10 %
//! probing 2/3 of its cap without rests). The cap starts at `--max-pool`, the
//! fixed cap's size, and moves by a factor of 3/2 down to an eighth of it
//! only as the evidence says: a workload that gains from a large pool but
//! whose signal is weak keeps it, and one that clearly works faster with
//! less memory for the pool (a build of short processes) gets it. A trial
//! with an epoch in which the pool served no page is dropped: without
//! swap-ins the machine is not short of memory, and the work done says
//! nothing about the pool.
//!
//! The trials cannot see one cost of a smaller cap: the pages it writes
//! back are read back later, after the trial, at the disk's pace. On a
//! disk whose reads are cheap (an SSD, or the 3,000 IOPS the bench's
//! throttled disk allows) that is small and the trials win; on a disk
//! whose every read costs a seek (the bench's HDD profile, 150 IOPS) it
//! is what decides: there a cap the trials shrank took the build far
//! longer than the fixed cap (docs/experiments/hdd.md). So
//! while the cold store's reads cost [`SLOW_READ`] or more each (its busy
//! time over its reads in an epoch, [`judge`]) the cap stays at
//! `--max-pool` and no trial runs.
//!
//! # Costs and limits
//! Reading `/proc/stat` and `/proc/self/stat` (or, for a cgroup, each of
//! its processes' `stat`) once an epoch, and the pool's counters. Without a
//! cgroup, work is the whole machine's user time, so another job's pace
//! moves it too: that is noise a trial must outweigh (on a workload bound
//! by its swap-ins, whose CPU is a few percent of the machine's, it did
//! not: docs/experiments/pool-size-trials.md), and it only ever moves the cap within its
//! bounds. A cgroup counts only its processes: each one's user time and
//! that of its children it has waited for (`utime` and `cutime`), so the
//! short processes of a build count once they exit. A shrink takes effect at once (the
//! shrinker writes back the coldest pages); a growth as the pool fills.
//! [`Sizer`] is the decision alone, a state machine fed epochs, so it is
//! tested without a machine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zmem_core::Pool;

/// One epoch of a trial.
pub const EPOCH: Duration = Duration::from_secs(5);
/// How much more work, as a share, B must do to win a trial.
pub const MARGIN: f64 = 0.01;
/// And by how many standard deviations of the tick sampling's error.
pub const Z: f64 = 2.0;
/// The tick rate the sampling error is reckoned at: `USER_HZ`, the unit of
/// `/proc`'s times. The kernel's own tick (`CONFIG_HZ`, 250 here) is at
/// least as fast, so the true error is no larger.
const TICK_HZ: f64 = 100.0;
/// The rest after a lost trial is 4 epochs << the losses in a row less
/// one, up to this shift (32 epochs, 160 s).
pub const MAX_REST_SHIFT: u32 = 3;
/// The cap's lower bound, as a share of `--max-pool`: 1/`MIN_SHARE`.
const MIN_SHARE: u64 = 8;
/// A cold store whose reads cost this much each, or more, is a disk that
/// seeks (a rotating disk takes 4-15 ms; the bench's HDD profile 6.7 ms;
/// an SSD 0.1 ms, the bench's throttled disk 0.33 ms): the cap stays at
/// `--max-pool` (see the module notes).
pub const SLOW_READ: Duration = Duration::from_millis(2);
/// The reads an epoch needs for a verdict on the store; with fewer, the
/// last verdict stands.
const READS_TO_JUDGE: u64 = 32;

/// Whether the cold store is slow ([`SLOW_READ`]), from an epoch's `reads`
/// and the time, `busy_ns`, with one in flight; `last` is the verdict so
/// far (a store not yet read is not slow).
pub fn judge(last: bool, reads: u64, busy_ns: u64) -> bool {
    if reads < READS_TO_JUDGE {
        return last;
    }
    busy_ns / reads >= SLOW_READ.as_nanos() as u64
}

/// One epoch, as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epoch {
    /// User CPU seconds of the workload ([`Work`]).
    pub work: f64,
    /// Its user and system CPU seconds: the ticks its user time was
    /// sampled from.
    pub cpu: f64,
    /// Pages the pool served (from RAM or its cold store).
    pub loads: u64,
}

impl Epoch {
    /// The variance, in seconds², of the user time as the kernel samples
    /// it: `cpu · TICK_HZ` ticks, each user with the share `work / cpu`
    /// (a binomial count).
    fn sampling_variance(&self) -> f64 {
        if self.cpu <= 0.0 {
            return 0.0;
        }
        let p = (self.work / self.cpu).clamp(0.0, 1.0);
        self.cpu * p * (1.0 - p) / TICK_HZ
    }
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
    /// Epochs to sit at A before the next trial, and the trials lost in
    /// a row.
    rest: u32,
    losses: u32,
    /// Trials decided, and of them those that moved the cap.
    pub trials: u64,
    pub moves: u64,
    /// The last trial decided, for the log.
    pub last: Option<Trial>,
}

/// A trial as decided: its two caps, the work done at each (two epochs
/// a side), the noise B had to beat, and whether it did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trial {
    pub a: u64,
    pub b: u64,
    pub a_work: f64,
    pub b_work: f64,
    pub noise: f64,
    pub won: bool,
}

impl Trial {
    /// The work B had to do to win: A's, and more by the margin or by
    /// the noise, whichever is larger.
    pub fn to_beat(&self) -> f64 {
        self.a_work + (self.a_work * MARGIN).max(self.noise)
    }

    /// Of `per_epoch`, a value for each of the trial's epochs (A B B A),
    /// B's sum over A's (NaN where A's is 0).
    pub fn b_over_a(per_epoch: [f64; 4]) -> f64 {
        let a = per_epoch[0] + per_epoch[3];
        if a > 0.0 {
            (per_epoch[1] + per_epoch[2]) / a
        } else {
            f64::NAN
        }
    }
}

impl Sizer {
    /// A sizer for a pool whose cap may go up to `max` bytes.
    pub fn new(max: u64) -> Sizer {
        let max = max.max(1);
        let min = (max / MIN_SHARE).clamp(1, max);
        Sizer { min, max, cap: max, way: Way::Down, epochs: Vec::with_capacity(4), rest: 0, losses: 0, trials: 0, moves: 0, last: None }
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

    /// An epoch has ended with the cold store slow ([`judge`]): the cap
    /// goes back to `--max-pool` and the trial under way is dropped; trials
    /// start afresh, from there, once the store is not slow. Returns the
    /// cap the next epoch runs at.
    pub fn slow_store(&mut self) -> u64 {
        self.epochs.clear();
        (self.rest, self.losses, self.way) = (0, 0, Way::Down);
        self.cap = self.max;
        self.cap
    }

    /// An epoch has ended; returns the cap the next one runs at.
    pub fn epoch(&mut self, e: Epoch) -> u64 {
        if self.rest > 0 {
            self.rest -= 1;
            return self.cap;
        }
        if e.loads == 0 {
            // Not short of memory: this trial says nothing.
            self.epochs.clear();
            return self.cap;
        }
        self.epochs.push(e);
        if self.epochs.len() == 4 {
            let a = self.epochs[0].work + self.epochs[3].work;
            let b_work = self.epochs[1].work + self.epochs[2].work;
            let noise = Z * self.epochs.iter().map(Epoch::sampling_variance).sum::<f64>().sqrt();
            let b = self.probe();
            self.epochs.clear();
            if b == self.cap {
                return self.cap; // min == max: nothing to try
            }
            let mut trial = Trial { a: self.cap, b, a_work: a, b_work, noise, won: false };
            trial.won = trial.b_work > trial.to_beat();
            let wins = trial.won;
            self.trials += 1;
            self.last = Some(trial);
            if wins {
                self.cap = b;
                self.moves += 1;
                self.losses = 0;
            } else {
                self.way = if b > self.cap { Way::Down } else { Way::Up };
                self.rest = 4 << self.losses.min(MAX_REST_SHIFT);
                self.losses += 1;
            }
        }
        self.next_cap()
    }
}

/// Whose CPU time counts as the work done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Every process but the server.
    Machine,
    /// The processes in this cgroup (a directory with `cgroup.procs`, v1
    /// or v2), but the server if it is one of them.
    Cgroup(PathBuf),
}

/// CPU seconds so far, as `/proc` counts them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Times {
    pub user: f64,
    /// User and system.
    pub cpu: f64,
}

impl Work {
    /// Its CPU times so far; `None` if they cannot be read (a cgroup not
    /// created yet, or removed).
    pub fn times(&self) -> Option<Times> {
        match self {
            Work::Machine => others_times(),
            Work::Cgroup(cg) => cgroup_times(cg),
        }
    }
}

/// The CPU times of the processes in cgroup `cg` but this one, with those
/// of the children each has waited for.
fn cgroup_times(cg: &Path) -> Option<Times> {
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).ok()?;
    let me = std::process::id().to_string();
    let sum = procs
        .lines()
        .map(str::trim)
        .filter(|&pid| !pid.is_empty() && pid != me)
        // (A process that exited since the list was read counts nothing
        // here; its parent's cutime counts it once it is waited for.)
        .filter_map(zmem_host::cpu_times)
        .fold(Times { user: 0.0, cpu: 0.0 }, |acc, t| {
            let user = t.user + t.children_user;
            Times { user: acc.user + user, cpu: acc.cpu + user + t.system + t.children_system }
        });
    Some(sum)
}

/// The whole machine's CPU times (`/proc/stat`) less this process's own.
fn others_times() -> Option<Times> {
    let (user, system) = zmem_host::machine_cpu_secs()?;
    let me = zmem_host::cpu_times("self")?;
    let others_user = (user - me.user).max(0.0);
    Some(Times { user: others_user, cpu: others_user + (system - me.system).max(0.0) })
}

/// Size `pool`'s cap by [`Sizer`] until `stop`: `max` is `--max-pool`,
/// `work` whose CPU time counts. While the work cannot be read (a
/// workload's cgroup not made yet), no epoch counts.
pub fn size_pool(pool: &Pool, max: u64, work: &Work, stop: &AtomicBool) {
    let mut sizer = Sizer::new(max);
    pool.set_max_pool(Some(sizer.cap()));
    tracing::info!("pool sizing: cap {} (between {} and {}), work counted for {work:?}", sizer.cap(), max / MIN_SHARE, max);
    let mut cap = sizer.cap();
    let counts = || {
        let st = pool.stats();
        (work.times(), st.loads, st.backing_read_ops, st.backing_read_busy_ns)
    };
    let mut last = counts();
    // Beside each epoch, for the trial's log only: the machine's memory
    // stall (some, full; µs) and the pool's loads, the last four epochs.
    let mut stall0 = zmem_host::memory_stall_us();
    let mut beside = [(0u64, 0u64, 0u64); 4];
    let mut slow = false;
    let mut start = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if start.elapsed() < EPOCH {
            continue;
        }
        start = Instant::now();
        let now = counts();
        let (Some(w0), Some(w)) = (last.0, now.0) else {
            last = now;
            continue;
        };
        // (A cgroup's sum falls when a process leaves it with its time:
        // that epoch says nothing either.)
        let shrank = w.user < w0.user || w.cpu < w0.cpu;
        let e = Epoch { work: (w.user - w0.user).max(0.0), cpu: (w.cpu - w0.cpu).max(0.0), loads: if shrank { 0 } else { now.1 - last.1 } };
        let (reads, busy) = (now.2.saturating_sub(last.2), now.3.saturating_sub(last.3));
        let stall = zmem_host::memory_stall_us();
        let (some, full) = match (stall0, stall) {
            (Some(a), Some(b)) => (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)),
            _ => (0, 0),
        };
        stall0 = stall;
        beside.rotate_left(1);
        beside[3] = (some, full, e.loads);
        last = now;
        let was = slow;
        slow = judge(slow, reads, busy);
        if slow != was {
            let ms = busy as f64 / reads as f64 / 1e6;
            tracing::info!(
                "pool sizing: the cold store's reads took {ms:.2} ms each in the last epoch: {}",
                if slow { "the cap stays at --max-pool" } else { "trials resume" }
            );
        }
        let trials = sizer.trials;
        let next = if slow { sizer.slow_store() } else { sizer.epoch(e) };
        if let Some(t) = sizer.last.filter(|_| sizer.trials != trials) {
            // (The trial's four epochs, A B B A, are the last four fed:
            // a trial is decided on the fourth of them.)
            let ratio = |f: fn(&(u64, u64, u64)) -> u64| Trial::b_over_a(beside.map(|x| f(&x) as f64));
            tracing::info!(
                "pool sizing: trial {}: A {} did {:.2} s of work, B {} {:.2} s (to beat: {:.2} s): {}; B / A: memory stall {:.2} (some), {:.2} (full), swap-ins served {:.2}",
                sizer.trials,
                t.a,
                t.a_work,
                t.b,
                t.b_work,
                t.to_beat(),
                if t.won { "B" } else { "A stays" },
                ratio(|x| x.0),
                ratio(|x| x.1),
                ratio(|x| x.2),
            );
        }
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

    /// Run `n` trials against a machine whose work in an epoch is
    /// `work(cap)`, all of its CPU user time (so no sampling noise).
    fn run(s: &mut Sizer, n: usize, work: impl Fn(u64) -> f64) {
        let mut cap = s.cap();
        for _ in 0..4 * n {
            let w = work(cap);
            cap = s.epoch(Epoch { work: w, cpu: w, loads: 1 });
        }
    }

    #[test]
    fn it_starts_at_max_pool_and_stays_within_its_bounds() {
        let s = Sizer::new(128 * MIB);
        assert_eq!(s.cap(), 128 * MIB, "the fixed cap's size until the evidence says otherwise");
        let mut s = Sizer::new(128 * MIB);
        run(&mut s, 30, |cap| cap as f64);
        assert_eq!(s.cap(), 128 * MIB, "more is better: it stays at --max-pool");
        let mut s = Sizer::new(128 * MIB);
        run(&mut s, 30, |cap| 1e12 / cap as f64);
        assert_eq!(s.cap(), 16 * MIB, "less is better: it falls to an eighth and stays");
        run(&mut s, 30, |cap| cap as f64);
        assert_eq!(s.cap(), 128 * MIB, "and climbs back when more is better again");
    }

    #[test]
    fn a_trial_runs_a_b_b_a() {
        let mut s = Sizer::new(128 * MIB);
        let a = s.cap();
        let b = a * 2 / 3;
        let mut caps = vec![];
        for w in [10.0, 12.0, 12.0, 10.0] {
            caps.push(s.epoch(Epoch { work: w, cpu: w, loads: 1 }));
        }
        assert_eq!(caps, vec![b, b, a, b], "A B B A, then the next trial's first epoch at the new A");
        assert_eq!((s.cap(), s.trials, s.moves), (b, 1, 1), "B did more work: it is the new A");
        assert_eq!(s.last, Some(Trial { a, b, a_work: 20.0, b_work: 24.0, noise: 0.0, won: true }), "the trial as logged");
        // Equal work: A stays (the pool never moves on a tie), rests a
        // trial's length, and the next trial tries the other way (up).
        let mut caps = vec![];
        for _ in 0..9 {
            caps.push(s.epoch(Epoch { work: 10.0, cpu: 10.0, loads: 1 }));
        }
        assert_eq!((s.cap(), s.trials, s.moves), (b, 2, 1));
        assert_eq!(s.last.map(|t| (t.a, t.b, t.won)), Some((b, b * 2 / 3, false)), "a lost trial is logged too");
        assert_eq!(Trial::b_over_a([2.0, 3.0, 3.0, 2.0]), 1.5);
        assert!(Trial::b_over_a([0.0, 3.0, 3.0, 0.0]).is_nan(), "nothing at A: no ratio");
        // (Each is the cap of the epoch after: B B A of this trial, four of
        // rest, the next trial's A, then its B, up.)
        let down = b * 2 / 3;
        assert!(caps[..2] == [down, down] && caps[2..8].iter().all(|&c| c == b) && caps[8] > b, "{caps:?}");
    }

    #[test]
    fn it_finds_a_peak_between_the_bounds() {
        let mut s = Sizer::new(128 * MIB);
        let best = 30 * MIB;
        run(&mut s, 40, |cap| 100.0 - (cap as f64 - best as f64).abs() / MIB as f64);
        let cap = s.cap();
        assert!(cap > best * 2 / 3 && cap < best * 3 / 2, "settles within a step of the peak: {cap}");
    }

    #[test]
    fn a_smaller_cap_must_win_by_the_margin() {
        let mut s = Sizer::new(128 * MIB);
        // A smaller cap does 0.5 % more work: within the margin.
        run(&mut s, 30, |cap| 100.0 + 0.5 * (1.0 - cap as f64 / (128 * MIB) as f64));
        assert_eq!((s.cap(), s.moves), (128 * MIB, 0));
    }

    /// A workload bound by its swap-ins, half its CPU in the kernel: its
    /// user time is sampled from few ticks, and a difference within the
    /// sampling's error moves nothing.
    #[test]
    fn a_difference_within_the_tick_samplings_error_moves_nothing() {
        // 0.6 s of CPU an epoch, half of it user: a trial's error (2 σ)
        // is sqrt(4 · 0.6 · 0.25 / 100) · 2 ≈ 0.155 s of about 0.6 s a side.
        let epoch = |user: f64| Epoch { work: user, cpu: 0.6, loads: 1 };
        let mut s = Sizer::new(128 * MIB);
        for w in [0.30, 0.35, 0.35, 0.30] {
            s.epoch(epoch(w));
        }
        assert_eq!((s.cap(), s.trials, s.moves), (128 * MIB, 1, 0), "0.1 s more in 0.6: noise");
        for _ in 0..4 {
            s.epoch(epoch(0.3)); // the rest after a lost trial
        }
        for w in [0.28, 0.40, 0.40, 0.28] {
            s.epoch(epoch(w));
        }
        assert_eq!((s.cap(), s.trials, s.moves), (128 * MIB * 2 / 3, 2, 1), "0.24 s more: beyond it");
        let e = epoch(0.3);
        assert!((e.sampling_variance() - 0.6 * 0.25 / 100.0).abs() < 1e-12);
        assert_eq!(Epoch { work: 0.0, cpu: 0.0, loads: 1 }.sampling_variance(), 0.0);
    }

    /// A cap that is right is probed less and less often: each lost
    /// trial in a row doubles the rest after it, up to eight trials' length.
    #[test]
    fn lost_trials_rest_longer_each_time() {
        let mut s = Sizer::new(128 * MIB);
        let mut starts = vec![];
        let mut cap = s.cap();
        for i in 0..400 {
            let next = s.epoch(Epoch { work: cap as f64, cpu: cap as f64, loads: 1 });
            if next != s.cap() && cap == s.cap() && (i == 0 || starts.last() != Some(&(i - 1))) {
                starts.push(i); // an epoch at B follows one at A: a trial's second epoch
            }
            cap = next;
        }
        assert_eq!(s.cap(), 128 * MIB, "more is better: it stays");
        let gaps: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        // A trial is four epochs; the rests are 4, 8, 16, then 32 epochs.
        assert_eq!(&gaps[..4], &[8, 12, 20, 36], "{starts:?}");
        assert!(gaps[4..].iter().all(|&g| g == 36), "{gaps:?}");
        assert!(s.trials <= 400 / 36 + 4, "{} trials in 400 epochs", s.trials);
    }

    #[test]
    fn an_epoch_without_swap_ins_drops_the_trial() {
        let mut s = Sizer::new(128 * MIB);
        let a = s.cap();
        for _ in 0..3 {
            s.epoch(Epoch { work: 10.0, cpu: 10.0, loads: 1 });
        }
        assert_eq!(s.epoch(Epoch { work: 0.0, cpu: 0.0, loads: 0 }), a, "back to A");
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
        let a = Work::Machine.times().expect("/proc/stat and /proc/self/stat parse");
        let b = Work::Machine.times().unwrap();
        assert!(a.user >= 0.0 && a.cpu >= a.user && b.user >= a.user - 0.5, "{a:?} then {b:?}");
    }

    /// A cgroup's work is its processes' user time, with their waited-for
    /// children's, and not the server's own: faked here by a directory
    /// whose `cgroup.procs` names this process and a child that spins.
    #[test]
    fn a_cgroup_counts_its_processes_and_their_children() {
        let dir = tempfile::tempdir().unwrap();
        let cg = Work::Cgroup(dir.path().to_path_buf());
        assert_eq!(cg.times(), None, "no cgroup.procs: unreadable, not zero");
        std::fs::write(dir.path().join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        assert_eq!(cg.times(), Some(Times { user: 0.0, cpu: 0.0 }), "the server itself does not count");
        // A shell that runs a spinning child for 0.3 s and waits for it.
        let mut sh = std::process::Command::new("sh").args(["-c", "timeout 0.3 sh -c 'while :; do :; done'; sleep 5"]).spawn().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), format!("{}\n{}\n", std::process::id(), sh.id())).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let t = cg.times();
        sh.kill().unwrap();
        sh.wait().unwrap();
        // (Its CPU time is the child's, reaped: in the shell's cutime.)
        let t = t.unwrap();
        assert!((0.05..=1.0).contains(&t.user) && t.cpu >= t.user, "the spinning child's 0.3 s counted once it was waited for: {t:?}");
    }

    /// A store whose reads cost a seek holds the cap at --max-pool, also
    /// after trials had shrunk it, and trials resume once it is fast.
    #[test]
    fn a_slow_store_keeps_the_cap_at_max_pool() {
        let mut s = Sizer::new(128 * MIB);
        run(&mut s, 30, |cap| 1e12 / cap as f64);
        assert_eq!(s.cap(), 16 * MIB, "less is better on a fast store");
        s.epoch(Epoch { work: 1.0, cpu: 1.0, loads: 1 }); // a trial under way
        for _ in 0..10 {
            assert_eq!(s.slow_store(), 128 * MIB);
        }
        assert_eq!(s.cap(), 128 * MIB);
        let trials = s.trials;
        run(&mut s, 1, |cap| 1e12 / cap as f64);
        assert_eq!((s.trials, s.cap()), (trials + 1, 128 * MIB * 2 / 3), "a whole trial from --max-pool, down");
    }

    #[test]
    fn a_store_is_slow_from_two_ms_a_read_judged_on_enough_reads() {
        let ms = 1_000_000;
        assert!(!judge(false, 100, 100 * ms), "1 ms a read");
        assert!(judge(false, 100, 200 * ms), "2 ms a read");
        assert!(judge(true, 31, 0) && !judge(false, 31, 31 * 10 * ms), "too few reads: the last verdict stands");
        assert!(!judge(true, 32, 32 * ms / 3), "the throttled disk's third of a ms: fast again");
        assert!(!judge(false, 0, 0));
    }
}
