//! Test-only helpers shared by zmem's crates (their tests, examples and
//! benchmarks' own tests). This crate depends on no workspace crate but
//! `zmem-rig` (which depends on none), so any of them can use it without a
//! dependency cycle; no product crate links it.
//!
//! * [`XorShift`] — the one deterministic generator of test data
//!   (xorshift64, `zmem-rig`'s): tests must not depend on a global or
//!   seeded-from-time RNG, and the same seed gives the same bytes on every
//!   run and machine.
//! * [`ports`], [`redis_cluster`] — loopback ports and a real Redis Cluster
//!   for a test's servers (`zmem-rig`'s, which `zmem bench` uses too).
//! * [`ci`] — skipping a test where a feature is missing, and failing
//!   instead under CI as root, where nothing may be missing.
//! * [`crash`] — the parent side of a crash loop: a worker killed at a
//!   random instant, round after round.
//! * [`machine`] — taking turns, across test binaries, at what the machine
//!   has one of (swap areas, zram, zswap, FUSE's io_uring switch, blkio
//!   throttles).

pub mod ci;
pub mod crash;
pub mod machine;

pub use zmem_rig::{ports, redis_cluster, XorShift};
