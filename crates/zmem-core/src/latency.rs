//! How long requests take, as a histogram of fixed buckets that any
//! thread records into without a lock: what the frontends (NBD, FUSE)
//! report for Prometheus (`zmem_*_request_duration_seconds`).
//!
//! The buckets are Prometheus's usual spread for storage requests, from
//! 10 µs to 1 s; a snapshot carries its bounds, so a reader never assumes
//! them.
//!
//! And how long a device is busy ([`BusyClock`]): the time with at least
//! one of its operations in flight, which divided by the operations is
//! what one costs, however many overlap (the kernel's `io_ticks`, as
//! `/proc/diskstats` counts a disk's).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde::{Deserialize, Serialize};

/// Upper bounds of the buckets, in nanoseconds; one more bucket holds the
/// rest.
pub const LATENCY_BOUNDS_NS: [u64; 15] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];

/// The recording side.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// A snapshot: per-bucket counts (not cumulative; the last is above every
/// bound) and the sum of the durations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latencies {
    pub bounds_ns: Vec<u64>,
    pub counts: Vec<u64>,
    pub sum_ns: u64,
}

impl LatencyHistogram {
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_NS.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    pub fn snapshot(&self) -> Latencies {
        Latencies { bounds_ns: LATENCY_BOUNDS_NS.to_vec(), counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(), sum_ns: self.sum_ns.load(Relaxed) }
    }
}

impl Latencies {
    /// Requests recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Time with at least one operation in flight (see the module notes).
/// An operation is a [`BusyClock::start`] until its guard drops; one lock
/// taken twice an operation (a few thousand a second, each a disk read).
#[derive(Debug, Default)]
pub struct BusyClock {
    /// Operations in flight, and since when there has been one.
    inflight: Mutex<(u32, Option<Instant>)>,
    busy_ns: AtomicU64,
}

/// One operation of a [`BusyClock`], until dropped (also by a panic).
pub struct Busy<'a>(&'a BusyClock);

impl BusyClock {
    pub fn start(&self) -> Busy<'_> {
        let mut f = self.inflight.lock();
        if f.0 == 0 {
            f.1 = Some(Instant::now());
        }
        f.0 += 1;
        Busy(self)
    }

    /// Nanoseconds busy so far, the operations in flight counted to now.
    pub fn busy_ns(&self) -> u64 {
        let f = self.inflight.lock();
        // (Some exactly while an operation is in flight.)
        let now = f.1.map_or(0, |t| t.elapsed().as_nanos() as u64);
        self.busy_ns.load(Relaxed) + now
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut f = self.0.inflight.lock();
        f.0 -= 1;
        if f.0 == 0 {
            if let Some(t) = f.1.take() {
                self.0.busy_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_their_buckets() {
        let h = LatencyHistogram::default();
        for us in [5, 10, 11, 300, 2_000_000] {
            h.observe(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!((s.counts[0], s.counts[1], s.counts[5], s.counts[15]), (2, 1, 1, 1), "{s:?}");
        assert_eq!(s.sum_ns, (5 + 10 + 11 + 300 + 2_000_000) * 1000);
        assert_eq!(s.bounds_ns.len() + 1, s.counts.len());
    }

    /// Overlapping operations count their union once (never more than
    /// the wall time they spanned; their sum would be); apart, each its
    /// own, and idle time nothing.
    #[test]
    fn busy_time_is_the_union_of_the_operations() {
        let c = BusyClock::default();
        let ms = Duration::from_millis;
        let t = Instant::now();
        {
            let _a = c.start();
            std::thread::sleep(ms(30));
            let _b = c.start();
            std::thread::sleep(ms(30));
        }
        let (one, wall) = (c.busy_ns(), t.elapsed().as_nanos() as u64);
        assert!(one >= 60_000_000 && one <= wall, "busy {one} ns in {wall} ns");
        std::thread::sleep(ms(50));
        assert_eq!(c.busy_ns(), one, "idle time is not busy");
        let t = Instant::now();
        let a = c.start();
        std::thread::sleep(ms(20));
        assert!(c.busy_ns() >= one + 20_000_000, "an operation in flight counts to now");
        drop(a);
        let (two, wall) = (c.busy_ns(), t.elapsed().as_nanos() as u64);
        assert!(two >= one + 20_000_000 && two <= one + wall, "{one} then {two} in {wall} ns");
    }
}
