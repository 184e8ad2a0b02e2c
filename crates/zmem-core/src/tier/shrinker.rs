//! The shrinker thread (zswap's `shrink_worker`): woken at the high mark,
//! it writes back from the LRUs' cold end until the pool is under its
//! accept threshold; a store that would take the pool over `max_pool`
//! waits for it here ([`Tier::wait_for_room`]). The shrinker's state is
//! one mutex ([`Ctl`]) with two condition variables: `wake` for the
//! shrinker, `progress` for the stores that wait.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use super::{Tier, TierHost};
use crate::entry::PAGE_SIZE;
use crate::error::Result;

/// How long a store over `max_pool` waits for the shrinker to make room.
const ADMIT_WAIT: Duration = Duration::from_secs(10);
/// Pause after a shrinker round that failed, before the next.
const BACKOFF: Duration = Duration::from_millis(100);

/// The shrinker's state, under [`Tier::ctl`].
#[derive(Default)]
pub(super) struct Ctl {
    stop: bool,
    running: bool,
    /// Rounds completed.
    rounds: u64,
    /// The last round ended with the pool still at `max_pool`: the disk
    /// failed, or nothing was left to write back.
    last_failed: bool,
    /// A store is waiting for room: cut a backoff short.
    urgent: bool,
    /// Since when rounds have failed on the cold store's errors (None:
    /// the last round did not fail that way).
    failing_since: Option<Instant>,
}

/// The shrinker thread: sleep until asked, run a round, report, repeat.
pub(crate) fn shrinker_main(e: &impl TierHost, t: &Tier) {
    loop {
        {
            let mut c = t.ctl.lock();
            while !c.stop && !t.wanted.load(Acquire) {
                t.wake.wait(&mut c);
            }
            if c.stop {
                return;
            }
            c.running = true;
        }
        t.wanted.store(false, Release);
        let r = t.shrink_round(e);
        let p = e.parts();
        let failed = match &r {
            Ok((_, exhausted)) => *exhausted && t.held_pages(&p) >= p.admission.max_pages(),
            Err(err) => {
                p.counters.reject_reclaim_fail.fetch_add(1, Relaxed);
                p.counters.warn.warn(|| format!("writeback failed; the pool stays near its limit: {err}"));
                true
            }
        };
        let mut c = t.ctl.lock();
        c.running = false;
        c.rounds += 1;
        c.last_failed = failed;
        c.failing_since = if r.is_err() { c.failing_since.or(Some(Instant::now())) } else { None };
        t.progress.notify_all();
        if failed {
            // Do not hammer a failing disk on behalf of the high mark: pause,
            // unless a store is waiting for room (it gets one more try) or
            // the pool is dropped.
            let until = Instant::now() + BACKOFF;
            while !c.stop && !c.urgent && !t.wake.wait_until(&mut c, until).timed_out() {}
        }
        c.urgent = false;
    }
}

impl Tier {
    /// Ask the shrinker for a round (cheap when it is already asked).
    pub fn kick(&self) {
        if self.on && !self.wanted.swap(true, Release) {
            let _c = self.ctl.lock();
            self.wake.notify_one();
        }
    }

    pub fn stop(&self) {
        self.ctl.lock().stop = true;
        self.wake.notify_all();
        self.progress.notify_all();
    }

    pub(super) fn stopping(&self) -> bool {
        self.ctl.lock().stop
    }

    pub(super) fn note_progress(&self) {
        let _c = self.ctl.lock();
        self.progress.notify_all();
    }

    /// Wait until the shrinker is idle and not asked for another round.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = self.ctl.lock();
        while c.running || self.wanted.load(Acquire) {
            if c.stop || self.progress.wait_until(&mut c, deadline).timed_out() {
                return !(c.running || self.wanted.load(Acquire));
            }
        }
        true
    }

    /// After a store: wake the shrinker if the pool is at its high mark.
    pub(crate) fn kick_if_high(&self, h: &impl TierHost) {
        let p = h.parts();
        if self.on && self.held_pages(&p) >= p.admission.high_pages() {
            self.kick();
        }
    }

    /// A store that needs new memory found the pool at `max` pages: wait
    /// for the shrinker to make room. Called with no lock held. Refuses
    /// when a round that ended while we waited could not get under the
    /// limit (the disk failed, or nothing is left to write back), or after
    /// [`ADMIT_WAIT`]. A cold store whose failures heal by themselves
    /// ([`ColdStore::ride_through`]: a cluster failing over) is waited for
    /// instead, until it has failed that long. A waiting store cuts the
    /// shrinker's backoff short, so a disk that failed once is tried again
    /// for it.
    pub(crate) fn wait_for_room(&self, h: &impl TierHost, max: u64) -> Result<()> {
        let p = h.parts();
        let ride = self.store.ride_through();
        let deadline = Instant::now() + ADMIT_WAIT.max(ride);
        let mut c = self.ctl.lock();
        let start = c.rounds;
        loop {
            if self.held_pages(&p) < max {
                return Ok(());
            }
            let healing = c.failing_since.is_some_and(|t| t.elapsed() < ride);
            let gave_up = c.last_failed && !c.running && c.rounds > start && !healing;
            if c.stop || gave_up || Instant::now() >= deadline {
                break;
            }
            c.urgent = true;
            self.wanted.store(true, Release);
            self.wake.notify_all();
            let until = (Instant::now() + Duration::from_millis(20)).min(deadline);
            self.progress.wait_until(&mut c, until);
        }
        drop(c);
        Err(p.counters.reject_full(max))
    }

    /// One shrinker round: write back from the cold end of the LRUs until
    /// the pool is under its target. Returns (pages written back, whether
    /// the LRUs ran out of candidates).
    fn shrink_round(&self, h: &impl TierHost) -> Result<(u64, bool)> {
        let mut buf = self.writing.lock();
        let p = h.parts();
        let target = p.admission.shrink_target();
        let mut total = 0;
        let mut exhausted = false;
        while self.held_pages(&p) > target && !self.stopping() {
            // Write back only what compaction cannot free. Under a store
            // storm, new objects fill the holes writeback leaves, so spans
            // rarely empty by themselves: without this, a round would write
            // back far past its target before the pages came free.
            // (A class with less than a span's worth of holes is left alone,
            // so this is cheap when there is nothing to gain.)
            if p.objects.compact_spans() > 0 {
                self.note_progress();
                continue;
            }
            // (At least a page: stores may have freed room since the check.)
            let need = self.held_pages(&p).saturating_sub(target).max(1);
            // A batch writes no more than the pages it must free: a small
            // pool may hold fewer objects than a full batch.
            let r = self.writeback_lru_batch(h, need.saturating_mul(PAGE_SIZE as u64) as usize, &mut buf);
            self.note_progress();
            let (written, examined) = r?;
            total += written;
            if examined == 0 {
                exhausted = true;
                break;
            }
        }
        if self.held_pages(&p) > target {
            p.objects.compact_spans();
        }
        Ok((total, exhausted))
    }
}
