//! What zmem's benchmarks (and, through `zmem-testkit`, its tests) set up
//! on this machine besides zmem's own servers. It is part of the product:
//! `zmem bench remote` and `zmem bench swap --systems ...,zmem-remote`
//! start a Redis Cluster of their own, and every benchmark's synthetic
//! data comes from one generator. It depends on no workspace crate.
//!
//! * [`XorShift`] — the one deterministic generator of synthetic data
//!   (xorshift64): the same seed gives the same bytes on every run and
//!   machine, and nothing depends on a global or time-seeded RNG.
//! * [`ports`] — loopback ports for servers started here, outside the
//!   kernel's ephemeral range.
//! * [`redis_cluster`] — a real Redis Cluster on loopback (Debian's
//!   `redis-server`), formed as an operator would and torn down on drop.
//! * [`effective_uid`] — whether this process runs as root.

pub mod ports;
pub mod redis_cluster;
mod xorshift;

pub use xorshift::XorShift;

/// The process's effective uid, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_ascii_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn uid_is_readable() {
        assert!(super::effective_uid().is_some());
    }
}
