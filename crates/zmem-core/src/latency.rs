//! How long requests take, as a histogram of fixed buckets that any
//! thread records into without a lock: what the frontends (NBD, FUSE)
//! report for Prometheus (`zmem_*_request_duration_seconds`).
//!
//! The buckets are Prometheus's usual spread for storage requests, from
//! 10 µs to 1 s; a snapshot carries its bounds, so a reader never assumes
//! them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
}
