//! Round-trip times as a histogram of atomic counters, for percentiles
//! without a lock on the read path.
//!
//! Buckets are powers of two of nanoseconds split in 8 (12.5 % wide), so a
//! percentile is exact to within one bucket's width.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const SUB: usize = 8;
const BUCKETS: usize = 64 * SUB;

pub struct Histogram {
    counts: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros() as usize; // >= 3
    let sub = ((ns >> (log - 3)) & (SUB as u64 - 1)) as usize;
    ((log - 2) * SUB + sub).min(BUCKETS - 1)
}

/// The upper bound of bucket `b`, in nanoseconds.
fn upper(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let (log, sub) = (b / SUB + 2, (b % SUB) as u64);
    ((SUB as u64 + sub + 1) << (log - 3)) - 1
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)].fetch_add(1, Relaxed);
    }

    /// The `p`-th percentile (0 < p ≤ 100) in nanoseconds: the upper
    /// bound of its bucket; 0 when nothing was recorded.
    pub fn percentile(&self, p: f64) -> u64 {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(b);
            }
        }
        upper(BUCKETS - 1)
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_and_bound_their_values() {
        for ns in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 123_456, 10_000_000_000, u64::MAX / 2] {
            let b = bucket(ns);
            assert!(upper(b) >= ns, "{ns} above its bucket's bound {}", upper(b));
            assert!(b == 0 || upper(b - 1) < ns, "{ns} belongs to an earlier bucket");
            assert!(upper(b) - ns <= ns / 8 + 1, "bucket of {ns} is too wide");
        }
    }

    #[test]
    fn percentiles_of_a_known_spread() {
        let h = Histogram::default();
        assert_eq!(h.percentile(50.0), 0);
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.percentile(50.0);
        let p99 = h.percentile(99.0);
        assert!((50_000..=57_000).contains(&p50), "{p50}");
        assert!((99_000..=112_000).contains(&p99), "{p99}");
        assert_eq!(h.count(), 100);
    }
}
